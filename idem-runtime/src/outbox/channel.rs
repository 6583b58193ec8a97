//! The in-process sink: delivers to an async callback in the same process,
//! for tests and single-process applications.

use std::future::Future;
use std::sync::Arc;

use super::sink::{Delivered, OutgoingMessage, Sink, SinkError, SinkFuture};

type Callback =
    dyn Fn(OutgoingMessage) -> SinkFuture<'static, Result<Delivered, SinkError>> + Send + Sync;

/// A [`Sink`] that hands each message to an async callback.
///
/// The callback is called at least once per message, like any sink: make
/// its effect idempotent on [`OutgoingMessage::id`] (and answer
/// [`Delivered::Duplicate`] for a repeat).
///
/// ```
/// use idem_runtime::outbox::{Delivered, InProcessSink, Sink};
/// let sink = InProcessSink::new("emails", |message| async move {
///     println!("send {} to {}", message.id, message.destination);
///     Ok(Delivered::Published { receipt: None })
/// });
/// assert_eq!(sink.name(), "emails");
/// ```
#[derive(Clone)]
pub struct InProcessSink {
    name: String,
    callback: Arc<Callback>,
}

impl std::fmt::Debug for InProcessSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessSink")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl InProcessSink {
    /// A sink named `name` (what messages give as their sink) calling `callback`.
    pub fn new<F, Fut>(name: impl Into<String>, callback: F) -> Self
    where
        F: Fn(OutgoingMessage) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Delivered, SinkError>> + Send + 'static,
    {
        Self {
            name: name.into(),
            callback: Arc::new(move |message| Box::pin(callback(message))),
        }
    }

    /// A sink that forwards each message to a channel; delivered once the
    /// channel accepted it, transient while it is full, permanent once the
    /// receiver is gone.
    ///
    /// ```
    /// use idem_runtime::outbox::InProcessSink;
    /// let (sink, mut messages) = InProcessSink::channel("events", 128);
    /// # drop((sink, messages.try_recv()));
    /// ```
    pub fn channel(
        name: impl Into<String>,
        capacity: usize,
    ) -> (Self, tokio::sync::mpsc::Receiver<OutgoingMessage>) {
        let (sender, receiver) = tokio::sync::mpsc::channel(capacity);
        let sink = Self::new(name, move |message| {
            let sender = sender.clone();
            async move {
                use tokio::sync::mpsc::error::TrySendError;
                match sender.try_send(message) {
                    Ok(()) => Ok(Delivered::Published { receipt: None }),
                    Err(TrySendError::Full(_)) => Err(SinkError::Transient {
                        message: "the in-process channel is full".into(),
                        retry_after: None,
                    }),
                    Err(TrySendError::Closed(_)) => Err(SinkError::Permanent {
                        message: "the in-process channel's receiver is gone".into(),
                    }),
                }
            }
        });
        (sink, receiver)
    }
}

impl Sink for InProcessSink {
    fn name(&self) -> &str {
        &self.name
    }

    fn publish<'a>(
        &'a self,
        message: &'a OutgoingMessage,
    ) -> SinkFuture<'a, Result<Delivered, SinkError>> {
        (self.callback)(message.clone())
    }
}
