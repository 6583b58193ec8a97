/// Charges a card.
pub async fn charge(
    engine: &::idem::Engine<::idem::sqlx::Sqlite>,
    tenant_id: String,
    key: IdempotencyKey,
    req: ChargeRequest,
) -> ::core::result::Result<
    ::idem::Answer<Result<Payment, ChargeError>>,
    ::idem::IdemError,
> {
    ::idem::__private::inventory::submit! {
        ::idem::__private::StepUse::new("charge-card.v1", ::idem::__private::Location {
        item : ::idem::__private::core::concat!(::idem::__private::core::module_path!(),
        "::", "charge"), file : ::idem::__private::core::file!(), line :
        ::idem::__private::core::line!(), },)
    }
    let __idem_step: &'static str = "charge-card.v1";
    let __idem_fingerprint = ::idem::__private::fingerprint_with(
        __idem_step,
        &req,
        <ChargeRequest as ::idem::__private::Fingerprint>::fingerprint,
    );
    let __idem_key = ::idem::__private::key(&key);
    let __idem_op = ::idem::__private::Operation::with_fingerprint(
        ::idem::__private::scope(&[&tenant_id]),
        __idem_key,
        __idem_step,
        __idem_fingerprint,
    );
    let __idem_op = ::idem::__private::Operation::with_policy(
        __idem_op,
        ::idem::__private::policy(engine)
            .with_retention(
                ::idem::__private::core::time::Duration::from_millis(604800000u64),
            ),
    );
    ::idem::__private::run(
            engine,
            &__idem_op,
            <Payment as ::idem::__private::Stores<
                <ChargeError as ::idem::__private::CheckedError>::Checked,
            >>::CODEC,
            async move |tx: &mut SqliteConnection| {
                #[allow(
                    unknown_lints,
                    unreachable_code,
                    clippy::diverging_sub_expression,
                    clippy::empty_loop,
                    clippy::let_unit_value,
                    clippy::needless_return
                )]
                if false {
                    let __idem_fake_return: Result<Payment, ChargeError> = loop {};
                    return __idem_fake_return;
                }
                {
                    let id = insert_payment(tx, &tenant_id, &req).await?;
                    Ok(Payment { id })
                }
            },
        )
        .await
}
