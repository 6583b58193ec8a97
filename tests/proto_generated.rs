//! The examples' gRPC code (examples/proto/payments.rs) is what
//! tonic-prost-build generates from examples/proto/payments.proto today.
//! The `.proto` is compiled by protox, a protobuf compiler written in Rust,
//! so neither this test nor the examples need `protoc`.
//!
//! After editing the `.proto`: `IDEM_REGENERATE_PROTO=1 cargo test --test proto_generated`.

use std::path::Path;

#[test]
fn generated_code_matches_the_proto() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/proto");
    let descriptors =
        protox::compile([root.join("payments.proto")], [&root]).expect("compile the .proto");
    let out = tempfile::tempdir().unwrap();
    tonic_prost_build::configure()
        .out_dir(out.path())
        .build_transport(false)
        // The request messages are fingerprinted by idem's derive: the map is
        // hashed in key order, the timestamp is left out.
        .message_attribute(
            ".idem.payments.v1.ChargeRequest",
            "#[derive(idem::Fingerprint)]",
        )
        .message_attribute(
            ".idem.payments.v1.RefundRequest",
            "#[derive(idem::Fingerprint)]",
        )
        .field_attribute(
            ".idem.payments.v1.ChargeRequest.requested_at",
            "#[fingerprint(skip)]",
        )
        .compile_fds(descriptors)
        .expect("generate");
    let generated = std::fs::read_to_string(out.path().join("idem.payments.v1.rs")).unwrap();
    let committed_path = root.join("payments.rs");
    if std::env::var_os("IDEM_REGENERATE_PROTO").is_some() {
        std::fs::write(&committed_path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
    assert!(
        committed == generated,
        "examples/proto/payments.rs is not what examples/proto/payments.proto generates; \
         run `IDEM_REGENERATE_PROTO=1 cargo test --test proto_generated`"
    );
}
