//! Writes that could not reach the shared tier, kept to be replayed (DESIGN.md §10 invariant
//! 13: no write lost in silence).
//!
//! A write that fails (Redis down, stalled past the timeout, an error reply) is applied
//! locally and queued here, in order, as an invalidation of its key: replaying an insert's
//! value could make it current again after a newer write made elsewhere while this one
//! waited, while an invalidation only ever moves a key's generation, so replaying it late is
//! harmless and replaying it twice is the same as once. An `invalidate_all` is queued as such.
//! Past the bound the queue is given up for one `invalidate_all` on recovery, which covers
//! every write it held. While anything is queued the instance does not read the tier (its
//! loads run locally) and queues its new writes behind the old ones; the subscriber thread
//! replays the queue whenever it wakes and Redis answers.

use crate::sync::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};

/// One write to replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deferred {
    /// An invalidation of the key with this policy key.
    Key(u64),
    /// An `invalidate_all`.
    All,
}

/// What became of a write (see `RedisTier::write`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sent {
    /// Redis applied it, and the fleet heard of it.
    Applied,
    /// Queued for replay.
    Deferred,
    /// The queue was full: recovery invalidates every shared value instead.
    Overflowed,
}

#[derive(Debug, Default)]
struct Queue {
    writes: VecDeque<Deferred>,
    /// Writes were given up past the bound: one `invalidate_all` replays them all.
    overflowed: bool,
}

/// The queue of deferred writes of one tier.
#[derive(Debug)]
pub(crate) struct Outbox {
    queue: Mutex<Queue>,
    /// Whether anything is queued: read by every load and write, so kept apart from the
    /// lock. Written under it.
    pending: AtomicBool,
    limit: usize,
}

impl Outbox {
    /// An empty outbox that holds at most `limit` writes.
    pub(crate) fn new(limit: usize) -> Self {
        Outbox {
            queue: Mutex::new(Queue::default()),
            pending: AtomicBool::new(false),
            limit,
        }
    }

    /// Whether writes wait to be replayed: then the tier is not read, and new writes queue
    /// behind them.
    pub(crate) fn pending(&self) -> bool {
        // Acquire pairs with the Release stores under the lock (`defer`, `replay`): a load
        // that sees the queue empty sees the replays that emptied it done.
        self.pending.load(Ordering::Acquire)
    }

    fn lock(&self) -> crate::sync::MutexGuard<'_, Queue> {
        self.queue.lock()
    }

    /// Queues `write` behind the others.
    pub(crate) fn defer(&self, write: Deferred) -> Sent {
        let mut q = self.lock();
        let sent = if q.overflowed {
            Sent::Overflowed
        } else if write == Deferred::All {
            // Covers every write before it.
            q.writes.clear();
            q.writes.push_back(Deferred::All);
            Sent::Deferred
        } else if q.writes.len() >= self.limit {
            q.writes.clear();
            q.overflowed = true;
            Sent::Overflowed
        } else {
            q.writes.push_back(write);
            Sent::Deferred
        };
        // Release pairs with the Acquire load in `pending`; a caller that sees true reads
        // nothing through it before it queues here, under the lock.
        self.pending.store(true, Ordering::Release);
        sent
    }

    /// Replays the queue in order with `send` (an `invalidate_all` first if it overflowed),
    /// until it is empty or a replay fails; returns how many writes it replayed. Only the
    /// subscriber thread replays, so writes are replayed once each; new ones may be queued
    /// meanwhile.
    pub(crate) fn replay<E>(&self, mut send: impl FnMut(Deferred) -> Result<(), E>) -> u64 {
        let mut replayed = 0;
        loop {
            let next = {
                let q = self.lock();
                if q.overflowed {
                    Some(Deferred::All)
                } else {
                    q.writes.front().copied()
                }
            };
            let Some(write) = next else {
                return replayed;
            };
            // Not under the lock: writers queue meanwhile.
            if send(write).is_err() {
                return replayed;
            }
            replayed += 1;
            let mut q = self.lock();
            if q.overflowed {
                // The `invalidate_all` covers every write queued before it was sent.
                q.overflowed = false;
                q.writes.clear();
            } else {
                q.writes.pop_front();
            }
            if q.writes.is_empty() && !q.overflowed {
                // Release pairs with the Acquire load in `pending`: who sees the queue empty
                // sees these replays done.
                self.pending.store(false, Ordering::Release);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_replay_in_order_and_a_failure_keeps_the_rest() {
        let o = Outbox::new(10);
        assert!(!o.pending());
        assert_eq!(o.defer(Deferred::Key(1)), Sent::Deferred);
        assert_eq!(o.defer(Deferred::Key(2)), Sent::Deferred);
        assert!(o.pending());
        let mut sent = Vec::new();
        let n = o.replay(|w| {
            if w == Deferred::Key(2) {
                return Err(());
            }
            sent.push(w);
            Ok(())
        });
        assert_eq!((n, sent.as_slice()), (1, &[Deferred::Key(1)][..]));
        assert!(o.pending(), "the write that failed stays");
        assert_eq!(o.replay(|_| Ok::<_, ()>(())), 1);
        assert!(!o.pending());
    }

    #[test]
    fn past_its_bound_the_outbox_replays_one_invalidate_all() {
        let o = Outbox::new(2);
        o.defer(Deferred::Key(1));
        o.defer(Deferred::Key(2));
        assert_eq!(o.defer(Deferred::Key(3)), Sent::Overflowed);
        assert_eq!(o.defer(Deferred::Key(4)), Sent::Overflowed);
        let mut sent = Vec::new();
        o.replay(|w| {
            sent.push(w);
            Ok::<_, ()>(())
        });
        assert_eq!(sent, [Deferred::All]);
        assert!(!o.pending());
        // An invalidate_all queued covers what was queued before it.
        o.defer(Deferred::Key(5));
        o.defer(Deferred::All);
        o.defer(Deferred::Key(6));
        let mut sent = Vec::new();
        o.replay(|w| {
            sent.push(w);
            Ok::<_, ()>(())
        });
        assert_eq!(sent, [Deferred::All, Deferred::Key(6)]);
    }
}
