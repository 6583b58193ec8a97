idem::steps! {
    pub const CHARGE = "Charge Card";
    pub const REFUND = "refund";
    pub const PAYOUT = "payout.v0";
}

fn main() {}
