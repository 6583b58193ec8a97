idem::steps! {
    pub CHARGE = "charge.v1";
}

fn main() {}
