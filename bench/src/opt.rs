//! Belady's clairvoyant policy, the limit the hit-ratio tables compare against.
//!
//! On a miss with the cache full it evicts, among the resident keys and the incoming one, the
//! key whose next access is farthest in the future (so it may decline to admit the incoming
//! key). No policy, with or without admission control, can score higher on the same trace.

use std::collections::{BTreeSet, HashMap};

/// Hit ratio of OPT on `keys` with room for `capacity` keys.
pub fn hit_ratio(keys: &[u64], capacity: usize) -> f64 {
    if keys.is_empty() || capacity == 0 {
        return 0.0;
    }
    // next[i]: index of the next access to keys[i] after i, or usize::MAX.
    let mut next = vec![usize::MAX; keys.len()];
    let mut last: HashMap<u64, usize> = HashMap::new();
    for (i, &k) in keys.iter().enumerate().rev() {
        if let Some(&j) = last.get(&k) {
            next[i] = j;
        }
        last.insert(k, i);
    }
    // Resident keys ordered by next use (ties among never-again keys broken by key).
    let mut by_next: BTreeSet<(usize, u64)> = BTreeSet::new();
    let mut resident: HashMap<u64, usize> = HashMap::with_capacity(capacity);
    let mut hits = 0u64;
    for (i, &k) in keys.iter().enumerate() {
        if let Some(at) = resident.get_mut(&k) {
            hits += 1;
            by_next.remove(&(*at, k));
            *at = next[i];
            by_next.insert((next[i], k));
            continue;
        }
        if resident.len() == capacity {
            let &(far, victim) = by_next.last().expect("full cache has keys");
            if far <= next[i] {
                continue; // the incoming key is needed last: do not admit it
            }
            by_next.remove(&(far, victim));
            resident.remove(&victim);
        }
        resident.insert(k, next[i]);
        by_next.insert((next[i], k));
    }
    hits as f64 / keys.len() as f64
}

#[cfg(test)]
mod tests {
    use super::hit_ratio;

    #[test]
    fn opt_keeps_what_is_used_next() {
        // Capacity 2: after 1 2, the access to 3 evicts 2 (used last), so 1 and 3 hit.
        let keys = [1, 2, 3, 1, 3, 2];
        assert_eq!(hit_ratio(&keys, 2), 2.0 / 6.0);
    }

    #[test]
    fn opt_survives_a_loop_larger_than_the_cache() {
        // A loop over 3 keys with room for 2: LRU never hits; OPT keeps two keys and declines
        // the third (needed last), so it hits two accesses in three.
        let keys: Vec<u64> = (0..300).map(|i| i % 3).collect();
        let r = hit_ratio(&keys, 2);
        assert!(r > 0.64 && r < 0.67, "{r}");
    }

    #[test]
    fn everything_fits_means_only_compulsory_misses() {
        let keys: Vec<u64> = (0..100).map(|i| i % 10).collect();
        assert_eq!(hit_ratio(&keys, 10), 0.9);
    }
}
