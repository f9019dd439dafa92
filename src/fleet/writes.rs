//! The tier's side of the cache's writes: announcing an insert or an invalidation (of a key,
//! or of all) to the fleet, and starting the subscriber that hears the others'. What the
//! cache does with them is the engine's (`engine/fleet.rs`).

use std::sync::Arc;
use std::time::Duration;

use super::coherence;
use super::redis_store::Write;
use super::RedisTier;
use crate::stats::Counter;

impl<K, V: 'static> RedisTier<K, V> {
    /// Announces and applies a write of the key with policy key `pkey` (`value`: an insert's
    /// value and TTL; `None`: an invalidation). A store failure is counted, logged and leaves
    /// the shared copy to its expiry.
    pub(crate) fn write(
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
                    super::tagged(self.value_tag, bytes),
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

    /// Announces an invalidation of every key (under the tier's prefix) to the fleet.
    pub(crate) fn announce_invalidate_all(&self, count: &dyn Fn(Counter)) {
        self.coherence.heard_all();
        let message = self.coherence.message(None);
        self.sent(self.sync.invalidate_all(&self.channel, &message), count);
    }

    /// Starts the subscriber thread, which hands what it hears to `heard` until that returns
    /// false (the cache is gone).
    pub(crate) fn subscribe(&self, heard: coherence::OnHeard) {
        coherence::subscribe(
            self.client.clone(),
            self.channel.clone(),
            Arc::clone(&self.coherence),
            self.op_timeout,
            self.retry_after,
            heard,
        );
    }
}
