//! Fleet-wide coalescing and coherence (feature `redis`): a shared second tier in Redis, a
//! soft lock with a lease so that many instances of a service load a hot key about once, not
//! once each, and writes that reach every instance.
//!
//! Only the in-process leader of a load (the one caller that single flight elects) talks to
//! Redis, so an instance makes at most one coordinated attempt per key per load. The lock is
//! only an optimisation: every path out of it ends in a value, and no caller waits longer
//! than its bound. See [`RedisTier`] for the protocol, the coherence guarantee and the
//! failure modes.

mod codec;
mod coherence;
mod heartbeat;
mod outbox;
mod protocol;
mod redis_store;
#[cfg(test)]
mod sim;
mod writes;

use crate::trace::trace_event;
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};

use foldhash::fast::FixedState;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[cfg(feature = "serde")]
pub use codec::Json;
pub use codec::{Codec, CodecError, Raw, Utf8};

use crate::error::BuildError;
pub(crate) use crate::flight::Keep;
use crate::stats::Counter;
pub(crate) use coherence::{Coherence, Heard, OwnWrite, Seen};
use heartbeat::Heartbeat;
pub(crate) use outbox::Sent;
use protocol::{Hooks, Keys, Outcome, Plan, StoreError};
use redis_store::{AsyncStore, SyncStore, TierKeys};

/// A Redis second tier with soft locks, shared by every instance that uses the same Redis
/// and key prefix; give it to [`CacheBuilder::shared_tier`](crate::CacheBuilder::shared_tier).
///
/// When an instance's leader loads a key, it:
/// 1. reads the shared value, its remaining TTL and the key's *stamp* (one Lua script); a
///    value written under the current stamp is the answer, cached locally until its Redis
///    expiry, so instances expire together;
/// 2. else takes the lock, `SET <prefix>l:<key> <token> NX PX <2 heartbeats>`, and renews it
///    every [`heartbeat`](RedisTierBuilder::heartbeat) while it loads, for at most its
///    [`lease`](RedisTierBuilder::lease); the winner reads the value once more (the previous
///    holder may have written it and released just before), and if there is still none
///    loads from the source, writes the value only if it still holds the lock and the key's
///    stamp is still the one it read before loading (a Lua compare-and-set), and deletes the
///    lock only if it still holds its token, so a holder whose lock lapsed never frees the
///    next holder's lock;
/// 3. a loser re-reads the value (and retries the lock) with backoff from 2 ms to 50 ms, for
///    at most [`wait_bound`](RedisTierBuilder::wait_bound) or until its own load deadline,
///    then loads from the source itself.
///
/// An early refresh goes through the same lock and takes a shared value only if it is newer
/// than the one being refreshed, so a fleet refreshes a hot key about once per TTL.
///
/// # Coherence
/// **While Redis is up, no instance returns a value older than an `invalidate`, `insert` or
/// `invalidate_all` made on any instance by more than the
/// [`coherence_bound`](RedisTierBuilder::coherence_bound) (100 ms by default), and a load
/// that raced such a write never puts its value in Redis or in any local cache.** One fault
/// stretches the bound: a link to Redis that dies without a word (a partition that drops
/// packets) is found within the [`keepalive`](RedisTierBuilder::keepalive) interval (1 s by
/// default) and half the bound; set the interval to a quarter of the bound to hold it there
/// too.
///
/// - Writes go through the tier. `invalidate(k)` moves the key's *generation* (drawn from a
///   counter in Redis, in the same Lua script that announces it on the channel
///   `<prefix>inv@<db>`), so every value written before is stale for every reader;
///   `insert(k, v)` does the same and writes `v` under the new generation (with the cache's
///   TTL); `invalidate_all()` moves the tier's *epoch*, which every value carries, so no
///   `KEYS` or `SCAN` sweep is needed. A key's stamp is its generation and the epoch; the
///   generation lives at `<prefix>g:<hash>` (a 64-bit hash of the key, the same for every
///   borrowed form of it, so `invalidate(&str)` works on `String` keys).
/// - A load in flight during such a write delivers its value to its own waiters, but the
///   compare-and-set refuses it (counted in
///   [`Stats::shared_conflicts`](crate::Stats::shared_conflicts)), and the instance does not
///   cache it either. A holder whose load outlived its lease does not publish.
/// - Every instance runs one subscriber thread on the channel and drops its local copy of a
///   key another instance wrote, within the network's delay; a load of that key running on
///   the instance at that moment drops what it installs.
/// - The link is watched: a link that closes (a restart, a failover, a kill) is lost at once;
///   when the channel has been quiet for the keep-alive interval the subscriber pings, and a
///   link that does not answer within half the bound is lost. The instance then cannot know
///   what it missed: it drops every local copy at once and, until it is subscribed again,
///   keeps what it loads at most the bound.
/// - No shared value lives forever: each is written with the cache's TTL, at most
///   [`max_shared_ttl`](RedisTierBuilder::max_shared_ttl) (one hour by default), which is
///   also the shared copy's lifetime for a cache without a TTL.
///
/// Instances must run the same build (key type, its `Hash`, herdcache and its hasher): the
/// channel and the generations name keys by a hash of them, seeded from the prefix (not at
/// random). Keep the bound well above twice the round trip to Redis plus the host's
/// scheduling delays: a ping unanswered within half of it counts as a lost link, which clears
/// the instance's copies. Writes on a fleet cache make one blocking Redis round trip.
///
/// # Failure modes
/// - **Lock held too long** (a slow holder): the others load on their own once their wait
///   bound (or their deadline) passes; the holder stops renewing at its lease anyway.
/// - **Holder died** (killed, frozen, cut off from Redis mid-load): its heartbeat stops and its
///   lock lapses within two heartbeats (500 ms by default); a waiter takes it over then. A
///   lock restored from a snapshot after a restart lapses as fast. A frozen holder that wakes
///   up no longer holds the lock, and does not publish.
/// - **A cancelled or panicking holder** (its future dropped past its deadline, or its loader
///   panicked): it releases its lock on the way out (best effort: a detached task for a
///   future, a blocking call for a thread).
/// - **Redis unreachable, slow or erroring**: an operation that fails or exceeds
///   [`op_timeout`](RedisTierBuilder::op_timeout) ends coordination for that load, which runs
///   locally (still single flight within the instance). The failure is counted in
///   [`Stats::shared_errors`](crate::Stats::shared_errors), logged at most once per
///   [`log_interval`](RedisTierBuilder::log_interval) (through the `log` crate), and Redis is
///   skipped for [`retry_after`](RedisTierBuilder::retry_after); then it is tried again, so a
///   restarted Redis is used again without restarting anything. It is never a load error.
///   Meanwhile the link is down, so local copies live at most the bound.
/// - **A write that cannot reach Redis** (down, stalled past `op_timeout`, a connection
///   closed under it: a dead pooled connection is first replaced and the write sent again,
///   once) is applied locally and kept in an outbox, as an invalidation of its key, replayed
///   in order as soon as Redis answers, before this instance reads the tier again; past
///   [`outbox_limit`](RedisTierBuilder::outbox_limit) writes, recovery invalidates every
///   shared value instead. Counted in [`Stats::shared_writes_failed`](crate::Stats::shared_writes_failed)
///   and [`Stats::shared_writes_replayed`](crate::Stats::shared_writes_replayed), logged, and
///   reported to the callers that ask (`Cache::try_insert`, `try_invalidate`,
///   `try_invalidate_all`). So a write is applied, or known not to be yet, and recovery never
///   makes an older shared value current again. Until the replay, other instances may serve
///   the old shared value: what they cannot know of, they cannot drop.
/// - **A failover or a restore from a snapshot** may lose recent writes with the data they
///   protected; a load in flight across it is refused rather than trusted.
/// - **Redis restarted without persistence**: values, generations and epoch are gone
///   together; the counters start again from Redis's clock, past every value handed out
///   before, so no old stamp matches a new one.
/// - **A value that does not decode** (say, written by another version): a miss, counted in
///   [`Stats::shared_codec_errors`](crate::Stats::shared_codec_errors); the lock's winner
///   overwrites it.
///
/// Redis Cluster is not supported (the scripts touch keys of one prefix in several slots).
///
/// ```no_run
/// use std::time::Duration;
/// use herdcache::{fleet::{RedisTier, Utf8}, Cache};
///
/// let tier = RedisTier::builder("redis://127.0.0.1:6379/")
///     .key_prefix("profiles:")
///     .lease(Duration::from_secs(2))
///     .wait_bound(Duration::from_millis(500))
///     .coherence_bound(Duration::from_millis(50))
///     .build(|id: &u64| id.to_string(), Utf8)?;
/// let cache: Cache<u64, String> = Cache::builder()
///     .max_capacity(10_000)
///     .time_to_live(Duration::from_secs(60))
///     .shared_tier(tier)
///     .build()?;
/// let name = cache.get_or_load(&42, |id| Ok::<_, std::io::Error>(format!("user {id}")))?;
/// // The source changed: every instance reads it afresh within 50 ms.
/// cache.invalidate(&42);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RedisTier<K, V> {
    sync: SyncStore,
    async_: AsyncStore,
    client: redis::Client,
    key_name: Box<dyn Fn(&K) -> String + Send + Sync>,
    codec: Box<dyn Codec<V>>,
    prefix: String,
    channel: String,
    /// A hash of the value type and the codec, which every value the tier writes carries.
    value_tag: u64,
    /// Writes that could not reach Redis, to replay.
    outbox: outbox::Outbox,
    /// The largest encoded value shared, in bytes.
    max_value_size: usize,
    lease: Duration,
    /// How often a held lock is renewed; it is set to live twice that.
    heartbeat: Duration,
    /// How long the channel may be quiet before the subscriber pings.
    keepalive: Duration,
    wait_bound: Duration,
    max_shared_ttl: Duration,
    op_timeout: Duration,
    retry_after: Duration,
    health: Health,
    coherence: Arc<Coherence>,
}

impl<K, V> RedisTier<K, V> {
    /// Connects to Redis once, now, and asks it for a `PING`: whether this tier can work,
    /// before a cache relies on it. A tier never fails a load (without Redis every load is
    /// local), so a wrong password or address would otherwise show only in the logs and in
    /// [`Stats::shared_errors`](crate::Stats::shared_errors).
    ///
    /// # Errors
    /// [`CheckError::Auth`] when Redis refuses the URL's user and password (or wants some),
    /// [`CheckError::Unreachable`] when it does not answer within
    /// [`op_timeout`](RedisTierBuilder::op_timeout), [`CheckError::Refused`] for any other
    /// error it replies.
    ///
    /// ```no_run
    /// # use herdcache::fleet::{RedisTier, Utf8};
    /// let tier: RedisTier<u64, String> = RedisTier::builder("redis://:secret@10.0.0.5/")
    ///     .key_prefix("users:")
    ///     .build(|id: &u64| id.to_string(), Utf8)?;
    /// if let Err(e) = tier.check() {
    ///     eprintln!("the users cache runs without its fleet: {e}");
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check(&self) -> Result<(), CheckError> {
        let ping = || -> redis::RedisResult<()> {
            let mut c = self.client.get_connection_with_timeout(self.op_timeout)?;
            c.set_read_timeout(Some(self.op_timeout))?;
            c.set_write_timeout(Some(self.op_timeout))?;
            redis::cmd("PING").query::<String>(&mut c).map(drop)
        };
        ping().map_err(|e| {
            let m = e.to_string();
            if redis_store::is_auth(&e) {
                CheckError::Auth(m)
            } else if e.is_io_error()
                || e.is_timeout()
                || e.is_connection_refusal()
                || e.is_connection_dropped()
            {
                CheckError::Unreachable(m)
            } else {
                CheckError::Refused(m)
            }
        })
    }

    /// Notes a future's load that skipped the tier for want of a tokio runtime.
    pub(crate) fn skipped_off_tokio(&self) {
        self.health.skipped_off_tokio();
    }
}

impl<K, V> fmt::Debug for RedisTier<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTier")
            .field("prefix", &self.prefix)
            .field("lease", &self.lease)
            .field("heartbeat", &self.heartbeat)
            .field("keepalive", &self.keepalive)
            .field("wait_bound", &self.wait_bound)
            .field("max_shared_ttl", &self.max_shared_ttl)
            .field("coherence_bound", &self.coherence.bound)
            .finish_non_exhaustive()
    }
}

/// Settings of a [`RedisTier`], checked by [`build`](Self::build).
///
/// ```
/// use std::time::Duration;
/// use herdcache::fleet::{RedisTier, RedisTierBuilder, Utf8};
/// // Settings are a plain value: one base for several tiers.
/// let base: RedisTierBuilder =
///     RedisTier::builder("redis://127.0.0.1/").key_prefix("users:").lease(Duration::from_secs(2));
/// let users: RedisTier<u64, String> = base
///     .clone()
///     .key_prefix("users:")
///     .build(|id: &u64| id.to_string(), Utf8)?;
/// let orders: RedisTier<u64, String> =
///     base.key_prefix("orders:").build(|id: &u64| id.to_string(), Utf8)?;
/// # let _ = (users, orders);
/// # Ok::<(), herdcache::BuildError>(())
/// ```
#[derive(Debug, Clone)]
pub struct RedisTierBuilder {
    url: String,
    prefix: Option<String>,
    lease: Duration,
    heartbeat: Duration,
    keepalive: Duration,
    wait_bound: Duration,
    op_timeout: Duration,
    retry_after: Duration,
    log_interval: Duration,
    max_shared_ttl: Duration,
    coherence_bound: Duration,
    outbox_limit: usize,
    max_value_size: usize,
}

impl RedisTier<(), ()> {
    /// Settings for a tier on the Redis at `url`: `redis://[user:password@]host:port/db`, or
    /// `rediss://...` for TLS (feature `tls`; the server's certificate is checked against
    /// the system's roots, or those named by `SSL_CERT_FILE`). Nothing connects
    /// until the tier is given to a cache. (The key and value types come with
    /// [`build`](RedisTierBuilder::build).)
    ///
    /// ```
    /// use herdcache::fleet::{RedisTier, Utf8};
    /// let tier: RedisTier<u64, String> = RedisTier::builder("redis://127.0.0.1:6379/0").key_prefix("users:")
    ///     .build(|id: &u64| id.to_string(), Utf8)?; // nothing connects yet
    /// let bad: Result<RedisTier<u64, String>, _> =
    ///     RedisTier::builder("not a url").key_prefix("users:").build(|id: &u64| id.to_string(), Utf8);
    /// assert_eq!(bad.unwrap_err().setting(), "url");
    /// # let _ = tier;
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn builder(url: impl Into<String>) -> RedisTierBuilder {
        RedisTierBuilder {
            url: url.into(),
            prefix: None,
            lease: Duration::from_secs(5),
            heartbeat: Duration::from_millis(250),
            keepalive: Duration::from_secs(1),
            wait_bound: Duration::from_secs(1),
            op_timeout: Duration::from_millis(100),
            retry_after: Duration::from_secs(1),
            log_interval: Duration::from_secs(10),
            max_shared_ttl: Duration::from_secs(3600),
            coherence_bound: Duration::from_millis(100),
            outbox_limit: 10_000,
            max_value_size: 1 << 20,
        }
    }
}

/// Longest lease, wait bound, timeout or interval accepted: one day.
const MAX_SETTING: Duration = Duration::from_secs(86_400);

/// Shortest coherence bound: a ping must be answered within half of it.
const MIN_COHERENCE_BOUND: Duration = Duration::from_millis(10);

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
    /// The cache's namespace in Redis: the prefix of every Redis key the tier uses (required,
    /// non-empty; no default, so that two caches on one Redis never share keys by
    /// forgetting it). Values live at `<prefix>v:<key>`, locks at `<prefix>l:<key>`,
    /// generations at `<prefix>g:<hash>`, the epoch and the generation counter at
    /// `<prefix>epoch` and `<prefix>seq`, and writes are announced on the channel
    /// `<prefix>inv@<db>` (channels span Redis's databases: the database number keeps caches
    /// of one prefix in two databases apart). Instances share values only under the same
    /// prefix and database; a message from another namespace, and a value written for
    /// another value type, are ignored.
    ///
    /// ```
    /// # use herdcache::fleet::{RedisTier, Utf8};
    /// let tier = RedisTier::builder("redis://127.0.0.1/")
    ///     .key_prefix("orders:v2:")
    ///     .build(|id: &u64| id.to_string(), Utf8)?;
    /// # let _: RedisTier<u64, String> = tier;
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// How long a load may hold its key's lock (default 5 s): its holder renews the lock
    /// every [`heartbeat`](Self::heartbeat) up to this, and a load that outlives it does not
    /// publish its value (the others then load for themselves once their wait bound passes).
    /// Make it longer than a typical load. A holder that dies costs the others about two
    /// heartbeats, not its lease. 1 ms to one day.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use herdcache::fleet::{RedisTier, Utf8};
    /// let tier: RedisTier<u64, String> = RedisTier::builder("redis://127.0.0.1/").key_prefix("users:")
    ///     .lease(Duration::from_secs(10)) // loads take up to a few seconds
    ///     .build(|id: &u64| id.to_string(), Utf8)?;
    /// let err = RedisTier::builder("redis://127.0.0.1/").key_prefix("users:")
    ///     .lease(Duration::from_micros(500))
    ///     .build::<u64, String>(|id| id.to_string(), Utf8)
    ///     .unwrap_err();
    /// assert_eq!(err.setting(), "lease"); // Redis leases are in milliseconds
    /// # let _ = tier;
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How often a lock's holder renews it while its load runs (default 250 ms; 1 ms to one
    /// day). A lock lives two heartbeats unless renewed, so a holder that died (killed,
    /// frozen, cut off from Redis), or a lock restored from a snapshot after a restart,
    /// holds the others up at most about that long; and a holder that missed its renewals
    /// (frozen past two heartbeats) no longer publishes, since another may hold the lock.
    /// One thread renews every lock the instance holds, one command per heartbeat, and only
    /// while it holds some. Keep it well above the round trip to Redis and the host's
    /// scheduling delays.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use herdcache::fleet::{RedisTier, Utf8};
    /// let tier = RedisTier::builder("redis://127.0.0.1/").key_prefix("users:")
    ///     .heartbeat(Duration::from_secs(1)) // a busy host: a dead holder costs ~2 s
    ///     .build(|id: &u64| id.to_string(), Utf8)?;
    /// # let _: RedisTier<u64, String> = tier;
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn heartbeat(mut self, interval: Duration) -> Self {
        self.heartbeat = interval;
        self
    }

    /// How long the fleet's channel may be quiet before the instance pings Redis on it
    /// (default 1 s; at most one day): an idle instance sends about one command per
    /// interval. A link that closes (a restart, a failover, a kill, a proxy's reset) is found
    /// lost at once, whatever the interval; one that dies without a word (a network
    /// partition that drops packets, a stalled server) is found when a ping goes unanswered
    /// for half the [`coherence_bound`](Self::coherence_bound): within this interval and half
    /// the bound. To hold the bound through silent failures too, set this to a quarter of it
    /// (25 ms for the default bound: 40 pings a second per idle instance).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use herdcache::fleet::{RedisTier, Utf8};
    /// // The 100 ms bound through partitions as well: ping whenever quiet for 25 ms.
    /// let tier = RedisTier::builder("redis://127.0.0.1/").key_prefix("users:")
    ///     .keepalive(Duration::from_millis(25))
    ///     .build(|id: &u64| id.to_string(), Utf8)?;
    /// # let _: RedisTier<u64, String> = tier;
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn keepalive(mut self, interval: Duration) -> Self {
        self.keepalive = interval;
        self
    }

    /// The longest an instance waits for another instance's load before loading itself
    /// (default 1 s; a load's own deadline cuts it shorter). Zero: never wait. At most one
    /// day.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use herdcache::fleet::{RedisTier, Utf8};
    /// // Latency first: never wait for another instance's load, load at once.
    /// let tier = RedisTier::builder("redis://127.0.0.1/").key_prefix("users:")
    ///     .wait_bound(Duration::ZERO)
    ///     .build(|id: &u64| id.to_string(), Utf8)?;
    /// # let _: RedisTier<u64, String> = tier;
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn wait_bound(mut self, bound: Duration) -> Self {
        self.wait_bound = bound;
        self
    }

    /// Connect and reply timeout of each Redis operation (default 100 ms).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use herdcache::fleet::{RedisTier, Utf8};
    /// // Redis in the same zone: give up on it sooner and load locally.
    /// let tier = RedisTier::builder("redis://127.0.0.1/").key_prefix("users:")
    ///     .op_timeout(Duration::from_millis(20))
    ///     .build(|id: &u64| id.to_string(), Utf8)?;
    /// # let _: RedisTier<u64, String> = tier;
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = timeout;
        self
    }

    /// How long Redis is skipped after a failure (default 1 s).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use herdcache::fleet::{RedisTier, Utf8};
    /// let tier = RedisTier::builder("redis://127.0.0.1/").key_prefix("users:")
    ///     .retry_after(Duration::from_secs(5)) // load locally for 5 s after a failure
    ///     .build(|id: &u64| id.to_string(), Utf8)?;
    /// # let _: RedisTier<u64, String> = tier;
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn retry_after(mut self, pause: Duration) -> Self {
        self.retry_after = pause;
        self
    }

    /// Failures are logged at most once per this interval (default 10 s); the rest are only
    /// counted.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use herdcache::fleet::{RedisTier, Utf8};
    /// let tier = RedisTier::builder("redis://127.0.0.1/").key_prefix("users:")
    ///     .log_interval(Duration::from_secs(60)) // one log line a minute at most
    ///     .build(|id: &u64| id.to_string(), Utf8)?;
    /// # let _: RedisTier<u64, String> = tier;
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn log_interval(mut self, interval: Duration) -> Self {
        self.log_interval = interval;
        self
    }

    /// The longest a value lives in Redis (default one hour): the TTL written is the cache's
    /// TTL (or an insert's own), capped at this, and a cache without a TTL writes this one.
    /// At most one day.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use herdcache::fleet::{RedisTier, Utf8};
    /// // A cache without a TTL: the fleet consults the source at least every 10 minutes.
    /// let tier = RedisTier::builder("redis://127.0.0.1/").key_prefix("users:")
    ///     .max_shared_ttl(Duration::from_secs(600))
    ///     .build(|id: &u64| id.to_string(), Utf8)?;
    /// # let _: RedisTier<u64, String> = tier;
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn max_shared_ttl(mut self, ttl: Duration) -> Self {
        self.max_shared_ttl = ttl;
        self
    }

    /// The most a read may lag behind a write made on another instance (default 100 ms; 10
    /// ms to one day): a ping on the channel must be answered within half of it, and while
    /// the link is down a local copy lives at most this long. See
    /// [Coherence](RedisTier#coherence) and [`keepalive`](Self::keepalive).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use herdcache::fleet::{RedisTier, Utf8};
    /// let tier = RedisTier::builder("redis://127.0.0.1/").key_prefix("users:")
    ///     .coherence_bound(Duration::from_millis(20))
    ///     .build(|id: &u64| id.to_string(), Utf8)?;
    /// # let _: RedisTier<u64, String> = tier;
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn coherence_bound(mut self, bound: Duration) -> Self {
        self.coherence_bound = bound;
        self
    }

    /// The largest value, encoded, that the tier shares (default 1 MiB): a larger one stays
    /// in the instance that loaded or inserted it (an insert still invalidates the key in
    /// the tier, so no other instance serves the value it replaced), counted in
    /// [`Stats::shared_too_large`](crate::Stats::shared_too_large). Shared values must
    /// cross the wire within `op_timeout`: tens of megabytes did not, and their reads timed
    /// out and took the tier down. A read also skips a stored value over the limit (written
    /// by an instance with a larger one).
    ///
    /// ```
    /// # use herdcache::fleet::{RedisTier, Raw};
    /// let tier = RedisTier::builder("redis://127.0.0.1/")
    ///     .key_prefix("thumbnails:")
    ///     .max_value_size(256 << 10)
    ///     .build(|id: &u64| id.to_string(), Raw)?;
    /// # let _: RedisTier<u64, Vec<u8>> = tier;
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn max_value_size(mut self, bytes: usize) -> Self {
        self.max_value_size = bytes;
        self
    }

    /// How many writes that could not reach Redis this instance keeps to replay (default
    /// 10,000): an `invalidate`, `insert` or `invalidate_all` that fails (Redis down, stalled
    /// past `op_timeout`, an error reply) is applied locally and queued, as an invalidation of
    /// its key, to be replayed in order once Redis answers again, before this instance reads
    /// the tier again. Past this many, the queue is given up for one `invalidate_all` on
    /// recovery, which covers every write it held. Counted in
    /// [`Stats::shared_writes_failed`](crate::Stats::shared_writes_failed) and
    /// [`Stats::shared_writes_replayed`](crate::Stats::shared_writes_replayed); the checked
    /// writes (`Cache::try_invalidate` and its kin) say which writes were deferred.
    ///
    /// ```
    /// # use herdcache::fleet::{RedisTier, Utf8};
    /// let tier = RedisTier::builder("redis://127.0.0.1/")
    ///     .key_prefix("orders:")
    ///     .outbox_limit(100_000) // a write-heavy service: keep more through an outage
    ///     .build(|id: &u64| id.to_string(), Utf8)?;
    /// # let _: RedisTier<u64, String> = tier;
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn outbox_limit(mut self, writes: usize) -> Self {
        self.outbox_limit = writes;
        self
    }

    /// Checks the settings and builds the tier: `key_name` names a key in Redis (after the
    /// prefix), `codec` carries values across the wire.
    ///
    /// # Errors
    /// [`BuildError::Invalid`] for a malformed URL or a duration out of range.
    ///
    /// ```
    /// use std::time::Duration;
    /// use herdcache::fleet::{Raw, RedisTier};
    /// // Keys of two parts, values stored as raw bytes.
    /// let tier: RedisTier<(u32, String), Vec<u8>> = RedisTier::builder("redis://127.0.0.1/").key_prefix("users:")
    ///     .build(|(tenant, path): &(u32, String)| format!("{tenant}/{path}"), Raw)?;
    /// let err = RedisTier::builder("redis://127.0.0.1/").key_prefix("users:")
    ///     .coherence_bound(Duration::from_millis(5))
    ///     .build::<u64, Vec<u8>>(|id| id.to_string(), Raw)
    ///     .unwrap_err();
    /// assert_eq!(err.setting(), "coherence_bound");
    /// # let _ = tier;
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn build<K, V>(
        self,
        key_name: impl Fn(&K) -> String + Send + Sync + 'static,
        codec: impl Codec<V>,
    ) -> Result<RedisTier<K, V>, BuildError> {
        check("lease", self.lease, false)?;
        check("heartbeat", self.heartbeat, false)?;
        check("keepalive", self.keepalive, false)?;
        if self.heartbeat < Duration::from_millis(1) {
            return Err(BuildError::Invalid {
                setting: "heartbeat",
                reason: "must be at least 1 ms (Redis expiries are in milliseconds)",
            });
        }
        check("wait_bound", self.wait_bound, true)?;
        check("op_timeout", self.op_timeout, false)?;
        check("retry_after", self.retry_after, false)?;
        check("log_interval", self.log_interval, true)?;
        check("max_shared_ttl", self.max_shared_ttl, false)?;
        check("coherence_bound", self.coherence_bound, false)?;
        if self.lease < Duration::from_millis(1) {
            return Err(BuildError::Invalid {
                setting: "lease",
                reason: "must be at least 1 ms (Redis leases are in milliseconds)",
            });
        }
        if self.max_shared_ttl < Duration::from_millis(1) {
            return Err(BuildError::Invalid {
                setting: "max_shared_ttl",
                reason: "must be at least 1 ms (Redis expiries are in milliseconds)",
            });
        }
        if self.coherence_bound < MIN_COHERENCE_BOUND {
            return Err(BuildError::Invalid {
                setting: "coherence_bound",
                reason: "must be at least 10 ms",
            });
        }
        let prefix = match self.prefix {
            Some(p) if !p.is_empty() => p,
            _ => {
                return Err(BuildError::Missing {
                    setting: "key_prefix",
                })
            }
        };
        let tls = self.url.starts_with("rediss://");
        if tls && !cfg!(feature = "tls") {
            return Err(BuildError::Invalid {
                setting: "url",
                reason: "rediss:// (TLS) needs herdcache's `tls` feature",
            });
        }
        let client = redis::Client::open(self.url.as_str()).map_err(|_| BuildError::Invalid {
            setting: "url",
            reason: "is not a valid Redis URL",
        })?;
        #[cfg(feature = "tls")]
        if tls {
            // rustls needs one process-wide crypto provider; with two compiled in (another
            // crate's choice) it would panic in the first connection rather than pick. Ours,
            // unless the application installed one first. (ring: deprecated by rustls for
            // want of post-quantum key exchange, but it builds with a C compiler alone; an
            // application that wants aws-lc-rs installs it before building the tier.)
            #[allow(deprecated)]
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let db = client.get_connection_info().redis_settings().db();
        let tier_keys = TierKeys {
            epoch: format!("{prefix}epoch"),
            sequence: format!("{prefix}seq"),
            // The stamp (two numbers of at most 20 digits, two colons) and the type's tag.
            max_value_size: self.max_value_size.saturating_add(60),
        };
        // Values carry their type: a value written by a cache of another value type (or
        // codec) under the same prefix is a miss, never a wrong value decoded.
        let value_tag = FixedState::with_seed(0x7479_7065).hash_one((
            std::any::type_name::<V>(),
            std::any::type_name_of_val(&codec),
        ));
        let heartbeat = Arc::new(Heartbeat::new(
            client.clone(),
            self.heartbeat,
            self.op_timeout,
        ));
        Ok(RedisTier {
            sync: SyncStore::new(
                client.clone(),
                self.op_timeout,
                tier_keys.clone(),
                Arc::clone(&heartbeat),
            ),
            async_: AsyncStore::new(client.clone(), self.op_timeout, tier_keys, heartbeat),
            client,
            key_name: Box::new(key_name),
            codec: Box::new(codec),
            channel: format!("{prefix}inv@{db}"),
            value_tag,
            outbox: outbox::Outbox::new(self.outbox_limit),
            max_value_size: self.max_value_size,
            coherence: Arc::new(Coherence::new(
                self.coherence_bound,
                FixedState::with_seed(0x6e73).hash_one((&prefix, db)),
            )),
            prefix,
            lease: self.lease,
            heartbeat: self.heartbeat,
            keepalive: self.keepalive,
            wait_bound: self.wait_bound,
            max_shared_ttl: self.max_shared_ttl,
            op_timeout: self.op_timeout,
            retry_after: self.retry_after,
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
    /// Whether a load outside a tokio runtime, which skips the tier, has been logged.
    logged_off_tokio: AtomicBool,
    /// Whether refused credentials have been logged (shared with the subscriber).
    logged_auth: Arc<AtomicBool>,
    retry_after: Duration,
    log_interval: Duration,
}

impl Health {
    fn new(retry_after: Duration, log_interval: Duration) -> Self {
        Health {
            epoch: Instant::now(),
            down_until: AtomicU64::new(0),
            logged_at: AtomicU64::new(0),
            logged_off_tokio: AtomicBool::new(false),
            logged_auth: Arc::new(AtomicBool::new(false)),
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

    /// The once-flag of [`say_refused`], shared with the subscriber.
    fn refused_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.logged_auth)
    }

    /// A future's load outside a tokio runtime skipped the tier: said once per tier, and
    /// counted each time by the caller.
    fn skipped_off_tokio(&self) {
        if !self.logged_off_tokio.swap(true, Ordering::Relaxed) {
            log::warn!(
                "herdcache: a future loaded outside a tokio runtime, which the shared tier's client needs; such loads skip the tier (counted in Stats::shared_skipped)"
            );
            trace_event!(
                WARN,
                "a future's load outside a tokio runtime skipped the shared tier"
            );
        }
    }

    /// A write was queued for replay (or, past the outbox's bound, given up for an
    /// `invalidate_all`): logged at most once per interval.
    fn deferred(&self, sent: Sent) {
        trace_event!(
            WARN,
            "a write could not reach the shared tier; deferred for replay"
        );
        if self.log_due() {
            let how = match sent {
                Sent::Overflowed => "the outbox is full: every shared value will be invalidated",
                _ => "it will be replayed, in order, once Redis answers",
            };
            log::warn!("herdcache: a write could not reach Redis and was deferred: {how}");
        }
    }

    /// Whether a log line is due (at most one per `log_interval`), claiming it.
    fn log_due(&self) -> bool {
        let now = self.now();
        let last = self.logged_at.load(Ordering::Relaxed);
        let due = last == 0 || now + 1 >= last + self.log_interval.as_nanos() as u64;
        due && self
            .logged_at
            .compare_exchange(last, now + 1, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    fn failed(&self, e: &StoreError) {
        trace_event!(WARN, error = %e.message, "shared tier failed; loading locally");
        let now = self.now();
        // An error reply about one key (a bad value, a script error) leaves Redis in use for
        // the others.
        if e.unreachable {
            self.down_until
                .store(now + self.retry_after.as_nanos() as u64, Ordering::Relaxed);
        }
        if e.auth && say_refused(&self.logged_auth, &e.message) {
            return;
        }
        if self.log_due() {
            log::warn!(
                "herdcache: Redis failed ({}); loading locally, retrying Redis in {:?}",
                e.message,
                self.retry_after
            );
        }
    }
}

/// Refused credentials are a configuration error, not a passing fault: said once per tier,
/// at once and at error level, past the log interval, by whichever connection meets them
/// first (a new instance's first is its subscriber's). Whether this call said it.
pub(crate) fn say_refused(said: &AtomicBool, message: &str) -> bool {
    if said.swap(true, Ordering::Relaxed) {
        return false;
    }
    log::error!(
        "herdcache: Redis refused the shared tier's credentials ({message}): every load is local and every local copy lives at most the coherence bound until the URL's user and password are fixed (RedisTier::check tells before a cache is built)"
    );
    trace_event!(ERROR, error = %message, "Redis refused the shared tier's credentials");
    true
}

/// A random 64-bit number (process id, a counter and the clock through a randomly seeded
/// hasher): lock tokens and instance ids.
pub(crate) fn random_u64() -> u64 {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    RandomState::new().hash_one((std::process::id(), seq, Instant::now()))
}

/// The bytes to store for `value`, tagged with its type, if the codec can encode it and they
/// are at most `max` bytes; else `None`, counted.
fn encode<V: 'static>(
    codec: &dyn Codec<V>,
    tag: u64,
    max: usize,
    value: &V,
    count: &dyn Fn(Counter),
) -> Option<Vec<u8>> {
    let Ok(bytes) = codec.encode(value) else {
        count(Counter::SharedCodecErrors);
        return None;
    };
    if bytes.len() > max {
        count(Counter::SharedTooLarge);
        return None;
    }
    Some(tagged(tag, bytes))
}

/// The bytes stored for a value: its type's tag (see `RedisTier::value_tag`), then the
/// codec's bytes.
pub(crate) fn tagged(tag: u64, bytes: Vec<u8>) -> Vec<u8> {
    let mut out = format!("{tag:016x}:").into_bytes();
    out.extend_from_slice(&bytes);
    out
}

/// The codec's bytes of a value stored by `tagged` with `tag`; `None` for another type's.
fn untagged(tag: u64, bytes: &[u8]) -> Option<&[u8]> {
    let (head, rest) = bytes.split_at_checked(17)?;
    (head[16] == b':' && head[..16] == *format!("{tag:016x}").as_bytes()).then_some(rest)
}

/// A random lock token: no two holders share one.
fn token() -> String {
    format!("{:016x}{:016x}", random_u64(), random_u64())
}

/// The protocol's view of a tier and its cache: the codec, the tag of the value type, and
/// the cache's counters.
struct TierHooks<'a, V: 'static> {
    codec: &'a dyn Codec<V>,
    tag: u64,
    max_value_size: usize,
    count: &'a (dyn Fn(Counter) + Sync),
}

impl<V: 'static> Hooks<V> for TierHooks<'_, V> {
    fn decode(&self, bytes: &[u8]) -> Option<V> {
        self.codec.decode(untagged(self.tag, bytes)?).ok()
    }

    fn encode(&self, value: &V) -> Option<Vec<u8>> {
        encode(self.codec, self.tag, self.max_value_size, value, self.count)
    }

    fn count(&self, c: Counter) {
        (self.count)(c)
    }
}

/// Why [`RedisTier::check`] found the tier unusable.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckError {
    /// Redis refused the URL's user and password, or wants some that the URL does not give.
    Auth(String),
    /// Redis did not answer within `op_timeout`: down, a wrong host or port, a TLS handshake
    /// that failed.
    Unreachable(String),
    /// Redis replied with another error.
    Refused(String),
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckError::Auth(m) => write!(f, "Redis refused the tier's credentials: {m}"),
            CheckError::Unreachable(m) => write!(f, "Redis did not answer: {m}"),
            CheckError::Refused(m) => write!(f, "Redis replied with an error: {m}"),
        }
    }
}

impl std::error::Error for CheckError {}

/// A write whose shared-tier half did not reach Redis, from the checked writes
/// ([`Cache::try_insert`](crate::Cache::try_insert),
/// [`try_invalidate`](crate::Cache::try_invalidate),
/// [`try_invalidate_all`](crate::Cache::try_invalidate_all)). The write was applied to this
/// instance; the fleet learns of it later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SharedWriteError {
    /// Queued: replayed, as an invalidation of its key, once Redis answers, before this
    /// instance reads the tier again (see
    /// [`outbox_limit`](RedisTierBuilder::outbox_limit)).
    Deferred,
    /// The outbox was full: on recovery every shared value is invalidated instead.
    OutboxFull,
}

impl SharedWriteError {
    /// `Ok` for a write that reached Redis (or had no tier to reach).
    pub(crate) fn of(sent: Option<Sent>) -> Result<(), Self> {
        match sent {
            None | Some(Sent::Applied) => Ok(()),
            Some(Sent::Deferred) => Err(SharedWriteError::Deferred),
            Some(Sent::Overflowed) => Err(SharedWriteError::OutboxFull),
        }
    }
}

impl fmt::Display for SharedWriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SharedWriteError::Deferred => {
                "the write did not reach the shared tier; it is queued, to be replayed once Redis answers"
            }
            SharedWriteError::OutboxFull => {
                "the write did not reach the shared tier, whose outbox is full: on recovery every shared value is invalidated"
            }
        })
    }
}

impl std::error::Error for SharedWriteError {}

/// What an instance knows of its shared tier, from
/// [`Cache::shared_status`](crate::Cache::shared_status): for readiness probes, and for
/// tests that must wait until an instance hears the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TierStatus {
    /// Subscribed to the tier's channel: the local copies this instance keeps from now on
    /// are dropped when another instance writes their key. While not, copies live at most
    /// the coherence bound.
    pub subscribed: bool,
    /// Redis answered the last operation that tried it: loads and writes use the tier
    /// (after a failure it is skipped for `retry_after`, and reads are served locally).
    pub reachable: bool,
}

/// A load that went through the tier: its result, what the local cache keeps of it, and
/// what the instance had heard when it began.
pub(crate) struct Fetched<V, E> {
    pub(crate) result: Result<V, E>,
    pub(crate) keep: Keep,
    pub(crate) seen: Seen,
}

/// What the cache tells the tier about one load.
pub(crate) struct LoadPlan {
    /// The key's policy key (its hash, the same on every instance).
    pub(crate) pkey: u64,
    /// The TTL to write a loaded value with (the cache's).
    pub(crate) ttl: Option<Duration>,
    /// For a refresh, how long the value being refreshed still lives.
    pub(crate) refreshing: Option<Duration>,
    /// The load's own deadline.
    pub(crate) deadline: Option<Instant>,
}

/// The Redis names of one key.
struct Names {
    value: String,
    lock: String,
    generation: String,
    token: String,
}

impl<K, V: 'static> RedisTier<K, V> {
    /// What this instance knows of the tier now.
    pub(crate) fn status(&self) -> TierStatus {
        TierStatus {
            subscribed: self.coherence.link_up(),
            reachable: !self.health.is_down(),
        }
    }

    /// The coherence state this tier's instance shares with its subscriber.
    pub(crate) fn coherence(&self) -> &Arc<Coherence> {
        &self.coherence
    }

    /// The seed of the cache's policy keys: the same on every instance of the tier's prefix,
    /// so a key's hash names it on the channel.
    pub(crate) fn pkey_seed(&self) -> u64 {
        foldhash::fast::FixedState::with_seed(0x6865_7264_6361_6368).hash_one(&self.prefix)
    }

    /// The TTL a value is written to Redis with: its own (or the cache's), capped.
    fn shared_ttl(&self, ttl: Option<Duration>) -> Duration {
        ttl.map_or(self.max_shared_ttl, |t| t.min(self.max_shared_ttl))
            .max(Duration::from_millis(1))
    }

    /// How long a key's generation outlives a value written under it: longer than any value
    /// lives, and than any load that may still publish (a lease) on either side.
    fn generation_ttl(&self) -> Duration {
        self.max_shared_ttl + 2 * self.lease + Duration::from_secs(1)
    }

    fn generation_key(&self, pkey: u64) -> String {
        format!("{}g:{pkey:016x}", self.prefix)
    }

    fn names(&self, key: &K, pkey: u64) -> Names {
        let name = (self.key_name)(key);
        Names {
            value: format!("{}v:{name}", self.prefix),
            lock: format!("{}l:{name}", self.prefix),
            generation: self.generation_key(pkey),
            token: token(),
        }
    }

    fn plan<'a>(&self, names: &'a Names, load: &LoadPlan) -> Plan<'a> {
        Plan {
            keys: Keys {
                value: &names.value,
                lock: &names.lock,
                generation: &names.generation,
            },
            token: &names.token,
            lease: self.lease,
            lock_ttl: heartbeat::lock_ttl(self.heartbeat),
            wait_bound: self.wait_bound,
            deadline: load.deadline,
            ttl: self.shared_ttl(load.ttl),
            generation_ttl: self.generation_ttl(),
            refreshing: load.refreshing,
        }
    }

    /// What the local cache keeps of a value that would live `ttl` (`None`: the cache's
    /// expiry): while the link is down, at most the coherence bound.
    pub(crate) fn keep(&self, ttl: Option<Duration>) -> Keep {
        if self.coherence.link_up() {
            Keep::For(ttl)
        } else {
            let bound = self.coherence.bound;
            Keep::For(Some(ttl.map_or(bound, |t| t.min(bound))))
        }
    }

    fn finish<E>(&self, out: Outcome<V, E>, seen: Seen, count: &dyn Fn(Counter)) -> Fetched<V, E> {
        let (result, keep) = match out {
            Outcome::Shared(v, ttl) => (Ok(v), self.keep(Some(ttl))),
            Outcome::Loaded(result) => (result, self.keep(None)),
            Outcome::Refused(result) => (result, Keep::No),
            Outcome::Failed(result, e) => {
                count(Counter::SharedErrors);
                self.health.failed(&e);
                (result, self.keep(None))
            }
        };
        Fetched { result, keep, seen }
    }

    /// The Redis names for one coordinated load of `key`, or `None` while Redis is being
    /// skipped after a failure, and while writes wait to be replayed (the tier may hold
    /// values they invalidate).
    fn begin(&self, key: &K, pkey: u64) -> Option<Names> {
        (!self.health.is_down() && !self.outbox.pending()).then(|| self.names(key, pkey))
    }

    /// A thread's coordinated load: `load` runs at most once, on this thread.
    pub(crate) fn load_sync<E>(
        &self,
        key: &K,
        load_plan: LoadPlan,
        count: &(dyn Fn(Counter) + Sync),
        load: impl FnOnce() -> Result<V, E>,
    ) -> Fetched<V, E> {
        let seen = self.coherence.before_load(load_plan.pkey);
        let Some(names) = self.begin(key, load_plan.pkey) else {
            return Fetched {
                result: load(),
                keep: self.keep(None),
                seen,
            };
        };
        let hooks = TierHooks {
            codec: &*self.codec,
            tag: self.value_tag,
            max_value_size: self.max_value_size,
            count,
        };
        let coordinated =
            protocol::coordinate(&self.sync, &hooks, self.plan(&names, &load_plan), async {
                load()
            });
        self.finish(crate::spawn::block_on(coordinated), seen, count)
    }

    /// A future's coordinated load: `load` is awaited at most once.
    pub(crate) async fn load_async<E, L>(
        &self,
        key: &K,
        load_plan: LoadPlan,
        count: &(dyn Fn(Counter) + Sync),
        load: L,
    ) -> Fetched<V, E>
    where
        L: Future<Output = Result<V, E>>,
    {
        let seen = self.coherence.before_load(load_plan.pkey);
        let Some(names) = self.begin(key, load_plan.pkey) else {
            return Fetched {
                result: load.await,
                keep: self.keep(None),
                seen,
            };
        };
        let hooks = TierHooks {
            codec: &*self.codec,
            tag: self.value_tag,
            max_value_size: self.max_value_size,
            count,
        };
        let plan = self.plan(&names, &load_plan);
        let out = protocol::coordinate(&self.async_, &hooks, plan, load).await;
        self.finish(out, seen, count)
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
        let b = || RedisTier::builder("redis://127.0.0.1:6379/").key_prefix("users:");
        assert_eq!(
            setting(build(
                RedisTier::builder("http://nope").key_prefix("users:")
            )),
            "url"
        );
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
        for bad in [
            Duration::ZERO,
            Duration::from_micros(10),
            Duration::from_secs(90_000),
        ] {
            assert_eq!(setting(build(b().max_shared_ttl(bad))), "max_shared_ttl");
        }
        for bad in [
            Duration::ZERO,
            Duration::from_millis(9),
            Duration::from_secs(90_000),
        ] {
            assert_eq!(setting(build(b().coherence_bound(bad))), "coherence_bound");
        }
        // Not waiting at all is a valid choice; building connects to nothing.
        assert!(build(b().wait_bound(Duration::ZERO)).is_ok());
        for bad in [Duration::ZERO, Duration::from_micros(10)] {
            assert_eq!(setting(build(b().heartbeat(bad))), "heartbeat");
        }
        assert_eq!(setting(build(b().keepalive(Duration::ZERO))), "keepalive");
        // TLS is a feature: without it a rediss:// URL says what it needs.
        let tls = build(RedisTier::builder("rediss://127.0.0.1:6380/").key_prefix("users:"));
        #[cfg(feature = "tls")]
        assert!(tls.is_ok(), "{tls:?}");
        #[cfg(not(feature = "tls"))]
        assert!(
            tls.as_ref()
                .is_err_and(|e| e.to_string().contains("`tls` feature")),
            "{tls:?}"
        );
        // A namespace must be named: two caches on one Redis never share one by default.
        let bare = RedisTier::builder("redis://127.0.0.1:6379/");
        for missing in [bare.clone(), bare.key_prefix("")] {
            assert_eq!(
                build(missing).unwrap_err(),
                BuildError::Missing {
                    setting: "key_prefix"
                }
            );
        }
    }

    #[test]
    fn a_tier_given_before_the_hasher_is_an_error_not_a_cache_without_coherence() {
        let tier =
            build(RedisTier::builder("redis://127.0.0.1:6379/").key_prefix("users:")).unwrap();
        let r = crate::Cache::<u64, String>::builder()
            .max_capacity(10)
            .shared_tier(tier)
            .hasher(std::hash::RandomState::new())
            .build();
        match r {
            Err(BuildError::Invalid { setting, .. }) => assert_eq!(setting, "shared_tier"),
            Ok(_) => panic!("built a fleet cache that would hear no broadcast"),
            Err(e) => panic!("unexpected {e:?}"),
        }
    }

    #[test]
    fn failures_skip_redis_for_a_while_and_log_once_per_interval() {
        let h = Health::new(Duration::from_secs(3600), Duration::from_secs(3600));
        assert!(!h.is_down());
        h.failed(&StoreError::new("refused", true));
        assert!(h.is_down());
        let logged = h.logged_at.load(Ordering::Relaxed);
        assert_ne!(logged, 0);
        h.failed(&StoreError::new("refused", true));
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
