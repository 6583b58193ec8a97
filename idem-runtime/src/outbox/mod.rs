//! The transactional outbox: messages enqueued in the claim's transaction,
//! delivered by a relay after the commit.

#[cfg(feature = "nats")]
pub mod nats;
pub mod sink;

pub use sink::{Delivered, OutgoingMessage, Sink, SinkError, SinkFuture};
