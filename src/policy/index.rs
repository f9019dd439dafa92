//! The policy's index from policy key to node: an open-addressing table of 8-byte slots, each
//! a node number and the low 32 bits of its policy key.
//!
//! A general map would store the whole 8-byte key beside the number and pad the pair to 16
//! bytes. The 32 bits kept place the entry (its home slot) and tell keys apart without
//! reading the node, so a probe or a deletion's shift touches only the index's own memory;
//! the node is read once, to confirm a match. Linear probing at a load factor of at most 3/4,
//! with backward-shift deletion, so there are no tombstones to clean up under churn.

/// An empty slot (no node has number `u32::MAX`).
const EMPTY: u64 = u64::MAX;

/// Smallest table, in slots.
const MIN_SLOTS: usize = 16;

/// Maps policy keys (uniformly distributed 64-bit hashes) to node numbers; the caller says
/// what key a node number stands for (`key_of`).
#[derive(Debug, Default)]
pub(super) struct Index {
    slots: Vec<u64>,
    len: usize,
}

/// The slot content for `node` with policy key `pkey`.
#[inline]
fn slot(pkey: u64, node: u32) -> u64 {
    (pkey << 32) | u64::from(node)
}

/// The node number in a slot.
#[inline]
fn node_of(slot: u64) -> u32 {
    slot as u32
}

/// The low 32 bits of the policy key in a slot, which also choose its home.
#[inline]
fn low_of(slot: u64) -> u64 {
    slot >> 32
}

impl Index {
    /// Entries held.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// The first node number held for `pkey` that `wanted` accepts, in probe order.
    #[inline]
    pub(super) fn get(
        &self,
        pkey: u64,
        key_of: impl Fn(u32) -> u64,
        mut wanted: impl FnMut(u32) -> bool,
    ) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        let mask = self.mask();
        let low = pkey & 0xffff_ffff;
        let mut i = low as usize & mask;
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                return None;
            }
            if low_of(s) == low && key_of(node_of(s)) == pkey && wanted(node_of(s)) {
                return Some(node_of(s));
            }
            i = (i + 1) & mask;
        }
    }

    /// Adds `pkey → node`; `node` must not be held (`pkey` may be, for other nodes: a key's
    /// records overlap while its writes report, see `tinylfu.rs`, "Succession").
    pub(super) fn insert(&mut self, pkey: u64, node: u32, key_of: impl Fn(u32) -> u64) {
        debug_assert_ne!(node, u32::MAX);
        debug_assert_eq!(key_of(node), pkey);
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        self.place(slot(pkey, node));
        self.len += 1;
    }

    fn place(&mut self, s: u64) {
        let mask = self.mask();
        let mut i = low_of(s) as usize & mask;
        while self.slots[i] != EMPTY {
            i = (i + 1) & mask;
        }
        self.slots[i] = s;
    }

    fn grow(&mut self) {
        let size = (self.slots.len() * 2).max(MIN_SLOTS);
        let old = std::mem::replace(&mut self.slots, vec![EMPTY; size]);
        for s in old.into_iter().filter(|&s| s != EMPTY) {
            self.place(s);
        }
    }

    /// Removes `pkey → node`: whether it was held.
    pub(super) fn remove(&mut self, pkey: u64, node: u32) -> bool {
        if self.len == 0 {
            return false;
        }
        let mask = self.mask();
        let target = slot(pkey, node);
        let mut i = low_of(target) as usize & mask;
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                return false;
            }
            if s == target {
                break;
            }
            i = (i + 1) & mask;
        }
        // Backward shift: move later members of the run into the hole while that keeps each
        // reachable from its home slot.
        let mut hole = i;
        let mut j = (i + 1) & mask;
        loop {
            let s = self.slots[j];
            if s == EMPTY {
                break;
            }
            let home = low_of(s) as usize & mask;
            // `n` may fill the hole unless its home lies cyclically in (hole, j].
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.slots[hole] = s;
                hole = j;
            }
            j = (j + 1) & mask;
        }
        self.slots[hole] = EMPTY;
        self.len -= 1;
        true
    }
}

#[cfg(all(test, not(herdcache_loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// Operations per case (fewer under Miri, which runs them thousands of times slower).
    const MODEL_OPS: usize = if cfg!(miri) { 100 } else { 400 };

    proptest! {
        // No unsafe code, and hundreds of cases: too slow under Miri, whose isolation also
        // refuses the working directory that failure persistence looks up.
        #![proptest_config(ProptestConfig {
            cases: if cfg!(miri) { 4 } else { 256 },
            failure_persistence: if cfg!(miri) {
                None
            } else {
                ProptestConfig::default().failure_persistence
            },
            ..ProptestConfig::default()
        })]
        /// Behaves as a map from policy key to node numbers, whatever the order of inserts
        /// and removes, including keys that share their home slot (small keys collide in a
        /// small table), keys that share the low 32 bits the index keeps, and a key held
        /// for several nodes at once, removed in any order.
        #[test]
        fn matches_a_map(
            ops in proptest::collection::vec((any::<bool>(), 0u64..64, any::<usize>()), 0..MODEL_OPS)
        ) {
            // Node number = position in `keys`; keys are spread so runs wrap around.
            let mut keys: Vec<u64> = Vec::new();
            let mut index = Index::default();
            let mut model: HashMap<u64, Vec<u32>> = HashMap::new();
            for (insert, k, pick) in ops {
                let pkey = if k % 2 == 0 {
                    k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (k % 3)
                } else {
                    (k % 4) | (k << 40)
                };
                let held = model.entry(pkey).or_default();
                if insert && held.len() < 3 {
                    let n = keys.len() as u32;
                    keys.push(pkey);
                    index.insert(pkey, n, |n| keys[n as usize]);
                    held.push(n);
                } else if !insert {
                    // Any of the key's nodes, or one the index never held.
                    let n = if held.is_empty() {
                        u32::MAX - 1
                    } else {
                        held.remove(pick % held.len())
                    };
                    prop_assert_eq!(index.remove(pkey, n), n != u32::MAX - 1);
                }
                let len: usize = model.values().map(Vec::len).sum();
                prop_assert_eq!(index.len(), len);
                for (&p, held) in &model {
                    let key_of = |n: u32| keys[n as usize];
                    for &n in held {
                        prop_assert_eq!(index.get(p, key_of, |m| m == n), Some(n));
                    }
                    prop_assert_eq!(index.get(p, key_of, |_| true).is_some(), !held.is_empty());
                }
            }
        }
    }
}
