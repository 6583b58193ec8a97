use idem::Fingerprint;

// `glbvs` and `yacxa` have the same 32-bit FNV-1a hash.
#[derive(Fingerprint)]
struct Charge {
    glbvs: i64,
    yacxa: i64,
}

#[derive(Fingerprint)]
#[allow(non_camel_case_types)]
enum Command {
    glbvs,
    yacxa { amount: i64 },
}

fn main() {}
