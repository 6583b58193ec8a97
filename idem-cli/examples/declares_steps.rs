//! A service's start-up, reduced to its step declarations and the registry
//! check: what `idem steps --declared-by` runs. With `IDEM_PRINT_STEPS` set,
//! `registry::check()` prints the declarations and exits; without it the
//! check passes and the program says so.

idem::steps! {
    /// An order placed.
    pub const PLACE_ORDER = "place-order.v1";
    /// The charge's old name, kept until its keys expire.
    #[retired]
    pub const CHARGE_CARD_V1 = "charge-card.v1";
}

fn main() {
    idem::registry::check().expect("the steps are consistent");
    println!("steps checked: {} and {}", PLACE_ORDER, CHARGE_CARD_V1);
}
