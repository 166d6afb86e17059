//! One sort routine for the whole crate.
//!
//! Each `sort_by` / `sort_unstable` call site instantiates the standard
//! library's sort (driftsort or ipnsort: about ten functions) for its element
//! type and comparator; fifteen call sites came to 179 functions, 41 KB of the
//! `.wasm` (5.6 % of its code, BENCHMARKS.md item 18). Here every sort goes
//! through one instantiation that orders indices with the comparator behind
//! `&dyn`, then a small per-type step moves the elements into that order.
//! Stable, like `slice::sort_by`; the sorts here are of tens to thousands of
//! elements, where a dynamic call per comparison costs nothing visible.

use std::cmp::Ordering;

/// Sort `v` stably by `cmp`.
pub fn sort_by<T>(v: &mut Vec<T>, cmp: impl Fn(&T, &T) -> Ordering) {
    if v.len() < 2 {
        return;
    }
    let mut order: Vec<usize> = (0..v.len()).collect();
    sort_indices(&mut order, &|a, b| cmp(&v[a], &v[b]));
    let mut slots: Vec<Option<T>> = v.drain(..).map(Some).collect();
    v.extend(order.iter().map(|&i| {
        slots[i]
            .take()
            .expect("a permutation takes each element once")
    }));
}

/// Sort `v` stably by the key `key` gives each element.
pub fn sort_by_key<T, K: Ord>(v: &mut Vec<T>, key: impl Fn(&T) -> K) {
    sort_by(v, |a, b| key(a).cmp(&key(b)));
}

/// Sort `v` in its natural order.
pub fn sort<T: Ord>(v: &mut Vec<T>) {
    sort_by(v, T::cmp);
}

/// The one instantiation of the standard sort: indices, compared through
/// `cmp`.
#[inline(never)]
#[allow(clippy::disallowed_methods)] // the one use the rest of the crate is steered to
fn sort_indices(order: &mut [usize], cmp: &dyn Fn(usize, usize) -> Ordering) {
    order.sort_by(|&a, &b| cmp(a, b));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic stream of pseudo-random numbers.
    fn numbers(seed: u64, n: usize, modulo: u64) -> Vec<u64> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 33) % modulo
            })
            .collect()
    }

    #[test]
    fn sorts_like_the_standard_stable_sort() {
        for (seed, n, modulo) in [
            (1, 0, 5),
            (2, 1, 5),
            (3, 2, 5),
            (4, 100, 7),
            (5, 5000, 1000),
        ] {
            let tagged: Vec<(u64, usize)> = numbers(seed, n, modulo)
                .into_iter()
                .enumerate()
                .map(|(i, k)| (k, i))
                .collect();
            let mut expected = tagged.clone();
            #[allow(clippy::disallowed_methods)] // the reference this module must match
            expected.sort_by_key(|(k, _)| *k);
            let mut got = tagged.clone();
            sort_by_key(&mut got, |(k, _)| *k);
            assert_eq!(
                got, expected,
                "seed {seed}: same order, equal keys keep theirs"
            );
        }
    }

    #[test]
    fn sorts_by_comparator_and_naturally_and_moves_owned_values() {
        let mut words: Vec<String> = ["pear", "fig", "apple", "fig", "kiwi"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        sort(&mut words);
        assert_eq!(words, ["apple", "fig", "fig", "kiwi", "pear"]);
        sort_by(&mut words, |a, b| {
            b.len().cmp(&a.len()).then_with(|| a.cmp(b))
        });
        assert_eq!(words, ["apple", "kiwi", "pear", "fig", "fig"]);
    }
}
