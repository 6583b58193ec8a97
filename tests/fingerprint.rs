//! `#[derive(Fingerprint)]` emits the runtime's canonical encoding: each rule
//! the derive promises, proved against a hand-fed hasher or a sibling type.

use std::collections::{BTreeMap, HashMap};

use idem::fingerprint::Label;
use idem::{fingerprint, Fingerprint, FingerprintHasher};

#[derive(Fingerprint)]
struct Ordered {
    a: i64,
    b: String,
}

#[derive(Fingerprint)]
struct Reordered {
    b: String,
    a: i64,
}

#[test]
fn field_order_does_not_matter() {
    let one = Ordered {
        a: 1,
        b: "x".into(),
    };
    let two = Reordered {
        b: "x".into(),
        a: 1,
    };
    assert_eq!(fingerprint("s.v1", &one), fingerprint("s.v1", &two));
}

#[test]
fn the_encoding_is_the_runtimes() {
    let mut hasher = FingerprintHasher::new("s.v1");
    hasher.begin_struct();
    hasher.write_field(Label::new("a"), &1i64);
    hasher.write_field(Label::new("b"), "x");
    hasher.end_struct();
    assert_eq!(
        fingerprint(
            "s.v1",
            &Reordered {
                b: "x".into(),
                a: 1
            }
        ),
        hasher.finish()
    );
}

/// The derive's bytes for a request, hashed outside Rust from the encoding's
/// table (the same digest the runtime's known-answer test pins).
#[test]
fn the_derive_matches_the_known_answer() {
    #[derive(Fingerprint)]
    struct Charge {
        currency: &'static str,
        memo: Option<String>,
        amount: i64,
        #[fingerprint(skip)]
        _received_at: u64,
    }
    let charge = Charge {
        currency: "EUR",
        memo: None,
        amount: 2500,
        _received_at: 7,
    };
    assert_eq!(
        format!("{:?}", fingerprint("charge-card.v1", &charge)),
        "RequestHash(bf7d4a471cd2d2c15012ea083f90a08724bdebfd6a71fb38fdd9c8584a7758a4)"
    );
}

#[derive(Fingerprint)]
struct WithMap {
    tags: HashMap<String, u32>,
}

#[derive(Fingerprint)]
struct WithBTreeMap {
    tags: BTreeMap<String, u32>,
}

#[test]
fn hash_map_order_does_not_matter() {
    let pairs: Vec<(String, u32)> = (0..50).map(|i| (format!("k{i}"), i)).collect();
    let forward = WithMap {
        tags: pairs.iter().cloned().collect(),
    };
    let backward = WithMap {
        tags: pairs.iter().rev().cloned().collect(),
    };
    let sorted = WithBTreeMap {
        tags: pairs.into_iter().collect(),
    };
    assert_eq!(
        fingerprint("s.v1", &forward),
        fingerprint("s.v1", &backward)
    );
    assert_eq!(fingerprint("s.v1", &forward), fingerprint("s.v1", &sorted));
}

#[derive(Fingerprint)]
struct Grown {
    a: i64,
    b: String,
    added_later: Option<String>,
}

#[test]
fn a_none_option_contributes_nothing() {
    let old = Ordered {
        a: 1,
        b: "x".into(),
    };
    let new = Grown {
        a: 1,
        b: "x".into(),
        added_later: None,
    };
    assert_eq!(fingerprint("s.v1", &old), fingerprint("s.v1", &new));
    let set = Grown {
        a: 1,
        b: "x".into(),
        added_later: Some("y".into()),
    };
    assert_ne!(fingerprint("s.v1", &old), fingerprint("s.v1", &set));
}

#[derive(Fingerprint)]
struct WithSkipped {
    a: i64,
    b: String,
    #[fingerprint(skip)]
    received_at: u64,
}

#[test]
fn skipped_fields_never_count() {
    let one = WithSkipped {
        a: 1,
        b: "x".into(),
        received_at: 1,
    };
    let two = WithSkipped {
        a: 1,
        b: "x".into(),
        received_at: 2,
    };
    assert_eq!(fingerprint("s.v1", &one), fingerprint("s.v1", &two));
    assert_eq!(
        fingerprint("s.v1", &one),
        fingerprint(
            "s.v1",
            &Ordered {
                a: 1,
                b: "x".into()
            }
        )
    );
    assert_eq!(one.received_at + two.received_at, 3);
}

#[derive(Fingerprint)]
struct Renamed {
    #[fingerprint(rename = "a")]
    amount: i64,
    b: String,
}

#[test]
fn rename_keeps_the_old_fingerprint() {
    let renamed = Renamed {
        amount: 1,
        b: "x".into(),
    };
    assert_eq!(
        fingerprint("s.v1", &renamed),
        fingerprint(
            "s.v1",
            &Ordered {
                a: 1,
                b: "x".into()
            }
        )
    );
}

#[allow(clippy::ptr_arg)] // `with` receives `&FieldType`
fn lowercase(value: &String, hasher: &mut FingerprintHasher) {
    hasher.write_str(&value.to_lowercase());
}

#[derive(Fingerprint)]
struct Email {
    #[fingerprint(with = lowercase)]
    address: String,
}

#[test]
fn with_uses_the_given_function() {
    let upper = Email {
        address: "A@X.IO".into(),
    };
    let lower = Email {
        address: "a@x.io".into(),
    };
    assert_eq!(fingerprint("s.v1", &upper), fingerprint("s.v1", &lower));
}

#[derive(Fingerprint)]
struct Tuple(i64, String);

#[derive(Fingerprint)]
struct Unit;

#[derive(Fingerprint)]
enum Command {
    Charge { amount: i64 },
    Refund { amount: i64 },
    Cancel(u64),
    Ping,
}

#[test]
fn tuple_unit_and_enum_shapes() {
    assert_ne!(
        fingerprint("s.v1", &Tuple(1, "x".into())),
        fingerprint("s.v1", &Tuple(2, "x".into()))
    );
    assert_eq!(fingerprint("s.v1", &Unit), fingerprint("s.v1", &Unit));
    // The variant name counts: same fields, different variant, different fingerprint.
    assert_ne!(
        fingerprint("s.v1", &Command::Charge { amount: 1 }),
        fingerprint("s.v1", &Command::Refund { amount: 1 })
    );
    assert_ne!(
        fingerprint("s.v1", &Command::Cancel(1)),
        fingerprint("s.v1", &Command::Ping)
    );
}

#[derive(Fingerprint)]
struct Page<T> {
    items: Vec<T>,
    #[fingerprint(skip)]
    cursor: NotFingerprinted,
}

struct NotFingerprinted;

#[test]
fn generics_get_bounds_per_field() {
    let page = Page {
        items: vec![1u8, 2],
        cursor: NotFingerprinted,
    };
    let NotFingerprinted = page.cursor;
    assert_eq!(
        fingerprint(
            "s.v1",
            &Page {
                items: vec![1u8, 2],
                cursor: NotFingerprinted
            }
        ),
        fingerprint("s.v1", &page)
    );
}
