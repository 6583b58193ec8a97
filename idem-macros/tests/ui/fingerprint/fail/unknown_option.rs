use idem::Fingerprint;

#[derive(Fingerprint)]
struct Charge {
    #[fingerprint(ignore)]
    trace_id: String,
    #[fingerprint(skip, flatten)]
    at: u64,
}

fn main() {}
