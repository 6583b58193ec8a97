//! Request fingerprints: SHA-256 over a canonical encoding of the step name and
//! the request's meaningful fields.
//!
//! # The encoding (version 1)
//!
//! Values are fed straight into the hash, with no intermediate buffer. Every
//! value starts with a one-byte tag and is self-delimiting, so the byte stream
//! of a request is unambiguous:
//!
//! | value | bytes |
//! |---|---|
//! | header | `"idem-fp-v1"`, then the step name as a string |
//! | signed integer (`i8`..`i128`, `isize`) | `'i'`, 16-byte big-endian `i128` |
//! | unsigned integer (`u8`..`u128`, `usize`) | `'u'`, 16-byte big-endian `u128` |
//! | float (`f32`, `f64`) | `'f'`, 8-byte big-endian bits of the `f64` (`-0.0` as `0.0`, one NaN) |
//! | `bool` | `'b'`, `0` or `1` |
//! | `char` | `'c'`, 4-byte big-endian scalar value |
//! | string | `'s'`, 8-byte big-endian length, UTF-8 bytes |
//! | `Option` | `'n'` for `None`; `'o'` then the value for `Some` |
//! | sequence (`Vec`, slice, array, `VecDeque`) | `'l'`, 8-byte length, each element |
//! | tuple | `'t'`, 8-byte arity, each element |
//! | map (`BTreeMap`, `HashMap`) | `'m'`, 8-byte length, each key then value, in ascending key order |
//! | set (`BTreeSet`, `HashSet`) | `'e'`, 8-byte length, each element in ascending order |
//! | struct (derived) | `'S'`, then for each present field in ascending name order: the name as a string, the value; then `'.'` |
//! | enum variant (derived) | `'V'`, the variant name as a string, then its fields as a struct |
//!
//! Consequences, each covered by tests: the order fields are declared in never
//! matters (the derive sorts them by name), `HashMap` iteration order never
//! matters, an `Option` field that is `None` is left out entirely (so adding an
//! optional field keeps old fingerprints), skipped fields never count, integer
//! widths can change (`i32` to `i64`) without changing the fingerprint, and the
//! type's own name is not part of it. The step name is, so the same body sent to
//! two steps never collides.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};

/// A request's 32-byte fingerprint.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestHash(pub [u8; 32]);

impl RequestHash {
    /// The raw digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Builds a hash from stored bytes; `None` unless exactly 32 bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }
}

impl fmt::Debug for RequestHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestHash({})", crate::hex::encode(&self.0))
    }
}

/// The hasher values write themselves into. See the module docs for the encoding.
pub struct FingerprintHasher {
    sha: Sha256,
}

impl FingerprintHasher {
    /// A hasher for a request to `step`; the step name is the first thing hashed.
    pub fn new(step: &str) -> Self {
        let mut hasher = Self { sha: Sha256::new() };
        hasher.sha.update(b"idem-fp-v1");
        hasher.write_str(step);
        hasher
    }

    /// The finished fingerprint.
    pub fn finish(self) -> RequestHash {
        RequestHash(self.sha.finalize().into())
    }

    fn tag(&mut self, tag: u8) {
        self.sha.update([tag]);
    }

    fn len(&mut self, len: usize) {
        self.sha.update((len as u64).to_be_bytes());
    }

    /// Writes a signed integer (any width encodes the same way).
    pub fn write_i128(&mut self, value: i128) {
        let mut buf = [0u8; 17];
        buf[0] = b'i';
        buf[1..].copy_from_slice(&value.to_be_bytes());
        self.sha.update(buf);
    }

    /// Writes an unsigned integer (any width encodes the same way).
    pub fn write_u128(&mut self, value: u128) {
        let mut buf = [0u8; 17];
        buf[0] = b'u';
        buf[1..].copy_from_slice(&value.to_be_bytes());
        self.sha.update(buf);
    }

    /// Writes a float; `-0.0` hashes as `0.0` and every NaN alike.
    pub fn write_f64(&mut self, value: f64) {
        let canonical = if value == 0.0 {
            0.0f64
        } else if value.is_nan() {
            f64::NAN
        } else {
            value
        };
        let mut buf = [0u8; 9];
        buf[0] = b'f';
        buf[1..].copy_from_slice(&canonical.to_bits().to_be_bytes());
        self.sha.update(buf);
    }

    /// Writes a bool.
    pub fn write_bool(&mut self, value: bool) {
        self.sha.update([b'b', u8::from(value)]);
    }

    /// Writes a char.
    pub fn write_char(&mut self, value: char) {
        let mut buf = [0u8; 5];
        buf[0] = b'c';
        buf[1..].copy_from_slice(&u32::from(value).to_be_bytes());
        self.sha.update(buf);
    }

    /// Writes a string, length-prefixed.
    pub fn write_str(&mut self, value: &str) {
        self.tag(b's');
        self.len(value.len());
        self.sha.update(value.as_bytes());
    }

    /// Writes `None`.
    pub fn write_none(&mut self) {
        self.tag(b'n');
    }

    /// Writes `Some(value)`.
    pub fn write_some<T: Fingerprint + ?Sized>(&mut self, value: &T) {
        self.tag(b'o');
        value.fingerprint(self);
    }

    /// Writes a sequence of values in order.
    pub fn write_seq<'a, T: Fingerprint + 'a>(
        &mut self,
        items: impl ExactSizeIterator<Item = &'a T>,
    ) {
        self.tag(b'l');
        self.len(items.len());
        for item in items {
            item.fingerprint(self);
        }
    }

    /// Starts a tuple of `arity` elements; write each element next.
    pub fn begin_tuple(&mut self, arity: usize) {
        self.tag(b't');
        self.len(arity);
    }

    /// Writes map entries, which must come in ascending key order.
    pub fn write_sorted_map<'a, K, V>(
        &mut self,
        entries: impl ExactSizeIterator<Item = (&'a K, &'a V)>,
    ) where
        K: Fingerprint + 'a,
        V: Fingerprint + 'a,
    {
        self.tag(b'm');
        self.len(entries.len());
        for (key, value) in entries {
            key.fingerprint(self);
            value.fingerprint(self);
        }
    }

    /// Writes set elements, which must come in ascending order.
    pub fn write_sorted_set<'a, T: Fingerprint + 'a>(
        &mut self,
        items: impl ExactSizeIterator<Item = &'a T>,
    ) {
        self.tag(b'e');
        self.len(items.len());
        for item in items {
            item.fingerprint(self);
        }
    }

    /// Starts a struct (used by `#[derive(Fingerprint)]`).
    pub fn begin_struct(&mut self) {
        self.tag(b'S');
    }

    /// Writes one struct field unless it is absent (a `None`). Fields must come
    /// in ascending name order; the derive sorts them.
    pub fn write_field<T: Fingerprint + ?Sized>(&mut self, name: &str, value: &T) {
        if !value.is_absent() {
            self.write_str(name);
            value.fingerprint(self);
        }
    }

    /// Writes a field through a custom function (`#[fingerprint(with = path)]`).
    pub fn write_field_with<T: ?Sized>(
        &mut self,
        name: &str,
        value: &T,
        with: fn(&T, &mut FingerprintHasher),
    ) {
        self.write_str(name);
        with(value, self);
    }

    /// Ends a struct.
    pub fn end_struct(&mut self) {
        self.tag(b'.');
    }

    /// Starts an enum variant; write its fields as a struct next.
    pub fn begin_variant(&mut self, variant: &str) {
        self.tag(b'V');
        self.write_str(variant);
    }

    /// Writes raw, already-canonical bytes (for custom `with` functions).
    pub fn write_bytes(&mut self, bytes: &[u8]) {
        self.tag(b'y');
        self.len(bytes.len());
        self.sha.update(bytes);
    }
}

/// A value that can be fed into a [`FingerprintHasher`].
///
/// Derive it with `#[derive(Fingerprint)]` from the `idem` crate; implement it
/// by hand only for types with a canonical form of their own.
///
/// ```
/// use idem_runtime::fingerprint::{fingerprint, Fingerprint, FingerprintHasher};
///
/// struct Cents(i64);
/// impl Fingerprint for Cents {
///     fn fingerprint(&self, hasher: &mut FingerprintHasher) {
///         self.0.fingerprint(hasher);
///     }
/// }
/// assert_eq!(fingerprint("refund.v1", &Cents(5)), fingerprint("refund.v1", &5i64));
/// assert_ne!(fingerprint("refund.v1", &Cents(5)), fingerprint("charge.v1", &Cents(5)));
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be fingerprinted: it does not implement `Fingerprint`",
    label = "`{Self}` does not implement `Fingerprint`",
    note = "add `#[derive(idem::Fingerprint)]` to `{Self}`, or implement `Fingerprint` by hand for a type with a canonical form of its own"
)]
pub trait Fingerprint {
    /// Writes the value's canonical encoding.
    fn fingerprint(&self, hasher: &mut FingerprintHasher);

    /// Whether the value is absent (`None`) and leaves its field out entirely.
    fn is_absent(&self) -> bool {
        false
    }
}

/// The fingerprint of `value` as a request to `step`.
pub fn fingerprint<T: Fingerprint + ?Sized>(step: &str, value: &T) -> RequestHash {
    let mut hasher = FingerprintHasher::new(step);
    value.fingerprint(&mut hasher);
    hasher.finish()
}

macro_rules! signed {
    ($($t:ty)*) => {$(
        impl Fingerprint for $t {
            fn fingerprint(&self, hasher: &mut FingerprintHasher) {
                hasher.write_i128(*self as i128);
            }
        }
    )*};
}
macro_rules! unsigned {
    ($($t:ty)*) => {$(
        impl Fingerprint for $t {
            fn fingerprint(&self, hasher: &mut FingerprintHasher) {
                hasher.write_u128(*self as u128);
            }
        }
    )*};
}
signed!(i8 i16 i32 i64 i128 isize);
unsigned!(u8 u16 u32 u64 u128 usize);

impl Fingerprint for f64 {
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        hasher.write_f64(*self);
    }
}

impl Fingerprint for f32 {
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        hasher.write_f64(f64::from(*self));
    }
}

impl Fingerprint for bool {
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        hasher.write_bool(*self);
    }
}

impl Fingerprint for char {
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        hasher.write_char(*self);
    }
}

impl Fingerprint for str {
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        hasher.write_str(self);
    }
}

impl Fingerprint for String {
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        hasher.write_str(self);
    }
}

impl Fingerprint for () {
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        hasher.begin_tuple(0);
    }
}

impl<T: Fingerprint + ?Sized> Fingerprint for &T {
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        (**self).fingerprint(hasher);
    }
    fn is_absent(&self) -> bool {
        (**self).is_absent()
    }
}

macro_rules! transparent {
    ($($wrapper:ident)*) => {$(
        impl<T: Fingerprint + ?Sized> Fingerprint for $wrapper<T> {
            fn fingerprint(&self, hasher: &mut FingerprintHasher) {
                (**self).fingerprint(hasher);
            }
            fn is_absent(&self) -> bool {
                (**self).is_absent()
            }
        }
    )*};
}
transparent!(Box Arc);

impl<T: Fingerprint> Fingerprint for std::rc::Rc<T> {
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        (**self).fingerprint(hasher);
    }
}

impl<T: Fingerprint + ToOwned + ?Sized> Fingerprint for std::borrow::Cow<'_, T> {
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        (**self).fingerprint(hasher);
    }
}

impl<T: Fingerprint> Fingerprint for std::num::Wrapping<T> {
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        self.0.fingerprint(hasher);
    }
}

macro_rules! nonzero {
    ($($t:ident)*) => {$(
        impl Fingerprint for std::num::$t {
            fn fingerprint(&self, hasher: &mut FingerprintHasher) {
                self.get().fingerprint(hasher);
            }
        }
    )*};
}
nonzero!(NonZeroU8 NonZeroU16 NonZeroU32 NonZeroU64 NonZeroU128 NonZeroUsize NonZeroI8 NonZeroI16 NonZeroI32 NonZeroI64 NonZeroI128 NonZeroIsize);

impl Fingerprint for std::time::Duration {
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        hasher.write_u128(self.as_nanos());
    }
}

impl<T: Fingerprint> Fingerprint for Option<T> {
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        match self {
            Some(value) => hasher.write_some(value),
            None => hasher.write_none(),
        }
    }
    fn is_absent(&self) -> bool {
        self.is_none()
    }
}

impl<T: Fingerprint> Fingerprint for [T] {
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        hasher.write_seq(self.iter());
    }
}

impl<T: Fingerprint, const N: usize> Fingerprint for [T; N] {
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        hasher.write_seq(self.iter());
    }
}

impl<T: Fingerprint> Fingerprint for Vec<T> {
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        hasher.write_seq(self.iter());
    }
}

impl<T: Fingerprint> Fingerprint for VecDeque<T> {
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        hasher.write_seq(self.iter());
    }
}

impl<K: Fingerprint, V: Fingerprint> Fingerprint for BTreeMap<K, V> {
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        hasher.write_sorted_map(self.iter());
    }
}

impl<T: Fingerprint> Fingerprint for BTreeSet<T> {
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        hasher.write_sorted_set(self.iter());
    }
}

/// Order-independent: entries are hashed in ascending key order, exactly as the
/// equal `BTreeMap` would be.
impl<K: Fingerprint + Ord, V: Fingerprint, S> Fingerprint for HashMap<K, V, S> {
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        let mut entries: Vec<(&K, &V)> = self.iter().collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
        hasher.write_sorted_map(entries.into_iter());
    }
}

/// Order-independent: elements are hashed in ascending order, exactly as the
/// equal `BTreeSet` would be.
impl<T: Fingerprint + Ord, S> Fingerprint for HashSet<T, S> {
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        let mut items: Vec<&T> = self.iter().collect();
        items.sort_unstable();
        hasher.write_sorted_set(items.into_iter());
    }
}

macro_rules! tuple {
    ($($n:tt $t:ident),+; $arity:expr) => {
        impl<$($t: Fingerprint),+> Fingerprint for ($($t,)+) {
            fn fingerprint(&self, hasher: &mut FingerprintHasher) {
                hasher.begin_tuple($arity);
                $(self.$n.fingerprint(hasher);)+
            }
        }
    };
}
tuple!(0 A; 1);
tuple!(0 A, 1 B; 2);
tuple!(0 A, 1 B, 2 C; 3);
tuple!(0 A, 1 B, 2 C, 3 D; 4);
tuple!(0 A, 1 B, 2 C, 3 D, 4 E; 5);
tuple!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F; 6);
tuple!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G; 7);
tuple!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G, 7 H; 8);

impl Fingerprint for serde_json::Value {
    /// JSON objects hash like maps (key order never matters); numbers hash as
    /// integers when they are integers, else as floats.
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        use serde_json::Value;
        match self {
            Value::Null => hasher.write_none(),
            Value::Bool(b) => hasher.write_bool(*b),
            Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    hasher.write_i128(i128::from(i));
                } else if let Some(u) = n.as_u64() {
                    hasher.write_u128(u128::from(u));
                } else {
                    hasher.write_f64(n.as_f64().unwrap_or(f64::NAN));
                }
            }
            Value::String(s) => hasher.write_str(s),
            Value::Array(items) => hasher.write_seq(items.iter()),
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
                hasher.write_sorted_map(entries.into_iter());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn integer_width_does_not_matter_but_sign_does() {
        assert_eq!(fingerprint("s.v1", &5i32), fingerprint("s.v1", &5i64));
        assert_eq!(fingerprint("s.v1", &5u8), fingerprint("s.v1", &5u64));
        assert_ne!(fingerprint("s.v1", &5i64), fingerprint("s.v1", &5u64));
    }

    #[test]
    fn strings_are_length_prefixed() {
        assert_ne!(
            fingerprint("s.v1", &("ab", "c")),
            fingerprint("s.v1", &("a", "bc"))
        );
        assert_ne!(
            fingerprint("s.v1", &vec!["ab".to_string()]),
            fingerprint("s.v1", &vec!["a".to_string(), "b".to_string()])
        );
    }

    #[test]
    fn options_in_sequences_stay_distinct() {
        assert_ne!(
            fingerprint("s.v1", &vec![None, Some(1)]),
            fingerprint("s.v1", &vec![Some(1), None])
        );
        assert_ne!(
            fingerprint("s.v1", &None::<i32>),
            fingerprint("s.v1", &Some(0))
        );
    }

    #[test]
    fn floats_are_canonical() {
        assert_eq!(fingerprint("s.v1", &0.0f64), fingerprint("s.v1", &-0.0f64));
        assert_eq!(
            fingerprint("s.v1", &f64::NAN),
            fingerprint("s.v1", &-f64::NAN)
        );
        assert_eq!(fingerprint("s.v1", &1.5f32), fingerprint("s.v1", &1.5f64));
    }

    #[test]
    fn json_object_order_does_not_matter() {
        let a: serde_json::Value = serde_json::from_str(r#"{"a":1,"b":[true,null]}"#).unwrap();
        let b: serde_json::Value = serde_json::from_str(r#"{"b":[true,null],"a":1}"#).unwrap();
        assert_eq!(fingerprint("s.v1", &a), fingerprint("s.v1", &b));
    }

    proptest! {
        #[test]
        fn hash_map_order_never_matters(entries in proptest::collection::vec((any::<String>(), any::<i64>()), 0..20)) {
            let forward: HashMap<String, i64> = entries.iter().cloned().collect();
            let mut reversed = HashMap::new();
            for (k, v) in entries.iter().rev() {
                reversed.entry(k.clone()).or_insert(*v);
            }
            // Same key set; where the two disagree on a value, align them.
            let aligned: HashMap<String, i64> = reversed.keys().map(|k| (k.clone(), forward[k])).collect();
            let btree: BTreeMap<String, i64> = forward.iter().map(|(k, v)| (k.clone(), *v)).collect();
            prop_assert_eq!(fingerprint("s.v1", &forward), fingerprint("s.v1", &aligned));
            prop_assert_eq!(fingerprint("s.v1", &forward), fingerprint("s.v1", &btree));
        }

        #[test]
        fn hash_set_order_never_matters(items in proptest::collection::vec(any::<u32>(), 0..20)) {
            let set: HashSet<u32> = items.iter().copied().collect();
            let rebuilt: HashSet<u32> = items.iter().rev().copied().collect();
            let btree: BTreeSet<u32> = items.iter().copied().collect();
            prop_assert_eq!(fingerprint("s.v1", &set), fingerprint("s.v1", &rebuilt));
            prop_assert_eq!(fingerprint("s.v1", &set), fingerprint("s.v1", &btree));
        }

        #[test]
        fn different_strings_differ(a in any::<String>(), b in any::<String>()) {
            prop_assume!(a != b);
            prop_assert_ne!(fingerprint("s.v1", &a), fingerprint("s.v1", &b));
        }

        #[test]
        fn step_name_is_part_of_the_fingerprint(value in any::<i64>()) {
            prop_assert_ne!(fingerprint("a.v1", &value), fingerprint("a.v2", &value));
        }
    }
}

#[cfg(test)]
mod struct_encoding_tests {
    use super::*;
    use proptest::prelude::*;

    /// Written exactly as `#[derive(Fingerprint)]` writes a struct: fields in
    /// ascending name order, `None` fields left out.
    struct V1 {
        amount: i64,
        currency: String,
    }
    struct V2 {
        currency: String,
        amount: i64,
        memo: Option<String>,
        requested_at: String, // skipped
    }
    impl Fingerprint for V1 {
        fn fingerprint(&self, h: &mut FingerprintHasher) {
            h.begin_struct();
            h.write_field("amount", &self.amount);
            h.write_field("currency", &self.currency);
            h.end_struct();
        }
    }
    impl Fingerprint for V2 {
        fn fingerprint(&self, h: &mut FingerprintHasher) {
            h.begin_struct();
            h.write_field("amount", &self.amount);
            h.write_field("currency", &self.currency);
            h.write_field("memo", &self.memo);
            h.end_struct();
        }
    }

    proptest! {
        #[test]
        fn a_new_none_field_and_a_skipped_field_keep_old_fingerprints(amount in any::<i64>(), currency in "[A-Z]{3}", at in any::<String>()) {
            let old = V1 { amount, currency: currency.clone() };
            let new = V2 { currency: currency.clone(), amount, memo: None, requested_at: at };
            prop_assert_eq!(fingerprint("charge.v1", &old), fingerprint("charge.v1", &new));
            let with_memo = V2 { memo: Some(String::new()), ..new };
            prop_assert_ne!(fingerprint("charge.v1", &old), fingerprint("charge.v1", &with_memo));
            let _ = &with_memo.requested_at;
        }
    }
}

#[cfg(test)]
mod known_answer {
    use super::*;

    /// Pins the v1 encoding: a change here changes every stored fingerprint.
    #[test]
    fn known_answer() {
        let long = "x".repeat(300);
        let map: BTreeMap<String, i64> = [("a".to_string(), 1), ("b".to_string(), -2)]
            .into_iter()
            .collect();
        let value = (
            "EUR",
            2500i64,
            Some(vec![1u8, 2]),
            long,
            map,
            1.5f64,
            'z',
            true,
        );
        let hash = fingerprint("charge-card.v1", &value);
        assert_eq!(
            crate::hex::encode(&hash.0),
            "4bdcdea895cb6a00f7c7434976229a5967fad2a0abf05b4fa9fc45beb8a90778"
        );
    }
}
