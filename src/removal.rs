//! What happens when an entry leaves the table: the policy forgets it, the counters count it,
//! and the eviction listener hears about a value that left; and, for a published write, the
//! policy learns of it and names the victims that make room for it.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use crate::cache::Cache;
use crate::clock::OnceNow;
use crate::entry::{Entry, Kind};
use crate::local::Pinned;
use crate::policy::{Look, Victim, Write};
use crate::stats::Counter;
use crate::table::{Decision, Node, Outcome};

/// Why a value left the cache, as told to the
/// [`eviction_listener`](crate::CacheBuilder::eviction_listener).
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use herdcache::RemovalCause;
/// let causes = Arc::new(Mutex::new(Vec::new()));
/// let seen = Arc::clone(&causes);
/// let cache = herdcache::Cache::builder()
///     .max_capacity(1)
///     .eviction_listener(move |_k: &u32, _v: &u32, cause| seen.lock().unwrap().push(cause))
///     .build()?;
/// cache.insert(1, 1);
/// cache.insert(1, 2); // replaces 1's value
/// cache.insert(2, 2); // no room for both: 1 is evicted
/// cache.invalidate_all();
/// use RemovalCause::*;
/// assert_eq!(*causes.lock().unwrap(), [Replaced, Size, Invalidated]);
/// # Ok::<(), herdcache::BuildError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RemovalCause {
    /// Evicted to keep the cache within its capacity.
    Size,
    /// It had expired (removed when read, replaced by a load, or chosen for eviction).
    Expired,
    /// Removed by [`invalidate`](Cache::invalidate) or
    /// [`invalidate_all`](Cache::invalidate_all).
    Invalidated,
    /// Replaced by an [`insert`](Cache::insert) of the same key, or by a load or early
    /// refresh of it (the refresh's old value leaves the table when the refresh starts, though
    /// readers keep being served it until the new one arrives).
    Replaced,
    /// Heavier (by the [`weigher`](crate::CacheBuilder::weigher)) than the whole
    /// `max_capacity`: the write that put it in the cache took it out again at once. This is
    /// the only way a write can be evicted by the admission it triggers.
    Oversized,
}

thread_local! {
    /// Whether this thread is inside an eviction listener (of any cache).
    static LISTENING: Cell<bool> = const { Cell::new(false) };
    /// Notifications made while it was, to run when it returns.
    static QUEUED: RefCell<VecDeque<Box<dyn FnOnce()>>> = const { RefCell::new(VecDeque::new()) };
}

/// Tells `listen` of `node`'s value, if it holds one, containing a panic.
fn call_listener<K, V>(listen: &Listener<K, V>, node: &Node<K, Entry<V>>, cause: RemovalCause) {
    if let Kind::Ready(r) = &node.value.kind {
        let _ = catch_unwind(AssertUnwindSafe(|| listen(&node.key, &r.value, cause)));
    }
}

/// The user's eviction listener.
pub(crate) type Listener<K, V> = Arc<dyn Fn(&K, &V, RemovalCause) + Send + Sync>;
/// The user's weigher.
pub(crate) type Weigher<K, V> = Arc<dyn Fn(&K, &V) -> u32 + Send + Sync>;
/// The user's per-value time to live (`CacheBuilder::expire_after`).
pub(crate) type ExpireAfter<K, V> = Arc<dyn Fn(&K, &V) -> Option<Duration> + Send + Sync>;

/// The optional user hooks on entries.
pub(crate) struct Hooks<K, V> {
    pub(crate) weigher: Option<Weigher<K, V>>,
    pub(crate) listener: Option<Listener<K, V>>,
    pub(crate) expire_after: Option<ExpireAfter<K, V>>,
}

impl<K, V> Clone for Hooks<K, V> {
    fn clone(&self) -> Self {
        Hooks {
            weigher: self.weigher.clone(),
            listener: self.listener.clone(),
            expire_after: self.expire_after.clone(),
        }
    }
}

impl<K, V> Default for Hooks<K, V> {
    fn default() -> Self {
        Hooks {
            weigher: None,
            listener: None,
            expire_after: None,
        }
    }
}

impl<K, V> fmt::Debug for Hooks<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hooks")
            .field("weigher", &self.weigher.is_some())
            .field("listener", &self.listener.is_some())
            .finish()
    }
}

impl<K, V, S> Cache<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// The policy key of `key` (any borrowed form hashes alike).
    #[inline]
    pub(crate) fn pkey<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.inner.pkeys.hash_one(key)
    }

    /// The weight of a value for `key` (1 without a weigher). Runs user code: call it before
    /// touching the table, so that a panic leaves nothing half done.
    pub(crate) fn weight_of(&self, key: &K, value: &V) -> u64 {
        match &self.inner.hooks.weigher {
            // A weight of 0 counts as 1, so every entry counts against the bound.
            Some(w) => u64::from(w(key, value)).max(1),
            None => 1,
        }
    }

    /// The time to live, in nanoseconds, of `value` written now for `key` by an insert or a
    /// load: the `expire_after` hook's answer, else the cache's `time_to_live` (`None`:
    /// never expires). Runs user code: call it before touching the table, as `weight_of`.
    pub(crate) fn ttl_of(&self, key: &K, value: &V) -> Option<u64> {
        match &self.inner.hooks.expire_after {
            Some(f) => f(key, value)
                .map(crate::clock::duration_to_nanos)
                .or(self.inner.time_to_live),
            None => self.inner.time_to_live,
        }
    }

    /// Tells the listener that `entry`'s value left the cache, if it held one. A panic in the
    /// listener is caught and dropped: the cache's state is already consistent.
    ///
    /// Listeners never nest: a notification made while this thread is inside a listener (its
    /// writes evicted something) is queued, and run once that listener has returned, so a
    /// listener that writes to the cache cannot recurse without bound. The queued node is
    /// kept alive by a nested pin of this thread's handle.
    pub(crate) fn notify(&self, node: &Node<K, Entry<V>>, cause: RemovalCause) {
        let (Some(listen), Kind::Ready(_)) = (&self.inner.hooks.listener, &node.value.kind) else {
            return;
        };
        let nested = LISTENING.try_with(Cell::get).unwrap_or(false);
        if nested {
            if let Some(guard) = self.inner.domain.pin().into_nested_guard() {
                let listen = Arc::clone(listen);
                let node = node as *const Node<K, Entry<V>> as usize;
                let job: Box<dyn FnOnce()> = Box::new(move || {
                    // SAFETY: `guard` is a nested pin of the handle whose guard the caller
                    // held while `node` was reachable, so the collector has not freed it.
                    let node = unsafe { &*(node as *const Node<K, Entry<V>>) };
                    call_listener(&listen, node, cause);
                    drop(guard);
                });
                if QUEUED.try_with(|q| q.borrow_mut().push_back(job)).is_ok() {
                    return;
                }
            }
            // No thread-local handle or storage (thread teardown): call it now.
            call_listener(listen, node, cause);
            return;
        }
        let _ = LISTENING.try_with(|l| l.set(true));
        call_listener(listen, node, cause);
        // What the listener's own writes evicted, in order, each after the one before it
        // has returned.
        while let Some(job) = QUEUED
            .try_with(|q| q.borrow_mut().pop_front())
            .ok()
            .flatten()
        {
            job();
        }
        let _ = LISTENING.try_with(|l| l.set(false));
    }

    /// `cause`, or `Expired` if the entry had expired.
    pub(crate) fn cause_for(&self, entry: &Entry<V>, cause: RemovalCause) -> RemovalCause {
        if entry.is_expired(|| self.now()) {
            RemovalCause::Expired
        } else {
            cause
        }
    }

    /// Tells the policy that the table no longer holds `entry` (removed by the caller).
    pub(crate) fn forget_in_policy(&self, pkey: u64, version: u64) {
        self.inner.policy.with(pkey, |p| p.remove(pkey, version));
    }

    /// An entry the caller removed from the table: the policy forgets it, it is counted, and
    /// the listener hears of its value.
    pub(crate) fn removed(
        &self,
        node: &Node<K, Entry<V>>,
        cause: RemovalCause,
        pinned: &Pinned<'_>,
    ) {
        let entry = &node.value;
        // A load in progress too: the policy may still track the write it replaced.
        self.forget_in_policy(entry.pkey, entry.version);
        let cause = self.cause_for(entry, cause);
        match cause {
            RemovalCause::Expired => pinned.count(Counter::Expirations),
            RemovalCause::Invalidated if entry.live_value(|| self.now()).is_some() => {
                pinned.count(Counter::Invalidations)
            }
            _ => {}
        }
        self.notify(node, cause);
    }

    /// Tells the policy that the table now holds `node` (just published by the caller, with
    /// `weight`), and evicts what the policy chooses to stay within capacity.
    pub(crate) fn admit(&self, node: &Node<K, Entry<V>>, weight: u64, pinned: &Pinned<'_>) {
        let guard = &pinned.guard;
        let table = &self.inner.table;
        // Collected for the listener, which must run outside the lock; without one, nothing
        // is collected (and nothing allocated).
        let listening = self.inner.hooks.listener.is_some();
        let mut evicted: Vec<(&Node<K, Entry<V>>, RemovalCause)> = Vec::new();
        self.inner
            .policy
            .with_scratch(node.value.pkey, |policy, victims| {
                // Only a write the table still holds is tracked; a later write (or a removal)
                // reports itself under this lock after us. The node cannot have been freed and
                // its address reused: our guard has been held since it was published.
                let current = table.get_node(node.hash, |n| std::ptr::eq(n, node), guard);
                if !current.is_some_and(|c| std::ptr::eq(c, node)) {
                    return;
                }
                let entry = &node.value;
                let now = OnceNow::new(&self.inner.clock);
                // Nodes are matched by the policy key they store, never by hashing or comparing
                // keys: no user code runs under the policy's lock.
                let mut probe =
                    |v: &Victim| match table.get_node(v.hash, |n| n.value.pkey == v.pkey, guard) {
                        Some(n) => Look {
                            hits: n.value.policy.take_hits(),
                            expired: n.value.is_expired(|| now.get()),
                        },
                        None => Look::default(),
                    };
                let write = Write {
                    pkey: entry.pkey,
                    hash: node.hash,
                    version: entry.version,
                    weight,
                };
                let counters = self.inner.domain.counters();
                policy.write(write, victims, &mut probe, &|| counters.requests());
                for v in victims.iter() {
                    // The victim's write, or an older one it replaced, never a load in progress
                    // or a newer write (that one reports itself, and the policy tracks it anew).
                    let outcome = table.update_node(
                        v.hash,
                        |n| n.value.pkey == v.pkey,
                        None,
                        |cur| match cur {
                            Some(n) if n.value.is_tracked() && n.value.version <= v.version => {
                                Decision::Remove
                            }
                            _ => Decision::Keep,
                        },
                        guard,
                    );
                    if let Outcome::Removed(old) = outcome {
                        let cause = if v.pkey == write.pkey && v.version == write.version {
                            pinned.count(Counter::Evictions);
                            RemovalCause::Oversized
                        } else if old.value.is_expired(|| now.get()) {
                            pinned.count(Counter::Expirations);
                            RemovalCause::Expired
                        } else {
                            pinned.count(Counter::Evictions);
                            RemovalCause::Size
                        };
                        if listening {
                            evicted.push((old, cause));
                        }
                    }
                }
            });
        // Outside the lock: the listener is user code.
        for (old, cause) in evicted {
            self.notify(old, cause);
        }
        self.sweep_after_write(pinned);
    }
}
