//! Eviction policy, behind a small internal trait so that it stays one module.
//!
//! A policy sees hits (through the per-entry state it owns) and chooses victims when the
//! cache is over capacity. Its hit hook must keep hits free of shared writes in the steady
//! state: test before set, never an unconditional store, never a shared counter.

mod frequency_clock;

pub(crate) use frequency_clock::{EntryState, FrequencyClock};

use crossbeam_epoch::Guard;

use crate::entry::Entry;
use crate::table::{Node, Table};

/// The interface between the cache and its eviction policy.
pub(crate) trait EvictionPolicy: Send + Sync {
    /// Records a hit on an entry.
    fn on_hit(&self, state: &EntryState);

    /// Chooses an entry to evict, preferring expired ones (`expired` says which are). `None`
    /// when the table is empty. The cache removes the victim, and asks again if that raced.
    fn victim<'g, K, V>(
        &self,
        table: &Table<K, Entry<V>>,
        expired: &dyn Fn(&Entry<V>) -> bool,
        guard: &'g Guard,
    ) -> Option<&'g Node<K, Entry<V>>>;
}
