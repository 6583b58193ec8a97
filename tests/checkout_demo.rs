//! The README's first command, `cargo run --example checkout`, exits 0 and
//! reports one charge per order. `cargo test` builds the example; this runs it.

use std::path::PathBuf;
use std::process::Command;

fn example(name: &str) -> PathBuf {
    // Tests run from target/<profile>/deps; examples are built into target/<profile>/examples.
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let binary = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.is_file(),
        "{} is missing: `cargo test` builds it; with `--test checkout_demo` alone run `cargo build --example {name}` first",
        binary.display()
    );
    binary
}

#[test]
fn checkout_demo_exits_zero_with_one_charge_per_order() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(example("checkout"))
        .current_dir(dir.path())
        .output()
        .expect("run the checkout demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "exit {:?}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("one charge per order: yes"), "{stdout}");
    assert!(!stdout.contains("WRONG"), "{stdout}");
    for story in [
        "lost response",
        "gateway retry",
        "mesh retry",
        "concurrently",
        "crash after commit",
        "changed amount",
    ] {
        assert!(stdout.contains(story), "{story} missing from\n{stdout}");
    }
}
