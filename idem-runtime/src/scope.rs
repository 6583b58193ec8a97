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
