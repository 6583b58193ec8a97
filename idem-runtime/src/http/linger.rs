//! Lingering after a refused body: a request body refused as too large is
//! read on and discarded, up to a bound, before the refusal is answered, so
//! a client that writes its whole body before reading sees the 413 instead
//! of a connection reset ("broken pipe") when the server closes on unread
//! data.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use http_body::{Frame, SizeHint};

/// At most this much of a refused body is read and discarded; a client
/// sending more still sees the connection close.
pub const LINGER_MAX_BYTES: usize = 16 * 1024 * 1024;

/// At most this long is spent reading a refused body.
pub const LINGER_MAX_TIME: Duration = Duration::from_secs(5);

/// Where a [`Returning`] body puts its unread rest when it is dropped.
pub(crate) type Rest = Arc<Mutex<Option<Body>>>;

/// A request body that, when dropped unfinished (by an extractor that
/// refused it), hands its unread rest to a [`Rest`] slot instead of closing
/// it.
pub(crate) struct Returning {
    inner: Option<Body>,
    rest: Rest,
}

impl Returning {
    /// `body`, and the slot its rest lands in.
    pub(crate) fn wrap(body: Body) -> (Body, Rest) {
        let rest = Rest::default();
        let returning = Returning {
            inner: Some(body),
            rest: rest.clone(),
        };
        (Body::new(returning), rest)
    }
}

impl HttpBody for Returning {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        match self.get_mut().inner.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(HttpBody::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), HttpBody::size_hint)
    }
}

impl Drop for Returning {
    fn drop(&mut self) {
        if let Some(body) = self.inner.take() {
            if !body.is_end_stream() {
                *self.rest.lock().unwrap_or_else(PoisonError::into_inner) = Some(body);
            }
        }
    }
}

/// Reads and discards what is left in `rest`, at most [`LINGER_MAX_BYTES`]
/// within [`LINGER_MAX_TIME`].
pub(crate) async fn discard_rest(rest: &Rest) {
    let body = rest.lock().unwrap_or_else(PoisonError::into_inner).take();
    let Some(mut body) = body else {
        return;
    };
    let drain = async {
        let mut read = 0usize;
        while let Some(Ok(frame)) = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            read += frame.data_ref().map_or(0, Bytes::len);
            if read > LINGER_MAX_BYTES {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(LINGER_MAX_TIME, drain).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_refused_body_hands_back_its_rest() {
        let (body, rest) = Returning::wrap(Body::from("0123456789"));
        drop(body);
        assert!(rest.lock().unwrap().is_some());
        discard_rest(&rest).await;
        assert!(rest.lock().unwrap().is_none());

        let (body, rest) = Returning::wrap(Body::empty());
        drop(body);
        assert!(rest.lock().unwrap().is_none(), "nothing left to read");
    }
}
