//! The tier's side of the cache's writes: announcing an insert or an invalidation (of a key,
//! or of all) to the fleet, and starting the subscriber that hears the others'. What the
//! cache does with them is the engine's (`engine/fleet.rs`).

use std::sync::Arc;
use std::time::Duration;

use super::coherence;
use super::outbox::{Deferred, Sent};
use super::redis_store::Write;
use super::RedisTier;
use crate::stats::Counter;

impl<K, V: 'static> RedisTier<K, V> {
    /// Announces and applies a write of the key with policy key `pkey` (`value`: an insert's
    /// value and TTL; `None`: an invalidation). A write that fails, or that comes while
    /// others wait to be replayed, is queued (see `outbox.rs`): counted, logged, and
    /// replayed as an invalidation.
    pub(crate) fn write(
        &self,
        key: Option<&K>,
        pkey: u64,
        value: Option<(&V, Option<Duration>)>,
        count: &dyn Fn(Counter),
    ) -> Sent {
        if self.outbox.pending() {
            return self.deferred(Deferred::Key(pkey), None, count);
        }
        // Tried even while loads skip Redis after a failure: a write that does not reach the
        // tier leaves the old value to every other instance.
        let generation_key = self.generation_key(pkey);
        let message = self.coherence.message(Some(pkey));
        // Not shareable (a codec error, too large): still invalidate, so no instance serves
        // the old value.
        let encoded = match (key, value) {
            (Some(k), Some((v, ttl))) => {
                super::encode(&*self.codec, self.value_tag, self.max_value_size, v, count).map(
                    |bytes| {
                        (
                            format!("{}v:{}", self.prefix, (self.key_name)(k)),
                            bytes,
                            self.shared_ttl(ttl),
                        )
                    },
                )
            }
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
        match self.sync.write(w) {
            Ok(()) => {
                count(Counter::SharedWritesSent);
                Sent::Applied
            }
            Err(e) => self.deferred(Deferred::Key(pkey), Some(e), count),
        }
    }

    /// Queues `write`, which failed with `failure` (or came while others wait).
    fn deferred(
        &self,
        write: Deferred,
        failure: Option<super::StoreError>,
        count: &dyn Fn(Counter),
    ) -> Sent {
        let sent = self.outbox.defer(write);
        count(Counter::SharedWritesFailed);
        if let Some(e) = failure {
            count(Counter::SharedErrors);
            self.health.failed(&e);
        }
        self.health.deferred(sent);
        sent
    }

    /// Announces an invalidation of every key (under the tier's prefix) to the fleet.
    pub(crate) fn announce_invalidate_all(&self, count: &dyn Fn(Counter)) -> Sent {
        self.coherence.heard_all();
        if self.outbox.pending() {
            return self.deferred(Deferred::All, None, count);
        }
        let message = self.coherence.message(None);
        match self.sync.invalidate_all(&self.channel, &message) {
            Ok(()) => {
                count(Counter::SharedWritesSent);
                Sent::Applied
            }
            Err(e) => self.deferred(Deferred::All, Some(e), count),
        }
    }

    /// Replays the writes that wait in the outbox, in order, while Redis answers (the
    /// subscriber thread does, whenever it wakes).
    pub(crate) fn replay_outbox(&self, count: &dyn Fn(Counter)) {
        if !self.outbox.pending() || self.health.is_down() {
            return;
        }
        let mut failure = None;
        let replayed = self.outbox.replay(|write| {
            let r = match write {
                Deferred::Key(pkey) => {
                    let generation_key = self.generation_key(pkey);
                    let message = self.coherence.message(Some(pkey));
                    self.sync.write(Write {
                        generation_key: &generation_key,
                        generation_ttl: self.generation_ttl(),
                        value: None,
                        channel: &self.channel,
                        message: &message,
                    })
                }
                Deferred::All => {
                    let message = self.coherence.message(None);
                    self.sync.invalidate_all(&self.channel, &message)
                }
            };
            r.map_err(|e| failure = Some(e))
        });
        for _ in 0..replayed {
            count(Counter::SharedWritesReplayed);
        }
        if let Some(e) = failure {
            count(Counter::SharedErrors);
            self.health.failed(&e);
        }
    }

    /// Starts the subscriber thread, which hands what it hears to `heard` until that returns
    /// false (the cache is gone).
    pub(crate) fn subscribe(&self, heard: coherence::OnHeard) {
        let link = coherence::Link {
            client: self.client.clone(),
            channel: self.channel.clone(),
            coherence: Arc::clone(&self.coherence),
            op_timeout: self.op_timeout,
            keepalive: self.keepalive,
            refused: self.health.refused_flag(),
            on_heard: heard,
        };
        coherence::subscribe(link, self.retry_after);
    }
}
