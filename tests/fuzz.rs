//! Bad input, fuzzed (property-based, with proptest): the `Idempotency-Key`
//! header parser, key and scope construction, the JSON extractor's limits,
//! a stored response read back from a corrupted row, and the fingerprint
//! encoding of derived types. Each target checks its input against an
//! independent rule (which keys are valid, which answer a body gets, which
//! values are equal), never only that nothing panicked.
//!
//! `cargo test --test fuzz` runs each target for its default number of cases
//! (CI); `PROPTEST_CASES=100000 cargo test --release --test fuzz` runs them
//! longer. Inputs that once failed are kept as tests at the end of the file.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::{to_bytes, Body};
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, Request, StatusCode};
use axum::routing::post;
use axum::Router;
use idem::http::{parse_header_value, respond, Json};
use idem::{
    fingerprint, Engine, Fingerprint, IdemError, IdempotencyKey, Operation, Problem, Scope,
    StoredResponse,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde::{Deserialize, Serialize};
use sqlx::Sqlite;
use tower::ServiceExt;

/// The runner of the targets that drive it by hand: proptest's default
/// number of cases (or `PROPTEST_CASES`); a failure prints its minimal input,
/// which becomes a test at the end of this file.
fn runner() -> TestRunner {
    TestRunner::new(Config {
        failure_persistence: None,
        ..Config::default()
    })
}

/// The key rule, written out: 1 to 255 visible ASCII characters.
fn valid_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= 255 && key.bytes().all(|b| (b'!'..=b'~').contains(&b))
}

/// Header text built from the characters the parser cares about.
fn header_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[\"\\\\ \t;=a-c!~]{0,12}",
        "\"[!-~ ]{0,300}\"(;[a-z]=[0-9])?",
        "[!-~]{250,260}",
        any::<String>(),
    ]
}

// ---------------------------------------------------------------------------
// The Idempotency-Key header parser
// ---------------------------------------------------------------------------

proptest! {
    /// Any header value: the parser answers a valid key or a rejection.
    #[test]
    fn the_header_parser_answers_a_valid_key_or_a_rejection(bytes in vec(any::<u8>(), 0..320)) {
        if let Ok(value) = HeaderValue::from_bytes(&bytes) {
            if let Ok(key) = parse_header_value(&value) {
                prop_assert!(valid_key(key.as_str()), "{:?} -> {:?}", bytes, key);
            }
        }
    }

    /// Header text made of quotes, escapes and parameters: the same.
    #[test]
    fn quoted_and_escaped_header_text_gives_a_valid_key_or_a_rejection(text in header_text()) {
        if let Ok(value) = HeaderValue::from_str(&text) {
            if let Ok(key) = parse_header_value(&value) {
                prop_assert!(valid_key(key.as_str()), "{:?} -> {:?}", text, key);
            }
        }
    }

    /// Every valid key comes back unchanged, bare or as a structured-field
    /// string (with its escapes and any parameters).
    #[test]
    fn every_valid_key_round_trips_bare_and_quoted(key in "[!-~]{1,255}", params in "(;[a-z]{1,3}=[0-9]{1,3}){0,2}") {
        let quoted = format!("\"{}\"{params}", key.replace('\\', "\\\\").replace('"', "\\\""));
        let parsed = parse_header_value(&HeaderValue::from_str(&quoted).unwrap()).unwrap();
        prop_assert_eq!(parsed.as_str(), key.as_str());
        if !key.starts_with('"') {
            let bare = parse_header_value(&HeaderValue::from_str(&key).unwrap()).unwrap();
            prop_assert_eq!(bare.as_str(), key.as_str());
        }
    }
}

// ---------------------------------------------------------------------------
// Keys and scopes
// ---------------------------------------------------------------------------

proptest! {
    /// `IdempotencyKey::new` accepts exactly the valid keys, unchanged.
    #[test]
    fn a_key_is_accepted_exactly_when_it_is_valid(text in header_text()) {
        match IdempotencyKey::new(text.clone()) {
            Ok(key) => {
                prop_assert!(valid_key(&text));
                prop_assert_eq!(key.as_str(), text.as_str());
            }
            Err(_) => prop_assert!(!valid_key(&text), "{:?} refused", text),
        }
    }

    /// Two scopes are equal exactly when their parts are, whatever the
    /// parts hold (separators included).
    #[test]
    fn scopes_are_equal_exactly_when_their_parts_are(
        a in vec("[0-9a/:]{0,4}", 0..4),
        b in vec("[0-9a/:]{0,4}", 0..4),
    ) {
        let (scope_a, scope_b) = (
            Scope::from_parts(a.iter().map(String::as_str)),
            Scope::from_parts(b.iter().map(String::as_str)),
        );
        prop_assert_eq!(scope_a == scope_b, a == b, "{:?} {:?}", scope_a, scope_b);
        prop_assert_eq!(scope_a.as_stored() == scope_b.as_stored(), a == b);
    }

    /// A tenant narrowed by a caller is the two-part scope.
    #[test]
    fn a_tenant_with_a_caller_is_the_two_part_scope(tenant in any::<String>(), caller in any::<String>()) {
        prop_assert_eq!(
            Scope::tenant(&tenant).with_caller(&caller),
            Scope::from_parts([tenant.as_str(), caller.as_str()])
        );
        prop_assert_ne!(Scope::tenant(&tenant), Scope::tenant(&tenant).with_caller(&caller));
    }
}

// ---------------------------------------------------------------------------
// The JSON extractor's limits
// ---------------------------------------------------------------------------

/// The routes' body limit.
const LIMIT: usize = 1024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Payment {
    amount_cents: i64,
    currency: String,
}

async fn accept(Json(payment): Json<Payment>) -> axum::Json<Payment> {
    axum::Json(payment)
}

/// A body: bytes, near-JSON text, a valid payment (padded to any size), or
/// deep nesting.
fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        vec(any::<u8>(), 0..2 * LIMIT),
        "[\\[\\]{}\":,0-9a-z ]{0,64}".prop_map(String::into_bytes),
        (any::<i64>(), "[A-Z]{0,4}", 0..2 * LIMIT).prop_map(|(amount, currency, pad)| {
            format!(
                "{{\"amount_cents\":{amount},\"currency\":\"{currency}\"}}{}",
                " ".repeat(pad)
            )
            .into_bytes()
        }),
        (1..100_000usize).prop_map(|depth| "[".repeat(depth).into_bytes()),
        (1..5_000usize).prop_map(|depth| format!(
            "{}1{}",
            "{\"a\":".repeat(depth),
            "}".repeat(depth)
        )
        .into_bytes()),
    ]
}

/// What the extractor must answer, worked out independently: 415 without
/// a JSON content type, 413 over the limit, 400 for anything that is not a
/// payment, 200 with the payment otherwise.
fn expected(content_type: Option<&str>, body: &[u8]) -> (u16, Option<Payment>) {
    let json = content_type.is_some_and(|ct| {
        let essence = ct
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        essence == "application/json"
            || (essence.starts_with("application/") && essence.ends_with("+json"))
    });
    if !json {
        return (415, None);
    }
    if body.len() > LIMIT {
        return (413, None);
    }
    match serde_json::from_slice::<Payment>(body) {
        Ok(payment) => (200, Some(payment)),
        Err(_) => (400, None),
    }
}

#[test]
fn the_json_extractor_answers_each_body_as_its_limits_say() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", post(accept))
        .layer(DefaultBodyLimit::max(LIMIT));
    let content_type = prop_oneof![
        Just(None),
        Just(Some("application/json".to_owned())),
        Just(Some("application/json; charset=utf-8".to_owned())),
        Just(Some("application/merge-patch+json".to_owned())),
        Just(Some("text/plain".to_owned())),
        "[a-z/+;= ]{0,24}".prop_map(Some),
    ];
    let mut runner = runner();
    runner
        .run(&(content_type, body()), |(content_type, body)| {
            let (status, payment) = expected(content_type.as_deref(), &body);
            let mut request = Request::post("/");
            if let Some(ct) = &content_type {
                request = request.header("content-type", ct);
            }
            let request = request.body(Body::from(body.clone())).unwrap();
            let (got, answer, problem_type) = runtime.block_on(async {
                let response = app.clone().oneshot(request).await.unwrap();
                let got = response.status();
                let problem_type = response
                    .headers()
                    .get("content-type")
                    .map(|v| v.to_str().unwrap_or("").to_owned());
                let bytes = to_bytes(response.into_body(), usize::MAX).await.unwrap();
                (got, bytes, problem_type)
            });
            prop_assert_eq!(
                got.as_u16(),
                status,
                "content type {:?}, {} bytes",
                content_type,
                body.len()
            );
            if got == StatusCode::OK {
                let echoed: Payment = serde_json::from_slice(&answer).unwrap();
                prop_assert_eq!(Some(echoed), payment);
            } else {
                prop_assert_eq!(problem_type.as_deref(), Some("application/problem+json"));
                let problem: serde_json::Value = serde_json::from_slice(&answer).unwrap();
                prop_assert_eq!(problem["status"].as_u64(), Some(u64::from(status)));
            }
            Ok(())
        })
        .unwrap();
}

// ---------------------------------------------------------------------------
// A stored response read back from a corrupted row
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    payment_id: String,
    amount_cents: i64,
}

/// What a corrupted row holds.
#[derive(Debug, Clone)]
struct Row {
    status: i64,
    content_type: Option<String>,
    body: Option<Vec<u8>>,
    headers: Option<String>,
}

fn row() -> impl Strategy<Value = Row> {
    let status = prop_oneof![
        100i64..600,
        Just(200i64),
        Just(422i64),
        any::<i64>(),
        -70_000i64..70_000,
    ];
    let body = prop_oneof![
        Just(None),
        vec(any::<u8>(), 0..64).prop_map(Some),
        Just(Some(
            br#"{"payment_id":"p_other","amount_cents":-1}"#.to_vec()
        )),
        Just(Some(
            br#"{"type":"about:blank","title":"x","status":422,"detail":"d"}"#.to_vec()
        )),
        "[\\[\\]{}\":,0-9a-z_]{0,40}".prop_map(|s| Some(s.into_bytes())),
    ];
    let headers = prop_oneof![
        Just(None),
        any::<String>().prop_map(Some),
        Just(Some(r#"[["location","/p/1"],["x-a","b"]]"#.to_owned())),
        Just(Some(
            r#"[["bad name","v"],["x-ok","line\nbreak"]]"#.to_owned()
        )),
        vec(("[ -~]{0,8}", "[\\x00-\\x7f]{0,8}"), 0..3)
            .prop_map(|pairs| Some(serde_json::to_string(&pairs).unwrap())),
    ];
    (
        status,
        proptest::option::of("[ -~\\x00-\\x1f]{0,24}"),
        body,
        headers,
    )
        .prop_map(|(status, content_type, body, headers)| Row {
            status,
            content_type,
            body,
            headers,
        })
}

/// Writes `row` over the stored response of `key`.
async fn corrupt(engine: &Engine<Sqlite>, key: &str, row: &Row) {
    sqlx::query(
        "UPDATE idempotency_keys SET response_status = ?1, response_content_type = ?2, \
         response_body = ?3, response_headers = ?4 WHERE key = ?5",
    )
    .bind(row.status)
    .bind(&row.content_type)
    .bind(&row.body)
    .bind(&row.headers)
    .bind(key)
    .execute(engine.pool())
    .await
    .unwrap();
}

/// The row's response as the store keeps it, if its status is an HTTP status.
fn stored(row: &Row) -> Option<StoredResponse> {
    let status = u16::try_from(row.status)
        .ok()
        .filter(|s| (100..=599).contains(s))?;
    Some(StoredResponse {
        status,
        content_type: row.content_type.clone().unwrap_or_default(),
        body: row.body.clone().unwrap_or_default(),
        headers: Vec::new(),
    })
}

/// Replays `key` from its (corrupted) row, as a typed outcome and as an HTTP
/// answer: each is the stored answer or an error, the work never runs again,
/// and nothing panics.
async fn replay_corrupted(engine: &Engine<Sqlite>, n: u64, row: &Row) -> Result<(), TestCaseError> {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let request = ("charge", n);
    let typed_key = format!("typed-{n}");
    let http_key = format!("http-{n}");
    let operation = |key: &str| {
        Operation::new(
            Scope::tenant("fuzz"),
            IdempotencyKey::new(key).unwrap(),
            "replay-corrupted.v1",
            &request,
        )
    };
    let receipt = Receipt {
        payment_id: format!("p_{n}"),
        amount_cents: 100,
    };

    // Typed: Result<Receipt, Problem>.
    let typed = operation(&typed_key);
    engine
        .run(&typed, async |_tx| Ok::<Receipt, Problem>(receipt.clone()))
        .await
        .unwrap();
    corrupt(engine, &typed_key, row).await;
    let runs = RUNS.load(Ordering::SeqCst);
    let replayed = engine
        .run(&typed, async |_tx| {
            RUNS.fetch_add(1, Ordering::SeqCst);
            Ok::<Receipt, Problem>(receipt.clone())
        })
        .await;
    prop_assert_eq!(
        RUNS.load(Ordering::SeqCst),
        runs,
        "the work ran again for {:?}",
        row
    );
    match (replayed, stored(row)) {
        (Ok(answer), Some(stored)) => {
            prop_assert_eq!(answer.via, idem::Via::Replayed);
            let expected: Result<Receipt, Problem> = if stored.status < 400 {
                Ok(serde_json::from_slice(&stored.body).unwrap())
            } else {
                Err(serde_json::from_slice(&stored.body).unwrap())
            };
            prop_assert_eq!(
                serde_json::to_value(answer.value.as_ref().map_err(|p| p.status)).unwrap(),
                serde_json::to_value(expected.as_ref().map_err(|p| p.status)).unwrap()
            );
        }
        (Ok(answer), None) => prop_assert!(false, "replayed {:?} from {:?}", answer.value, row),
        (Err(IdemError::Replay(_)), Some(_)) => {}
        (Err(IdemError::Unavailable { .. }), None) => {}
        (Err(error), _) => prop_assert!(false, "{error} for {:?}", row),
    }

    // HTTP: the stored response itself.
    let http = operation(&http_key);
    engine
        .run(&http, async |_tx| StoredResponse {
            status: 201,
            content_type: "application/json".to_owned(),
            body: serde_json::to_vec(&receipt).unwrap(),
            headers: vec![("location".to_owned(), format!("/p/{n}"))],
        })
        .await
        .unwrap();
    corrupt(engine, &http_key, row).await;
    let runs = RUNS.load(Ordering::SeqCst);
    let replayed = engine
        .run(&http, async |_tx| {
            RUNS.fetch_add(1, Ordering::SeqCst);
            StoredResponse {
                status: 201,
                content_type: String::new(),
                body: Vec::new(),
                headers: Vec::new(),
            }
        })
        .await;
    prop_assert_eq!(
        RUNS.load(Ordering::SeqCst),
        runs,
        "the work ran again for {:?}",
        row
    );
    let expected = stored(row);
    let response = respond(replayed);
    match expected {
        Some(stored) => {
            prop_assert_eq!(response.status().as_u16(), stored.status, "{:?}", row);
            prop_assert_eq!(
                response.headers()["idempotent-replayed"].to_str().unwrap(),
                "true"
            );
            let body = to_bytes(response.into_body(), usize::MAX).await.unwrap();
            prop_assert_eq!(body.to_vec(), stored.body);
        }
        None => prop_assert_eq!(response.status().as_u16(), 503, "{:?}", row),
    }
    Ok(())
}

#[test]
fn a_corrupted_stored_response_replays_as_stored_or_fails_and_never_runs_again() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let db = idem_test_support::TestDb::sqlite();
    let engine = runtime.block_on(async {
        let engine = Engine::<Sqlite>::new(
            idem::store::sqlite::connect(db.url(), &idem::Policy::default(), 2)
                .await
                .unwrap(),
        );
        engine.migrate().await.unwrap();
        engine
    });
    let next = AtomicU64::new(0);
    let mut runner = runner();
    runner
        .run(&row(), |row| {
            let n = next.fetch_add(1, Ordering::Relaxed);
            runtime.block_on(replay_corrupted(&engine, n, &row))
        })
        .unwrap();
}

// ---------------------------------------------------------------------------
// The fingerprint encoding of derived types
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Fingerprint)]
enum Delivery {
    Pickup,
    Courier(String),
    Post { zone: u8, tracked: Option<bool> },
}

#[derive(Debug, Clone, PartialEq, Fingerprint)]
struct Line {
    sku: String,
    quantity: u32,
}

#[derive(Debug, Clone, PartialEq, Fingerprint)]
struct Basket {
    customer: String,
    note: Option<String>,
    lines: Vec<Line>,
    tags: Vec<String>,
    amount_cents: i64,
    gift: bool,
    delivery: Delivery,
    attributes: HashMap<String, String>,
}

fn short() -> impl Strategy<Value = String> {
    "[ab,:\"\\\\\\x00]{0,3}"
}

fn basket() -> impl Strategy<Value = Basket> {
    let delivery = prop_oneof![
        Just(Delivery::Pickup),
        short().prop_map(Delivery::Courier),
        (0u8..3, proptest::option::of(any::<bool>()))
            .prop_map(|(zone, tracked)| Delivery::Post { zone, tracked }),
    ];
    let line = (short(), 0u32..3).prop_map(|(sku, quantity)| Line { sku, quantity });
    (
        short(),
        proptest::option::of(short()),
        vec(line, 0..3),
        vec(short(), 0..3),
        -2i64..3,
        any::<bool>(),
        delivery,
        proptest::collection::hash_map(short(), short(), 0..3),
    )
        .prop_map(
            |(customer, note, lines, tags, amount_cents, gift, delivery, attributes)| Basket {
                customer,
                note,
                lines,
                tags,
                amount_cents,
                gift,
                delivery,
                attributes,
            },
        )
}

proptest! {
    /// Across a corpus of small, collision-prone values (empty strings,
    /// separators, `None` against `Some("")`, empty lists), two baskets hash
    /// alike exactly when they are equal.
    #[test]
    fn distinct_values_of_a_derived_type_never_hash_alike(corpus in vec(basket(), 2..40)) {
        let hashes: Vec<_> = corpus.iter().map(|b| fingerprint("basket.v1", b)).collect();
        for (i, a) in corpus.iter().enumerate() {
            for (j, b) in corpus.iter().enumerate().skip(i + 1) {
                prop_assert_eq!(hashes[i] == hashes[j], a == b, "{:?}\n{:?}", a, b);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Inputs that once failed
// ---------------------------------------------------------------------------

/// A stored status of 0 was replayed as a success (and a negative one, or
/// one past `u16`, made the record look unanswered, so the work ran again):
/// a status that is not an HTTP status now fails the claim closed (503).
#[tokio::test]
async fn a_stored_status_that_is_not_an_http_status_fails_closed() {
    let db = idem_test_support::TestDb::sqlite();
    let engine = Engine::<Sqlite>::new(
        idem::store::sqlite::connect(db.url(), &idem::Policy::default(), 2)
            .await
            .unwrap(),
    );
    engine.migrate().await.unwrap();
    for (n, status) in [0, -1, 99, 600, 70_000, i64::MIN].into_iter().enumerate() {
        let row = Row {
            status,
            content_type: None,
            body: Some(br#"{"payment_id":"p_1","amount_cents":100}"#.to_vec()),
            headers: None,
        };
        replay_corrupted(&engine, n as u64, &row).await.unwrap();
    }
}
