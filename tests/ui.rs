//! Compile-time rules of the macros, one trybuild case each. Refresh the
//! `.stderr` files with `TRYBUILD=overwrite cargo test -p idem --test ui` and
//! review the diff like code.

#[test]
fn idempotent() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/idempotent/pass/*.rs");
    cases.compile_fail("tests/ui/idempotent/fail/*.rs");
}

#[test]
fn fingerprint() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/fingerprint/pass/*.rs");
    cases.compile_fail("tests/ui/fingerprint/fail/*.rs");
}

#[test]
fn steps() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/steps/pass/*.rs");
    cases.compile_fail("tests/ui/steps/fail/*.rs");
}
