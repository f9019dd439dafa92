//! The engine's side of fleet coherence (feature `redis`): its writes go through the tier,
//! what the subscriber hears drops local copies, and a load or insert that ran while a write
//! of its key was heard drops what it installed.

use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::time::Duration;

use super::Engine;
use crate::fleet::{Heard, Keep, OwnWrite, Seen, Sent};
use crate::stats::Counter;

/// A write this instance made through the tier, for the check after its local half (it
/// counts as in progress until dropped).
pub(crate) struct Written<'a> {
    pkey: u64,
    own: OwnWrite<'a>,
    /// The longest the local copy may live (nanoseconds): the coherence bound while the link
    /// is down.
    pub(crate) cap: Option<u64>,
    /// Whether the write reached Redis, or was deferred.
    pub(crate) sent: Sent,
}

impl<K, V, S> Engine<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// The tier's half of an insert of `key` (`value` with its TTL in nanoseconds) or of an
    /// invalidation (`None`) of the key `named`; `None` without a tier. Inlined, so that a
    /// cache without one pays a test, not a call, on every write.
    #[inline]
    pub(crate) fn write_through<Q: Hash + ?Sized>(
        &self,
        named: &Q,
        key: Option<&K>,
        value: Option<(&V, Option<u64>)>,
    ) -> Option<Written<'_>> {
        let tier = self.shared()?;
        Some(self.write_to(tier, named, key, value))
    }

    /// `write_through` with the tier (out of line, so that the test stays small).
    #[inline(never)]
    fn write_to<'a, Q: Hash + ?Sized>(
        &'a self,
        tier: &'a crate::fleet::RedisTier<K, V>,
        named: &Q,
        key: Option<&K>,
        value: Option<(&V, Option<u64>)>,
    ) -> Written<'a> {
        // Only with a tier, whose policy keys are hashed from the key (no table hash needed).
        let pkey = self.pkey_with(|| self.hash(named), named);
        // Our own loads of the key in flight must not install what they read before this.
        let own = tier.coherence().begin_write(pkey);
        let count = self.counting();
        let ttl = value.and_then(|(_, t)| t).map(Duration::from_nanos);
        let sent = tier.write(key, pkey, value.map(|(v, _)| (v, ttl)), &count);
        let cap = match tier.keep(None) {
            Keep::For(Some(bound)) => Some(crate::clock::duration_to_nanos(bound)),
            _ => None,
        };
        Written {
            pkey,
            own,
            cap,
            sent,
        }
    }

    /// The tier's half of `invalidate_all`: `None` without a tier.
    pub(crate) fn invalidate_all_through(&self) -> Option<Sent> {
        let tier = self.shared()?;
        Some(tier.announce_invalidate_all(&self.counting()))
    }

    /// After a local install (an insert's, or a load's): drops it if another instance's write
    /// of a key in its slot was heard since `seen`, or the link changed.
    pub(crate) fn recheck(&self, pkey: u64, seen: Seen) {
        let Some(tier) = self.shared() else {
            return;
        };
        if tier.coherence().changed_since(seen) && self.remove_by_pkey(pkey) {
            self.pin().count(Counter::SharedStaleDropped);
        }
    }

    /// `recheck` for a write made by `write_through`, which also drops the copy if another
    /// write of the key on this instance overlapped it.
    pub(crate) fn recheck_write(&self, written: Written<'_>) {
        if !written.own.may_keep() && self.remove_by_pkey(written.pkey) {
            self.pin().count(Counter::SharedStaleDropped);
        }
    }

    /// What the subscriber heard.
    fn heard(&self, heard: Heard, lag: Duration) {
        let Some(tier) = self.shared() else {
            return;
        };
        let shared = self.counters().shared();
        // Deferred writes go out first, as soon as Redis answers: until then this instance
        // does not read the tier.
        tier.replay_outbox(&|c| shared.bump_shared(c));
        match heard {
            Heard::Key(pkey) => {
                tier.coherence().heard_key(pkey);
                if self.remove_by_pkey(pkey) {
                    shared.bump_shared(Counter::SharedStaleDropped);
                }
            }
            Heard::All => {
                tier.coherence().heard_all();
                shared.add_shared(Counter::SharedStaleDropped, self.clear());
            }
            Heard::LinkLost => {
                shared.add_shared(Counter::SharedStaleDropped, self.clear());
                return;
            }
            Heard::Quiet => return,
        }
        shared.bump_shared(Counter::SharedWritesHeard);
        shared.add_shared(Counter::SharedBroadcastLagMicros, lag.as_micros() as u64);
    }

    /// Starts the subscriber thread of this cache's tier; it ends soon after the cache is
    /// dropped.
    pub(crate) fn listen_to_fleet(self: &Arc<Self>)
    where
        S: Send + Sync + 'static,
    {
        let Some(tier) = self.shared() else {
            return;
        };
        let weak = Arc::downgrade(self);
        tier.subscribe(Box::new(move |heard, lag| match weak.upgrade() {
            Some(engine) => {
                engine.heard(heard, lag);
                true
            }
            None => false,
        }));
    }
}
