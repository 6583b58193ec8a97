//! Re-runs the build when the embedded migrations change.
// Re-embed the migrations whenever they change.
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
