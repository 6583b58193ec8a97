//! One keyed unit of work: who asks, with which key, for which step, with what request.

use crate::fingerprint::{fingerprint, Fingerprint, RequestHash};
use crate::policy::Policy;
use crate::scope::Scope;
use crate::IdempotencyKey;

/// Everything the engine needs to claim a key.
///
/// ```
/// use idem_runtime::{IdempotencyKey, Operation, Scope};
///
/// let op = Operation::new(
///     Scope::tenant("acme"),
///     IdempotencyKey::new("order-8812").unwrap(),
///     "charge-card.v1",
///     &("EUR", 2500),
/// );
/// assert_eq!(op.step(), "charge-card.v1");
/// ```
#[derive(Debug, Clone)]
pub struct Operation {
    pub(crate) scope: Scope,
    pub(crate) key: IdempotencyKey,
    pub(crate) step: &'static str,
    pub(crate) fingerprint: RequestHash,
    pub(crate) policy: Option<Policy>,
}

impl Operation {
    /// An operation whose fingerprint is computed from `request`.
    pub fn new<T: Fingerprint + ?Sized>(
        scope: Scope,
        key: IdempotencyKey,
        step: &'static str,
        request: &T,
    ) -> Self {
        Self::with_fingerprint(scope, key, step, fingerprint(step, request))
    }

    /// An operation with a fingerprint computed elsewhere.
    pub fn with_fingerprint(
        scope: Scope,
        key: IdempotencyKey,
        step: &'static str,
        fingerprint: RequestHash,
    ) -> Self {
        Self {
            scope,
            key,
            step,
            fingerprint,
            policy: None,
        }
    }

    /// Overrides the engine's default policy for this operation.
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// The scope.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }
    /// The key.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }
    /// The step name.
    pub fn step(&self) -> &'static str {
        self.step
    }
    /// The request's fingerprint.
    pub fn fingerprint(&self) -> RequestHash {
        self.fingerprint
    }

    /// A stable 64-bit lock id for `(scope, key)`.
    pub(crate) fn lock_id(&self) -> i64 {
        use sha2::{Digest, Sha256};
        let mut sha = Sha256::new();
        sha.update(self.scope.as_stored().as_bytes());
        sha.update([0]);
        sha.update(self.key.as_str().as_bytes());
        let digest = sha.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        i64::from_be_bytes(first)
    }
}
