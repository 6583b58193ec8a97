//! The runtime's rules that the macros apply at compile time, so their errors
//! point at the user's tokens. Each mirrors one rule of `idem-runtime`:
//!
//! - [`check_step_name`]: `idem_runtime::check_step_name`, the `name.vN`
//!   form of a step name (here with messages that say how to fix it);
//! - [`label`]: `idem_runtime::fingerprint::Label::new`, the 32-bit FNV-1a hash
//!   of a field name that the fingerprint encoding writes;
//! - [`parse_millis`]: the attribute's durations (`"500ms"`, `"30s"`, `"15m"`,
//!   `"24h"`, `"7d"`), which become the `Policy` durations of the operation;
//! - [`NEVER_KEPT_HEADERS`], the response headers no handler may ask to
//!   store: `idem_runtime::http::KeptHeaders::never_kept`;
//! - [`GRPC_CODES`] and [`GRPC_STORABLE_ON_REQUEST`], the gRPC status codes
//!   by name and those a method may add to the stored set:
//!   `idem_runtime::grpc::StoredCodes::STORABLE_ON_REQUEST`.
//!
//! The file depends on nothing but `std`: `tests/rules.rs` in the `idem`
//! crate includes it and checks it against the runtime.

/// Checks a step name has the form `name.vN`; on failure, says how to fix it.
/// The same rule as `idem_runtime::check_step_name`, evaluated here so the
/// error can point at the literal.
pub(crate) fn check_step_name(name: &str) -> Result<(), &'static str> {
    let Some((base, version)) = name.rsplit_once(".v") else {
        return Err("has no version; step names have the form `name.vN`, e.g. `charge-card.v1`");
    };
    if version.is_empty()
        || version.starts_with('0')
        || !version.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(
            "needs a version after `.v` counting from 1, without leading zeros (`.v1`, `.v2`, ...), e.g. `charge-card.v2`",
        );
    }
    let starts_lower = base.bytes().next().is_some_and(|b| b.is_ascii_lowercase());
    if !starts_lower
        || !base
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err("must start with a lowercase letter and hold only lowercase letters, digits and dashes before `.vN`, e.g. `charge-card.v1`");
    }
    Ok(())
}

/// Parses `"24h"`, `"30s"`, `"500ms"`, `"15m"`, `"7d"` into milliseconds.
pub(crate) fn parse_millis(text: &str) -> Option<u64> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    let value: u64 = number.parse().ok()?;
    let unit_ms = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    value.checked_mul(unit_ms)
}

/// The 32-bit FNV-1a hash of `name`: what `idem_runtime::fingerprint::Label::new`
/// computes for the encoding.
pub(crate) fn label(name: &str) -> u32 {
    name.bytes().fold(0x811c_9dc5, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// Headers no response keeps, named or not: they describe one connection, or
/// are recomputed for each answer. The same set as
/// `idem_runtime::http::KeptHeaders::never_kept`, lowercase.
pub(crate) const NEVER_KEPT_HEADERS: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "content-type",
    "idempotent-replayed",
];

/// The gRPC status codes: the name the attribute takes (as the gRPC
/// specification spells it) and `tonic::Code`'s variant.
pub(crate) const GRPC_CODES: &[(&str, &str)] = &[
    ("OK", "Ok"),
    ("CANCELLED", "Cancelled"),
    ("UNKNOWN", "Unknown"),
    ("INVALID_ARGUMENT", "InvalidArgument"),
    ("DEADLINE_EXCEEDED", "DeadlineExceeded"),
    ("NOT_FOUND", "NotFound"),
    ("ALREADY_EXISTS", "AlreadyExists"),
    ("PERMISSION_DENIED", "PermissionDenied"),
    ("RESOURCE_EXHAUSTED", "ResourceExhausted"),
    ("FAILED_PRECONDITION", "FailedPrecondition"),
    ("ABORTED", "Aborted"),
    ("OUT_OF_RANGE", "OutOfRange"),
    ("UNIMPLEMENTED", "Unimplemented"),
    ("INTERNAL", "Internal"),
    ("UNAVAILABLE", "Unavailable"),
    ("DATA_LOSS", "DataLoss"),
    ("UNAUTHENTICATED", "Unauthenticated"),
];

/// The codes `store = [...]` may add: not stored by default, and not transient.
pub(crate) const GRPC_STORABLE_ON_REQUEST: &[&str] = &[
    "PERMISSION_DENIED",
    "UNAUTHENTICATED",
    "RESOURCE_EXHAUSTED",
    "UNIMPLEMENTED",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_names_match_the_runtime_rule() {
        for ok in ["charge-card.v1", "a.v1", "x9.v12"] {
            assert!(check_step_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "charge",
            "charge.v",
            "charge.v0",
            "charge.v1a",
            "Charge.v1",
            "charge_card.v1",
            ".v1",
            "1a.v1",
        ] {
            assert!(check_step_name(bad).is_err(), "{bad}");
        }
    }

    /// The same values `idem_runtime::fingerprint::Label` is pinned to.
    #[test]
    fn labels_are_fnv_1a() {
        assert_eq!(label("amount"), 0xf785_ce49);
        assert_eq!(label("glbvs"), label("yacxa"));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_millis("24h"), Some(86_400_000));
        assert_eq!(parse_millis("500ms"), Some(500));
        assert_eq!(parse_millis("soon"), None);
        assert_eq!(parse_millis("5"), None);
    }
}
