//! Which answers are retried, and how long the client waits, against a small
//! axum server on 127.0.0.1 that answers each request with the next status of
//! a script and records the key and body every attempt carried.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use idem_client::{
    IdempotencyKey, RequestBuilderExt, ResponseExt, RetryPolicy, IN_PROGRESS_PROBLEM,
};

/// One scripted answer.
#[derive(Clone)]
struct Answer {
    status: u16,
    retry_after: Option<String>,
    problem_type: Option<&'static str>,
}

fn status(status: u16) -> Answer {
    Answer {
        status,
        retry_after: None,
        problem_type: None,
    }
}

impl Answer {
    fn retry_after(mut self, value: impl Into<String>) -> Self {
        self.retry_after = Some(value.into());
        self
    }
    fn problem(mut self, type_: &'static str) -> Self {
        self.problem_type = Some(type_);
        self
    }
}

/// What an attempt carried.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    key: Option<String>,
    body: Vec<u8>,
}

#[derive(Clone, Default)]
struct Script {
    answers: Arc<Mutex<VecDeque<Answer>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

async fn answer(State(script): State<Script>, headers: HeaderMap, body: Bytes) -> Response {
    script.seen.lock().unwrap().push(Seen {
        key: headers
            .get("idempotency-key")
            .map(|v| v.to_str().unwrap().to_owned()),
        body: body.to_vec(),
    });
    let next = script
        .answers
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or(status(200));
    let mut response = match next.problem_type {
        Some(type_) => (
            [("content-type", "application/problem+json")],
            serde_json::json!({"type": type_, "title": "t", "status": next.status, "detail": "d"})
                .to_string(),
        )
            .into_response(),
        None => format!("answer {}", next.status).into_response(),
    };
    *response.status_mut() = StatusCode::from_u16(next.status).unwrap();
    if let Some(value) = next.retry_after {
        response
            .headers_mut()
            .insert("retry-after", HeaderValue::from_str(&value).unwrap());
    }
    response
}

/// Serves `answers` in order (then 200s); returns the URL and the record.
async fn serve(answers: Vec<Answer>) -> (String, Script) {
    let script = Script::default();
    script.answers.lock().unwrap().extend(answers);
    let app = axum::Router::new()
        .route("/op", axum::routing::any(answer))
        .with_state(script.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/op", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, script)
}

fn quick() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(8)
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
}

async fn post(policy: RetryPolicy, url: &str, key: &IdempotencyKey) -> reqwest::Response {
    idem_client::client(reqwest::Client::new(), policy)
        .post(url)
        .idempotency_key(key.clone())
        .body("the same bytes every time")
        .send()
        .await
        .expect("an answer")
}

#[tokio::test]
async fn transient_statuses_are_retried_with_the_same_key_and_body() {
    let (url, script) = serve(
        [408, 425, 429, 500, 502, 503, 504]
            .into_iter()
            .map(status)
            .chain([status(201)])
            .collect(),
    )
    .await;
    let key = IdempotencyKey::new("op-1").unwrap();
    let response = post(quick(), &url, &key).await;
    assert_eq!(response.status(), 201);
    assert_eq!(response.attempts(), 8);
    let seen = script.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 8);
    for attempt in &seen {
        assert_eq!(attempt.key.as_deref(), Some("\"op-1\""));
        assert_eq!(attempt.body, b"the same bytes every time");
    }
}

#[tokio::test]
async fn client_errors_are_final() {
    for code in [400, 401, 403, 404, 409, 410, 413, 415, 422] {
        let (url, script) = serve(vec![status(code).retry_after("0"), status(201)]).await;
        let response = post(quick(), &url, &IdempotencyKey::random()).await;
        assert_eq!(response.status(), code);
        assert_eq!(response.attempts(), 1);
        assert_eq!(script.seen.lock().unwrap().len(), 1, "{code}");
    }
}

#[tokio::test]
async fn idems_in_progress_conflict_is_retried_and_others_are_kept_intact() {
    let (url, _) = serve(vec![
        status(409).retry_after("0").problem(IN_PROGRESS_PROBLEM),
        status(201),
    ])
    .await;
    let response = post(quick(), &url, &IdempotencyKey::random()).await;
    assert_eq!((response.status().as_u16(), response.attempts()), (201, 2));

    // Another problem type: not retried, and the body read to tell is still there.
    let other = "https://example.com/problems#out-of-stock";
    let (url, _) = serve(vec![status(409).retry_after("0").problem(other)]).await;
    let response = post(quick(), &url, &IdempotencyKey::random()).await;
    assert_eq!(response.status(), 409);
    assert_eq!(response.attempts(), 1);
    assert_eq!(response.url().as_str(), url);
    let problem: serde_json::Value =
        serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert_eq!(problem["type"], other);

    // Any 409 with Retry-After, by configuration; none without it.
    let (url, _) = serve(vec![status(409).retry_after("0"), status(201)]).await;
    let policy = quick().retry_any_conflict_with_retry_after(true);
    let response = post(policy.clone(), &url, &IdempotencyKey::random()).await;
    assert_eq!((response.status().as_u16(), response.attempts()), (201, 2));
    let (url, _) = serve(vec![status(409), status(201)]).await;
    let response = post(policy, &url, &IdempotencyKey::random()).await;
    assert_eq!((response.status().as_u16(), response.attempts()), (409, 1));
}

#[tokio::test]
async fn retry_after_as_an_http_date_is_honoured_and_long_ones_are_capped() {
    let at = SystemTime::now() + Duration::from_secs(2);
    let (url, _) = serve(vec![
        status(503).retry_after(httpdate::fmt_http_date(at)),
        status(200),
    ])
    .await;
    let started = Instant::now();
    let response = post(quick(), &url, &IdempotencyKey::random()).await;
    let waited = started.elapsed();
    assert_eq!(response.attempts(), 2);
    // HTTP dates have whole seconds: the wait is between 1 and 2 s.
    assert!(
        waited >= Duration::from_millis(950) && waited < Duration::from_secs(3),
        "{waited:?}"
    );

    let (url, _) = serve(vec![status(429).retry_after("3600"), status(200)]).await;
    let started = Instant::now();
    let policy = quick().retry_after_cap(Duration::from_millis(200));
    let response = post(policy, &url, &IdempotencyKey::random()).await;
    let waited = started.elapsed();
    assert_eq!(response.attempts(), 2);
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
}

#[tokio::test]
async fn the_attempt_limit_returns_the_last_answer() {
    let (url, script) = serve(vec![status(503), status(503), status(503), status(200)]).await;
    let response = post(quick().max_attempts(3), &url, &IdempotencyKey::random()).await;
    assert_eq!(response.status(), 503);
    assert_eq!(response.attempts(), 3);
    assert_eq!(script.seen.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn idempotent_methods_are_retried_without_a_key_and_keyless_posts_are_not() {
    let (url, script) = serve(vec![status(500), status(200)]).await;
    let http = idem_client::client(reqwest::Client::new(), quick());
    let response = http.get(&url).send().await.unwrap();
    assert_eq!((response.status().as_u16(), response.attempts()), (200, 2));
    assert!(script.seen.lock().unwrap().iter().all(|s| s.key.is_none()));

    let (url, script) = serve(vec![status(500), status(200)]).await;
    let response = http.post(&url).body("x").send().await.unwrap();
    assert_eq!((response.status().as_u16(), response.attempts()), (500, 1));
    assert_eq!(script.seen.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn replays_are_reported() {
    let app = axum::Router::new().route(
        "/op",
        axum::routing::post(|| async { ([("idempotent-replayed", "true")], "stored") }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/op", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let response = post(quick(), &url, &IdempotencyKey::random()).await;
    assert!(response.replayed());
    assert_eq!(response.attempts(), 1);
}

/// The in-progress problem type the middleware retries on is the one idem's
/// servers answer with.
#[test]
fn in_progress_problem_type_is_the_servers() {
    assert_eq!(
        idem_client::IN_PROGRESS_PROBLEM,
        idem_runtime::http::problem::types::IN_PROGRESS
    );
}
