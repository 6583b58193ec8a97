//! A bounded, per-process cache of the records this process completed, so a
//! repeat it sees again is answered without a round trip to the store.
//!
//! An entry is the stored response of a key this engine (or a clone of it)
//! executed and committed, with the request's fingerprint and an expiry no
//! later than the record's own in the store (the claim's start plus the
//! policy's retention). A repeat with the same scope, key and fingerprint,
//! before that expiry, is answered from the entry; anything else (another
//! fingerprint, an expired entry, a key the cache does not hold) goes to the
//! store as if there were no cache, so a mismatch is still refused and an
//! expired key still runs anew.
//!
//! The cache is **per process**: other processes neither see nor change it.
//! In particular an operator who deletes a key from the store (`idem delete`,
//! or SQL) to let its next attempt run again must also restart the processes
//! that completed it, or call [`Engine::clear_replay_cache`](crate::Engine::clear_replay_cache)
//! in them: until then they keep replaying the deleted record, at most for the
//! retention it was written with. Engines are built without a cache; opt in
//! with [`Engine::with_replay_cache`](crate::Engine::with_replay_cache).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Instant;

use crate::operation::Operation;
use crate::outcome::StoredResponse;

/// Bytes an entry is charged beyond its strings and body (the map's slot,
/// the queue's, the fingerprint, the expiry).
const ENTRY_OVERHEAD: usize = 128;

/// The bounds of a [`ReplayCache`]: how many entries and how many bytes
/// (scope, key, body, content type and headers, plus a fixed overhead per
/// entry). The oldest entries go first when either is reached.
///
/// ```
/// use idem_runtime::ReplayCache;
/// let cache = ReplayCache::new(10_000, 16 * 1024 * 1024);
/// assert_eq!(cache.len(), 0);
/// ```
#[derive(Debug)]
pub struct ReplayCache {
    max_entries: usize,
    max_bytes: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<(String, String), Entry>,
    /// Insertion order, for eviction; an id that no longer matches its
    /// entry's was replaced since and is skipped.
    order: VecDeque<((String, String), u64)>,
    bytes: usize,
    next_id: u64,
}

#[derive(Debug)]
struct Entry {
    id: u64,
    fingerprint: [u8; 32],
    response: StoredResponse,
    expires: Instant,
    size: usize,
}

impl ReplayCache {
    /// A cache of at most `max_entries` entries and `max_bytes` bytes; a
    /// response larger than `max_bytes` on its own is not kept.
    pub fn new(max_entries: usize, max_bytes: usize) -> Self {
        Self {
            max_entries,
            max_bytes,
            inner: Mutex::default(),
        }
    }

    /// Entries held now (expired ones included until they are looked up or
    /// evicted).
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes charged now.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Forgets every entry.
    pub fn clear(&self) {
        let mut inner = self.lock();
        inner.entries.clear();
        inner.order.clear();
        inner.bytes = 0;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The stored response for `op`, if the cache holds its key with the
    /// same fingerprint and the entry has not expired.
    pub(crate) fn get(&self, op: &Operation) -> Option<StoredResponse> {
        let slot = (op.scope.as_stored().to_owned(), op.key.as_str().to_owned());
        let mut inner = self.lock();
        let entry = inner.entries.get(&slot)?;
        if entry.expires <= Instant::now() {
            let size = entry.size;
            inner.entries.remove(&slot);
            inner.bytes -= size;
            return None;
        }
        (entry.fingerprint == op.fingerprint.0).then(|| entry.response.clone())
    }

    /// Keeps `response` as `op`'s completed record until `expires`.
    pub(crate) fn put(&self, op: &Operation, response: StoredResponse, expires: Instant) {
        let scope = op.scope.as_stored();
        let key = op.key.as_str();
        let size = ENTRY_OVERHEAD
            + 2 * (scope.len() + key.len())
            + response.body.len()
            + response.content_type.len()
            + response
                .headers
                .iter()
                .map(|(name, value)| name.len() + value.len() + 48)
                .sum::<usize>();
        if size > self.max_bytes || self.max_entries == 0 {
            return;
        }
        let mut inner = self.lock();
        let id = inner.next_id;
        inner.next_id += 1;
        let slot = (scope.to_owned(), key.to_owned());
        let entry = Entry {
            id,
            fingerprint: op.fingerprint.0,
            response,
            expires,
            size,
        };
        if let Some(old) = inner.entries.insert(slot.clone(), entry) {
            inner.bytes -= old.size;
        }
        inner.bytes += size;
        inner.order.push_back((slot, id));
        while inner.entries.len() > self.max_entries || inner.bytes > self.max_bytes {
            let Some((slot, id)) = inner.order.pop_front() else {
                break;
            };
            if inner.entries.get(&slot).is_some_and(|entry| entry.id == id) {
                let gone = inner.entries.remove(&slot).expect("present");
                inner.bytes -= gone.size;
            }
        }
        // Replaced entries leave stale ids behind; keep the queue bounded.
        if inner.order.len() > 2 * self.max_entries.max(16) {
            let Inner { entries, order, .. } = &mut *inner;
            order.retain(|(slot, id)| entries.get(slot).is_some_and(|entry| entry.id == *id));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{IdempotencyKey, Scope};

    fn op(key: &str, request: i64) -> Operation {
        Operation::new(
            Scope::tenant("acme"),
            IdempotencyKey::new(key).unwrap(),
            "charge.v1",
            &request,
        )
    }

    fn response(body: &str) -> StoredResponse {
        StoredResponse {
            status: 201,
            content_type: "application/json".into(),
            body: body.as_bytes().to_vec(),
            headers: Vec::new(),
        }
    }

    #[test]
    fn answers_the_same_fingerprint_only_until_expiry() {
        let cache = ReplayCache::new(10, 1 << 20);
        let later = Instant::now() + Duration::from_secs(60);
        cache.put(&op("k-1", 1), response("{\"id\":1}"), later);
        assert_eq!(cache.get(&op("k-1", 1)), Some(response("{\"id\":1}")));
        // Another request under the same key: the store decides.
        assert_eq!(cache.get(&op("k-1", 2)), None);
        assert_eq!(cache.get(&op("k-2", 1)), None);
        // Expired: gone, and its bytes with it.
        cache.put(&op("k-3", 1), response("x"), Instant::now());
        assert_eq!(cache.get(&op("k-3", 1)), None);
        assert_eq!(cache.len(), 1);
        cache.clear();
        assert!(cache.is_empty());
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn stays_within_its_count_and_bytes() {
        let later = Instant::now() + Duration::from_secs(60);
        let cache = ReplayCache::new(3, 1 << 20);
        for i in 0..10 {
            cache.put(&op(&format!("k-{i}"), 1), response("{}"), later);
        }
        assert_eq!(cache.len(), 3);
        // The oldest went first.
        assert_eq!(cache.get(&op("k-6", 1)), None);
        assert!(cache.get(&op("k-9", 1)).is_some());

        let body = "b".repeat(1000);
        let cache = ReplayCache::new(1000, 5000);
        for i in 0..20 {
            cache.put(&op(&format!("k-{i}"), 1), response(&body), later);
            assert!(cache.bytes() <= 5000, "{}", cache.bytes());
        }
        assert!(cache.len() >= 3 && cache.len() <= 4, "{}", cache.len());
        // Larger than the whole budget: not kept.
        cache.put(&op("huge", 1), response(&"h".repeat(6000)), later);
        assert_eq!(cache.get(&op("huge", 1)), None);
        // Replacing a key charges it once.
        let cache = ReplayCache::new(10, 1 << 20);
        cache.put(&op("k", 1), response(&body), later);
        let once = cache.bytes();
        for _ in 0..100 {
            cache.put(&op("k", 1), response(&body), later);
        }
        assert_eq!(cache.bytes(), once);
        assert_eq!(cache.len(), 1);
    }
}
