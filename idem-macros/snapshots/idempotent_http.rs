async fn create_order(
    engine: ::idem::Engine<::idem::__private::sqlx::Postgres>,
    __idem_arg1: Path<String>,
    key: IdempotencyKey,
    __idem_arg3: Json<NewOrder>,
) -> ::idem::__private::axum::response::Response {
    ::idem::__private::inventory::submit! {
        ::idem::__private::StepUse::new(::idem::__private::step_name(steps::CREATE_ORDER),
        ::idem::__private::Location { item :
        ::idem::__private::core::concat!(::idem::__private::core::module_path!(), "::",
        "create_order"), file : ::idem::__private::core::file!(), line :
        ::idem::__private::core::line!(), },)
    }
    let __idem_step: &'static str = ::idem::__private::step_name(steps::CREATE_ORDER);
    let __idem_fingerprint = ::idem::__private::fingerprint_with(
        __idem_step,
        &__idem_arg3,
        <Json<NewOrder> as ::idem::__private::Fingerprint>::fingerprint,
    );
    let __idem_key = ::idem::__private::key(&key);
    let Path(tenant) = __idem_arg1;
    let Json(order) = __idem_arg3;
    let __idem_op = ::idem::__private::Operation::with_fingerprint(
        ::idem::__private::scope(&[&tenant]),
        __idem_key,
        __idem_step,
        __idem_fingerprint,
    );
    ::idem::__private::Instrument::instrument(
            async {
                let __idem_result = match ::idem::Engine::claim(&engine, &__idem_op)
                    .await
                {
                    ::idem::__private::core::result::Result::Err(error) => {
                        ::idem::__private::core::result::Result::Err(error)
                    }
                    ::idem::__private::core::result::Result::Ok(
                        ::idem::__private::Claim::Replay(stored),
                    ) => ::idem::__private::replayed::<::idem::StoredResponse>(stored),
                    ::idem::__private::core::result::Result::Ok(
                        ::idem::__private::Claim::Execute(mut __idem_guard),
                    ) => {
                        let __idem_value = {
                            let limit = __idem_guard.work_timeout();
                            let tx: &mut PgConnection = __idem_guard.connection();
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
                                            let __idem_fake_return: Result<
                                                (StatusCode, Json<Order>),
                                                AppError,
                                            > = loop {};
                                            return __idem_fake_return;
                                        }
                                        {
                                            Ok((
                                                StatusCode::CREATED,
                                                Json(insert(tx, &tenant, order).await?),
                                            ))
                                        }
                                    },
                                )
                                .await
                        };
                        match __idem_value {
                            ::idem::__private::core::option::Option::Some(
                                __idem_value,
                            ) => {
                                let __idem_value = ::idem::__private::axum::response::IntoResponse::into_response(
                                    __idem_value,
                                );
                                __idem_guard
                                    .complete(
                                        ::idem::__private::http::into_stored(__idem_value).await,
                                    )
                                    .await
                            }
                            ::idem::__private::core::option::Option::None => {
                                ::idem::__private::timed_out(__idem_guard).await
                            }
                        }
                    }
                };
                ::idem::__private::http::respond(__idem_result)
            },
            ::idem::__private::http::operation_span(&__idem_op),
        )
        .await
}
