//! Expansion snapshots: what the macros generate, pretty-printed and compared
//! with the checked-in files under `idem-macros/snapshots/`. Refresh with
//! `IDEM_SNAPSHOTS=overwrite cargo test -p idem-macros snapshots` and read the
//! diff as a code review.

use proc_macro2::TokenStream;
use quote::quote;

fn check(name: &str, expanded: TokenStream) {
    let file: syn::File = syn::parse2(expanded).expect("the expansion parses as a file");
    let pretty = prettyplease::unparse(&file);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("snapshots")
        .join(format!("{name}.rs"));
    if std::env::var("IDEM_SNAPSHOTS").as_deref() == Ok("overwrite") || !path.exists() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &pretty).unwrap();
    }
    let expected = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        pretty, expected,
        "expansion of `{name}` changed; rerun with IDEM_SNAPSHOTS=overwrite and review the diff"
    );
}

#[test]
fn idempotent_plain() {
    let args = quote!(scope = "tenant_id", step = "charge-card.v1", retain = "7d");
    let item = quote! {
        /// Charges a card.
        pub async fn charge(
            tx: &mut SqliteConnection,
            tenant_id: String,
            key: IdempotencyKey,
            #[fingerprint] req: ChargeRequest,
        ) -> Result<Payment, ChargeError> {
            let id = insert_payment(tx, &tenant_id, &req).await?;
            Ok(Payment { id })
        }
    };
    check(
        "idempotent_plain",
        crate::idempotent::idempotent(args, item),
    );
}

#[test]
fn idempotent_http() {
    let args = quote!(http, scope = "tenant", step = steps::CREATE_ORDER);
    let item = quote! {
        async fn create_order(
            tx: &mut PgConnection,
            Path(tenant): Path<String>,
            key: IdempotencyKey,
            #[fingerprint] Json(order): Json<NewOrder>,
        ) -> Result<(StatusCode, Json<Order>), AppError> {
            Ok((StatusCode::CREATED, Json(insert(tx, &tenant, order).await?)))
        }
    };
    check("idempotent_http", crate::idempotent::idempotent(args, item));
}

#[test]
fn derive_fingerprint() {
    let input = quote! {
        enum Command<T> {
            Charge { amount: T, #[fingerprint(rename = "currency")] ccy: String, #[fingerprint(skip)] trace_id: u64 },
            Refund(u64, #[fingerprint(with = hash_reason)] Reason),
            Ping,
        }
    };
    check("derive_fingerprint", crate::fingerprint::derive(input));
}

#[test]
fn steps_declaration() {
    let input = quote! {
        /// The card charge.
        pub const CHARGE_CARD = "charge-card.v1";
        #[retired]
        pub const CHARGE = "charge.v1";
    };
    check("steps", crate::steps::steps(input));
}
