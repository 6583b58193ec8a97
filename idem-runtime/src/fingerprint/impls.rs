//! `Fingerprint` for the standard library's types, `serde_json::Value` and tuples.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use super::{Fingerprint, FingerprintHasher};

macro_rules! signed {
    ($($t:ty)*) => {$(
        impl Fingerprint for $t {
            #[inline]
            fn fingerprint(&self, hasher: &mut FingerprintHasher) {
                hasher.write_i128(*self as i128);
            }
        }
    )*};
}
macro_rules! unsigned {
    ($($t:ty)*) => {$(
        impl Fingerprint for $t {
            #[inline]
            fn fingerprint(&self, hasher: &mut FingerprintHasher) {
                hasher.write_u128(*self as u128);
            }
        }
    )*};
}
signed!(i8 i16 i32 i64 i128 isize);
unsigned!(u8 u16 u32 u64 u128 usize);

impl Fingerprint for f64 {
    #[inline]
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        hasher.write_f64(*self);
    }
}

impl Fingerprint for f32 {
    #[inline]
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        hasher.write_f64(f64::from(*self));
    }
}

impl Fingerprint for bool {
    #[inline]
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        hasher.write_bool(*self);
    }
}

impl Fingerprint for char {
    #[inline]
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        hasher.write_char(*self);
    }
}

impl Fingerprint for str {
    #[inline]
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        hasher.write_str(self);
    }
}

impl Fingerprint for String {
    #[inline]
    fn fingerprint(&self, hasher: &mut FingerprintHasher) {
        hasher.write_str(self);
    }
}

impl Fingerprint for () {
    #[inline]
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
            #[inline]
            fn fingerprint(&self, hasher: &mut FingerprintHasher) {
                self.get().fingerprint(hasher);
            }
        }
    )*};
}
nonzero!(NonZeroU8 NonZeroU16 NonZeroU32 NonZeroU64 NonZeroU128 NonZeroUsize NonZeroI8 NonZeroI16 NonZeroI32 NonZeroI64 NonZeroI128 NonZeroIsize);

impl Fingerprint for std::time::Duration {
    #[inline]
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
    use crate::fingerprint::fingerprint;
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
