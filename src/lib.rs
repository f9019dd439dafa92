//! A lock-free concurrent in-process cache for very hot read paths.
//!
//! herdcache is for keys that are read tens of thousands of times a second: a hit takes no
//! lock and, once an entry is hot, writes no memory that another core writes. The cache is
//! bounded by entry count (or total weight) and evicts with W-TinyLFU, whose hits stay
//! write-free.
//!
//! # Getting started
//!
//! ```
//! use std::time::Duration;
//! use herdcache::Cache;
//!
//! let cache: Cache<String, u64> = Cache::builder()
//!     .max_capacity(10_000)                  // required
//!     .time_to_live(Duration::from_secs(60)) // optional
//!     .build()?;
//!
//! cache.insert("a".to_owned(), 1);
//! assert_eq!(cache.get("a"), Some(1));       // look up with any `Q` where `K: Borrow<Q>`
//! assert!(cache.invalidate("a"));
//! assert_eq!(cache.get("a"), None);
//! # Ok::<(), herdcache::BuildError>(())
//! ```
//!
//! A [`Cache`] is a handle: clone it into every thread that needs it; all clones are one cache.
//!
//! # Reading without cloning
//!
//! [`Cache::get`] clones the value, which for an `Arc<T>` is a reference-count increment on a
//! line every reader shares. [`Cache::pin`] returns a [`CacheGuard`] that lends `&V` instead,
//! and amortises the epoch pin over many reads:
//!
//! ```
//! use std::sync::Arc;
//! let cache = herdcache::Cache::builder().max_capacity(100).build()?;
//! for k in 0..10u32 {
//!     cache.insert(k, Arc::new(k.to_string()));
//! }
//! let guard = cache.pin();
//! let total: usize = (0..10u32).filter_map(|k| guard.get(&k)).map(|s| s.len()).sum();
//! assert_eq!(total, 10);
//! # Ok::<(), herdcache::BuildError>(())
//! ```
//!
//! While a guard lives, entries removed from the cache (by any thread) are not freed; keep
//! guards for a batch of reads.
//!
//! # Loading on a miss, once (single flight)
//!
//! [`Cache::get_or_load`] returns the cached value or, on a miss, runs the loader in exactly
//! one caller while every other caller for that key parks and receives the same result:
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! let cache = herdcache::Cache::builder().max_capacity(100).build()?;
//! let loads = AtomicUsize::new(0);
//! std::thread::scope(|s| {
//!     for _ in 0..8 {
//!         s.spawn(|| {
//!             let v = cache.get_or_load(&"config", |_| {
//!                 loads.fetch_add(1, Ordering::Relaxed);
//!                 Ok::<_, std::io::Error>(42)
//!             });
//!             assert_eq!(v.unwrap(), 42);
//!         });
//!     }
//! });
//! assert_eq!(loads.load(Ordering::Relaxed), 1);
//! # Ok::<(), herdcache::BuildError>(())
//! ```
//!
//! - The value is cached before any waiter wakes, so waiters and later readers agree.
//! - A loader error goes to every waiter as the same [`LoadError::Failed`]`(Arc<E>)` and is not
//!   cached, unless [`negative_ttl`](CacheBuilder::negative_ttl) asks for it to be.
//! - A panicking loader wakes every waiter with [`LoadError::Panicked`]; the panic continues
//!   in the caller that ran it, and the next caller loads afresh. Nothing stays parked.
//! - [`Cache::get_or_load_timeout`] bounds the wait: at the deadline a waiter gets the expired
//!   value the load is replacing, if it expired at most [`max_stale`](CacheBuilder::max_stale)
//!   ago, else [`LoadError::Timeout`]; the load goes on for the others and is cached. (The
//!   ordering guarantee: a waiter that gets a value got the load's value or the stale one,
//!   never a value older than the stale one.)
//! - Every load has its own deadline with [`load_timeout`](CacheBuilder::load_timeout)
//!   (strongly recommended): a loader that hangs is detached at it, its waiters are answered
//!   (the stale value within `max_stale`, else [`LoadError::LoadTimedOut`]), its load permit
//!   is returned, the next caller loads afresh, and the detached load's late result is
//!   never cached. It is off by default, and then a loader that never returns blocks its
//!   key for ever (callers with a deadline of their own still give up at it).
//! - An [`insert`](Cache::insert) or [`invalidate`](Cache::invalidate) during a load wins:
//!   the load's result reaches its own waiters but is not cached, so it can never overwrite
//!   newer data. [`forget`](Cache::forget) detaches a load: its waiters look again (one of
//!   them leads a new load) and its result is not cached.
//! - Read-your-write: a value just written, by [`insert`](Cache::insert) or by a load, is
//!   never evicted by the admission its own write triggers, so the next read finds it and a
//!   hot key is never loaded twice in a row. (Only an entry heavier than the whole capacity
//!   leaves at once, reported as [`RemovalCause::Oversized`].)
//! - A loader that calls back into the cache for its own key gets [`LoadError::Recursive`].
//!
//! # Which loading call when
//!
//! Every loading call is the same single flight over the same entries (threads and futures
//! share loads), takes the key by any borrowed form (`&str` for `String` keys), and differs
//! in who runs the loader and how long the caller waits:
//!
//! | Call | Caller | Loader runs | Caller waits | Needs |
//! |---|---|---|---|---|
//! | [`get_or_load`](Cache::get_or_load) | thread | in the caller that wins (and refreshes there) | until the load ends, or `load_timeout` | |
//! | [`get_or_load_timeout`](Cache::get_or_load_timeout) | thread | as `get_or_load` | at most its timeout, then the stale value or `Timeout` | |
//! | [`get_with`](Cache::get_with) | thread | as `get_or_load`, for a loader that cannot fail | until it has a value | |
//! | [`get_or_load_background`](Cache::get_or_load_background) | thread | misses inline; early refreshes on the spawner | never for a refresh | a spawner |
//! | [`get_or_load_async`](Cache::get_or_load_async) | future | in the future that wins; dropping it cancels the load | until the load ends | |
//! | [`get_or_load_async_until`](Cache::get_or_load_async_until) | future | as `get_or_load_async` | until its deadline future | |
//! | [`get_with_async`](Cache::get_with_async) | future | as `get_or_load_async`, cannot fail | until it has a value | |
//! | [`get_or_load_spawned`](Cache::get_or_load_spawned) | future | as a task on the spawner: outlives every caller | until the load ends | a spawner |
//! | [`get_or_load_spawned_until`](Cache::get_or_load_spawned_until) | future | as `get_or_load_spawned` | until its deadline future | a spawner |
//! | [`optionally_get_with`](Cache::optionally_get_with) | thread | as `get_with`, for a loader that may find nothing | until it has an answer | |
//! | [`optionally_get_with_async`](Cache::optionally_get_with_async) | future | as `get_with_async`, for a loader that may find nothing | until it has an answer | |
//! | [`get_or_load_all`](Cache::get_or_load_all) | thread | one batch call for the keys that miss, each key still one flight | until every key is done | |
//! | [`get_or_load_all_async`](Cache::get_or_load_all_async) | future | as `get_or_load_all`, a batch future | until every key is done | |
//! | [`warm`](Cache::warm) | thread | on up to `concurrency` threads, for a list of keys | until every key is done | |
//!
//! [`Cache::compute`] is the read-modify-write of one key: its closure sees the current
//! value and puts a new one, removes it or keeps it, atomically with the key's other writes
//! and loads (it waits for a load in flight, and a load that starts meanwhile waits for it).
//!
//! For async services behind request timeouts, `get_or_load_spawned`: a load a timed-out
//! caller started still finishes and is cached. "A spawner" is the one
//! [`Spawner`] given to [`CacheBuilder::spawner`]: `TokioSpawner` (feature `tokio`),
//! [`ThreadSpawner`], or your own for another executor; it takes both the futures' load tasks
//! and the threads' refresh jobs. A call that needs one on a cache built without it returns
//! [`LoadError::NoSpawner`] at once, never a silent inline load.
//!
//! # Refreshing before expiry
//!
//! With early refresh on, a hot key is reloaded before it expires, by one caller of
//! `get_or_load`, while all other readers keep getting the current value without waiting:
//!
//! - [`xfetch(beta)`](CacheBuilder::xfetch): XFetch probabilistic early expiration. A hit
//!   refreshes when `now - delta * beta * ln(U) >= expiry` (delta: the measured load time, U:
//!   uniform in (0, 1] from a per-thread RNG). Far from expiry a hit pays one comparison. At
//!   R reads a second the first refresh comes about `delta * beta * ln(R * delta * beta)`
//!   before the expiry, so hotter keys refresh earlier; it never comes before
//!   `expiry - delta - ttl / 5`, nor before 4/5 of a TTL after the previous load started, so
//!   a key is loaded at most about 1.25 times per TTL however hot it is, whatever the beta,
//!   and however far one slow load has raised the estimate `delta`.
//! - [`refresh_after(soft_ttl)`](CacheBuilder::refresh_after): stale-while-revalidate. After
//!   the soft TTL the next `get_or_load` refreshes; the hard TTL still bounds staleness.
//! - [`stale_if_error(true)`](CacheBuilder::stale_if_error): a failed refresh keeps the old
//!   value until its hard expiry and retries after a backoff.
//!
//! With `get_or_load`, the refresh runs inline in the caller that wins it (that caller waits
//! for the load; nobody else does). With [`Cache::get_or_load_background`] and a
//! [`spawner`](CacheBuilder::spawner), it runs as a [`RefreshJob`] on the
//! spawner and even the winning caller returns the current value at once. If the hard expiry
//! arrives while a refresh runs, readers wait for that refresh rather than starting a second
//! load. A refresh whose loader panics, or whose job is dropped unrun, keeps the current value
//! and is retried after a backoff.
//!
//! # Async
//!
//! [`Cache::get_or_load_async`] is the same single flight for futures: a waiting future
//! registers its waker on the key's flight and blocks no executor thread, and threads and
//! futures missing the same key share one load. herdcache needs no runtime for it.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! let cache: herdcache::Cache<u32, String> = herdcache::Cache::builder()
//!     .max_capacity(1_000)
//!     .spawner(herdcache::TokioSpawner::current().expect("in a runtime")) // feature `tokio`
//!     .build()?;
//! async fn fetch(id: u32) -> Result<String, std::io::Error> {
//!     Ok(format!("user {id}"))
//! }
//! // Inline: the future that wins runs the load.
//! let a = cache.get_or_load_async(&1, |id| fetch(*id)).await?;
//! // Detached: the load runs as a task and outlives the caller; waiting is bounded here.
//! let b = cache
//!     .get_or_load_spawned_until(&2, tokio::time::sleep(Duration::from_millis(50)), |id| {
//!         fetch(*id)
//!     })
//!     .await?;
//! assert_eq!((a.as_str(), b.as_str()), ("user 1", "user 2"));
//! # Ok(())
//! # }
//! ```
//!
//! Cancellation, which futures make common (timeouts, aborted tasks, dropped requests):
//!
//! - Dropping a future that waits for another caller's load deregisters it; the load goes on
//!   for the others.
//! - A load led inline by [`get_or_load_async`](Cache::get_or_load_async) lives in its
//!   leader's future: dropping that future cancels the load, nothing is cached, and every
//!   caller waiting on it looks at the key again, so one of them starts it afresh. With no
//!   caller left, nothing runs until the next read.
//! - A load started by [`get_or_load_spawned`](Cache::get_or_load_spawned) on the cache's
//!   [`spawner`](CacheBuilder::spawner) belongs to its task: no caller's drop
//!   cancels it, and it is cached even if every caller left. An early refresh it wins runs
//!   there too, and the caller returns the current value at once.
//! - A panic in a loader future gives every waiter [`LoadError::Panicked`], as in the sync
//!   path.
//!
//! Under callers that time out before a load can finish, the difference is large: in the
//! `async_stampede` example (20 ms loads, reads given 5 ms), inline loads are cancelled and
//! restarted over and over and most reads get nothing, while spawned loads finish once per
//! expiry and every later read hits.
//!
//! # Fleet-wide coalescing (feature `redis`)
//!
//! Single flight is per process: a hundred instances of a service still send a hundred loads
//! when a hot key expires. `CacheBuilder::shared_tier` with a `fleet::RedisTier` makes the instances' leaders meet in Redis first: the one that takes
//! a soft lock (renewed by a heartbeat while it loads) loads and writes the value there, the
//! others wait briefly and take it, and every instance expires the value when Redis does, so
//! the fleet loads about once per TTL. The lock is only an optimisation: a crashed holder
//! costs about two heartbeats, a wait
//! never exceeds its bound, and with Redis down every read is still served by local single
//! flight (counted in [`Stats::shared_errors`], never a load error). Values cross the wire
//! through a `fleet::Codec`.
//!
//! Writes go through the tier too: `invalidate`, `insert` and `invalidate_all` on one
//! instance reach Redis and every other instance within the tier's coherence bound (100 ms by
//! default), and a load that raced such a write delivers its value to its own waiters but
//! never puts it back, in Redis or in any local cache. The guarantee and the failure modes are
//! under `fleet::RedisTier` (the `fleet` module exists with the `redis` feature; `rediss://`
//! URLs need the `tls` feature). A write that cannot reach Redis is queued and replayed,
//! never dropped in silence; `Cache::try_invalidate` and its kin say when one was.
//!
//! # Pacing loads
//!
//! [`max_concurrent_loads(n)`](CacheBuilder::max_concurrent_loads) bounds the loads in flight
//! across all keys (those within their `load_timeout`: a hung sync loader keeps running,
//! without its permit): a caller over the bound serves its stale value, or queues for a permit;
//! a released permit goes to the first caller in the queue, and only that one is woken. With
//! a [`load_timeout`](CacheBuilder::load_timeout), a hung load's permit is taken back at its
//! deadline, so hung loaders cannot starve the cache. [`Cache::warm`] loads a list of keys
//! with bounded parallelism (at most [`MAX_WARM_CONCURRENCY`] and the permits) before
//! serving.
//!
//! # Expiry and time
//!
//! Entries expire at the cache's [`time_to_live`](CacheBuilder::time_to_live) or at the TTL
//! given to [`Cache::insert_with_ttl`]; an expired entry is never returned. Time comes from a
//! [`Clock`]: the [`SystemClock`] by default, or a [`ManualClock`] that tests advance by hand.
//! The clock is read only for entries that can expire.
//!
//! # Capacity and eviction
//!
//! The cache holds at most [`max_capacity`](CacheBuilder::max_capacity) entries, or with a
//! [`weigher`](CacheBuilder::weigher) that much total weight, except transiently: each
//! inserting thread stores its entry and then evicts, so while inserts race the cache may
//! exceed its capacity by the entries of the threads inserting at that moment.
//!
//! The policy is W-TinyLFU: new entries enter a small window; one leaving the window takes a
//! place in the main space only if a frequency sketch says its key has recently been asked
//! for more often than the key it would displace. So a scan of one-off keys cannot flush the
//! keys that are read all the time, and the window's size adapts between recency- and
//! frequency-heavy workloads: it grows while keys it turned away come back soon after, and
//! shrinks while the main space's least recently used entries are still being read.
//! Expired entries are evicted first. A hit only raises a small
//! counter in its entry, test before set, which the policy reads when it next considers that
//! entry: hits take no lock and, once an entry is warm, write nothing.
//!
//! An [`eviction_listener`](CacheBuilder::eviction_listener) is told of every value that
//! leaves the cache, with a [`RemovalCause`]:
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! let evicted = Arc::new(Mutex::new(Vec::new()));
//! let log = evicted.clone();
//! let cache = herdcache::Cache::builder()
//!     .max_capacity(2)
//!     .eviction_listener(move |k: &u32, _v: &u32, cause| log.lock().unwrap().push((*k, cause)))
//!     .build()?;
//! for k in 0..5 {
//!     cache.insert(k, k);
//! }
//! assert_eq!(evicted.lock().unwrap().len(), 3);
//! assert!(cache.entry_count() <= 2);
//! # Ok::<(), herdcache::BuildError>(())
//! ```
//!
//! # Consistency
//!
//! Each operation on a key is atomic (linearisable): a reader sees a key's value before or
//! after a concurrent write, never a mix, and once a write has returned every later read sees
//! it or a newer one. [`Cache::invalidate_all`] and [`Cache::entry_count`] are not atomic
//! across keys: entries inserted while `invalidate_all` runs may survive it.
//!
//! # Walking and inspecting the cache
//!
//! [`CacheGuard::iter`] borrows every live entry and [`Cache::retain`] removes those a
//! predicate rejects; both are weakly consistent (an entry present throughout is seen once,
//! one written meanwhile may or may not be) and take no lock. [`Cache::peek`] reads a value
//! without counting a lookup or marking it used, [`Cache::remove`] returns the value it
//! removes, and [`Cache::weighted_size`] is what `max_capacity` bounds.
//!
//! ```
//! let cache = herdcache::Cache::builder().max_capacity(100).build()?;
//! for i in 0..10u32 {
//!     cache.insert(i, i * i);
//! }
//! cache.retain(|_k, v| v % 2 == 0);
//! let sum: u32 = cache.pin().iter().map(|(_k, v)| v).sum();
//! assert_eq!(sum, 0 + 4 + 16 + 36 + 64);
//! # Ok::<(), herdcache::BuildError>(())
//! ```
//!
//! # User code and panics
//!
//! The cache runs your code: the key's `Hash`, `Eq` and `Clone`, the value's `Clone` and
//! `Drop`, the weigher, the eviction listener and the loader. A panic in any of them breaks
//! only the operation that ran it (a custom [`Clock`] is the one exception: it must not
//! panic):
//!
//! - that operation panics (a loader's panic goes on in the caller that ran the loader; the
//!   callers waiting on that load get [`LoadError::Panicked`]);
//! - every other operation and thread carries on, and the next call for the key works;
//! - the table and the eviction policy stay in step, so the capacity bound holds: the
//!   policy's own bookkeeping, done under its lock, runs none of the code above;
//! - no value is leaked: a value whose `Drop` panics is still counted as dropped, and the
//!   panic is contained where the cache frees it (in a later reclamation, or when the cache
//!   is dropped) instead of surfacing in an unrelated operation;
//! - nothing aborts: the paths that clean up after a failed load run user code only under
//!   `catch_unwind`.
//!
//! A panic in the eviction listener is caught and dropped (the removal it reports is already
//! done). A listener may write to its own cache: what its writes evict is reported after it
//! returns, never from inside it, and a chain of such reports is bounded by
//! [`MAX_LISTENER_CHAIN`] (a listener that writes a new key on every call into its full cache
//! would otherwise never let the write that started it return).
//!
//! # Memory reclamation
//!
//! Removed entries are freed by crossbeam-epoch once no thread can still be reading them,
//! using a collector private to each cache. Dropping the last handle of a cache frees its
//! entries; entries retired by other threads are freed when those threads exit or next touch a
//! herdcache cache they have not used recently.
#![warn(missing_docs, missing_debug_implementations)]
#![deny(unsafe_op_in_unsafe_fn)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod builder;
mod cache;
mod clock;
mod engine;
mod entry;
mod error;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod fleet;
mod flight;
mod idle;
mod local;
#[cfg(feature = "metrics")]
mod metrics;
mod pacing;
mod policy;
mod prefetch;
mod refresh;
mod removal;
mod rng;
mod settings;
mod spawn;
mod stats;
mod sync;
// The table's items are `pub` for the raw API that the fuzz and loom crates see (`raw`
// below); in other builds nothing outside the crate can reach them.
#[cfg_attr(not(any(fuzzing, herdcache_loom)), allow(unreachable_pub))]
mod table;
mod timer;
mod trace;

pub use builder::{CacheBuilder, MAX_CAPACITY_LIMIT, MAX_DURATION, MAX_INITIAL_CAPACITY};
pub use cache::compute::{Compute, Computed};
pub use cache::entries::Iter;
pub use cache::warm::{WarmProgress, WarmReport, MAX_WARM_CONCURRENCY};
pub use cache::{Cache, CacheGuard, CachePolicy};
pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{BuildError, LoadError};
pub use refresh::RefreshJob;
pub use removal::{RemovalCause, MAX_LISTENER_CHAIN};
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub use spawn::TokioSpawner;
pub use spawn::{LoadTask, Spawner, ThreadSpawner};
pub use stats::Stats;

/// README.md's examples, compiled and run as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The default hasher: foldhash, randomly seeded for each cache.
pub type DefaultHashBuilder = foldhash::fast::RandomState;

/// The lock-free table under the cache, exported only to the fuzz and loom crates (built with
/// `--cfg fuzzing` or `--cfg herdcache_loom`). Its methods take a guard that
/// [`Table::verify`](raw::Table::verify) checked against the table's collector.
#[doc(hidden)]
#[cfg(any(fuzzing, herdcache_loom))]
pub mod raw {
    pub use crate::table::{Decision, Iter, Node, Outcome, Table, VerifiedGuard};
}
