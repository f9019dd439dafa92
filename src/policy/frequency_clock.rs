//! CLOCK with a two-bit frequency per entry (GCLOCK): a hand sweeps the table's slots; an
//! entry whose frequency is zero is the victim, others have their frequency lowered by one.
//!
//! Once the hand has a victim it looks a short window further for an expired entry, which it
//! takes instead.
//!
//! A hit raises the frequency only if it is below the maximum (test before set), so a hot
//! entry's state line is read, never written, once it has saturated: the steady state of a
//! hot read path writes nothing. The hand is a shared counter, but only evictions (inserts
//! over capacity) touch it.

use crossbeam_epoch::Guard;
use crossbeam_utils::CachePadded;

use super::{Candidate, EvictionPolicy};
use crate::entry::Entry;
use crate::sync::{AtomicU8, AtomicUsize, Ordering};
use crate::table::{Node, Table};

/// Highest frequency an entry can reach: it then survives this many sweeps without a hit.
const MAX_FREQUENCY: u8 = 3;

/// Slots the hand claims per `fetch_add`.
const HAND_STRIDE: usize = 8;

/// Slots the hand looks past a live victim for an expired entry, which it evicts instead:
/// expired entries are preferred within this window.
const EXPIRED_LOOKAHEAD: usize = 32;

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
        classify: &dyn Fn(&Entry<V>) -> Candidate,
        guard: &'g Guard,
    ) -> Option<&'g Node<K, Entry<V>>> {
        if table.is_empty() {
            return None;
        }
        // Each full sweep lowers every frequency by one, so within MAX_FREQUENCY + 1 sweeps
        // some entry reaches zero (unless the table empties meanwhile).
        let budget = table.slot_count(guard) * (MAX_FREQUENCY as usize + 1) + HAND_STRIDE;
        let mut visited = 0;
        let mut fallback: Option<&'g Node<K, Entry<V>>> = None;
        let mut looked_ahead = 0;
        while visited < budget {
            let start = self.hand.fetch_add(HAND_STRIDE, Ordering::Relaxed);
            for i in start..start + HAND_STRIDE {
                if let Some(node) = table.node_at(i, guard) {
                    let entry = &node.value;
                    match classify(entry) {
                        Candidate::Skip => {}
                        Candidate::Expired => return Some(node),
                        Candidate::Live if fallback.is_none() => {
                            let f = entry.policy.frequency.load(Ordering::Relaxed);
                            if f == 0 {
                                fallback = Some(node);
                            } else {
                                entry.policy.frequency.store(f - 1, Ordering::Relaxed);
                            }
                        }
                        // Looking ahead for an expired entry: leave frequencies alone.
                        Candidate::Live => {}
                    }
                }
                if fallback.is_some() {
                    looked_ahead += 1;
                    if looked_ahead > EXPIRED_LOOKAHEAD {
                        return fallback;
                    }
                }
            }
            visited += HAND_STRIDE;
            if table.is_empty() {
                return None;
            }
        }
        fallback
    }
}
