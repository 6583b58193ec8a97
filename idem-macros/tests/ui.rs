//! Compile-time rules of the macros: what they refuse and what they accept.
//!
//! The compile-fail cases are trybuild cases, checked in one batch in a nested
//! cargo project under `target/tests/trybuild` (`cargo check --bins
//! --keep-going`: no code generation, one cargo run for all of them). Refresh
//! their `.stderr` files with `TRYBUILD=overwrite cargo test -p idem-macros --test ui`
//! and review the diff like code. They live in the macro crate so that the
//! nested project builds only its few dev-dependencies.
//!
//! The pass cases are compiled into this test crate instead, one module each,
//! and their `main` runs: they share the build of the other tests, where a
//! trybuild pass case would make the nested project build every dependency
//! with code generation and then each case on its own. Every file under
//! `tests/ui/*/pass` must be listed below; [`every_pass_case_is_listed`]
//! checks that.

#[test]
fn compile_fail() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/idempotent/fail/*.rs");
    cases.compile_fail("tests/ui/fingerprint/fail/*.rs");
    cases.compile_fail("tests/ui/steps/fail/*.rs");
}

/// One module per pass case, holding the case's file as it is, and a test
/// that runs every case's `main`.
macro_rules! pass_cases {
    ($($module:ident => $path:literal),* $(,)?) => {
        $(
            #[allow(dead_code, unused, clippy::all)]
            mod $module {
                include!($path);

                pub(super) fn run() {
                    main()
                }
            }
        )*

        /// Every pass case compiles, as a module of an ordinary crate, and its
        /// `main` runs.
        #[test]
        fn pass() {
            $($module::run();)*
        }

        /// The pass case files, relative to `tests/`.
        const PASS_CASES: &[&str] = &[$($path),*];
    };
}

pass_cases! {
    idempotent_axum_handler => "ui/idempotent/pass/axum_handler.rs",
    idempotent_axum_generic_handler => "ui/idempotent/pass/axum_generic_handler.rs",
    idempotent_axum_sharded_handler => "ui/idempotent/pass/axum_sharded_handler.rs",
    idempotent_free_fn => "ui/idempotent/pass/free_fn.rs",
    idempotent_mysql_fn => "ui/idempotent/pass/mysql_fn.rs",
    idempotent_generic => "ui/idempotent/pass/generic.rs",
    idempotent_method => "ui/idempotent/pass/method.rs",
    idempotent_shadowing => "ui/idempotent/pass/shadowing.rs",
    idempotent_grpc_async_trait => "ui/idempotent/pass/grpc_async_trait.rs",
    idempotent_grpc_plain_impl => "ui/idempotent/pass/grpc_plain_impl.rs",
    idempotent_grpc_generic => "ui/idempotent/pass/grpc_generic.rs",
    fingerprint_shapes => "ui/fingerprint/pass/shapes.rs",
    steps_declare => "ui/steps/pass/declare.rs",
}

/// A pass case added under `tests/ui/*/pass` without a line in `pass_cases!`
/// would never be compiled: refuse that.
#[test]
fn every_pass_case_is_listed() {
    let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut on_disk = Vec::new();
    for group in std::fs::read_dir(tests.join("ui")).expect("tests/ui") {
        let pass = group.expect("tests/ui entry").path().join("pass");
        let Ok(files) = std::fs::read_dir(&pass) else {
            continue;
        };
        for file in files {
            let path = file.expect("pass case").path();
            if path.extension().is_some_and(|ext| ext == "rs") {
                let relative = path.strip_prefix(&tests).expect("under tests/");
                on_disk.push(relative.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    on_disk.sort();
    let mut listed: Vec<String> = PASS_CASES.iter().map(|case| case.to_string()).collect();
    listed.sort();
    assert_eq!(
        listed, on_disk,
        "list every file under tests/ui/*/pass in `pass_cases!` in tests/ui.rs"
    );
}
