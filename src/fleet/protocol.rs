//! The fleet coordination protocol, written once over an abstract [`Store`]: the sync path
//! drives it with a store whose operations block (and a trivial executor), the async path with
//! a store whose operations are futures.
//!
//! Run only by the in-process leader of a load, so each instance talks to the store at most
//! once per key per load:
//! 1. Read the shared tier: the value, its remaining TTL, and the key's current [`Stamp`]. A
//!    value written under the current stamp (and for a refresh, newer than the one being
//!    refreshed) is the answer.
//! 2. Else try the soft lock (`SET NX PX lock_ttl` with a random token). The winner keeps
//!    it alive with a heartbeat while it loads (for at most its lease), reads the tier again
//!    (a holder may have written and released since step 1), then loads and publishes the
//!    value only if it still holds the lock and the key's stamp is still the one it read
//!    (and claimed) before loading (compare-and-set in the store), and releases the lock
//!    only if it still holds it. A load that outlived its lease is not published: the stamp
//!    it read may have been invalidated and expired since.
//! 3. A loser waits with backoff, re-reading the tier and retrying the lock (a holder that
//!    died stops its heartbeat, and its lock lapses within `lock_ttl`), until its wait bound
//!    or its own deadline; then it loads anyway, without publishing.
//!
//! The store can only ever make a load cheaper: every store error ends coordination for this
//! load (counted, and the store is then skipped for a while by the caller), and the load runs
//! locally.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::stats::Counter;

/// A store operation failed (unreachable, slow, or an error reply).
#[derive(Debug)]
pub(crate) struct StoreError {
    pub(crate) message: String,
    /// The store could not be reached (a connection failed, or an operation timed out): it
    /// is skipped for a while. An error reply about one key says nothing of the others.
    pub(crate) unreachable: bool,
    /// Redis refused the credentials (or wants some): every command will fail alike until
    /// the configuration is fixed.
    pub(crate) auth: bool,
}

impl StoreError {
    pub(crate) fn new(message: impl Into<String>, unreachable: bool) -> Self {
        StoreError {
            message: message.into(),
            unreachable,
            auth: false,
        }
    }
}

/// Which write of a key a shared value belongs to: the tier's epoch (moved by
/// `invalidate_all`) and the key's generation (moved by `invalidate` and `insert`). A value is
/// current only while both still match the store's; 0 stands for "not set", which no stored
/// value ever carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Stamp {
    pub(crate) epoch: u64,
    pub(crate) generation: u64,
}

/// A stored value: the stamp it was written under, then the codec's bytes.
pub(crate) fn split_stamped(bytes: &[u8]) -> Option<(Stamp, &[u8])> {
    let mut parts = bytes.splitn(3, |&b| b == b':');
    let mut number = || -> Option<u64> { std::str::from_utf8(parts.next()?).ok()?.parse().ok() };
    let epoch = number()?;
    let generation = number()?;
    let rest = parts.next()?;
    Some((Stamp { epoch, generation }, rest))
}

/// What one read of the tier saw.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    /// The stored bytes (stamp and payload) and their remaining time to live.
    pub(crate) value: Option<(Vec<u8>, Duration)>,
    /// The key's current stamp.
    pub(crate) current: Stamp,
}

/// Where one key lives in the store.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keys<'a> {
    pub(crate) value: &'a str,
    pub(crate) lock: &'a str,
    pub(crate) generation: &'a str,
}

/// The shared tier and its soft locks.
pub(crate) trait Store: Sync {
    /// The value under `keys.value` with its remaining time to live, and the key's stamp,
    /// read atomically. With `claim` (a generation TTL), a key without a generation and a
    /// tier without an epoch get one first, so the stamp read is never "not set".
    fn read(
        &self,
        keys: Keys<'_>,
        claim: Option<Duration>,
    ) -> impl Future<Output = Result<Snapshot, StoreError>> + Send;
    /// `SET lock token NX PX ttl`: whether the lock is now ours.
    fn try_lock(
        &self,
        lock: &str,
        token: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
    /// Keeps `lock` alive while it holds `token`, until `until` (a heartbeat renews it) or
    /// `unhold`.
    fn hold(&self, _lock: &str, _token: &str, _until: Instant) {}
    /// Stops renewing `lock`.
    fn unhold(&self, _lock: &str) {}
    /// Writes `payload` under the key's stamp with time to live `ttl`, atomically and only if
    /// the key's lock still holds `token` and its stamp is still `expected` and set (keeping
    /// the generation at least `generation_ttl`): whether it wrote.
    fn publish(
        &self,
        keys: Keys<'_>,
        token: &str,
        expected: Stamp,
        payload: Vec<u8>,
        ttl: Duration,
        generation_ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
    /// Deletes the lock if it still holds `token` (atomically): whether it did.
    fn release(
        &self,
        lock: &str,
        token: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
    /// Releases the lock from a drop guard (a holder cancelled or unwinding): best effort,
    /// and never blocking an async executor.
    fn release_detached(&self, lock: &str, token: &str);
    /// Waits, between polls of a lock held elsewhere.
    fn sleep(&self, d: Duration) -> impl Future<Output = ()> + Send;
}

/// One coordinated load's parameters.
pub(crate) struct Plan<'a> {
    pub(crate) keys: Keys<'a>,
    pub(crate) token: &'a str,
    /// How long a load may hold the lock (renewed meanwhile) and still publish.
    pub(crate) lease: Duration,
    /// The lock's time to live, renewed by the holder's heartbeat: what a holder that died
    /// costs the others.
    pub(crate) lock_ttl: Duration,
    pub(crate) wait_bound: Duration,
    /// The load's own deadline: waiting for another holder ends there too.
    pub(crate) deadline: Option<Instant>,
    /// The TTL written with a loaded value.
    pub(crate) ttl: Duration,
    /// The least time a key's generation outlives a value written under it.
    pub(crate) generation_ttl: Duration,
    /// For a refresh: how long the value being refreshed still lives. Only a shared value
    /// that outlives it by more than [`NEWER_BY`] is taken as a newer one.
    pub(crate) refreshing: Option<Duration>,
}

/// How much longer than the value being refreshed a shared value must live to count as a
/// newer write (instances filled from one write expire within milliseconds of each other).
pub(crate) const NEWER_BY: Duration = Duration::from_millis(20);

/// First and longest pause between polls of a lock held elsewhere.
const BACKOFF_FIRST: Duration = Duration::from_millis(2);
const BACKOFF_MAX: Duration = Duration::from_millis(50);

/// What coordination produced.
pub(crate) enum Outcome<V, E> {
    /// The shared tier had the value: decoded, with its remaining TTL.
    Shared(V, Duration),
    /// This instance loaded (as the lock's holder, after a store error, or after waiting out
    /// the bound).
    Loaded(Result<V, E>),
    /// This instance loaded as the lock's holder, but the key was written or invalidated
    /// since it read the stamp (or the load outlived its lease): the value goes to this
    /// load's waiters only, and is cached nowhere.
    Refused(Result<V, E>),
    /// The store failed; the caller marks it down. The load still ran.
    Failed(Result<V, E>, StoreError),
}

/// Hooks from the protocol to the cache: the codec and the counters.
pub(crate) trait Hooks<V> {
    fn decode(&self, bytes: &[u8]) -> Option<V>;
    /// The bytes to publish for `value`, or `None` (counted by the hooks: a codec error, a
    /// value too large to share).
    fn encode(&self, value: &V) -> Option<Vec<u8>>;
    fn count(&self, c: Counter);
}

/// Runs one coordinated load; `load` is polled at most once to completion.
pub(crate) async fn coordinate<St, V, E, L>(
    store: &St,
    hooks: &(impl Hooks<V> + Sync),
    plan: Plan<'_>,
    load: L,
) -> Outcome<V, E>
where
    St: Store,
    L: Future<Output = Result<V, E>>,
{
    let started = Instant::now();
    let give_up = match plan.deadline {
        Some(d) => d.min(started + plan.wait_bound),
        None => started + plan.wait_bound,
    };
    let mut backoff = BACKOFF_FIRST;
    let mut waited = false;
    loop {
        // 1. The shared tier.
        match shared(store, hooks, &plan, false).await {
            Ok(Answer::Value(v, ttl)) => return Outcome::Shared(v, ttl),
            Ok(Answer::Miss(_)) => {}
            Err(e) => return Outcome::Failed(load.await, e),
        }
        // 2. The soft lock.
        match store
            .try_lock(plan.keys.lock, plan.token, plan.lock_ttl)
            .await
        {
            Ok(true) => {
                store.hold(plan.keys.lock, plan.token, Instant::now() + plan.lease);
                let held = LockGuard {
                    store,
                    plan: &plan,
                    armed: true,
                };
                // A holder may have written its value and released between our read and
                // our lock: Redis runs commands one at a time, so a read after our lock sees
                // any value written before the release that let us take it.
                let read_at = Instant::now();
                return match shared(store, hooks, &plan, true).await {
                    Ok(Answer::Value(v, ttl)) => {
                        let _ = held.release().await;
                        Outcome::Shared(v, ttl)
                    }
                    Ok(Answer::Miss(stamp)) => hold(held, hooks, stamp, read_at, load).await,
                    Err(e) => {
                        held.disarm();
                        Outcome::Failed(load.await, e)
                    }
                };
            }
            Ok(false) => {}
            Err(e) => return Outcome::Failed(load.await, e),
        }
        // 3. Held elsewhere: wait, within the bound and the load's own deadline.
        if !waited {
            waited = true;
            hooks.count(Counter::SharedLockWaits);
        }
        let left = give_up.saturating_duration_since(Instant::now());
        if left.is_zero() {
            hooks.count(Counter::SharedWaitTimeouts);
            return Outcome::Loaded(load.await);
        }
        store.sleep(backoff.min(left)).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// What a read of the tier means for this load.
enum Answer<V> {
    /// A current value (newer than the one being refreshed), with its remaining TTL.
    Value(V, Duration),
    /// No usable value; the key's stamp as read.
    Miss(Stamp),
}

/// Reads the tier: a value written under the key's current stamp answers the load (counted
/// as a shared hit), unless it is a refresh's own write. An undecodable value is a miss,
/// counted once per load (not again on the `holder`'s re-read after the lock, which also
/// claims a stamp for the key).
async fn shared<St: Store, V>(
    store: &St,
    hooks: &impl Hooks<V>,
    plan: &Plan<'_>,
    holder: bool,
) -> Result<Answer<V>, StoreError> {
    let snapshot = store
        .read(plan.keys, holder.then_some(plan.generation_ttl))
        .await?;
    let current = snapshot.current;
    let Some((bytes, ttl)) = snapshot.value else {
        return Ok(Answer::Miss(current));
    };
    let payload = match split_stamped(&bytes) {
        // Written before the last invalidation, insert or invalidate_all: gone.
        Some((stamp, _)) if stamp != current => return Ok(Answer::Miss(current)),
        Some((_, payload)) => Some(payload),
        None => None,
    };
    if !is_newer(ttl, plan.refreshing) {
        return Ok(Answer::Miss(current));
    }
    match payload.and_then(|p| hooks.decode(p)) {
        Some(v) => {
            hooks.count(Counter::SharedHits);
            Ok(Answer::Value(v, ttl))
        }
        // Treated as a miss: the lock's winner overwrites it.
        None => {
            if !holder {
                hooks.count(Counter::SharedCodecErrors);
            }
            Ok(Answer::Miss(current))
        }
    }
}

/// Whether a shared value with `ttl` left answers this load.
fn is_newer(ttl: Duration, refreshing: Option<Duration>) -> bool {
    match refreshing {
        None => true,
        Some(left) => ttl > left + NEWER_BY,
    }
}

/// The soft lock while this load holds it: released on every path out, including a holder
/// cancelled mid-load (its future dropped) or unwinding from a panicking loader.
struct LockGuard<'a, St: Store> {
    store: &'a St,
    plan: &'a Plan<'a>,
    armed: bool,
}

impl<St: Store> LockGuard<'_, St> {
    /// Releases the lock: whether the store answered.
    async fn release(mut self) -> Result<bool, StoreError> {
        self.armed = false;
        self.store.unhold(self.plan.keys.lock);
        self.store
            .release(self.plan.keys.lock, self.plan.token)
            .await
    }

    /// The store failed: leave the lock to lapse (its heartbeat stops) rather than call it
    /// again.
    fn disarm(mut self) {
        self.armed = false;
        self.store.unhold(self.plan.keys.lock);
    }
}

impl<St: Store> Drop for LockGuard<'_, St> {
    fn drop(&mut self) {
        if self.armed {
            self.store.unhold(self.plan.keys.lock);
            self.store
                .release_detached(self.plan.keys.lock, self.plan.token);
        }
    }
}

/// Loads as the lock's holder, publishes if the key's stamp is still `stamp` (read at
/// `read_at`), and releases.
async fn hold<St, V, E, L>(
    held: LockGuard<'_, St>,
    hooks: &impl Hooks<V>,
    stamp: Stamp,
    read_at: Instant,
    load: L,
) -> Outcome<V, E>
where
    St: Store,
    L: Future<Output = Result<V, E>>,
{
    let (store, plan) = (held.store, held.plan);
    hooks.count(Counter::SharedLoads);
    let result = load.await;
    let mut refused = false;
    if let Ok(v) = &result {
        // Past its lease the stamp read may have been moved and expired again (generations
        // outlive a lease, not more), so the compare-and-set could not tell: not published.
        // The instance may still keep it: its own re-check covers the writes it heard.
        if read_at.elapsed() < plan.lease {
            // Not shareable (`None`: the hooks counted why): the others load for themselves.
            if let Some(bytes) = hooks.encode(v) {
                match store
                    .publish(
                        plan.keys,
                        plan.token,
                        stamp,
                        bytes,
                        plan.ttl,
                        plan.generation_ttl,
                    )
                    .await
                {
                    Ok(written) => refused = !written,
                    // Released even so (best effort): a publish that timed out must not
                    // leave the lock to its lease, holding up every other instance.
                    Err(e) => {
                        drop(held);
                        return Outcome::Failed(result, e);
                    }
                }
            }
        }
        if refused {
            hooks.count(Counter::SharedConflicts);
        }
    }
    // After an error too, so that the others load at once rather than after the lease.
    match held.release().await {
        Ok(_) if refused => Outcome::Refused(result),
        Ok(_) => Outcome::Loaded(result),
        Err(e) => Outcome::Failed(result, e),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! The protocol against an in-memory store with the Redis scripts' semantics.
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// Stored bytes and time to live, by key ("v" the value, "l" the lock, "g" the
    /// generation).
    type Map = HashMap<String, (Vec<u8>, Option<Duration>)>;

    #[derive(Default)]
    pub(crate) struct Memory {
        map: Mutex<Map>,
        epoch: Mutex<u64>,
        sequence: Mutex<u64>,
        fail: Mutex<bool>,
        /// Values to appear in the tier after this many sleeps.
        appear_after_sleeps: Mutex<Option<(usize, Vec<u8>)>>,
        /// A holder that writes this value and releases just before our lock attempt.
        finish_before_lock: Mutex<Option<Vec<u8>>>,
        sleeps: Mutex<usize>,
        log: Mutex<Vec<String>>,
    }

    impl Memory {
        /// A store whose lock another instance holds.
        fn locked_elsewhere() -> Self {
            let store = Memory::default();
            store.put("l", b"other", None);
            store
        }

        /// Stores raw `bytes` under `key`, as another instance would.
        fn put(&self, key: &str, bytes: &[u8], ttl: Option<Duration>) {
            self.map
                .lock()
                .unwrap()
                .insert(key.into(), (bytes.to_vec(), ttl));
        }

        fn stamp(&self, map: &Map) -> Stamp {
            let generation = map
                .get("g")
                .map_or(0, |(g, _)| std::str::from_utf8(g).unwrap().parse().unwrap());
            Stamp {
                epoch: *self.epoch.lock().unwrap(),
                generation,
            }
        }

        fn next_generation(&self, map: &mut Map) -> u64 {
            let mut s = self.sequence.lock().unwrap();
            *s += 1;
            map.insert("g".into(), (s.to_string().into_bytes(), None));
            *s
        }

        fn stamped(&self, map: &mut Map, payload: &[u8]) -> Vec<u8> {
            if self.stamp(map).generation == 0 {
                self.next_generation(map);
            }
            let s = self.stamp(map);
            let mut bytes = format!("{}:{}:", s.epoch, s.generation).into_bytes();
            bytes.extend_from_slice(payload);
            bytes
        }

        /// Another instance's write of `payload` under the key's current stamp.
        pub(crate) fn write_current(&self, payload: &[u8], ttl: Duration) {
            let mut m = self.map.lock().unwrap();
            let bytes = self.stamped(&mut m, payload);
            m.insert("v".into(), (bytes, Some(ttl)));
        }

        /// An insert of `payload`: a new generation, and the value under it.
        pub(crate) fn insert(&self, payload: &[u8]) {
            let mut m = self.map.lock().unwrap();
            self.next_generation(&mut m);
            let bytes = self.stamped(&mut m, payload);
            m.insert("v".into(), (bytes, Some(Duration::from_secs(9))));
        }

        /// An invalidation of the key (its generation moves; the stale bytes stay).
        pub(crate) fn invalidate(&self) {
            let mut m = self.map.lock().unwrap();
            self.next_generation(&mut m);
        }

        /// The payload stored under the current stamp, if any.
        pub(crate) fn current(&self) -> Option<Vec<u8>> {
            let m = self.map.lock().unwrap();
            let (bytes, _) = m.get("v")?;
            let (stamp, payload) = split_stamped(bytes)?;
            (stamp == self.stamp(&m)).then(|| payload.to_vec())
        }

        fn check(&self, op: &str) -> Result<(), StoreError> {
            self.log.lock().unwrap().push(op.to_owned());
            if *self.fail.lock().unwrap() {
                Err(StoreError::new("down", true))
            } else {
                Ok(())
            }
        }
    }

    impl Store for Memory {
        async fn read(&self, _: Keys<'_>, claim: Option<Duration>) -> Result<Snapshot, StoreError> {
            self.check("read")?;
            let mut m = self.map.lock().unwrap();
            if claim.is_some() && self.stamp(&m).generation == 0 {
                self.next_generation(&mut m);
            }
            Ok(Snapshot {
                value: m
                    .get("v")
                    .map(|(b, t)| (b.clone(), t.unwrap_or(Duration::from_secs(9)))),
                current: self.stamp(&m),
            })
        }
        async fn try_lock(&self, lock: &str, token: &str, _: Duration) -> Result<bool, StoreError> {
            self.check("lock")?;
            if let Some(v) = self.finish_before_lock.lock().unwrap().take() {
                self.write_current(&v, Duration::from_secs(9));
                self.map.lock().unwrap().remove(lock);
            }
            let mut m = self.map.lock().unwrap();
            if m.contains_key(lock) {
                return Ok(false);
            }
            m.insert(lock.into(), (token.as_bytes().to_vec(), None));
            Ok(true)
        }
        async fn publish(
            &self,
            keys: Keys<'_>,
            token: &str,
            expected: Stamp,
            payload: Vec<u8>,
            ttl: Duration,
            _: Duration,
        ) -> Result<bool, StoreError> {
            self.check("publish")?;
            let mut m = self.map.lock().unwrap();
            let holds = m.get(keys.lock).is_some_and(|(t, _)| t == token.as_bytes());
            if !holds || expected.generation == 0 || self.stamp(&m) != expected {
                return Ok(false);
            }
            let bytes = self.stamped(&mut m, &payload);
            m.insert("v".into(), (bytes, Some(ttl)));
            Ok(true)
        }
        async fn release(&self, lock: &str, token: &str) -> Result<bool, StoreError> {
            self.check("release")?;
            let mut m = self.map.lock().unwrap();
            let ours = m.get(lock).is_some_and(|(t, _)| t == token.as_bytes());
            if ours {
                m.remove(lock);
            }
            Ok(ours)
        }
        fn release_detached(&self, lock: &str, token: &str) {
            self.log.lock().unwrap().push("release_detached".into());
            let mut m = self.map.lock().unwrap();
            if m.get(lock).is_some_and(|(t, _)| t == token.as_bytes()) {
                m.remove(lock);
            }
        }
        async fn sleep(&self, _: Duration) {
            self.log.lock().unwrap().push("sleep".into());
            let mut n = self.sleeps.lock().unwrap();
            *n += 1;
            let mut appear = self.appear_after_sleeps.lock().unwrap();
            if let Some((after, v)) = appear.as_ref() {
                if *n >= *after {
                    let v = v.clone();
                    *appear = None;
                    self.write_current(&v, Duration::from_secs(9));
                }
            }
        }
    }

    #[derive(Default)]
    pub(crate) struct Counts(pub(crate) Mutex<Vec<Counter>>);

    impl Hooks<u64> for Counts {
        fn decode(&self, bytes: &[u8]) -> Option<u64> {
            std::str::from_utf8(bytes).ok()?.parse().ok()
        }
        fn encode(&self, v: &u64) -> Option<Vec<u8>> {
            Some(v.to_string().into_bytes())
        }
        fn count(&self, c: Counter) {
            self.0.lock().unwrap().push(c);
        }
    }

    pub(crate) const KEYS: Keys<'static> = Keys {
        value: "v",
        lock: "l",
        generation: "g",
    };

    fn plan(refreshing: Option<Duration>) -> Plan<'static> {
        Plan {
            keys: KEYS,
            token: "me",
            lease: Duration::from_secs(3600),
            lock_ttl: Duration::from_secs(3600),
            wait_bound: Duration::from_secs(3600),
            deadline: None,
            ttl: Duration::from_secs(10),
            generation_ttl: Duration::from_secs(7200),
            refreshing,
        }
    }

    fn run<V>(f: impl Future<Output = V>) -> V {
        crate::spawn::block_on(f)
    }

    fn loaded<V: std::fmt::Debug, E: std::fmt::Debug>(o: Outcome<V, E>) -> Result<V, E> {
        match o {
            Outcome::Loaded(r) => r,
            Outcome::Shared(..) => panic!("expected a load, got a shared value"),
            Outcome::Refused(r) => panic!("expected a published load, got a refused {r:?}"),
            Outcome::Failed(_, e) => panic!("expected a load, got {e:?}"),
        }
    }

    #[test]
    fn a_shared_value_answers_without_loading() {
        let store = Memory::default();
        store.write_current(b"7", Duration::from_secs(5));
        let hooks = Counts::default();
        let out = run(coordinate(&store, &hooks, plan(None), async {
            unreachable!("no load when the tier has the value")
        }));
        assert!(matches!(out, Outcome::<u64, ()>::Shared(7, _)));
        assert_eq!(*hooks.0.lock().unwrap(), [Counter::SharedHits]);
    }

    #[test]
    fn the_lock_holder_loads_publishes_with_the_ttl_and_releases() {
        let store = Memory::default();
        let hooks = Counts::default();
        let out = run(coordinate(&store, &hooks, plan(None), async {
            Ok::<_, ()>(5)
        }));
        assert_eq!(loaded(out), Ok(5));
        assert_eq!(store.current().as_deref(), Some(&b"5"[..]));
        let map = store.map.lock().unwrap();
        assert_eq!(map["v"].1, Some(Duration::from_secs(10)));
        assert!(!map.contains_key("l"), "released");
        assert_eq!(
            *store.log.lock().unwrap(),
            ["read", "lock", "read", "publish", "release"]
        );
    }

    #[test]
    fn a_failed_load_is_not_written_but_releases_the_lock() {
        let store = Memory::default();
        let out = run(coordinate(&store, &Counts::default(), plan(None), async {
            Err::<u64, _>("source down")
        }));
        assert_eq!(loaded(out), Err("source down"));
        let map = store.map.lock().unwrap();
        assert!(!map.contains_key("v") && !map.contains_key("l"));
    }

    #[test]
    fn a_loser_waits_for_the_holders_value() {
        let store = Memory::locked_elsewhere();
        *store.appear_after_sleeps.lock().unwrap() = Some((3, b"9".to_vec()));
        let hooks = Counts::default();
        let out = run(coordinate(&store, &hooks, plan(None), async {
            unreachable!("the holder's value arrives first")
        }));
        assert!(matches!(out, Outcome::<u64, ()>::Shared(9, _)));
        assert_eq!(*store.sleeps.lock().unwrap(), 3);
        assert_eq!(
            *hooks.0.lock().unwrap(),
            [Counter::SharedLockWaits, Counter::SharedHits]
        );
    }

    #[test]
    fn a_lock_freed_by_a_holder_that_just_wrote_its_value_does_not_load_again() {
        let store = Memory::locked_elsewhere();
        // The holder writes and releases between our read and our lock attempt.
        *store.finish_before_lock.lock().unwrap() = Some(b"8".to_vec());
        let hooks = Counts::default();
        let out = run(coordinate(&store, &hooks, plan(None), async {
            unreachable!("the holder's value is already in the tier")
        }));
        assert!(matches!(out, Outcome::<u64, ()>::Shared(8, _)));
        assert!(
            !store.map.lock().unwrap().contains_key("l"),
            "the lock taken for nothing is released"
        );
        assert_eq!(*hooks.0.lock().unwrap(), [Counter::SharedHits]);
    }

    #[test]
    fn a_loser_loads_anyway_once_its_bound_has_passed() {
        let store = Memory::locked_elsewhere();
        let hooks = Counts::default();
        let p = Plan {
            wait_bound: Duration::ZERO,
            ..plan(None)
        };
        let out = run(coordinate(&store, &hooks, p, async { Ok::<_, ()>(4) }));
        assert_eq!(loaded(out), Ok(4));
        assert_eq!(
            *hooks.0.lock().unwrap(),
            [Counter::SharedLockWaits, Counter::SharedWaitTimeouts]
        );
        // It did not take the lock from its holder.
        assert_eq!(store.map.lock().unwrap()["l"].0, b"other");
    }

    #[test]
    fn a_loser_waits_no_longer_than_its_own_deadline() {
        let store = Memory::locked_elsewhere();
        let hooks = Counts::default();
        // A long wait bound, but the load's deadline has come.
        let p = Plan {
            deadline: Some(Instant::now()),
            ..plan(None)
        };
        let out = run(coordinate(&store, &hooks, p, async { Ok::<_, ()>(4) }));
        assert_eq!(loaded(out), Ok(4));
        assert_eq!(*store.sleeps.lock().unwrap(), 0, "no wait at all");
    }

    #[test]
    fn a_store_error_still_loads() {
        let store = Memory::default();
        *store.fail.lock().unwrap() = true;
        let out = run(coordinate(&store, &Counts::default(), plan(None), async {
            Ok::<_, ()>(3)
        }));
        assert!(matches!(out, Outcome::Failed(Ok(3), _)));
    }

    #[test]
    fn an_undecodable_value_is_a_counted_miss() {
        for garbage in [&b"garbage"[..], b"1:1:garbage"] {
            let store = Memory::default();
            store.write_current(b"", Duration::from_secs(9)); // gives the key a generation
            store.put("v", garbage, None);
            if garbage.starts_with(b"1:") {
                store
                    .map
                    .lock()
                    .unwrap()
                    .insert("g".into(), (b"1".to_vec(), None));
                *store.epoch.lock().unwrap() = 1;
            }
            let hooks = Counts::default();
            let out = run(coordinate(&store, &hooks, plan(None), async {
                Ok::<_, ()>(2)
            }));
            assert_eq!(loaded(out), Ok(2));
            assert!(hooks
                .0
                .lock()
                .unwrap()
                .contains(&Counter::SharedCodecErrors));
            assert_eq!(store.current().as_deref(), Some(&b"2"[..]), "overwritten");
        }
    }

    #[test]
    fn a_refresh_takes_only_a_newer_shared_value() {
        let store = Memory::default();
        let left = Duration::from_secs(2);
        // The same write the instance already holds (it expires at about the same time).
        store.write_current(b"1", left);
        let out = run(coordinate(
            &store,
            &Counts::default(),
            plan(Some(left)),
            async { Ok::<_, ()>(2) },
        ));
        assert_eq!(
            loaded(out),
            Ok(2),
            "refreshed: the shared value was not newer"
        );
        // Another instance's refresh wrote a value that lives longer.
        let out = run(coordinate(
            &store,
            &Counts::default(),
            plan(Some(left)),
            async { unreachable!("the newer shared value answers") },
        ));
        assert!(matches!(out, Outcome::<u64, ()>::Shared(2, _)));
    }

    #[test]
    fn a_value_written_before_an_invalidation_is_never_served() {
        let store = Memory::default();
        store.write_current(b"1", Duration::from_secs(9));
        store.invalidate();
        let out = run(coordinate(&store, &Counts::default(), plan(None), async {
            Ok::<_, ()>(2)
        }));
        assert_eq!(loaded(out), Ok(2), "the invalidated bytes were not taken");
        assert_eq!(store.current().as_deref(), Some(&b"2"[..]));
    }

    #[test]
    fn a_load_raced_by_an_invalidation_reaches_its_waiters_but_is_never_published() {
        let store = Memory::default();
        let hooks = Counts::default();
        let out = run(coordinate(&store, &hooks, plan(None), async {
            // The source changes and another instance invalidates while we load.
            store.invalidate();
            Ok::<_, ()>(1)
        }));
        assert!(matches!(out, Outcome::Refused(Ok(1))));
        assert_eq!(store.current(), None, "the old value was not put back");
        assert!(!store.map.lock().unwrap().contains_key("l"), "released");
        assert!(hooks.0.lock().unwrap().contains(&Counter::SharedConflicts));
    }

    #[test]
    fn a_load_that_outlived_its_lease_is_not_published_but_may_be_kept_locally() {
        let store = Memory::default();
        let p = Plan {
            lease: Duration::from_millis(1),
            ..plan(None)
        };
        let out = run(coordinate(&store, &Counts::default(), p, async {
            std::thread::sleep(Duration::from_millis(5));
            Ok::<_, ()>(1)
        }));
        assert_eq!(loaded(out), Ok(1));
        assert_eq!(store.current(), None, "not published");
    }

    #[test]
    fn a_generation_lost_while_the_holder_loads_refuses_its_value() {
        let store = Memory::default();
        let out = run(coordinate(&store, &Counts::default(), plan(None), async {
            // Another instance invalidates, and that generation is then lost (evicted, or a
            // failover to a replica that never had it).
            store.invalidate();
            store.map.lock().unwrap().remove("g");
            Ok::<_, ()>(1)
        }));
        assert!(matches!(out, Outcome::Refused(Ok(1))));
        assert_eq!(store.current(), None, "the old value was not put back");
    }

    #[test]
    fn a_cancelled_holder_releases_its_lock() {
        let store = Memory::default();
        let hooks = Counts::default();
        {
            let fut = coordinate(
                &store,
                &hooks,
                plan(None),
                std::future::pending::<Result<u64, ()>>(),
            );
            let mut fut = std::pin::pin!(fut);
            let waker = std::task::Waker::noop();
            let mut cx = std::task::Context::from_waker(waker);
            assert!(fut.as_mut().poll(&mut cx).is_pending());
            assert!(
                store.map.lock().unwrap().contains_key("l"),
                "holding the lock"
            );
        } // the holder's future is dropped mid-load
        assert!(
            !store.map.lock().unwrap().contains_key("l"),
            "released on drop"
        );
        assert!(store
            .log
            .lock()
            .unwrap()
            .contains(&"release_detached".to_owned()));
    }
}
