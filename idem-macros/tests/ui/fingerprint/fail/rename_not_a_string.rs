use idem::Fingerprint;

#[derive(Fingerprint)]
struct Charge {
    #[fingerprint(rename = amount_cents)]
    amount: i64,
}

fn main() {}
