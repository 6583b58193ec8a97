idem::steps! {
    pub const CHARGE: idem::Step = "charge.v1";
}

fn main() {}
