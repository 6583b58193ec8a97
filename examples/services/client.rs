//! A small HTTP/1.1 client for the demos and tests (hyper's pooled client).
#![allow(dead_code)]

use std::error::Error;

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

/// Any error on the way to an answer: connection refused, reset, bad header.
pub type BoxError = Box<dyn Error + Send + Sync>;

/// A pooled HTTP client.
#[derive(Clone)]
pub struct HttpClient {
    inner: Client<HttpConnector, Full<Bytes>>,
}

/// A buffered answer.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// The response headers.
    pub headers: HeaderMap,
    /// The body bytes.
    pub body: Vec<u8>,
}

impl Reply {
    /// The body as JSON (`null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// A header as text, if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Whether the answer carries `Idempotent-Replayed: true`.
    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }
}

impl Default for HttpClient {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpClient {
    /// A client with a connection pool.
    pub fn new() -> Self {
        Self {
            inner: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// Sends a request; header values are raw bytes so tests can send malformed ones.
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &[u8])],
        body: Option<Vec<u8>>,
    ) -> Result<Reply, BoxError> {
        let mut request = Request::builder().method(method).uri(url);
        let map = request.headers_mut().expect("a fresh builder has headers");
        if body.is_some() {
            map.insert("content-type", HeaderValue::from_static("application/json"));
        }
        for (name, value) in headers {
            let name = HeaderName::from_bytes(name.as_bytes())?;
            if name == "content-type" {
                map.remove(&name);
            }
            map.append(name, HeaderValue::from_bytes(value)?);
        }
        let request = request.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let response = self.inner.request(request).await?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await?.to_bytes().to_vec();
        Ok(Reply {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        })
    }

    /// `POST url` with a JSON body and text headers.
    pub async fn post_json(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: &serde_json::Value,
    ) -> Result<Reply, BoxError> {
        let headers: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, v.as_bytes())).collect();
        self.send(Method::POST, url, &headers, Some(serde_json::to_vec(body)?))
            .await
    }

    /// `GET url` with text headers.
    pub async fn get(&self, url: &str, headers: &[(&str, &str)]) -> Result<Reply, BoxError> {
        let headers: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, v.as_bytes())).collect();
        self.send(Method::GET, url, &headers, None).await
    }
}
