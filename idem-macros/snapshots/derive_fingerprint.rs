const _: () = {
    #[automatically_derived]
    impl<T> ::idem::__private::Fingerprint for Command<T>
    where
        T: ::idem::__private::Fingerprint,
    {
        fn fingerprint(&self, hasher: &mut ::idem::__private::FingerprintHasher) {
            match self {
                #[allow(unused_variables)]
                Self::Charge {
                    amount: __idem_amount,
                    ccy: __idem_ccy,
                    trace_id: __idem_trace_id,
                } => {
                    hasher
                        .begin_variant(const {
                            ::idem::__private::Label::new("Charge")
                        });
                    hasher.begin_struct();
                    hasher
                        .write_field(
                            const { ::idem::__private::Label::new("amount") },
                            __idem_amount,
                        );
                    hasher
                        .write_field(
                            const { ::idem::__private::Label::new("currency") },
                            __idem_ccy,
                        );
                    hasher.end_struct();
                }
                #[allow(unused_variables)]
                Self::Refund(__idem_0, __idem_1) => {
                    hasher
                        .begin_variant(const {
                            ::idem::__private::Label::new("Refund")
                        });
                    hasher.begin_struct();
                    hasher
                        .write_field(
                            const { ::idem::__private::Label::new("0") },
                            __idem_0,
                        );
                    hasher
                        .write_field_with(
                            const { ::idem::__private::Label::new("1") },
                            __idem_1,
                            hash_reason,
                        );
                    hasher.end_struct();
                }
                #[allow(unused_variables)]
                Self::Ping => {
                    hasher
                        .begin_variant(const { ::idem::__private::Label::new("Ping") });
                    hasher.begin_struct();
                    hasher.end_struct();
                }
            }
        }
    }
};
