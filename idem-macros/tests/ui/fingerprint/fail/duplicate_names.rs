use idem::Fingerprint;

#[derive(Fingerprint)]
struct Charge {
    amount: i64,
    #[fingerprint(rename = "amount")]
    amount_cents: i64,
}

fn main() {}
