//! Fingerprints of axum's wrappers: the wrapped value's.

use crate::fingerprint::{Fingerprint, FingerprintHasher};

macro_rules! delegate {
    ($($wrapper:path),*) => {$(
        /// The wrapped value's fingerprint.
        impl<T: Fingerprint> Fingerprint for $wrapper {
            fn fingerprint(&self, hasher: &mut FingerprintHasher) {
                self.0.fingerprint(hasher)
            }
            fn is_absent(&self) -> bool {
                self.0.is_absent()
            }
        }
    )*};
}

delegate!(
    axum::Json<T>,
    super::Json<T>,
    axum::extract::Path<T>,
    axum::extract::Query<T>,
    axum::Form<T>
);

#[cfg(test)]
mod tests {
    use crate::fingerprint::fingerprint;

    #[test]
    fn wrappers_hash_as_their_contents() {
        let plain = fingerprint("a.v1", &("EUR", 2500));
        assert_eq!(fingerprint("a.v1", &axum::Json(("EUR", 2500))), plain);
        assert_eq!(
            fingerprint("a.v1", &super::super::Json(("EUR", 2500))),
            plain
        );
        assert_eq!(
            fingerprint("a.v1", &axum::extract::Path(("EUR", 2500))),
            plain
        );
    }
}
