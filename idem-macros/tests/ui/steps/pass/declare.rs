idem::steps! {
    /// Charging a card.
    pub const CHARGE_CARD = "charge-card.v2";
    #[retired]
    #[allow(dead_code)]
    const CHARGE_CARD_V1 = "charge-card.v1";
}

fn main() {
    let key = idem::IdempotencyKey::new("k").unwrap();
    let _child = key.child(CHARGE_CARD);
    assert_eq!(CHARGE_CARD.name(), "charge-card.v2");
}
