async fn create_order(
    engines: ::idem::Engines<::idem::sqlx::Postgres>,
    __idem_arg1: Path<String>,
    key: IdempotencyKey,
    __idem_arg3: Json<NewOrder>,
) -> ::idem::__private::axum::response::Response {
    ::idem::__private::http::idem_json::<Json<NewOrder>>();
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
    let __idem_span = ::idem::__private::http::operation_span(&__idem_op);
    ::idem::__private::Instrument::instrument(
            async move {
                let engine = match ::idem::Engines::for_scope(
                        &engines,
                        ::idem::__private::Operation::scope(&__idem_op),
                    )
                    .await
                {
                    ::core::result::Result::Ok(__idem_value) => __idem_value,
                    ::core::result::Result::Err(__idem_value) => {
                        return ::idem::__private::http::respond(
                            ::core::result::Result::Err(__idem_value),
                        );
                    }
                };
                ::idem::__private::http::respond(
                    ::idem::__private::run(
                            engine,
                            &__idem_op,
                            ::idem::__private::Codec::outcome(),
                            async move |tx: &mut PgConnection| {
                                let __idem_value = ::idem::__private::axum::response::IntoResponse::into_response(
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
                                    }
                                        .await,
                                );
                                ::idem::__private::http::into_outcome(
                                        __idem_value,
                                        ::idem::__private::http::KeptHeaders::also(&[]),
                                        ::idem::StoredStatuses::new(&[], &[]),
                                    )
                                    .await
                            },
                        )
                        .await,
                )
            },
            __idem_span,
        )
        .await
}
