use std::collections::HashMap;

use idem::{fingerprint, Fingerprint, FingerprintHasher};

#[derive(Fingerprint)]
struct Named {
    amount: i64,
    note: Option<String>,
    tags: HashMap<String, String>,
    #[fingerprint(skip)]
    trace_id: String,
    #[fingerprint(rename = "ccy")]
    currency: String,
    #[fingerprint(with = lowercase)]
    email: String,
    r#type: u8,
}

fn lowercase(value: &String, hasher: &mut FingerprintHasher) {
    hasher.write_str(&value.to_lowercase());
}

#[derive(Fingerprint)]
struct Tuple(i64, #[fingerprint(skip)] u64);

#[derive(Fingerprint)]
struct Unit;

#[derive(Fingerprint)]
enum Command<T: Clone> {
    Charge { amount: T, r#type: u8 },
    Refund(T, #[fingerprint(skip)] String),
    Ping,
}

#[derive(Fingerprint)]
enum Never {}

fn main() {
    let named = Named {
        amount: 1,
        note: None,
        tags: HashMap::new(),
        trace_id: String::new(),
        currency: "EUR".into(),
        email: "a@b".into(),
        r#type: 1,
    };
    let _ = (fingerprint("s.v1", &named), named.trace_id);
    let _ = fingerprint("s.v1", &Tuple(1, 2));
    let _ = fingerprint("s.v1", &Unit);
    let _ = fingerprint("s.v1", &Command::<u8>::Ping);
    let _ = fingerprint("s.v1", &Command::Refund(1u8, String::new()));
    let _ = fingerprint("s.v1", &Command::Charge { amount: 1u8, r#type: 2 });
    let _ = |never: &Never| fingerprint("s.v1", never);
}
