fn main() {
    let key = idem::IdempotencyKey::new("k").unwrap();
    let _child = key.child("charge.v1");
}
