fn main() {
    let key = idem::IdempotencyKey::new("k").unwrap();
    // `child` takes a declared `Step` (from `steps!`); a string is not one.
    let step: idem::Step = "charge.v1";
    let _child = key.child(step);
}
