use idem::Fingerprint;

#[derive(Fingerprint)]
struct Charge {
    #[fingerprint(skip = true)]
    trace_id: String,
}

fn main() {}
