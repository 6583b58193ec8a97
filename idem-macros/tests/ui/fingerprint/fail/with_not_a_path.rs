use idem::Fingerprint;

#[derive(Fingerprint)]
struct Charge {
    #[fingerprint(with = "lowercase")]
    email: String,
}

fn main() {}
