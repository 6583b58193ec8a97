//! The macros' compile-time copies of runtime rules (`idem-macros/src/rules.rs`)
//! agree with the runtime.

#[path = "../idem-macros/src/rules.rs"]
#[allow(dead_code)]
mod rules;

#[test]
fn step_names_follow_the_runtime_rule() {
    for name in [
        "charge-card.v1",
        "a.v1",
        "x9.v12",
        "a-b-c.v100",
        "",
        "charge",
        "charge.v",
        "charge.v0",
        "charge.v01",
        "charge.v1a",
        "Charge.v1",
        "charge_card.v1",
        ".v1",
        "1a.v1",
        "-a.v1",
        "a.v1.v2",
        "a.b.v1",
        "é.v1",
    ] {
        assert_eq!(
            rules::check_step_name(name).is_ok(),
            idem::check_step_name(name).is_ok(),
            "{name:?}"
        );
    }
}

#[test]
fn labels_are_the_runtime_labels() {
    for name in [
        "",
        "amount",
        "currency",
        "glbvs",
        "yacxa",
        "r#type",
        "a_long_field_name_1",
    ] {
        assert_eq!(rules::label(name), idem::Label::new(name).get(), "{name:?}");
    }
}

#[test]
fn durations_are_whole_units() {
    assert_eq!(rules::parse_millis("500ms"), Some(500));
    assert_eq!(rules::parse_millis("30s"), Some(30_000));
    assert_eq!(rules::parse_millis("15m"), Some(900_000));
    assert_eq!(rules::parse_millis("24h"), Some(86_400_000));
    assert_eq!(rules::parse_millis("7d"), Some(604_800_000));
    for bad in ["", "5", "soon", "1.5s", "-1s", "99999999999999999999d"] {
        assert_eq!(rules::parse_millis(bad), None, "{bad:?}");
    }
}

#[test]
fn never_kept_headers_are_the_runtimes() {
    use idem_runtime::http::KeptHeaders;
    for name in rules::NEVER_KEPT_HEADERS {
        assert!(KeptHeaders::never_kept(name), "{name}");
    }
    // Every header the runtime knows by name, kept or not: the two sets agree.
    for name in [
        "location",
        "content-location",
        "etag",
        "last-modified",
        "cache-control",
        "expires",
        "vary",
        "link",
        "content-language",
        "content-disposition",
        "content-encoding",
        "retry-after",
        "allow",
        "www-authenticate",
        "set-cookie",
        "x-request-id",
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "content-type",
        "idempotent-replayed",
    ] {
        assert_eq!(
            KeptHeaders::never_kept(name),
            rules::NEVER_KEPT_HEADERS.contains(&name),
            "{name}"
        );
    }
}

#[test]
fn grpc_codes_are_tonics() {
    use idem_runtime::grpc::StoredCodes;
    for (number, (name, variant)) in rules::GRPC_CODES.iter().enumerate() {
        let code = tonic::Code::from_i32(number as i32);
        assert_eq!(format!("{code:?}"), *variant, "{name}");
    }
    let storable: Vec<String> = StoredCodes::STORABLE_ON_REQUEST
        .iter()
        .map(|code| format!("{code:?}"))
        .collect();
    let named: Vec<String> = rules::GRPC_STORABLE_ON_REQUEST
        .iter()
        .map(|name| {
            let (_, variant) = rules::GRPC_CODES.iter().find(|(n, _)| n == name).unwrap();
            variant.to_string()
        })
        .collect();
    assert_eq!(named, storable);
    // None of them is stored already.
    for code in StoredCodes::STORABLE_ON_REQUEST {
        assert!(!StoredCodes::STORED_BY_DEFAULT.contains(code), "{code:?}");
    }
}
