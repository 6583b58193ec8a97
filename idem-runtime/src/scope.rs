//! The compound identity under which keys live.

use std::fmt;

/// The identity that owns a key: a tenant, optionally narrowed by a caller.
///
/// Keys are never global. Two scopes never see each other's records, so tenant
/// B presenting tenant A's key executes B's own operation.
///
/// Parts are stored length-prefixed (`<len>:<part>` joined by `/`), so no two
/// different part lists encode to the same stored scope.
///
/// ```
/// use idem_runtime::Scope;
///
/// let tenant = Scope::tenant("acme");
/// let caller = Scope::tenant("acme").with_caller("billing-api");
/// assert_ne!(tenant, caller);
/// assert_eq!(caller.as_stored(), "4:acme/11:billing-api");
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Scope {
    stored: String,
}

impl Scope {
    /// A scope of one tenant.
    pub fn tenant(tenant: impl AsRef<str>) -> Self {
        Self::from_parts([tenant.as_ref()])
    }

    /// A scope made of several parts, outermost first (tenant, caller, ...).
    ///
    /// ```
    /// # use idem_runtime::Scope;
    /// assert_eq!(Scope::from_parts(["a", "b"]), Scope::tenant("a").with_caller("b"));
    /// assert_ne!(Scope::from_parts(["a/1:b"]), Scope::from_parts(["a", "b"]));
    /// ```
    pub fn from_parts<'a>(parts: impl IntoIterator<Item = &'a str>) -> Self {
        let mut scope = Self {
            stored: String::new(),
        };
        for part in parts {
            scope.push(part);
        }
        scope
    }

    /// Narrows the scope by a caller (or any further part).
    pub fn with_caller(mut self, caller: impl AsRef<str>) -> Self {
        self.push(caller.as_ref());
        self
    }

    fn push(&mut self, part: &str) {
        use std::fmt::Write;
        if !self.stored.is_empty() {
            self.stored.push('/');
        }
        let _ = write!(self.stored, "{}:{}", part.len(), part);
    }

    /// The scope's first part: the tenant of a tenant scope, what
    /// [`crate::shard::Shards`] routes by. Empty for an empty scope.
    ///
    /// ```
    /// use idem_runtime::Scope;
    /// assert_eq!(Scope::tenant("acme").with_caller("api").first_part(), "acme");
    /// assert_eq!(Scope::from_parts(["a/1:b"]).first_part(), "a/1:b");
    /// ```
    pub fn first_part(&self) -> &str {
        let Some((len, rest)) = self.stored.split_once(':') else {
            return "";
        };
        let len: usize = len.parse().unwrap_or(0);
        rest.get(..len).unwrap_or(rest)
    }

    /// The scope as stored in the `scope` column.
    pub fn as_stored(&self) -> &str {
        &self.stored
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Scope({})", self.stored)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.stored)
    }
}

/// A value that names (part of) a [`Scope`]: what `#[idempotent(scope = "...")]`
/// parameters must implement. Implemented for strings, integers, `bool`,
/// `char`, and references and smart pointers to them; implement it for your
/// own tenant or caller types.
///
/// ```
/// use idem_runtime::ScopePart;
/// use std::borrow::Cow;
///
/// struct TenantId(u64);
/// impl ScopePart for TenantId {
///     fn scope_part(&self) -> Cow<'_, str> {
///         Cow::Owned(self.0.to_string())
///     }
/// }
/// assert_eq!(TenantId(7).scope_part(), "7");
/// ```
pub trait ScopePart {
    /// The text this value contributes to the scope.
    fn scope_part(&self) -> std::borrow::Cow<'_, str>;
}

impl ScopePart for str {
    fn scope_part(&self) -> std::borrow::Cow<'_, str> {
        std::borrow::Cow::Borrowed(self)
    }
}

impl ScopePart for String {
    fn scope_part(&self) -> std::borrow::Cow<'_, str> {
        std::borrow::Cow::Borrowed(self)
    }
}

impl ScopePart for std::borrow::Cow<'_, str> {
    fn scope_part(&self) -> std::borrow::Cow<'_, str> {
        std::borrow::Cow::Borrowed(self)
    }
}

impl<T: ScopePart + ?Sized> ScopePart for &T {
    fn scope_part(&self) -> std::borrow::Cow<'_, str> {
        (**self).scope_part()
    }
}

impl<T: ScopePart + ?Sized> ScopePart for Box<T> {
    fn scope_part(&self) -> std::borrow::Cow<'_, str> {
        (**self).scope_part()
    }
}

impl<T: ScopePart + ?Sized> ScopePart for std::sync::Arc<T> {
    fn scope_part(&self) -> std::borrow::Cow<'_, str> {
        (**self).scope_part()
    }
}

macro_rules! display_scope_part {
    ($($t:ty)*) => {$(
        impl ScopePart for $t {
            fn scope_part(&self) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Owned(self.to_string())
            }
        }
    )*};
}
display_scope_part!(i8 i16 i32 i64 i128 isize u8 u16 u32 u64 u128 usize bool char);
