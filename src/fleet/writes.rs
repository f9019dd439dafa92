//! The cache's side of fleet coherence: its writes go through the tier, what the subscriber
//! hears drops local copies, and a load or insert that ran while a write of its key was heard
//! drops what it installed.

use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::time::Duration;

use super::coherence::{self, Heard, OwnWrite};
use super::redis_store::Write;
use super::{Keep, RedisTier, Seen};
use crate::cache::Cache;
use crate::stats::Counter;

/// A write this instance made through the tier, for the check after its local half (it
/// counts as in progress until dropped).
pub(crate) struct Written<'a> {
    pkey: u64,
    own: OwnWrite<'a>,
    /// The longest the local copy may live (nanoseconds): the coherence bound while the link
    /// is down.
    pub(crate) cap: Option<u64>,
}

impl<K, V: 'static> RedisTier<K, V> {
    /// Announces and applies a write of the key with policy key `pkey` (`value`: an insert's
    /// value and TTL; `None`: an invalidation). A store failure is counted, logged and leaves
    /// the shared copy to its expiry.
    fn write(
        &self,
        key: Option<&K>,
        pkey: u64,
        value: Option<(&V, Option<Duration>)>,
        count: &dyn Fn(Counter),
    ) {
        // Tried even while loads skip Redis after a failure: a write that does not reach the
        // tier leaves the old value to every other instance.
        let generation_key = self.generation_key(pkey);
        let message = self.coherence.message(Some(pkey));
        let encoded = match (key, value) {
            (Some(k), Some((v, ttl))) => match self.codec.encode(v) {
                Ok(bytes) => Some((
                    format!("{}v:{}", self.prefix, (self.key_name)(k)),
                    bytes,
                    self.shared_ttl(ttl),
                )),
                // Not shareable: still invalidate, so no instance serves the old value.
                Err(_) => {
                    count(Counter::SharedCodecErrors);
                    None
                }
            },
            _ => None,
        };
        let w = Write {
            generation_key: &generation_key,
            generation_ttl: self.generation_ttl(),
            value: encoded
                .as_ref()
                .map(|(name, bytes, ttl)| (name.as_str(), bytes.clone(), *ttl)),
            channel: &self.channel,
            message: &message,
        };
        self.sent(self.sync.write(w), count);
    }

    fn sent(&self, r: Result<(), super::StoreError>, count: &dyn Fn(Counter)) {
        match r {
            Ok(()) => count(Counter::SharedWritesSent),
            Err(e) => {
                count(Counter::SharedErrors);
                self.health.failed(&e);
            }
        }
    }
}

impl<K, V, S> Cache<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// The tier's half of an insert (`value` with its TTL in nanoseconds) or an invalidation
    /// (`None`) of the key with policy key `pkey`; `None` without a tier.
    pub(crate) fn write_through(
        &self,
        key: Option<&K>,
        pkey: u64,
        value: Option<(&V, Option<u64>)>,
    ) -> Option<Written<'_>> {
        let tier = self.inner.shared()?;
        // Our own loads of the key in flight must not install what they read before this.
        let own = tier.coherence().begin_write(pkey);
        let count = self.inner.counting();
        let ttl = value.and_then(|(_, t)| t).map(Duration::from_nanos);
        tier.write(key, pkey, value.map(|(v, _)| (v, ttl)), &count);
        let cap = match tier.keep(None) {
            Keep::For(Some(bound)) => Some(crate::clock::duration_to_nanos(bound)),
            _ => None,
        };
        Some(Written { pkey, own, cap })
    }

    /// The tier's half of `invalidate_all`.
    pub(crate) fn invalidate_all_through(&self) {
        let Some(tier) = self.inner.shared() else {
            return;
        };
        tier.coherence().heard_all();
        let count = self.inner.counting();
        let message = tier.coherence().message(None);
        tier.sent(tier.sync.invalidate_all(&tier.channel, &message), &count);
    }

    /// After a local install (an insert's, or a load's): drops it if another instance's write
    /// of a key in its slot was heard since `seen`, or the link changed.
    pub(crate) fn recheck(&self, pkey: u64, seen: Seen) {
        let Some(tier) = self.inner.shared() else {
            return;
        };
        if tier.coherence().changed_since(seen) && self.inner.remove_by_pkey(pkey) {
            self.inner.pin().count(Counter::SharedStaleDropped);
        }
    }

    /// `recheck` for a write made by `write_through`, which also drops the copy if another
    /// write of the key on this instance overlapped it.
    pub(crate) fn recheck_write(&self, written: Written<'_>) {
        if !written.own.may_keep() && self.inner.remove_by_pkey(written.pkey) {
            self.inner.pin().count(Counter::SharedStaleDropped);
        }
    }

    /// What the subscriber heard.
    fn heard(&self, heard: Heard, lag: Duration) {
        let Some(tier) = self.inner.shared() else {
            return;
        };
        let shared = self.inner.counters().shared();
        match heard {
            Heard::Key(pkey) => {
                tier.coherence().heard_key(pkey);
                if self.inner.remove_by_pkey(pkey) {
                    shared.bump_shared(Counter::SharedStaleDropped);
                }
            }
            Heard::All => {
                tier.coherence().heard_all();
                shared.add_shared(Counter::SharedStaleDropped, self.clear_local());
            }
            Heard::LinkLost => {
                shared.add_shared(Counter::SharedStaleDropped, self.clear_local());
                return;
            }
            Heard::Quiet => return,
        }
        shared.bump_shared(Counter::SharedWritesHeard);
        shared.add_shared(Counter::SharedBroadcastLagMicros, lag.as_micros() as u64);
    }

    /// Starts the subscriber thread of this cache's tier; it ends soon after the cache is
    /// dropped.
    pub(crate) fn listen_to_fleet(&self)
    where
        S: Send + Sync + 'static,
    {
        let Some(tier) = self.inner.shared() else {
            return;
        };
        let weak = Arc::downgrade(&self.inner);
        coherence::subscribe(
            tier.client.clone(),
            tier.channel.clone(),
            Arc::clone(tier.coherence()),
            tier.op_timeout,
            tier.retry_after,
            Box::new(move |heard, lag| match weak.upgrade() {
                Some(inner) => {
                    Cache { inner }.heard(heard, lag);
                    true
                }
                None => false,
            }),
        );
    }
}
