//! Compile-time rules of the macros, one trybuild case each. Refresh the
//! `.stderr` files with `TRYBUILD=overwrite cargo test -p idem --test ui` and
//! review the diff like code.
//!
//! trybuild compiles the cases in a nested cargo project under
//! `target/tests/trybuild`. The compile-fail cases go in one batch
//! (`cargo check --bins --keep-going`, no code generation); a batch holding a
//! pass case is instead built case by case, so the pass cases get a batch of
//! their own. The nested build skips debug info: nothing debugs the cases.

#[test]
fn ui() {
    // The only test in this binary, so no other thread reads the environment.
    std::env::set_var("CARGO_PROFILE_DEV_DEBUG", "0");
    {
        let cases = trybuild::TestCases::new();
        cases.compile_fail("tests/ui/idempotent/fail/*.rs");
        cases.compile_fail("tests/ui/fingerprint/fail/*.rs");
        cases.compile_fail("tests/ui/steps/fail/*.rs");
    }
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/idempotent/pass/*.rs");
    cases.pass("tests/ui/fingerprint/pass/*.rs");
    cases.pass("tests/ui/steps/pass/*.rs");
}
