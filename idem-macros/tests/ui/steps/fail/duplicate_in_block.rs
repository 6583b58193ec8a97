idem::steps! {
    pub const CHARGE = "charge.v1";
    pub const CHARGE_AGAIN = "charge.v1";
}

fn main() {}
