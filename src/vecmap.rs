//! A map for tables that hold a handful of entries.
//!
//! Each `HashMap<K, V>` instantiates hashbrown's table code (rehashing,
//! probing, dropping) for its element type: ~1–1.5 KB of the `.wasm` per map
//! type (BENCHMARKS.md item 22). The engine's per-connection, per-request and
//! per-response tables hold a few entries at a time (open panels, requests
//! in flight, the calls of one response; the providers' blocks and partial
//! calls of one stream; a snapshot's child frames), where a linear search is as fast
//! as hashing and the vector's code is shared with every other `Vec`. Tables
//! that grow with the user's data (threads, receipts, site rules) stay hash
//! maps.
//!
//! Iteration is in insertion order (removal keeps the order of the rest), so
//! it is also deterministic, which a `HashMap`'s is not.

use std::borrow::Borrow;

/// A map kept as a vector of `(key, value)` pairs, one per key.
#[derive(Debug, Clone, PartialEq)]
pub struct VecMap<K, V> {
    entries: Vec<(K, V)>,
}

impl<K, V> Default for VecMap<K, V> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
        }
    }
}

impl<K: PartialEq, V> VecMap<K, V> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn position<Q>(&self, key: &Q) -> Option<usize>
    where
        K: Borrow<Q>,
        Q: PartialEq + ?Sized,
    {
        self.entries.iter().position(|(k, _)| k.borrow() == key)
    }

    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: PartialEq + ?Sized,
    {
        self.position(key).map(|i| &self.entries[i].1)
    }

    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: PartialEq + ?Sized,
    {
        self.position(key).map(|i| &mut self.entries[i].1)
    }

    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: PartialEq + ?Sized,
    {
        self.position(key).is_some()
    }

    /// Insert or replace; returns the value it replaced. A replaced entry
    /// keeps its place in the order.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.position(&key) {
            Some(i) => Some(std::mem::replace(&mut self.entries[i].1, value)),
            None => {
                self.entries.push((key, value));
                None
            }
        }
    }

    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: PartialEq + ?Sized,
    {
        self.position(key).map(|i| self.entries.remove(i).1)
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }

    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.iter().map(|(_, v)| v)
    }

    /// The value of `key`, inserted with `make` first if there is none.
    pub fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        let at = match self.position(&key) {
            Some(at) => at,
            None => {
                self.entries.push((key, make()));
                self.entries.len() - 1
            }
        };
        &mut self.entries[at].1
    }
}

/// The entries in insertion order.
impl<K, V> IntoIterator for VecMap<K, V> {
    type Item = (K, V);
    type IntoIter = std::vec::IntoIter<(K, V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

/// Later entries replace earlier ones of the same key, in place.
impl<K: PartialEq, V> FromIterator<(K, V)> for VecMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut map = Self::new();
        for (key, value) in iter {
            map.insert(key, value);
        }
        map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_entry_per_key_in_insertion_order() {
        let mut map: VecMap<String, u32> = VecMap::new();
        assert!(map.is_empty());
        assert_eq!(map.insert("b".into(), 1), None);
        assert_eq!(map.insert("a".into(), 2), None);
        assert_eq!(map.insert("c".into(), 3), None);
        assert_eq!(map.insert("b".into(), 4), Some(1), "replaced in place");
        assert_eq!(map.len(), 3);
        assert_eq!(
            map.iter()
                .map(|(k, v)| (k.as_str(), *v))
                .collect::<Vec<_>>(),
            [("b", 4), ("a", 2), ("c", 3)]
        );
        assert_eq!(map.get("a"), Some(&2));
        assert!(map.contains_key("c"));
        assert!(!map.contains_key("d"));
        *map.get_mut("c").unwrap() += 10;
        assert_eq!(map.remove("a"), Some(2));
        assert_eq!(map.remove("a"), None);
        assert_eq!(map.values().copied().collect::<Vec<_>>(), [4, 13]);
        *map.get_or_insert_with("d".into(), || 0) += 1;
        *map.get_or_insert_with("b".into(), || 0) += 1;
        assert_eq!(
            map.clone().into_iter().collect::<Vec<_>>(),
            [
                ("b".to_string(), 5),
                ("c".to_string(), 13),
                ("d".to_string(), 1)
            ]
        );
        assert_eq!(
            [
                ("x".to_string(), 1),
                ("y".to_string(), 2),
                ("x".to_string(), 3)
            ]
            .into_iter()
            .collect::<VecMap<_, _>>()
            .into_iter()
            .collect::<Vec<_>>(),
            [("x".to_string(), 3), ("y".to_string(), 2)],
            "a later entry replaces an earlier one in place"
        );
        map.clear();
        assert!(map.is_empty());
        assert_eq!(map.get("b"), None);
    }
}
