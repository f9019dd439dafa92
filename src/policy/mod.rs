//! Eviction policy, behind a small internal trait so that it stays one module.
//!
//! The policy (W-TinyLFU, `tinylfu.rs`) is a single-threaded structure under a lock, taken by
//! writes (inserts, published loads) and removals, which keep its view of the table exact.
//! Hits never take it: a hit only raises a small counter in its own entry, test before set
//! ([`EntryState::on_hit`]), so once an entry has been hit a few times since the policy last
//! looked at it, further hits read that byte and write nothing. When the policy considers an
//! entry (as a victim or as a candidate leaving the window) it reads and resets the counter:
//! the hits are folded into the frequency sketch, and an entry hit since its last look gets a
//! second chance in its region, as in CLOCK. So hits cost what they cost under CLOCK, and the
//! sketch still counts every key's recent popularity, resident or not.

mod sketch;
mod tinylfu;
mod window;

pub(crate) use tinylfu::{Look, Probe, Victim, Write};
pub(crate) use window::{Requests, Served};

use crate::sync::{AtomicU8, Mutex, Ordering};

/// Hits an entry counts between two looks of the policy (more are not told apart).
const MAX_HITS: u8 = 3;

/// Per-entry policy state: hits since the policy last looked at the entry.
#[derive(Debug, Default)]
pub(crate) struct EntryState {
    hits: AtomicU8,
}

impl EntryState {
    /// Records a hit. Test before set: an entry already at `MAX_HITS` is only read, so a hot
    /// entry's line stays shared between the cores reading it. Relaxed: a hint, and a lost
    /// increment between racing readers only makes the count a little low.
    #[inline]
    pub(crate) fn on_hit(&self) {
        let h = self.hits.load(Ordering::Relaxed);
        if h < MAX_HITS {
            self.hits.store(h + 1, Ordering::Relaxed);
        }
    }

    /// The hits since the last look, resetting them (the policy, under its lock).
    pub(crate) fn take_hits(&self) -> u8 {
        if self.hits.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        self.hits.swap(0, Ordering::Relaxed)
    }
}

/// What the cache needs from an eviction policy. Keys are policy keys (a seeded 64-bit hash
/// of the key); versions identify writes and only grow.
pub(crate) trait EvictionPolicy: Send {
    /// The table now holds `write`; evictions needed to stay within capacity go to `out`.
    /// `probe` reports (and resets) an entry's hits and whether it expired; expired entries
    /// go first. `served` reads the cache's lookup counters (hits and misses so far).
    fn write(
        &mut self,
        write: Write,
        out: &mut Vec<Victim>,
        probe: &mut Probe<'_>,
        served: &Served<'_>,
    );
    /// The table no longer holds write `version` of the key, nor any older one.
    fn remove(&mut self, pkey: u64, version: u64);
    /// The table hash of the tracked key with policy key `pkey`: how an entry known only by
    /// its policy key is found (the shared tier's broadcasts).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    fn hash_of(&self, pkey: u64) -> Option<u64>;
}

/// The cache's policy and its lock, with a scratch list of victims reused across writes (an
/// insert at capacity would otherwise allocate one).
#[derive(Debug)]
pub(crate) struct Policy {
    core: Mutex<(tinylfu::Core, Vec<Victim>)>,
}

impl Policy {
    /// A policy for `max_weight` units, seeded for its sketch.
    pub(crate) fn new(max_weight: u64, seed: u64) -> Self {
        Policy {
            core: Mutex::new((tinylfu::Core::new(max_weight, seed), Vec::new())),
        }
    }

    /// Runs `f` on the locked policy (a write or a removal). The policy runs no user code, so
    /// a panic while it is held cannot leave it half-updated by a caller: it is taken over.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut dyn EvictionPolicy) -> R) -> R {
        self.with_scratch(|p, _| f(p))
    }

    /// Like `with`, also lending the (empty) scratch list of victims.
    pub(crate) fn with_scratch<R>(
        &self,
        f: impl FnOnce(&mut dyn EvictionPolicy, &mut Vec<Victim>) -> R,
    ) -> R {
        let mut guard = self.core.lock().unwrap_or_else(|p| p.into_inner());
        let (core, scratch) = &mut *guard;
        scratch.clear();
        let r = f(core, scratch);
        scratch.clear();
        r
    }
}
