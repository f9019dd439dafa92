//! CLOCK with a two-bit frequency per entry (GCLOCK): a hand sweeps the table's slots; an
//! entry whose frequency is zero is the victim, others have their frequency lowered by one.
//!
//! A hit raises the frequency only if it is below the maximum (test before set), so a hot
//! entry's state line is read, never written, once it has saturated: the steady state of a
//! hot read path writes nothing. The hand is a shared counter, but only evictions (inserts
//! over capacity) touch it.

use crossbeam_epoch::Guard;
use crossbeam_utils::CachePadded;

use super::EvictionPolicy;
use crate::entry::Entry;
use crate::sync::{AtomicU8, AtomicUsize, Ordering};
use crate::table::{Node, Table};

/// Highest frequency an entry can reach: it then survives this many sweeps without a hit.
const MAX_FREQUENCY: u8 = 3;

/// Slots the hand claims per `fetch_add`.
const HAND_STRIDE: usize = 8;

/// Per-entry state: the entry's frequency, 0..=3.
#[derive(Debug, Default)]
pub(crate) struct EntryState {
    frequency: AtomicU8,
}

/// The policy's shared state: the hand.
#[derive(Debug, Default)]
pub(crate) struct FrequencyClock {
    hand: CachePadded<AtomicUsize>,
}

impl EvictionPolicy for FrequencyClock {
    #[inline]
    fn on_hit(&self, state: &EntryState) {
        // Relaxed: the frequency is a hint; a lost update only makes eviction slightly less
        // precise, and ordering it with anything else buys nothing.
        let f = state.frequency.load(Ordering::Relaxed);
        if f < MAX_FREQUENCY {
            state.frequency.store(f + 1, Ordering::Relaxed);
        }
    }

    fn victim<'g, K, V>(
        &self,
        table: &Table<K, Entry<V>>,
        expired: &dyn Fn(&Entry<V>) -> bool,
        guard: &'g Guard,
    ) -> Option<&'g Node<K, Entry<V>>> {
        if table.is_empty() {
            return None;
        }
        // Each full sweep lowers every frequency by one, so within MAX_FREQUENCY + 1 sweeps
        // some entry reaches zero (unless the table empties meanwhile).
        let budget = table.slot_count(guard) * (MAX_FREQUENCY as usize + 1) + HAND_STRIDE;
        let mut visited = 0;
        while visited < budget {
            let start = self.hand.fetch_add(HAND_STRIDE, Ordering::Relaxed);
            for i in start..start + HAND_STRIDE {
                let Some(node) = table.node_at(i, guard) else {
                    continue;
                };
                let entry = &node.value;
                if expired(entry) {
                    return Some(node);
                }
                let f = entry.policy.frequency.load(Ordering::Relaxed);
                if f == 0 {
                    return Some(node);
                }
                entry.policy.frequency.store(f - 1, Ordering::Relaxed);
            }
            visited += HAND_STRIDE;
            if table.is_empty() {
                return None;
            }
        }
        None
    }
}
