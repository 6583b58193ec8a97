//! Scope extractors: where a handler's keys live, taken from a header, a
//! named path segment, or the authenticated principal an auth layer put in
//! the request's extensions. Each implements [`ScopePart`], so it can be
//! named in `#[idempotent(http, scope = "...")]` directly.
//!
//! ```
//! use axum::{routing::post, Router};
//! use idem_runtime::http::{HeaderScope, PathScope, ScopeHeaderName, ScopePathParam};
//!
//! /// The header the tenant is sent in.
//! struct XAccount;
//! impl ScopeHeaderName for XAccount {
//!     const NAME: &'static str = "x-account";
//! }
//!
//! /// The path segment `{shop}`.
//! struct Shop;
//! impl ScopePathParam for Shop {
//!     const NAME: &'static str = "shop";
//! }
//!
//! async fn by_header(account: HeaderScope<XAccount>) -> String {
//!     account.as_str().to_owned()
//! }
//! async fn by_path(shop: PathScope<Shop>) -> String {
//!     shop.to_string()
//! }
//!
//! let _app: Router = Router::new()
//!     .route("/orders", post(by_header))
//!     .route("/{shop}/orders/{id}", post(by_path));
//! ```

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use axum::extract::{FromRequestParts, RawPathParams};
use axum::http::request::Parts;

use super::trace::record_rejected;
use crate::problem::Problem;
use crate::scope::ScopePart;
use crate::IdempotencyKey;

/// Names the request header a [`HeaderScope`] reads.
pub trait ScopeHeaderName {
    /// The header's name, lower case (`"x-tenant-id"`).
    const NAME: &'static str;
}

/// The `X-Tenant-Id` header.
///
/// ```
/// use idem_runtime::http::{ScopeHeaderName, XTenantId};
/// assert_eq!(XTenantId::NAME, "x-tenant-id");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct XTenantId;

impl ScopeHeaderName for XTenantId {
    const NAME: &'static str = "x-tenant-id";
}

/// Names the path parameter a [`PathScope`] reads (`"tenant"` for a route
/// `/{tenant}/orders`).
pub trait ScopePathParam {
    /// The parameter's name in the route, without braces.
    const NAME: &'static str;
}

/// A scope from the request header `N` names: 1 to 255 visible ASCII
/// characters, trimmed; missing or otherwise, a 400 problem.
///
/// In `#[idempotent(http, scope = "tenant", ...)]`, a parameter
/// `tenant: HeaderScope<XTenantId>`; by hand, the [`Scope`](crate::Scope)
/// of an operation:
///
/// ```
/// use axum::{routing::post, Router};
/// use idem_runtime::http::{HeaderScope, XTenantId};
/// use idem_runtime::{Scope, ScopePart};
///
/// async fn create(tenant: HeaderScope<XTenantId>) -> String {
///     let scope = Scope::tenant(tenant.scope_part());
///     scope.to_string()
/// }
///
/// let _app: Router = Router::new().route("/orders", post(create));
/// ```
pub struct HeaderScope<N> {
    value: String,
    name: PhantomData<fn() -> N>,
}

/// A scope from the path parameter `N` names; a route without it is a 500
/// problem (a routing mistake, not the client's).
pub struct PathScope<N> {
    value: String,
    name: PhantomData<fn() -> N>,
}

/// A scope from the authenticated principal `P` that an authentication
/// layer inserted into the request's extensions
/// (`request.extensions_mut().insert(principal)`); without one, a 401
/// problem. `P` says which scope it stands for by implementing
/// [`ScopePart`].
///
/// ```
/// use std::borrow::Cow;
/// use idem_runtime::http::PrincipalScope;
/// use idem_runtime::ScopePart;
///
/// #[derive(Clone)]
/// struct Caller { org: String, user: String }
///
/// // Keys live per organisation, whichever of its users sends them.
/// impl ScopePart for Caller {
///     fn scope_part(&self) -> Cow<'_, str> {
///         Cow::Borrowed(&self.org)
///     }
/// }
///
/// async fn handler(PrincipalScope(caller): PrincipalScope<Caller>) -> String {
///     format!("{} in {}", caller.user, caller.org)
/// }
/// # let _ = handler;
/// ```
#[derive(Debug, Clone)]
pub struct PrincipalScope<P>(pub P);

macro_rules! text_scope {
    ($name:ident, $bound:ident) => {
        impl<N> $name<N> {
            /// The scope's text.
            pub fn as_str(&self) -> &str {
                &self.value
            }

            /// The scope's text, owned.
            pub fn into_string(self) -> String {
                self.value
            }
        }

        impl<N> std::ops::Deref for $name<N> {
            type Target = str;
            fn deref(&self) -> &str {
                &self.value
            }
        }

        impl<N> ScopePart for $name<N> {
            fn scope_part(&self) -> Cow<'_, str> {
                Cow::Borrowed(&self.value)
            }
        }

        impl<N: $bound> fmt::Debug for $name<N> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({}: {:?})", stringify!($name), N::NAME, self.value)
            }
        }

        impl<N> fmt::Display for $name<N> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.value)
            }
        }

        impl<N> Clone for $name<N> {
            fn clone(&self) -> Self {
                Self {
                    value: self.value.clone(),
                    name: PhantomData,
                }
            }
        }
    };
}

text_scope!(HeaderScope, ScopeHeaderName);

impl<N: ScopeHeaderName> HeaderScope<N> {
    /// The scope in `headers`' one `N::NAME` entry, trimmed; `None` when it
    /// is missing, repeated or not 1 to 255 visible ASCII characters. gRPC
    /// metadata is read the same way.
    pub(crate) fn from_headers(headers: &axum::http::HeaderMap) -> Option<Self> {
        let mut values = headers.get_all(N::NAME).iter();
        let value = match (values.next(), values.next()) {
            (Some(value), None) => value.to_str().ok().map(str::trim).filter(|v| valid(v)),
            _ => None,
        }?;
        Some(Self {
            value: value.to_owned(),
            name: PhantomData,
        })
    }

    /// What a refusal tells the client to send.
    pub(crate) fn expected() -> String {
        format!(
            "Send the {} header once, with 1 to 255 visible ASCII characters: the scope this \
             request's idempotency key lives in",
            N::NAME
        )
    }
}
text_scope!(PathScope, ScopePathParam);

impl<P: ScopePart> ScopePart for PrincipalScope<P> {
    fn scope_part(&self) -> Cow<'_, str> {
        self.0.scope_part()
    }
}

/// Why a scope could not be extracted; renders as problem details.
#[derive(Debug)]
pub struct ScopeRejection(Problem);

impl ScopeRejection {
    /// The problem this rejection answers with.
    pub fn problem(&self) -> &Problem {
        &self.0
    }
}

impl axum::response::IntoResponse for ScopeRejection {
    fn into_response(self) -> axum::response::Response {
        record_rejected();
        self.0.into_response()
    }
}

/// The same rule as a key: 1 to 255 visible ASCII characters.
fn valid(text: &str) -> bool {
    IdempotencyKey::new(text).is_ok()
}

impl<S: Send + Sync, N: ScopeHeaderName> FromRequestParts<S> for HeaderScope<N> {
    type Rejection = ScopeRejection;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Self::from_headers(&parts.headers).ok_or_else(|| {
            ScopeRejection(
                Problem::new(400, format!("{} header missing or malformed", N::NAME))
                    .with_detail(format!("{}. Nothing was executed.", Self::expected())),
            )
        })
    }
}

impl<S: Send + Sync, N: ScopePathParam> FromRequestParts<S> for PathScope<N> {
    type Rejection = ScopeRejection;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let params = RawPathParams::from_request_parts(parts, state).await.ok();
        let value = params
            .as_ref()
            .and_then(|params| params.iter().find(|(name, _)| *name == N::NAME))
            .map(|(_, value)| value.to_owned());
        match value {
            Some(value) if valid(&value) => Ok(Self {
                value,
                name: PhantomData,
            }),
            Some(_) => Err(ScopeRejection(
                Problem::new(400, "Malformed scope in the path").with_detail(format!(
                    "The path segment {{{}}} must be 1 to 255 visible ASCII characters. Nothing was executed.",
                    N::NAME
                )),
            )),
            None => Err(ScopeRejection(
                Problem::new(500, "Scope path parameter not routed").with_detail(format!(
                    "This route has no path parameter {{{}}}; the service's routing is wrong. Nothing was executed.",
                    N::NAME
                )),
            )),
        }
    }
}

impl<S: Send + Sync, P: Clone + Send + Sync + 'static> FromRequestParts<S> for PrincipalScope<P> {
    type Rejection = ScopeRejection;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        match parts.extensions.get::<P>() {
            Some(principal) => Ok(Self(principal.clone())),
            None => Err(ScopeRejection(
                Problem::new(401, "Not authenticated").with_detail(
                    "This request carries no authenticated principal, so its idempotency key has no scope. \
                     Authenticate and retry. Nothing was executed.",
                ),
            )),
        }
    }
}
