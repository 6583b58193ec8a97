/// Charges a card.
pub async fn charge(
    engine: &::idem::Engine<::idem::__private::sqlx::Sqlite>,
    tenant_id: String,
    key: IdempotencyKey,
    req: ChargeRequest,
) -> ::idem::__private::core::result::Result<
    ::idem::Completed<Result<Payment, ChargeError>>,
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
    let __idem_op = __idem_op
        .policy({
            let mut policy = *::idem::Engine::policy(engine);
            policy.retention = ::idem::__private::core::time::Duration::from_millis(
                604800000u64,
            );
            policy
        });
    match ::idem::Engine::claim(engine, &__idem_op).await {
        ::idem::__private::core::result::Result::Err(error) => {
            ::idem::__private::core::result::Result::Err(error)
        }
        ::idem::__private::core::result::Result::Ok(
            ::idem::__private::Claim::Replay(stored),
        ) => {
            <Payment as ::idem::__private::Stores<
                <ChargeError as ::idem::__private::CheckedError>::Checked,
            >>::replayed(stored)
        }
        ::idem::__private::core::result::Result::Ok(
            ::idem::__private::Claim::Execute(mut __idem_guard),
        ) => {
            let __idem_value = {
                let limit = __idem_guard.work_timeout();
                let tx: &mut SqliteConnection = __idem_guard.connection();
                ::idem::__private::within(
                        limit,
                        async move {
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
            };
            match __idem_value {
                ::idem::__private::core::option::Option::Some(__idem_value) => {
                    <Payment as ::idem::__private::Stores<
                        <ChargeError as ::idem::__private::CheckedError>::Checked,
                    >>::complete(__idem_guard, __idem_value)
                        .await
                }
                ::idem::__private::core::option::Option::None => {
                    ::idem::__private::timed_out(__idem_guard).await
                }
            }
        }
    }
}
