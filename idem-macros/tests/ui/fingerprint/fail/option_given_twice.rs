use idem::Fingerprint;

#[derive(Fingerprint)]
struct Charge {
    #[fingerprint(skip, skip)]
    trace_id: String,
    #[fingerprint(rename = "a", rename = "b")]
    amount: i64,
}

fn main() {}
