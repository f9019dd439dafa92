//! Fleet-wide coalescing (feature `redis`): a shared second tier in Redis and a soft lock with
//! a lease, so that many instances of a service load a hot key about once, not once each.
//!
//! Only the in-process leader of a load (the one caller that single flight elects) talks to
//! Redis, so an instance makes at most one coordinated attempt per key per load. The lock is
//! only an optimisation: every path out of it ends in a value, and no caller waits longer
//! than its bound. See [`RedisTier`] for the protocol and the failure modes.

mod codec;
mod protocol;
mod redis_store;

use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

#[cfg(feature = "serde")]
pub use codec::Json;
pub use codec::{Codec, CodecError, Raw, Utf8};

use crate::builder::BuildError;
use crate::stats::Counter;
use protocol::{Hooks, Outcome, Plan, StoreError};
use redis_store::{AsyncStore, SyncStore};

/// A Redis second tier with soft locks, shared by every instance that uses the same Redis
/// and key prefix; give it to [`CacheBuilder::shared_tier`](crate::CacheBuilder::shared_tier).
///
/// When an instance's leader loads a key, it:
/// 1. reads the shared value (`GET` and `PTTL`); one found is the answer, cached locally until
///    its Redis expiry, so instances expire together;
/// 2. else takes the lock, `SET <prefix>l:<key> <token> NX PX <lease>`; the winner reads the
///    value once more (the previous holder may have written it and released just before),
///    and if there is still none loads from the source, writes the value with the cache's
///    TTL, and deletes the lock only if it still holds its token (a Lua compare-and-delete),
///    so a holder whose lease ran out never frees the next holder's lock;
/// 3. a loser re-reads the value (and retries the lock) with backoff from 2 ms to 50 ms, for
///    at most [`wait_bound`](RedisTierBuilder::wait_bound), then loads from the source itself.
///
/// An early refresh goes through the same lock and takes a shared value only if it is newer
/// than the one being refreshed, so a fleet refreshes a hot key about once per TTL.
///
/// # Failure modes
/// - **Lock held too long** (a slow holder): the others load on their own once their wait
///   bound passes; the lease ends the lock anyway.
/// - **Holder crashed** (killed mid-load): its lock lives one lease at most; a waiter takes it
///   over then (if its bound is longer than the lease) or loads at its bound.
/// - **Redis unreachable, slow or erroring**: an operation that fails or exceeds
///   [`op_timeout`](RedisTierBuilder::op_timeout) ends coordination for that load, which runs
///   locally (still single flight within the instance). The failure is counted in
///   [`Stats::shared_errors`](crate::Stats::shared_errors), logged at most once per
///   [`log_interval`](RedisTierBuilder::log_interval) (through the `log` crate), and Redis is
///   skipped for [`retry_after`](RedisTierBuilder::retry_after); then it is tried again, so a
///   restarted Redis is used again without restarting anything. It is never a load error.
/// - **A value that does not decode** (say, written by another version): a miss, counted in
///   [`Stats::shared_codec_errors`](crate::Stats::shared_codec_errors); the lock's winner
///   overwrites it.
/// - **A cancelled or panicking holder**: its lock is not released and lives out its lease.
///
/// ```no_run
/// use std::time::Duration;
/// use herdcache::{fleet::{RedisTier, Utf8}, Cache};
///
/// let tier = RedisTier::builder("redis://127.0.0.1:6379/")
///     .key_prefix("profiles:")
///     .lease(Duration::from_secs(2))
///     .wait_bound(Duration::from_millis(500))
///     .build(|id: &u64| id.to_string(), Utf8)?;
/// let cache: Cache<u64, String> = Cache::builder()
///     .max_capacity(10_000)
///     .time_to_live(Duration::from_secs(60))
///     .shared_tier(tier)
///     .build()?;
/// let name = cache.get_or_load(&42, |id| Ok::<_, std::io::Error>(format!("user {id}")))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RedisTier<K, V> {
    sync: SyncStore,
    async_: AsyncStore,
    key_name: Box<dyn Fn(&K) -> String + Send + Sync>,
    codec: Box<dyn Codec<V>>,
    prefix: String,
    lease: Duration,
    wait_bound: Duration,
    health: Health,
}

impl<K, V> fmt::Debug for RedisTier<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTier")
            .field("prefix", &self.prefix)
            .field("lease", &self.lease)
            .field("wait_bound", &self.wait_bound)
            .finish_non_exhaustive()
    }
}

/// Settings of a [`RedisTier`], checked by [`build`](Self::build).
#[derive(Debug, Clone)]
pub struct RedisTierBuilder {
    url: String,
    prefix: String,
    lease: Duration,
    wait_bound: Duration,
    op_timeout: Duration,
    retry_after: Duration,
    log_interval: Duration,
}

impl RedisTier<(), ()> {
    /// Settings for a tier on the Redis at `url` (`redis://host:port/db`). Nothing connects
    /// until the first load. (The key and value types come with
    /// [`build`](RedisTierBuilder::build).)
    pub fn builder(url: impl Into<String>) -> RedisTierBuilder {
        RedisTierBuilder {
            url: url.into(),
            prefix: "herdcache:".into(),
            lease: Duration::from_secs(5),
            wait_bound: Duration::from_secs(1),
            op_timeout: Duration::from_millis(100),
            retry_after: Duration::from_secs(1),
            log_interval: Duration::from_secs(10),
        }
    }
}

/// Longest lease, wait bound, timeout or interval accepted: one day.
const MAX_SETTING: Duration = Duration::from_secs(86_400);

fn check(setting: &'static str, d: Duration, zero_ok: bool) -> Result<(), BuildError> {
    if d.is_zero() && !zero_ok {
        return Err(BuildError::Invalid {
            setting,
            reason: "must be greater than zero",
        });
    }
    if d > MAX_SETTING {
        return Err(BuildError::Invalid {
            setting,
            reason: "must be at most one day",
        });
    }
    Ok(())
}

impl RedisTierBuilder {
    /// Prefix of every Redis key the tier uses (default `herdcache:`): values live at
    /// `<prefix>v:<key>`, locks at `<prefix>l:<key>`. Instances share values only under the
    /// same prefix.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long a lock lives unless its holder releases it (default 5 s): the most a crashed
    /// holder can delay the fleet. Make it longer than a typical load. 1 ms to one day.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The longest an instance waits for another instance's load before loading itself
    /// (default 1 s). Zero: never wait. At most one day.
    pub fn wait_bound(mut self, bound: Duration) -> Self {
        self.wait_bound = bound;
        self
    }

    /// Connect and reply timeout of each Redis operation (default 100 ms).
    pub fn op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = timeout;
        self
    }

    /// How long Redis is skipped after a failure (default 1 s).
    pub fn retry_after(mut self, pause: Duration) -> Self {
        self.retry_after = pause;
        self
    }

    /// Failures are logged at most once per this interval (default 10 s); the rest are only
    /// counted.
    pub fn log_interval(mut self, interval: Duration) -> Self {
        self.log_interval = interval;
        self
    }

    /// Checks the settings and builds the tier: `key_name` names a key in Redis (after the
    /// prefix), `codec` carries values across the wire.
    ///
    /// # Errors
    /// [`BuildError::Invalid`] for a malformed URL or a duration out of range.
    pub fn build<K, V>(
        self,
        key_name: impl Fn(&K) -> String + Send + Sync + 'static,
        codec: impl Codec<V>,
    ) -> Result<RedisTier<K, V>, BuildError> {
        check("lease", self.lease, false)?;
        check("wait_bound", self.wait_bound, true)?;
        check("op_timeout", self.op_timeout, false)?;
        check("retry_after", self.retry_after, false)?;
        check("log_interval", self.log_interval, true)?;
        if self.lease < Duration::from_millis(1) {
            return Err(BuildError::Invalid {
                setting: "lease",
                reason: "must be at least 1 ms (Redis leases are in milliseconds)",
            });
        }
        let client = redis::Client::open(self.url.as_str()).map_err(|_| BuildError::Invalid {
            setting: "url",
            reason: "is not a valid Redis URL",
        })?;
        Ok(RedisTier {
            sync: SyncStore::new(client.clone(), self.op_timeout),
            async_: AsyncStore::new(client, self.op_timeout),
            key_name: Box::new(key_name),
            codec: Box::new(codec),
            prefix: self.prefix,
            lease: self.lease,
            wait_bound: self.wait_bound,
            health: Health::new(self.retry_after, self.log_interval),
        })
    }
}

/// Whether Redis is being skipped after a failure, and when a failure was last logged.
#[derive(Debug)]
struct Health {
    epoch: Instant,
    /// Nanoseconds since `epoch` until which Redis is skipped.
    down_until: AtomicU64,
    /// Nanoseconds since `epoch` of the last logged failure, plus one (0: never).
    logged_at: AtomicU64,
    retry_after: Duration,
    log_interval: Duration,
}

impl Health {
    fn new(retry_after: Duration, log_interval: Duration) -> Self {
        Health {
            epoch: Instant::now(),
            down_until: AtomicU64::new(0),
            logged_at: AtomicU64::new(0),
            retry_after,
            log_interval,
        }
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    // Relaxed throughout: these are timestamps for a heuristic, ordering nothing else.
    fn is_down(&self) -> bool {
        self.now() < self.down_until.load(Ordering::Relaxed)
    }

    fn failed(&self, e: &StoreError) {
        let now = self.now();
        self.down_until
            .store(now + self.retry_after.as_nanos() as u64, Ordering::Relaxed);
        let last = self.logged_at.load(Ordering::Relaxed);
        let due = last == 0 || now + 1 >= last + self.log_interval.as_nanos() as u64;
        if due
            && self
                .logged_at
                .compare_exchange(last, now + 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            log::warn!(
                "herdcache: Redis failed ({}); loading locally, retrying Redis in {:?}",
                e.0,
                self.retry_after
            );
        }
    }
}

/// A random lock token: no two holders share one.
fn token() -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let s = RandomState::new();
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let a = s.hash_one((std::process::id(), seq));
    let b = s.hash_one((seq, Instant::now()));
    format!("{a:016x}{b:016x}")
}

/// The protocol's view of a tier and its cache: the codec and the cache's counters.
struct TierHooks<'a, V: 'static> {
    codec: &'a dyn Codec<V>,
    count: &'a (dyn Fn(Counter) + Sync),
}

impl<V: 'static> Hooks<V> for TierHooks<'_, V> {
    fn decode(&self, bytes: &[u8]) -> Option<V> {
        self.codec.decode(bytes).ok()
    }

    fn encode(&self, value: &V) -> Option<Vec<u8>> {
        self.codec.encode(value).ok()
    }

    fn count(&self, c: Counter) {
        (self.count)(c)
    }
}

/// A load that went through the tier: its result, and for a value taken from Redis, the time
/// it has left there (the local entry expires with it).
pub(crate) struct Fetched<V, E> {
    pub(crate) result: Result<V, E>,
    pub(crate) ttl: Option<Duration>,
}

impl<K, V: 'static> RedisTier<K, V> {
    fn plan<'a>(
        &self,
        keys: &'a (String, String, String),
        ttl: Option<Duration>,
        refreshing: Option<Duration>,
    ) -> Plan<'a> {
        Plan {
            value_key: &keys.0,
            lock_key: &keys.1,
            token: &keys.2,
            lease: self.lease,
            wait_bound: self.wait_bound,
            ttl,
            refreshing,
        }
    }

    fn keys(&self, key: &K) -> (String, String, String) {
        let name = (self.key_name)(key);
        (
            format!("{}v:{name}", self.prefix),
            format!("{}l:{name}", self.prefix),
            token(),
        )
    }

    fn finish<E>(&self, out: Outcome<V, E>, count: &dyn Fn(Counter)) -> Fetched<V, E> {
        match out {
            Outcome::Shared(v, ttl) => Fetched { result: Ok(v), ttl },
            Outcome::Loaded(result) => Fetched { result, ttl: None },
            Outcome::Failed(result, e) => {
                count(Counter::SharedErrors);
                self.health.failed(&e);
                Fetched { result, ttl: None }
            }
        }
    }

    /// The Redis keys and lock token for one coordinated load of `key`, or `None` while
    /// Redis is being skipped after a failure.
    fn begin(&self, key: &K) -> Option<(String, String, String)> {
        (!self.health.is_down()).then(|| self.keys(key))
    }

    /// A thread's coordinated load: `load` runs at most once, on this thread.
    pub(crate) fn load_sync<E>(
        &self,
        key: &K,
        ttl: Option<Duration>,
        refreshing: Option<Duration>,
        count: &(dyn Fn(Counter) + Sync),
        load: impl FnOnce() -> Result<V, E>,
    ) -> Fetched<V, E> {
        let Some(keys) = self.begin(key) else {
            return Fetched {
                result: load(),
                ttl: None,
            };
        };
        let hooks = TierHooks {
            codec: &*self.codec,
            count,
        };
        let coordinated = protocol::coordinate(
            &self.sync,
            &hooks,
            self.plan(&keys, ttl, refreshing),
            async { load() },
        );
        self.finish(block_on(coordinated), count)
    }

    /// A future's coordinated load: `load` is awaited at most once.
    pub(crate) async fn load_async<E, L>(
        &self,
        key: &K,
        ttl: Option<Duration>,
        refreshing: Option<Duration>,
        count: &(dyn Fn(Counter) + Sync),
        load: L,
    ) -> Fetched<V, E>
    where
        L: Future<Output = Result<V, E>>,
    {
        let Some(keys) = self.begin(key) else {
            return Fetched {
                result: load.await,
                ttl: None,
            };
        };
        let hooks = TierHooks {
            codec: &*self.codec,
            count,
        };
        let plan = self.plan(&keys, ttl, refreshing);
        let out = protocol::coordinate(&self.async_, &hooks, plan, load).await;
        self.finish(out, count)
    }
}

/// Runs a future on this thread, parking between polls. The sync store's operations and a
/// sync loader never return `Pending`, so in practice this polls once.
pub(crate) fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = pin!(f);
    loop {
        match f.as_mut().poll(&mut cx) {
            Poll::Ready(v) => return v,
            Poll::Pending => std::thread::park(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(b: RedisTierBuilder) -> Result<RedisTier<u64, String>, BuildError> {
        b.build(|k: &u64| k.to_string(), Utf8)
    }

    fn setting(r: Result<RedisTier<u64, String>, BuildError>) -> &'static str {
        match r {
            Err(BuildError::Invalid { setting, .. }) => setting,
            other => panic!("expected an invalid setting, got {other:?}"),
        }
    }

    #[test]
    fn bad_settings_are_errors_naming_them() {
        let b = || RedisTier::builder("redis://127.0.0.1:6379/");
        assert_eq!(setting(build(RedisTier::builder("http://nope"))), "url");
        assert_eq!(setting(build(b().lease(Duration::ZERO))), "lease");
        assert_eq!(
            setting(build(b().lease(Duration::from_micros(10)))),
            "lease"
        );
        assert_eq!(
            setting(build(b().lease(Duration::from_secs(90_000)))),
            "lease"
        );
        assert_eq!(setting(build(b().op_timeout(Duration::ZERO))), "op_timeout");
        assert_eq!(
            setting(build(b().retry_after(Duration::ZERO))),
            "retry_after"
        );
        assert_eq!(
            setting(build(b().wait_bound(Duration::from_secs(90_000)))),
            "wait_bound"
        );
        // Not waiting at all is a valid choice; building connects to nothing.
        assert!(build(b().wait_bound(Duration::ZERO)).is_ok());
    }

    #[test]
    fn failures_skip_redis_for_a_while_and_log_once_per_interval() {
        let h = Health::new(Duration::from_secs(3600), Duration::from_secs(3600));
        assert!(!h.is_down());
        h.failed(&StoreError("refused".into()));
        assert!(h.is_down());
        let logged = h.logged_at.load(Ordering::Relaxed);
        assert_ne!(logged, 0);
        h.failed(&StoreError("refused".into()));
        assert_eq!(
            h.logged_at.load(Ordering::Relaxed),
            logged,
            "not logged again"
        );
    }

    #[test]
    fn tokens_differ() {
        assert_ne!(token(), token());
    }
}
