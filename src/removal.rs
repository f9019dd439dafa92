//! Why values leave the cache, and the user's hooks on entries: the weigher, the per-value
//! time to live, and the eviction listener, which hears of every value that left. (The
//! bookkeeping of a removal and of an eviction is the engine's, in `engine/admit.rs`.)

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use crate::entry::{Entry, Kind};
use crate::local::Domain;
use crate::table::Node;

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
    /// Removed by [`invalidate`](crate::Cache::invalidate) or
    /// [`invalidate_all`](crate::Cache::invalidate_all).
    Invalidated,
    /// Replaced by an [`insert`](crate::Cache::insert) of the same key, or by a load or early
    /// refresh of it. A value being refreshed (readers are served it meanwhile) is reported
    /// once, when the refresh ends: replaced by its new value, or dropped by a refresh that
    /// failed without [`stale_if_error`](crate::CacheBuilder::stale_if_error); a refresh that
    /// fails with it, or runs past its `load_timeout`, puts the value back, and nothing is
    /// reported then.
    Replaced,
    /// Heavier (by the [`weigher`](crate::CacheBuilder::weigher)) than the whole
    /// `max_capacity`: the write that put it in the cache took it out again at once. This is
    /// the only way a write can be evicted by the admission it triggers.
    Oversized,
}

/// The most notifications one chain of listener calls may make: those made by the writes of
/// the listener calls that a first, outermost call (run by some operation of the cache)
/// started, directly or through each other. Past it, the rest of the chain's removals are
/// not told to the listener (counted in [`Stats::listener_skipped`](crate::Stats::listener_skipped)).
///
/// A listener that writes to its own full cache on every call makes a chain that never ends
/// by itself: each write evicts, and each eviction is told to the listener. While a chain
/// runs, the operation that started it holds its epoch pin, so nothing removed meanwhile can
/// be freed: unbounded, the chain held every value it evicted until memory ran out. Chains
/// that end by themselves are short (a write-back of a few entries); this one never does.
pub const MAX_LISTENER_CHAIN: usize = 1_024;

thread_local! {
    /// Whether this thread is inside an eviction listener (of any cache).
    static LISTENING: Cell<bool> = const { Cell::new(false) };
    /// Notifications made so far in the chain the outermost listener call started.
    static CHAINED: Cell<usize> = const { Cell::new(0) };
    /// Notifications made while it was, to run when it returns.
    static QUEUED: RefCell<VecDeque<Box<dyn FnOnce()>>> = const { RefCell::new(VecDeque::new()) };
}

/// The value the listener hears of when `node` leaves the table: its ready value, or the
/// value a refresh in progress still served (which stayed in the cache's keeping until the
/// refresh ended). A load of a missing or expired value holds none: an expired value it
/// replaced was told of when the load started.
fn told_value<K, V>(node: &Node<K, Entry<V>>) -> Option<&V> {
    match node.value.kind() {
        Kind::Ready(r) => Some(r.value),
        Kind::Loading(flight) if flight.is_refresh() => flight.stale(),
        Kind::Loading(_) | Kind::Failed { .. } => None,
    }
}

/// Tells `listen` of `node`'s value, if it holds one, containing a panic.
fn call_listener<K, V>(listen: &Listener<K, V>, node: &Node<K, Entry<V>>, cause: RemovalCause) {
    crate::sync::user_code_may_run("the eviction listener");
    if let Some(value) = told_value(node) {
        let _ = catch_unwind(AssertUnwindSafe(|| listen(&node.key, value, cause)));
    }
}

/// The user's eviction listener.
pub(crate) type Listener<K, V> = Arc<dyn Fn(&K, &V, RemovalCause) + Send + Sync>;
/// The user's weigher.
pub(crate) type Weigher<K, V> = Arc<dyn Fn(&K, &V) -> u64 + Send + Sync>;
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

impl<K, V> Hooks<K, V> {
    /// The weight of a value for `key` (1 without a weigher). Runs user code: call it before
    /// touching the table, so that a panic leaves nothing half done.
    pub(crate) fn weight_of(&self, key: &K, value: &V) -> u64 {
        match &self.weigher {
            // A weight of 0 counts as 1, so every entry counts against the bound.
            Some(w) => {
                crate::sync::user_code_may_run("the weigher");
                w(key, value).max(1)
            }
            None => 1,
        }
    }

    /// The time to live, in nanoseconds, of `value` written now for `key` by an insert or a
    /// load: the `expire_after` hook's answer, else `default` (the cache's `time_to_live`;
    /// `None`: never expires). Runs user code: call it before touching the table, as
    /// `weight_of`.
    pub(crate) fn ttl_of(&self, key: &K, value: &V, default: Option<u64>) -> Option<u64> {
        match &self.expire_after {
            Some(f) => {
                crate::sync::user_code_may_run("the expire_after hook");
                f(key, value)
                    .map(crate::clock::duration_to_nanos)
                    .or(default)
            }
            None => default,
        }
    }

    /// Tells the listener that `entry`'s value left the cache, if it held one. A panic in the
    /// listener is caught and dropped: the cache's state is already consistent.
    ///
    /// Listeners never nest: a notification made while this thread is inside a listener (its
    /// writes evicted something) is queued, and run once that listener has returned, so a
    /// listener that writes to the cache cannot recurse without bound. The queued node is
    /// kept alive by a nested pin of this thread's handle.
    ///
    /// Returns whether a listener ran here (user code, which may have taken any time).
    pub(crate) fn notify(
        &self,
        domain: &Domain,
        node: &Node<K, Entry<V>>,
        cause: RemovalCause,
    ) -> bool
    where
        K: 'static,
        V: 'static,
    {
        let (Some(listen), Some(_)) = (&self.listener, told_value(node)) else {
            return false;
        };
        let nested = LISTENING.try_with(Cell::get).unwrap_or(false);
        if nested {
            let chained = CHAINED.try_with(|c| c.replace(c.get() + 1)).unwrap_or(0);
            if chained >= MAX_LISTENER_CHAIN {
                if chained == MAX_LISTENER_CHAIN {
                    crate::trace::trace_event!(
                        WARN,
                        "a chain of eviction listener calls reached MAX_LISTENER_CHAIN: the rest of its removals go untold (the listener's writes keep evicting)"
                    );
                }
                domain.pin().count(crate::stats::Counter::ListenerSkipped);
                return false;
            }
            if let Some(guard) = domain.pin().into_nested_guard() {
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
                    return false;
                }
            }
            // No thread-local handle or storage (thread teardown): call it now.
            call_listener(listen, node, cause);
            return true;
        }
        let _ = LISTENING.try_with(|l| l.set(true));
        let _ = CHAINED.try_with(|c| c.set(0));
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
        true
    }
}
