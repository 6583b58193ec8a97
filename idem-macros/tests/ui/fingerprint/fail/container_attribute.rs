use idem::Fingerprint;

#[derive(Fingerprint)]
#[fingerprint(skip)]
struct Charge {
    amount: i64,
}

#[derive(Fingerprint)]
enum Command {
    #[fingerprint(rename = "pay")]
    Charge { amount: i64 },
}

fn main() {}
