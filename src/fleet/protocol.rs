//! The fleet coordination protocol, written once over an abstract [`Store`]: the sync path
//! drives it with a store whose operations block (and a trivial executor), the async path with
//! a store whose operations are futures.
//!
//! Run only by the in-process leader of a load, so each instance talks to the store at most
//! once per key per load:
//! 1. Read the shared tier (value and remaining TTL). A value, or for a refresh a value newer
//!    than the one being refreshed, is the answer.
//! 2. Else try the soft lock (`SET NX PX lease` with a random token). The winner reads the
//!    tier again (a holder may have written and released since step 1), then loads, writes
//!    the value with its TTL, and releases the lock only if it still holds it.
//! 3. A loser waits with backoff, re-reading the tier and retrying the lock (a holder that
//!    crashed frees it after one lease), for at most the wait bound; then loads anyway.
//!
//! The store can only ever make a load cheaper: every store error ends coordination for this
//! load (counted, and the store is then skipped for a while by the caller), and the load runs
//! locally.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::stats::Counter;

/// A store operation failed (unreachable, slow, or an error reply).
#[derive(Debug)]
pub(crate) struct StoreError(pub(crate) String);

/// A value read from the shared tier, with its remaining time to live (`None`: no expiry).
pub(crate) type Read = Option<(Vec<u8>, Option<Duration>)>;

/// The shared tier and its soft locks.
pub(crate) trait Store: Sync {
    /// The value under `key` and its remaining time to live (`None`: no expiry).
    fn read(&self, key: &str) -> impl Future<Output = Result<Read, StoreError>> + Send;
    /// `SET lock token NX PX lease`: whether the lock is now ours.
    fn try_lock(
        &self,
        lock: &str,
        token: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
    /// Writes the value with its time to live (`None`: none).
    fn write(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Deletes the lock if it still holds `token` (atomically): whether it did.
    fn release(
        &self,
        lock: &str,
        token: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
    /// Waits, between polls of a lock held elsewhere.
    fn sleep(&self, d: Duration) -> impl Future<Output = ()> + Send;
}

/// One coordinated load's parameters.
pub(crate) struct Plan<'a> {
    pub(crate) value_key: &'a str,
    pub(crate) lock_key: &'a str,
    pub(crate) token: &'a str,
    pub(crate) lease: Duration,
    pub(crate) wait_bound: Duration,
    /// The TTL written with a loaded value (the cache's TTL).
    pub(crate) ttl: Option<Duration>,
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
    Shared(V, Option<Duration>),
    /// This instance loaded (as the lock's holder, after a store error, or after waiting out
    /// the bound).
    Loaded(Result<V, E>),
    /// The store failed; the caller marks it down. The load still ran.
    Failed(Result<V, E>, StoreError),
}

/// Hooks from the protocol to the cache: the codec and the counters.
pub(crate) trait Hooks<V> {
    fn decode(&self, bytes: &[u8]) -> Option<V>;
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
    let mut backoff = BACKOFF_FIRST;
    let mut waited = false;
    loop {
        // 1. The shared tier.
        match shared(store, hooks, &plan, true).await {
            Ok(Some((v, ttl))) => return Outcome::Shared(v, ttl),
            Ok(None) => {}
            Err(e) => return Outcome::Failed(load.await, e),
        }
        // 2. The soft lock.
        match store.try_lock(plan.lock_key, plan.token, plan.lease).await {
            Ok(true) => {
                // A holder may have written its value and released between our read and
                // our lock: Redis runs commands one at a time, so a read after our lock sees
                // any value written before the release that let us take it.
                return match shared(store, hooks, &plan, false).await {
                    Ok(Some((v, ttl))) => {
                        let _ = store.release(plan.lock_key, plan.token).await;
                        Outcome::Shared(v, ttl)
                    }
                    Ok(None) => hold(store, hooks, &plan, load).await,
                    Err(e) => Outcome::Failed(load.await, e),
                };
            }
            Ok(false) => {}
            Err(e) => return Outcome::Failed(load.await, e),
        }
        // 3. Held elsewhere: wait, within the bound.
        if !waited {
            waited = true;
            hooks.count(Counter::SharedLockWaits);
        }
        let left = plan.wait_bound.saturating_sub(started.elapsed());
        if left.is_zero() {
            hooks.count(Counter::SharedWaitTimeouts);
            return Outcome::Loaded(load.await);
        }
        store.sleep(backoff.min(left)).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// The shared tier's value if it answers this load (decoded, and for a refresh newer than
/// the value being refreshed), counted as a shared hit. An undecodable value is a miss,
/// counted if `count_codec_errors` (once per load: not again on the re-read after the lock).
async fn shared<St: Store, V>(
    store: &St,
    hooks: &impl Hooks<V>,
    plan: &Plan<'_>,
    count_codec_errors: bool,
) -> Result<Option<(V, Option<Duration>)>, StoreError> {
    let Some((bytes, ttl)) = store.read(plan.value_key).await? else {
        return Ok(None);
    };
    if !is_newer(ttl, plan.refreshing) {
        return Ok(None);
    }
    match hooks.decode(&bytes) {
        Some(v) => {
            hooks.count(Counter::SharedHits);
            Ok(Some((v, ttl)))
        }
        // Treated as a miss: the lock's winner overwrites it.
        None => {
            if count_codec_errors {
                hooks.count(Counter::SharedCodecErrors);
            }
            Ok(None)
        }
    }
}

/// Whether a shared value with `ttl` left answers this load.
fn is_newer(ttl: Option<Duration>, refreshing: Option<Duration>) -> bool {
    match (refreshing, ttl) {
        (None, _) => true,
        // A value that never expires is newer than one being refreshed only if it is not
        // the same write: without a TTL there is no telling, so refresh.
        (Some(_), None) => false,
        (Some(left), Some(ttl)) => ttl > left + NEWER_BY,
    }
}

/// Loads as the lock's holder, publishes, and releases.
async fn hold<St, V, E, L>(
    store: &St,
    hooks: &impl Hooks<V>,
    plan: &Plan<'_>,
    load: L,
) -> Outcome<V, E>
where
    St: Store,
    L: Future<Output = Result<V, E>>,
{
    hooks.count(Counter::SharedLoads);
    let result = load.await;
    if let Ok(v) = &result {
        match hooks.encode(v) {
            Some(bytes) => {
                if let Err(e) = store.write(plan.value_key, bytes, plan.ttl).await {
                    return Outcome::Failed(result, e);
                }
            }
            None => hooks.count(Counter::SharedCodecErrors),
        }
    }
    // After an error too, so that the others load at once rather than after the lease.
    match store.release(plan.lock_key, plan.token).await {
        Ok(_) => Outcome::Loaded(result),
        Err(e) => Outcome::Failed(result, e),
    }
}

#[cfg(test)]
mod tests {
    //! The protocol against an in-memory store with a scripted clock-free lock.
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// Stored bytes and time to live, by key.
    type Map = HashMap<String, (Vec<u8>, Option<Duration>)>;

    #[derive(Default)]
    struct Memory {
        map: Mutex<Map>,
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

        /// Stores `bytes` under `key` (a value, or a lock's token), as another instance would.
        fn put(&self, key: &str, bytes: &[u8], ttl: Option<Duration>) {
            self.map
                .lock()
                .unwrap()
                .insert(key.into(), (bytes.to_vec(), ttl));
        }

        fn check(&self, op: &str) -> Result<(), StoreError> {
            self.log.lock().unwrap().push(op.to_owned());
            if *self.fail.lock().unwrap() {
                Err(StoreError("down".into()))
            } else {
                Ok(())
            }
        }
    }

    impl Store for Memory {
        async fn read(&self, key: &str) -> Result<Option<(Vec<u8>, Option<Duration>)>, StoreError> {
            self.check("read")?;
            Ok(self.map.lock().unwrap().get(key).cloned())
        }
        async fn try_lock(&self, lock: &str, token: &str, _: Duration) -> Result<bool, StoreError> {
            self.check("lock")?;
            let mut m = self.map.lock().unwrap();
            if let Some(v) = self.finish_before_lock.lock().unwrap().take() {
                m.insert("v".into(), (v, Some(Duration::from_secs(9))));
                m.remove(lock);
            }
            if m.contains_key(lock) {
                return Ok(false);
            }
            m.insert(lock.into(), (token.as_bytes().to_vec(), None));
            Ok(true)
        }
        async fn write(
            &self,
            key: &str,
            value: Vec<u8>,
            ttl: Option<Duration>,
        ) -> Result<(), StoreError> {
            self.check("write")?;
            self.map.lock().unwrap().insert(key.into(), (value, ttl));
            Ok(())
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
        async fn sleep(&self, _: Duration) {
            self.log.lock().unwrap().push("sleep".into());
            let mut n = self.sleeps.lock().unwrap();
            *n += 1;
            let mut appear = self.appear_after_sleeps.lock().unwrap();
            if let Some((after, v)) = appear.as_ref() {
                if *n >= *after {
                    let v = v.clone();
                    *appear = None;
                    self.map
                        .lock()
                        .unwrap()
                        .insert("v".into(), (v, Some(Duration::from_secs(9))));
                }
            }
        }
    }

    #[derive(Default)]
    struct Counts(Mutex<Vec<Counter>>);

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

    fn plan(refreshing: Option<Duration>) -> Plan<'static> {
        Plan {
            value_key: "v",
            lock_key: "l",
            token: "me",
            lease: Duration::from_secs(1),
            wait_bound: Duration::from_secs(3600),
            ttl: Some(Duration::from_secs(10)),
            refreshing,
        }
    }

    fn run<V>(f: impl Future<Output = V>) -> V {
        crate::fleet::block_on(f)
    }

    fn loaded<V: std::fmt::Debug, E: std::fmt::Debug>(o: Outcome<V, E>) -> Result<V, E> {
        match o {
            Outcome::Loaded(r) => r,
            Outcome::Shared(..) => panic!("expected a load, got a shared value"),
            Outcome::Failed(_, e) => panic!("expected a load, got {e:?}"),
        }
    }

    #[test]
    fn a_shared_value_answers_without_loading() {
        let store = Memory::default();
        store.put("v", b"7", None);
        let hooks = Counts::default();
        let out = run(coordinate(&store, &hooks, plan(None), async {
            unreachable!("no load when the tier has the value")
        }));
        assert!(matches!(out, Outcome::<u64, ()>::Shared(7, None)));
        assert_eq!(*hooks.0.lock().unwrap(), [Counter::SharedHits]);
    }

    #[test]
    fn the_lock_holder_loads_writes_with_the_ttl_and_releases() {
        let store = Memory::default();
        let hooks = Counts::default();
        let out = run(coordinate(&store, &hooks, plan(None), async {
            Ok::<_, ()>(5)
        }));
        assert_eq!(loaded(out), Ok(5));
        let map = store.map.lock().unwrap();
        assert_eq!(
            map.get("v"),
            Some(&(b"5".to_vec(), Some(Duration::from_secs(10))))
        );
        assert!(!map.contains_key("l"), "released");
        assert_eq!(
            *store.log.lock().unwrap(),
            ["read", "lock", "read", "write", "release"]
        );
    }

    #[test]
    fn a_failed_load_is_not_written_but_releases_the_lock() {
        let store = Memory::default();
        let out = run(coordinate(&store, &Counts::default(), plan(None), async {
            Err::<u64, _>("source down")
        }));
        assert_eq!(loaded(out), Err("source down"));
        assert!(store.map.lock().unwrap().is_empty());
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
        let store = Memory::default();
        store.put("v", b"garbage", None);
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
        assert_eq!(store.map.lock().unwrap()["v"].0, b"2", "overwritten");
    }

    #[test]
    fn a_refresh_takes_only_a_newer_shared_value() {
        let store = Memory::default();
        let left = Duration::from_secs(2);
        // The same write the instance already holds (it expires at about the same time).
        store.put("v", b"1", Some(left));
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
}
