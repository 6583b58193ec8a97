//! Request fingerprints: SHA-256 over a canonical encoding of the step name and
//! the request's meaningful fields.
//!
//! # The encoding (version 2)
//!
//! Values are fed straight into the hash as they are written. Every value
//! starts with a one-byte tag and is self-delimiting, so the byte stream of a
//! request is unambiguous. Lengths and integers are LEB128 varints (7 bits per
//! byte, low bits first), so small values take one or two bytes:
//!
//! | value | bytes |
//! |---|---|
//! | header | `"idem-fp-v2"`, the step name's length (varint), the step name, zero bytes up to a multiple of 64 |
//! | signed integer (`i8`..`i128`, `isize`) | `'i'`, the zigzag-encoded `i128` (`0, -1, 1, -2` → `0, 1, 2, 3`) as a varint |
//! | unsigned integer (`u8`..`u128`, `usize`) | `'u'`, the `u128` as a varint |
//! | float (`f32`, `f64`) | `'f'`, 8-byte big-endian bits of the `f64` (`-0.0` as `0.0`, one NaN) |
//! | `bool` | `'b'`, `0` or `1` |
//! | `char` | `'c'`, the scalar value as a varint |
//! | string | `'s'`, length (varint), UTF-8 bytes |
//! | bytes (`write_bytes`) | `'y'`, length (varint), the bytes |
//! | `Option` | `'n'` for `None`; `'o'` then the value for `Some` |
//! | sequence (`Vec`, slice, array, `VecDeque`) | `'l'`, length (varint), each element |
//! | tuple | `'t'`, arity (varint), each element |
//! | map (`BTreeMap`, `HashMap`) | `'m'`, length (varint), each key then value, in ascending key order |
//! | set (`BTreeSet`, `HashSet`) | `'e'`, length (varint), each element in ascending order |
//! | struct (derived) | `'S'`, then for each present field in ascending name order: its [`Label`] (4 bytes), the value; then `'.'` |
//! | enum variant (derived) | `'V'`, the variant's [`Label`], then its fields as a struct |
//!
//! A field or variant is named by its [`Label`], a 32-bit hash of its name
//! computed at compile time, rather than by the name itself: the encoding of a
//! typical request then fits in two SHA-256 blocks instead of three. The
//! derive refuses, at compile time, a type where two labels of one struct or
//! enum collide, naming the pair. The header fills whole blocks, so the state
//! after it is computed once per step and thread and reused.
//!
//! The header names the version, and a new version changes every
//! fingerprint: a key stored by a build with the previous encoding (v1 wrote
//! names, 8-byte lengths and 16-byte integers) answers a retry made across the
//! upgrade with `422` until the key expires. Deploy such an upgrade when
//! in-flight retries can be refused, or wait out the retention period.
//!
//! Consequences, each covered by tests: the order fields are declared in never
//! matters (the derive sorts them by name), `HashMap` iteration order never
//! matters, an `Option` field that is `None` is left out entirely (so adding an
//! optional field keeps old fingerprints), skipped fields never count, integer
//! widths can change (`i32` to `i64`) without changing the fingerprint, and the
//! type's own name is not part of it. The step name is, so the same body sent to
//! two steps never collides.

mod header;
mod impls;
mod stream;

use std::fmt;

use stream::Sha256Stream;

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

/// A struct field's or enum variant's name as the encoding writes it: the
/// 32-bit FNV-1a hash of the name. `const`, so the derive computes it at
/// compile time.
///
/// ```
/// use idem_runtime::fingerprint::Label;
/// const AMOUNT: Label = Label::new("amount");
/// assert_eq!(AMOUNT.get(), 0xf785_ce49);
/// assert_ne!(AMOUNT, Label::new("currency"));
/// // 32 bits can collide; the derive refuses such a pair at compile time.
/// assert_eq!(Label::new("glbvs"), Label::new("yacxa"));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Label(u32);

impl Label {
    /// The label of `name`.
    pub const fn new(name: &str) -> Self {
        let bytes = name.as_bytes();
        let mut hash: u32 = 0x811c_9dc5;
        let mut i = 0;
        while i < bytes.len() {
            hash ^= bytes[i] as u32;
            hash = hash.wrapping_mul(0x0100_0193);
            i += 1;
        }
        Self(hash)
    }

    /// The label's value.
    pub const fn get(self) -> u32 {
        self.0
    }
}

/// The hasher values write themselves into. See the module docs for the encoding.
pub struct FingerprintHasher {
    stream: Sha256Stream,
}

impl FingerprintHasher {
    /// A hasher for a request to `step`; the step name is the first thing hashed.
    pub fn new(step: &str) -> Self {
        Self {
            stream: header::stream_after(step),
        }
    }

    /// The finished fingerprint.
    pub fn finish(self) -> RequestHash {
        RequestHash(self.stream.finish())
    }

    /// Writes a signed integer (any width encodes the same way).
    #[inline]
    pub fn write_i128(&mut self, value: i128) {
        self.stream.byte(b'i');
        self.stream.varint(((value << 1) ^ (value >> 127)) as u128);
    }

    /// Writes an unsigned integer (any width encodes the same way).
    #[inline]
    pub fn write_u128(&mut self, value: u128) {
        self.stream.byte(b'u');
        self.stream.varint(value);
    }

    /// Writes a float; `-0.0` hashes as `0.0` and every NaN alike.
    #[inline]
    pub fn write_f64(&mut self, value: f64) {
        let canonical = if value == 0.0 {
            0.0f64
        } else if value.is_nan() {
            f64::NAN
        } else {
            value
        };
        self.stream.byte(b'f');
        self.stream.array(canonical.to_bits().to_be_bytes());
    }

    /// Writes a bool.
    #[inline]
    pub fn write_bool(&mut self, value: bool) {
        self.stream.array([b'b', u8::from(value)]);
    }

    /// Writes a char.
    #[inline]
    pub fn write_char(&mut self, value: char) {
        self.stream.byte(b'c');
        self.stream.varint(u128::from(u32::from(value)));
    }

    /// Writes a string, length-prefixed.
    #[inline]
    pub fn write_str(&mut self, value: &str) {
        self.tagged_bytes(b's', value.as_bytes());
    }

    /// Writes raw, already-canonical bytes (for custom `with` functions).
    #[inline]
    pub fn write_bytes(&mut self, bytes: &[u8]) {
        self.tagged_bytes(b'y', bytes);
    }

    /// Writes `None`.
    #[inline]
    pub fn write_none(&mut self) {
        self.stream.byte(b'n');
    }

    /// Writes `Some(value)`.
    #[inline]
    pub fn write_some<T: Fingerprint + ?Sized>(&mut self, value: &T) {
        self.stream.byte(b'o');
        value.fingerprint(self);
    }

    /// Writes a sequence of values in order.
    #[inline]
    pub fn write_seq<'a, T: Fingerprint + 'a>(
        &mut self,
        items: impl ExactSizeIterator<Item = &'a T>,
    ) {
        self.tagged_items(b'l', items);
    }

    /// Starts a tuple of `arity` elements; write each element next.
    #[inline]
    pub fn begin_tuple(&mut self, arity: usize) {
        self.tagged_len(b't', arity);
    }

    /// Writes map entries, which must come in ascending key order.
    #[inline]
    pub fn write_sorted_map<'a, K, V>(
        &mut self,
        entries: impl ExactSizeIterator<Item = (&'a K, &'a V)>,
    ) where
        K: Fingerprint + 'a,
        V: Fingerprint + 'a,
    {
        self.tagged_len(b'm', entries.len());
        for (key, value) in entries {
            key.fingerprint(self);
            value.fingerprint(self);
        }
    }

    /// Writes set elements, which must come in ascending order.
    #[inline]
    pub fn write_sorted_set<'a, T: Fingerprint + 'a>(
        &mut self,
        items: impl ExactSizeIterator<Item = &'a T>,
    ) {
        self.tagged_items(b'e', items);
    }

    /// `tag`, the count, then each item.
    #[inline]
    fn tagged_items<'a, T: Fingerprint + 'a>(
        &mut self,
        tag: u8,
        items: impl ExactSizeIterator<Item = &'a T>,
    ) {
        self.tagged_len(tag, items.len());
        for item in items {
            item.fingerprint(self);
        }
    }

    /// Starts a struct (used by `#[derive(Fingerprint)]`).
    #[inline]
    pub fn begin_struct(&mut self) {
        self.stream.byte(b'S');
    }

    /// Writes one struct field unless it is absent (a `None`). Fields must come
    /// in ascending name order; the derive sorts them.
    #[inline]
    pub fn write_field<T: Fingerprint + ?Sized>(&mut self, field: Label, value: &T) {
        if !value.is_absent() {
            self.label(field);
            value.fingerprint(self);
        }
    }

    /// Writes a field through a custom function (`#[fingerprint(with = path)]`).
    #[inline]
    pub fn write_field_with<T: ?Sized>(
        &mut self,
        field: Label,
        value: &T,
        with: fn(&T, &mut FingerprintHasher),
    ) {
        self.label(field);
        with(value, self);
    }

    /// Ends a struct.
    #[inline]
    pub fn end_struct(&mut self) {
        self.stream.byte(b'.');
    }

    /// Starts an enum variant; write its fields as a struct next.
    #[inline]
    pub fn begin_variant(&mut self, variant: Label) {
        self.stream.byte(b'V');
        self.label(variant);
    }

    #[inline]
    fn label(&mut self, label: Label) {
        self.stream.array(label.0.to_be_bytes());
    }

    #[inline]
    fn tagged_len(&mut self, tag: u8, len: usize) {
        self.stream.byte(tag);
        self.stream.varint(len as u128);
    }

    #[inline]
    fn tagged_bytes(&mut self, tag: u8, bytes: &[u8]) {
        self.tagged_len(tag, bytes.len());
        self.stream.bytes(bytes);
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
    #[inline]
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
            h.write_field(Label::new("amount"), &self.amount);
            h.write_field(Label::new("currency"), &self.currency);
            h.end_struct();
        }
    }
    impl Fingerprint for V2 {
        fn fingerprint(&self, h: &mut FingerprintHasher) {
            h.begin_struct();
            h.write_field(Label::new("amount"), &self.amount);
            h.write_field(Label::new("currency"), &self.currency);
            h.write_field(Label::new("memo"), &self.memo);
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
    use std::collections::BTreeMap;

    use super::*;

    /// Pins the v2 encoding: a change here changes every stored fingerprint.
    /// The expected digests were computed outside Rust from the table in the
    /// module docs (Python's `hashlib` over the bytes the table describes).
    #[test]
    fn values() {
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
        assert_eq!(
            crate::hex::encode(&fingerprint("charge-card.v1", &value).0),
            "0caebc37310680e29ee1ffa08c43b4f355a4bdc740cc267b8d3a24ff9bad9e40"
        );
    }

    /// A struct as the derive writes it: labels in name order, `None` left out.
    #[test]
    fn a_struct() {
        struct Charge {
            amount: i64,
            currency: &'static str,
            memo: Option<String>,
        }
        impl Fingerprint for Charge {
            fn fingerprint(&self, h: &mut FingerprintHasher) {
                h.begin_struct();
                h.write_field(Label::new("amount"), &self.amount);
                h.write_field(Label::new("currency"), &self.currency);
                h.write_field(Label::new("memo"), &self.memo);
                h.end_struct();
            }
        }
        let charge = Charge {
            amount: 2500,
            currency: "EUR",
            memo: None,
        };
        assert_eq!(
            crate::hex::encode(&fingerprint("charge-card.v1", &charge).0),
            "bf7d4a471cd2d2c15012ea083f90a08724bdebfd6a71fb38fdd9c8584a7758a4"
        );
    }

    /// A step name too long for one header block takes the uncached path.
    #[test]
    fn a_long_step_name() {
        let step = format!("step.{}", "y".repeat(70));
        assert_eq!(
            crate::hex::encode(&fingerprint(&step, &-1i64).0),
            "03fd0b6e9bed2a4adb0bc75e145bb1af5d2b94ebf4ec52f48aaae342eac34b92"
        );
    }
}
