//! What an idempotent gRPC method reads from its request before anything is
//! claimed: the engine (from the service), the key and the scope (from the
//! metadata and the extensions an interceptor set).

use idem_core::extract::{key_from_headers, KeyRejection};
use idem_core::header::IDEMPOTENCY_KEY;
use idem_core::problem::types;
use tonic::metadata::MetadataMap;
use tonic::{Code, Extensions, Status};

use super::status::refused;
use crate::engine::Engine;
use crate::fingerprint::FingerprintHasher;
use crate::http::{HeaderScope, PrincipalScope, ScopeHeaderName};
use crate::store::Backend;
use crate::IdempotencyKey;

/// A tonic service whose `#[idempotent(grpc)]` methods claim on `engine()`.
///
/// ```
/// use idem_runtime::grpc::HasEngine;
/// use idem_runtime::Engine;
/// use sqlx::Sqlite;
///
/// struct Payments {
///     engine: Engine<Sqlite>,
/// }
///
/// impl HasEngine<Sqlite> for Payments {
///     fn engine(&self) -> &Engine<Sqlite> {
///         &self.engine
///     }
/// }
/// ```
pub trait HasEngine<DB: Backend> {
    /// The engine the service's keys are claimed on.
    fn engine(&self) -> &Engine<DB>;
}

/// A value an `#[idempotent(grpc)]` method takes as a parameter besides its
/// request and transaction, read from the request's metadata and extensions
/// before anything is claimed. A refusal is answered as it is and nothing
/// runs.
///
/// Implemented for [`IdempotencyKey`] (the `idempotency-key` entry),
/// [`HeaderScope`] (a metadata entry) and [`PrincipalScope`] (the
/// authenticated principal an interceptor inserted into the extensions);
/// implement it for a scope of your own.
///
/// ```
/// use std::borrow::Cow;
/// use idem_runtime::grpc::FromRequestMetadata;
/// use idem_runtime::ScopePart;
/// use tonic::metadata::MetadataMap;
/// use tonic::{Extensions, Status};
///
/// /// The tenant, from the `x-shop` metadata entry.
/// struct Shop(String);
///
/// impl ScopePart for Shop {
///     fn scope_part(&self) -> Cow<'_, str> {
///         Cow::Borrowed(&self.0)
///     }
/// }
///
/// impl FromRequestMetadata for Shop {
///     fn from_request_metadata(metadata: &MetadataMap, _: &Extensions) -> Result<Self, Status> {
///         match metadata.get("x-shop").and_then(|value| value.to_str().ok()) {
///             Some(shop) => Ok(Shop(shop.to_owned())),
///             None => Err(Status::invalid_argument("send the x-shop metadata entry")),
///         }
///     }
/// }
/// ```
pub trait FromRequestMetadata: Sized {
    /// Reads the value, or the status to answer with.
    fn from_request_metadata(
        metadata: &MetadataMap,
        extensions: &Extensions,
    ) -> Result<Self, Status>;
}

/// The `idempotency-key` ASCII metadata entry, with the syntax and limits of
/// the HTTP header (a bare value or a structured-field string, 1 to 255
/// visible ASCII characters). Missing, repeated, malformed or sent as
/// binary (`idempotency-key-bin`): `INVALID_ARGUMENT`, and nothing runs.
///
/// ```
/// use idem_runtime::grpc::FromRequestMetadata;
/// use idem_runtime::IdempotencyKey;
/// use tonic::metadata::MetadataMap;
/// use tonic::{Code, Extensions};
///
/// let mut metadata = MetadataMap::new();
/// let missing = IdempotencyKey::from_request_metadata(&metadata, &Extensions::new()).unwrap_err();
/// assert_eq!(missing.code(), Code::InvalidArgument);
/// metadata.insert("idempotency-key", "order-7".parse().unwrap());
/// let key = IdempotencyKey::from_request_metadata(&metadata, &Extensions::new()).unwrap();
/// assert_eq!(key.as_str(), "order-7");
/// ```
impl FromRequestMetadata for IdempotencyKey {
    fn from_request_metadata(metadata: &MetadataMap, _: &Extensions) -> Result<Self, Status> {
        let rejection = match key_from_headers(metadata.as_ref()) {
            Ok(Some(key)) => return Ok(key),
            Ok(None) if metadata.get_bin(format!("{IDEMPOTENCY_KEY}-bin")).is_some() => {
                KeyRejection::Malformed(format!(
                    "the key was sent as binary metadata `{IDEMPOTENCY_KEY}-bin`; send it as the ASCII entry `{IDEMPOTENCY_KEY}`"
                ))
            }
            Ok(None) => KeyRejection::Missing,
            Err(rejection) => rejection,
        };
        let (problem, message) = match rejection {
            KeyRejection::Missing => (
                types::KEY_MISSING,
                format!(
                    "this call needs an `{IDEMPOTENCY_KEY}` metadata entry; generate a unique value (e.g. a UUID) \
                     for this operation and send it with every retry. Nothing was executed"
                ),
            ),
            other => (
                types::KEY_MALFORMED,
                format!("the `{IDEMPOTENCY_KEY}` metadata entry was refused: {other}. Nothing was executed"),
            ),
        };
        Err(refused(Code::InvalidArgument, problem, message))
    }
}

/// The metadata entry `N` names, as for an HTTP header: missing or
/// malformed, `INVALID_ARGUMENT`.
///
/// ```
/// use idem_runtime::grpc::FromRequestMetadata;
/// use idem_runtime::http::{HeaderScope, XTenantId};
/// use tonic::metadata::MetadataMap;
/// use tonic::Extensions;
///
/// let mut metadata = MetadataMap::new();
/// metadata.insert("x-tenant-id", "acme".parse().unwrap());
/// let tenant = HeaderScope::<XTenantId>::from_request_metadata(&metadata, &Extensions::new()).unwrap();
/// assert_eq!(tenant.as_str(), "acme");
/// ```
impl<N: ScopeHeaderName> FromRequestMetadata for HeaderScope<N> {
    fn from_request_metadata(metadata: &MetadataMap, _: &Extensions) -> Result<Self, Status> {
        Self::from_headers(metadata.as_ref()).ok_or_else(|| {
            refused(
                Code::InvalidArgument,
                types::ABOUT_BLANK,
                format!(
                    "{} metadata entry missing or malformed. {}. Nothing was executed",
                    N::NAME,
                    Self::expected()
                ),
            )
        })
    }
}

/// The principal `P` an interceptor inserted into the request's extensions
/// (`request.extensions_mut().insert(principal)`); without one,
/// `UNAUTHENTICATED`.
///
/// ```
/// use idem_runtime::grpc::FromRequestMetadata;
/// use idem_runtime::http::PrincipalScope;
/// use tonic::metadata::MetadataMap;
/// use tonic::{Code, Extensions};
///
/// #[derive(Clone, Debug)]
/// struct Caller(String);
///
/// let mut extensions = Extensions::new();
/// let missing = PrincipalScope::<Caller>::from_request_metadata(&MetadataMap::new(), &extensions);
/// assert_eq!(missing.unwrap_err().code(), Code::Unauthenticated);
/// extensions.insert(Caller("org-1".into()));
/// let PrincipalScope(caller) = PrincipalScope::<Caller>::from_request_metadata(&MetadataMap::new(), &extensions).unwrap();
/// assert_eq!(caller.0, "org-1");
/// ```
impl<P: Clone + Send + Sync + 'static> FromRequestMetadata for PrincipalScope<P> {
    fn from_request_metadata(_: &MetadataMap, extensions: &Extensions) -> Result<Self, Status> {
        match extensions.get::<P>() {
            Some(principal) => Ok(PrincipalScope(principal.clone())),
            None => Err(refused(
                Code::Unauthenticated,
                types::ABOUT_BLANK,
                "this call carries no authenticated principal, so its idempotency key has no scope. \
                 Authenticate and retry. Nothing was executed"
                    .to_owned(),
            )),
        }
    }
}

/// Writes a request message's protobuf encoding as its fingerprint:
/// `#[idempotent(grpc, fingerprint = encoding)]` uses this instead of the
/// message's [`Fingerprint`](crate::Fingerprint) impl, so the generated
/// messages need no derive.
///
/// prost writes fields in field-number order, so the encoding is the same
/// for equal messages when every field is a scalar, string, bytes, enum,
/// `repeated` or nested message. A `map` field generated as a `HashMap` is
/// written in the map's iteration order, which differs between processes:
/// generate maps as `BTreeMap` (prost-build's `.btree_map(["."])`), or use
/// `#[derive(Fingerprint)]`, which hashes every map in key order.
///
/// ```
/// use idem_runtime::fingerprint::FingerprintHasher;
/// use idem_runtime::grpc::fingerprint_encoding;
///
/// let hash = |message: &String| {
///     let mut hasher = FingerprintHasher::new("echo.v1");
///     fingerprint_encoding(message, &mut hasher);
///     hasher.finish()
/// };
/// assert_eq!(hash(&"a".to_owned()), hash(&"a".to_owned()));
/// assert_ne!(hash(&"a".to_owned()), hash(&"b".to_owned()));
/// ```
pub fn fingerprint_encoding<M: prost::Message>(message: &M, hasher: &mut FingerprintHasher) {
    hasher.write_bytes(&message.encode_to_vec());
}

/// The key carried in a request message's field, as Google's AIP-155 does
/// with `string request_id`: `#[idempotent(grpc, key = request_id)]` reads it
/// with this. Empty or malformed: `INVALID_ARGUMENT`, and nothing runs.
///
/// ```
/// use idem_runtime::grpc::key_from_field;
/// use tonic::Code;
///
/// assert_eq!(key_from_field("order-7", "request_id").unwrap().as_str(), "order-7");
/// assert_eq!(key_from_field("", "request_id").unwrap_err().code(), Code::InvalidArgument);
/// ```
pub fn key_from_field(value: &str, field: &str) -> Result<IdempotencyKey, Status> {
    if value.is_empty() {
        return Err(refused(
            Code::InvalidArgument,
            types::KEY_MISSING,
            format!(
                "this call needs its idempotency key in the request's `{field}` field; generate a unique value \
                 (e.g. a UUID) for this operation and send it with every retry. Nothing was executed"
            ),
        ));
    }
    IdempotencyKey::new(value).map_err(|error| {
        refused(
            Code::InvalidArgument,
            types::KEY_MALFORMED,
            format!("the request's `{field}` field is not a valid idempotency key: {error}. Nothing was executed"),
        )
    })
}
