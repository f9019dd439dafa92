//! User code cannot break the cache (DESIGN.md §10 invariant 9): a panic in `Hash`, `Eq`,
//! `Clone`, `Drop`, the weigher, the listener or the loader reaches only the operation that
//! ran it; the process stays alive, the cache stays within its capacity, nothing leaks, and
//! later operations work. Also: settings that would abort are errors, a finite TTL never
//! becomes "never", and a listener that writes to its cache does not recurse.

use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herdcache::{Cache, ManualClock};

/// Makes every panic of the test quiet (they are expected) while keeping assertion messages.
fn quietly<T>(f: impl FnOnce() -> T) -> T {
    static LOCK: Mutex<()> = Mutex::new(());
    let _one_at_a_time = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|info| {
        let msg = info.to_string();
        if !msg.contains("user code") {
            eprintln!("{msg}");
        }
    }));
    let r = catch_unwind(AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    r.unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// A key whose `Hash` or `Eq` panics while its switch is on.
#[derive(Debug, Clone)]
struct Key {
    id: u64,
    hash_panics: Arc<AtomicBool>,
    eq_panics: Arc<AtomicBool>,
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        if self.hash_panics.load(Ordering::SeqCst) {
            panic!("user code: Hash");
        }
        self.id.hash(state);
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        if self.eq_panics.load(Ordering::SeqCst) || other.eq_panics.load(Ordering::SeqCst) {
            panic!("user code: Eq");
        }
        self.id == other.id
    }
}
impl Eq for Key {}

fn key(id: u64) -> Key {
    Key {
        id,
        hash_panics: Arc::default(),
        eq_panics: Arc::default(),
    }
}

/// A value whose `Clone` panics while its switch is on, and whose drops are counted.
#[derive(Debug)]
struct Val {
    n: u64,
    clone_panics: Arc<AtomicBool>,
    drop_panics: bool,
    drops: Arc<AtomicUsize>,
}

impl Clone for Val {
    fn clone(&self) -> Self {
        if self.clone_panics.load(Ordering::SeqCst) {
            panic!("user code: Clone");
        }
        self.drops.fetch_sub(0, Ordering::SeqCst);
        Val {
            n: self.n,
            clone_panics: Arc::clone(&self.clone_panics),
            drop_panics: false,
            drops: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl Drop for Val {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
        if self.drop_panics && !std::thread::panicking() {
            panic!("user code: Drop");
        }
    }
}

fn val(n: u64, drops: &Arc<AtomicUsize>) -> Val {
    Val {
        n,
        clone_panics: Arc::default(),
        drop_panics: false,
        drops: Arc::clone(drops),
    }
}

const SEC: Duration = Duration::from_secs(1);

/// A cache of keys due for an early refresh (soft TTL 10 s, hard 60 s) on a manual clock.
fn due_for_refresh(clock: &ManualClock, weigher_panics: &Arc<AtomicBool>) -> Cache<Key, Val> {
    let w = Arc::clone(weigher_panics);
    Cache::builder()
        .max_capacity(100)
        .time_to_live(60 * SEC)
        .refresh_after(10 * SEC)
        .stale_if_error(true)
        .clock(clock.clone())
        .weigher(move |_, _| {
            if w.load(Ordering::SeqCst) {
                panic!("user code: weigher");
            }
            1
        })
        .build()
        .unwrap()
}

#[test]
fn a_panicking_weigher_in_a_failed_refresh_fails_that_call_only() {
    quietly(|| {
        let (clock, weigher_panics) = (ManualClock::new(), Arc::new(AtomicBool::new(false)));
        let c = due_for_refresh(&clock, &weigher_panics);
        let drops = Arc::new(AtomicUsize::new(0));
        let k = key(1);
        c.get_or_load(&k, |_| Ok::<_, ()>(val(1, &drops))).unwrap();
        clock.advance(11 * SEC);
        weigher_panics.store(true, Ordering::SeqCst);
        // The refresh fails; stale-if-error weighs the old value to put it back: the weigher
        // panics. That reaches this call, and nothing else (the process used to abort here).
        let r = catch_unwind(AssertUnwindSafe(|| {
            c.get_or_load(&k, |_| Err::<Val, _>(()))
        }));
        assert!(
            r.is_err(),
            "the weigher's panic reaches the call that ran it"
        );
        weigher_panics.store(false, Ordering::SeqCst);
        let v = c.get_or_load(&k, |_| Ok::<_, ()>(val(2, &drops))).unwrap();
        assert!(v.n == 1 || v.n == 2);
        assert!(c.entry_count() <= 100);
    });
}

#[test]
fn a_panicking_clone_or_eq_after_a_loader_panic_does_not_abort() {
    for what in ["clone", "eq"] {
        quietly(|| {
            let (clock, no) = (ManualClock::new(), Arc::new(AtomicBool::new(false)));
            let c = due_for_refresh(&clock, &no);
            let drops = Arc::new(AtomicUsize::new(0));
            let k = key(1);
            let v = c.get_or_load(&k, |_| Ok::<_, ()>(val(1, &drops))).unwrap();
            clock.advance(11 * SEC);
            // The refresh's loader panics; putting the old value back clones it (and used to
            // compare keys): both panic now.
            let r = catch_unwind(AssertUnwindSafe(|| {
                c.get_or_load(&k, |_| {
                    match what {
                        "clone" => v.clone_panics.store(true, Ordering::SeqCst),
                        _ => k.eq_panics.store(true, Ordering::SeqCst),
                    }
                    panic!("user code: loader");
                    #[allow(unreachable_code)]
                    Ok::<Val, ()>(val(0, &drops))
                })
            }));
            assert!(r.is_err());
            v.clone_panics.store(false, Ordering::SeqCst);
            k.eq_panics.store(false, Ordering::SeqCst);
            // The key is not stuck: a later call gets a value.
            let got = c.get_or_load(&k, |_| Ok::<_, ()>(val(3, &drops))).unwrap();
            assert!(got.n == 1 || got.n == 3, "{what}: {}", got.n);
        });
    }
}

/// A key whose `Hash` disagrees with its `Eq`: it hashes a salt that equality ignores.
#[derive(Debug, Clone)]
struct Salted {
    id: u64,
    salt: u64,
}

impl Hash for Salted {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.id.hash(state);
        self.salt.hash(state);
    }
}

impl PartialEq for Salted {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}
impl Eq for Salted {}

/// A table hasher that keeps the first word written (a `Salted`'s id) and ignores the rest,
/// so that the table finds a key's earlier write whatever its salt. (The eviction policy's
/// keys derive from the table hash without a shared tier, so it agrees with the table; with
/// one, its keys hash the whole key and it sees a new key at each salt, which the library's
/// `policy_keys_that_disagree_with_the_table_keep_the_bound_and_the_policy_whole` covers.)
#[derive(Default, Clone)]
struct FirstWord(Option<u64>);

impl Hasher for FirstWord {
    fn finish(&self) -> u64 {
        self.0.unwrap_or(0).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0.get_or_insert(n);
    }
}

#[test]
fn a_key_whose_hash_disagrees_with_its_eq_keeps_the_bound_and_the_policy_whole() {
    // Large enough for several policy shards (where the policy's keys are the shared tier's,
    // a key's writes land in different ones).
    const CAP: u64 = 1 << 16;
    let c: Cache<Salted, u64, _> = Cache::builder()
        .max_capacity(CAP)
        .hasher(std::hash::BuildHasherDefault::<FirstWord>::default())
        .build()
        .unwrap();
    let salted = |id, salt| Salted { id, salt };
    c.insert(salted(0, 0), 0);
    c.insert(salted(0, 1), 1);
    assert_eq!(
        c.entry_count(),
        1,
        "premise: the table matched the key's second write with its first"
    );
    for id in 1..=2 * CAP {
        c.insert(salted(id, 0), id);
        c.insert(salted(id, 1), id);
        assert!(
            c.entry_count() <= CAP,
            "{} entries at capacity {CAP}",
            c.entry_count()
        );
    }
    assert_eq!(
        c.weighted_size(),
        c.entry_count(),
        "the policy weighs exactly the entries the table holds"
    );
    c.invalidate_all();
    assert_eq!((c.entry_count(), c.weighted_size()), (0, 0));
    // A cache refilled with ordinary writes fills, within its bound.
    for id in 0..2 * CAP {
        c.insert(salted(id, 0), id);
    }
    assert!(c.entry_count() <= CAP && c.entry_count() > CAP / 2);
    assert_eq!(c.weighted_size(), c.entry_count());
}

/// A clock that panics while its switch is on.
#[derive(Debug, Default, Clone)]
struct Trap {
    time: ManualClock,
    panics: Arc<AtomicBool>,
}

impl herdcache::Clock for Trap {
    fn now(&self) -> Duration {
        if self.panics.load(Ordering::SeqCst) {
            panic!("user code: clock");
        }
        self.time.now()
    }
}

#[test]
fn writes_of_a_key_whose_hash_disagrees_with_its_eq_stay_tracked_through_loads_and_unwinding() {
    const CAP: u64 = 1 << 16;
    const N: u64 = 4_096;
    let clock = Trap::default();
    let c: Cache<Salted, u64, _> = Cache::builder()
        .max_capacity(CAP)
        .clock(clock.clone())
        .hasher(std::hash::BuildHasherDefault::<FirstWord>::default())
        .build()
        .unwrap();
    let salted = |id, salt| Salted { id, salt };
    let tracked_as_held = |c: &Cache<Salted, u64, _>, what: &str| {
        assert_eq!(
            (c.entry_count(), c.weighted_size()),
            (N, N),
            "{what}: every entry held and weighed once"
        );
    };
    let hour = Duration::from_secs(3600);
    for id in 0..N {
        c.insert_with_ttl(salted(id, 0), id, hour);
    }
    // Each write replaces a value that can expire, and the clock read to judge it panics:
    // the write is in the table, and reported as its thread unwinds.
    clock.panics.store(true, Ordering::SeqCst);
    quietly(|| {
        for id in 0..N {
            // Salts that put the write in its predecessor's policy shard or in another.
            let r = catch_unwind(AssertUnwindSafe(|| {
                c.insert(salted(id, 1 + id % 5), N + id)
            }));
            assert!(r.is_err(), "premise: the write read the clock");
        }
    });
    clock.panics.store(false, Ordering::SeqCst);
    for id in 0..N {
        assert_eq!(
            c.get(&salted(id, 0)),
            Some(N + id),
            "premise: the clock was read after the table write"
        );
    }
    tracked_as_held(&c, "after writes that unwound");
    // Loads in place of expired values: each load takes the key's place (and record).
    for id in 0..N {
        c.insert_with_ttl(salted(id, 2), id, hour);
    }
    clock.time.advance(2 * hour);
    for id in 0..N {
        assert_eq!(c.get_with(&salted(id, 3 + id % 5), |_| id + 1), id + 1);
    }
    tracked_as_held(&c, "after loads");
    c.invalidate_all();
    assert_eq!((c.entry_count(), c.weighted_size()), (0, 0));
}

#[test]
fn a_resident_key_whose_hash_panics_leaves_other_writes_and_the_bound_alone() {
    quietly(|| {
        let c: Cache<Key, u64> = Cache::builder().max_capacity(100).build().unwrap();
        let bad = key(0);
        c.insert(bad.clone(), 0);
        bad.hash_panics.store(true, Ordering::SeqCst);
        for round in 0..50u64 {
            for i in 1..=200u64 {
                let id = round * 1_000 + i;
                let r = catch_unwind(AssertUnwindSafe(|| c.insert(key(id), id)));
                assert!(r.is_ok(), "an insert of another key panicked");
            }
            assert!(
                c.entry_count() <= 100,
                "round {round}: {} entries at capacity 100",
                c.entry_count()
            );
        }
    });
}

#[test]
fn a_panicking_drop_leaks_nothing_and_reaches_no_other_operation() {
    quietly(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let c: Cache<u64, Arc<Val>> = Cache::builder().max_capacity(10).build().unwrap();
        let mut bad = val(0, &drops);
        bad.drop_panics = true;
        c.insert(0, Arc::new(bad));
        // Evict it, and keep writing: its drop runs in some later reclamation batch.
        for k in 1..=1_000u64 {
            let r = catch_unwind(AssertUnwindSafe(|| c.insert(k, Arc::new(val(k, &drops)))));
            assert!(r.is_ok(), "an unrelated insert got the value's drop panic");
        }
        drop(c);
        assert_eq!(
            drops.load(Ordering::SeqCst),
            1_001,
            "every value dropped once"
        );
    });
}

#[test]
fn dropping_a_cache_with_a_panicking_value_drops_all_the_others() {
    quietly(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let c: Cache<u64, Arc<Val>> = Cache::builder().max_capacity(1_000).build().unwrap();
        for k in 0..100u64 {
            let mut v = val(k, &drops);
            v.drop_panics = k == 50;
            c.insert(k, Arc::new(v));
        }
        let r = catch_unwind(AssertUnwindSafe(|| drop(c)));
        assert!(r.is_ok());
        assert_eq!(drops.load(Ordering::SeqCst), 100, "no value leaked");
    });
}

/// Where a listener finds its own cache.
type Cell = Arc<Mutex<Option<Cache<u64, u64>>>>;

/// A cache of 10 entries whose eviction listener inserts a new key into the cache itself
/// (which evicts another), for its first `stop` calls; the count of its calls; and the cell
/// through which the listener reaches its cache (empty it to break the cycle).
fn self_writing_cache(stop: usize) -> (Cache<u64, u64>, Arc<AtomicUsize>, Cell) {
    let calls = Arc::new(AtomicUsize::new(0));
    let cell: Cell = Arc::default();
    let (n, handle) = (Arc::clone(&calls), Arc::clone(&cell));
    let c: Cache<u64, u64> = Cache::builder()
        .max_capacity(10)
        .eviction_listener(move |k: &u64, _: &u64, _| {
            if n.fetch_add(1, Ordering::SeqCst) < stop {
                let c = handle.lock().unwrap().clone();
                if let Some(c) = c {
                    c.insert(k + 1_000_000, 0);
                }
            }
        })
        .build()
        .unwrap();
    *cell.lock().unwrap() = Some(c.clone());
    (c, calls, cell)
}

#[test]
fn a_listener_that_writes_to_its_cache_does_not_recurse() {
    // Under the chain's bound (`herdcache::MAX_LISTENER_CHAIN`).
    // Each eviction inserts a new key, which evicts another: 1,000 levels deep if listeners
    // nested (a stack overflow on a small stack), a loop of 1,000 turns if they do not.
    const WRITES: usize = 1_000;
    let (c, writes, cell) = self_writing_cache(WRITES);
    // A thread with a small stack, so that recursion would show at once.
    let c2 = c.clone();
    std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(move || {
            for k in 0..11 {
                c2.insert(k, k);
            }
        })
        .unwrap()
        .join()
        .expect("the writing thread overflowed its stack");
    assert!(writes.load(Ordering::SeqCst) > WRITES);
    assert!(c.entry_count() <= 10);
    cell.lock().unwrap().take();
}

#[test]
fn a_weight_of_zero_still_counts_against_the_bound() {
    let c: Cache<u64, u64> = Cache::builder()
        .max_capacity(10)
        .weigher(|_, _| 0)
        .build()
        .unwrap();
    for k in 0..10_000 {
        c.insert(k, k);
    }
    assert!(c.entry_count() <= 10, "{} entries", c.entry_count());
}

#[test]
fn a_finite_ttl_never_becomes_never_at_the_end_of_the_clock() {
    let clock = ManualClock::new();
    let c: Cache<u64, u64> = Cache::builder()
        .max_capacity(10)
        .time_to_live(Duration::from_secs(3_600))
        .clock(clock.clone())
        .build()
        .unwrap();
    clock.advance(Duration::from_nanos(u64::MAX - 1_000));
    c.insert_with_ttl(1, 1, Duration::ZERO);
    assert_eq!(c.get(&1), None, "a zero TTL expires at once");
    c.insert(2, 2);
    assert_eq!(c.get(&2), Some(2));
    clock.advance(Duration::from_secs(3_600));
    assert_eq!(c.get(&2), None, "the TTL saturated into 'never'");
}

#[test]
fn an_initial_capacity_that_cannot_be_allocated_is_a_build_error() {
    let r = Cache::<u64, u64>::builder()
        .max_capacity(1 << 48)
        .initial_capacity(1 << 48)
        .build();
    assert_eq!(r.unwrap_err().setting(), "initial_capacity");
}

#[test]
fn warm_survives_a_key_whose_hash_panics() {
    quietly(|| {
        let c: Cache<Key, u64> = Cache::builder().max_capacity(100).build().unwrap();
        let bad = key(3);
        bad.hash_panics.store(true, Ordering::SeqCst);
        let keys: Vec<Key> = (0..10)
            .map(|i| if i == 3 { bad.clone() } else { key(i) })
            .collect();
        let report = c.warm(keys, |k: &Key| Ok::<_, ()>(k.id), 2);
        assert_eq!((report.loaded, report.failed), (9, 1));
    });
}

/// A key whose `Clone` panics on the clone number `n` (counting down from the arming).
#[derive(Debug)]
struct CloneBomb {
    id: u64,
    countdown: Arc<AtomicUsize>,
}

impl Clone for CloneBomb {
    fn clone(&self) -> Self {
        if self.countdown.fetch_sub(1, Ordering::SeqCst) == 1 {
            panic!("user code: key Clone");
        }
        CloneBomb {
            id: self.id,
            countdown: Arc::clone(&self.countdown),
        }
    }
}
impl PartialEq for CloneBomb {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}
impl Eq for CloneBomb {}
impl Hash for CloneBomb {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

#[test]
fn a_key_clone_panicking_in_get_or_load_leaves_no_load_behind() {
    quietly(|| {
        for n in 1..=3 {
            let c: Cache<CloneBomb, u64> = Cache::builder().max_capacity(10).build().unwrap();
            let key = CloneBomb {
                id: 1,
                countdown: Arc::new(AtomicUsize::new(n)),
            };
            let r = catch_unwind(AssertUnwindSafe(|| c.get_or_load(&key, |_| Ok::<_, ()>(1))));
            key.countdown.store(usize::MAX, Ordering::SeqCst);
            // Whatever clone panicked, the key is not left loading: the next call loads.
            let (tx, rx) = std::sync::mpsc::channel();
            let (c2, k2) = (c.clone(), key.clone());
            std::thread::spawn(move || tx.send(c2.get_or_load(&k2, |_| Ok::<_, ()>(2))));
            let got = rx
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("clone {n}: the next caller is stuck on a dead load"));
            match r {
                Ok(v) => assert_eq!((v, got), (Ok(1), Ok(1)), "clone {n}"),
                Err(_) => assert_eq!(got, Ok(2), "clone {n}"),
            }
        }
    });
}

/// A value whose destructor writes to the cache that held it (once: the value it writes
/// back does not).
struct WritesBack {
    key: u64,
    echo: bool,
}

static WRITTEN_BACK: std::sync::OnceLock<Cache<u64, WritesBack>> = std::sync::OnceLock::new();

impl Drop for WritesBack {
    fn drop(&mut self) {
        if self.echo {
            if let Some(c) = WRITTEN_BACK.get() {
                let key = self.key | 1 << 63;
                c.insert(key, WritesBack { key, echo: false });
            }
        }
    }
}

/// Destructors of values run when the epoch collector gets to them, which may be during any
/// of the cache's operations: never under the policy lock, where a destructor that writes to
/// the cache would wait for that lock forever (and, in a debug build, the crate's check of
/// invariant 9 fails). Two writers churn a small cache, one now and then finishing, while it
/// evicts, a migration of the table that the other started (`table/tests.rs` makes that case
/// deterministic).
#[test]
fn a_value_whose_drop_writes_to_its_cache_never_deadlocks_a_writer() {
    let cache = WRITTEN_BACK.get_or_init(|| {
        Cache::builder()
            .max_capacity(2_000)
            .weigher(|_: &u64, _: &WritesBack| 1)
            .build()
            .unwrap()
    });
    let (done, finished) = std::sync::mpsc::channel();
    let mut writers = Vec::new();
    for t in 0..2u64 {
        let (cache, done) = (cache.clone(), done.clone());
        writers.push(std::thread::spawn(move || {
            for i in 0..100_000u64 {
                let key = i * 2 + t;
                cache.insert(key, WritesBack { key, echo: true });
            }
            let _ = done.send(());
        }));
    }
    for _ in 0..2 {
        finished
            .recv_timeout(Duration::from_secs(300))
            .expect("a writer never finished: a value's drop waited for a lock its writer held");
    }
    // Their exits flush what they retired, whose destructors write too.
    for w in writers {
        w.join().expect("a writer panicked");
    }
    assert!(cache.entry_count() <= 2_000);
}

/// Runs `scenario` in a child process (this test binary, filtered to `test`), so that an
/// abort, which would take the whole test binary down, is reported as this test's failure.
fn in_child_process(test: &str, scenario: impl FnOnce()) {
    const CHILD: &str = "HERDCACHE_USER_CODE_CHILD";
    if std::env::var_os(CHILD).is_some() {
        scenario();
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new(exe)
        .args([test, "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD, "1")
        .output()
        .expect("the child test process starts");
    assert!(
        out.status.success(),
        "the scenario's process ended with {:?}:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A key whose `Drop` panics once after it is armed; its clones share the switch.
#[derive(Debug, Clone)]
struct ArmedKey {
    id: u64,
    armed: Arc<AtomicBool>,
}

impl Hash for ArmedKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}
impl PartialEq for ArmedKey {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}
impl Eq for ArmedKey {}

impl Drop for ArmedKey {
    fn drop(&mut self) {
        if self.armed.swap(false, Ordering::SeqCst) {
            panic!("user code: key Drop");
        }
    }
}

/// A value that counts how many of it were made (clones included) and dropped, and whose
/// `Drop` panics if `drop_panics`.
#[derive(Debug)]
struct Counted {
    made: Arc<AtomicUsize>,
    drops: Arc<AtomicUsize>,
    drop_panics: bool,
}

impl Counted {
    fn new(made: &Arc<AtomicUsize>, drops: &Arc<AtomicUsize>) -> Self {
        made.fetch_add(1, Ordering::SeqCst);
        Counted {
            made: Arc::clone(made),
            drops: Arc::clone(drops),
            drop_panics: false,
        }
    }
}

impl Clone for Counted {
    fn clone(&self) -> Self {
        Counted::new(&self.made, &self.drops)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
        // Even while unwinding: a destructor cannot know how it is being run.
        if self.drop_panics {
            panic!("user code: value Drop");
        }
    }
}

#[test]
fn a_key_whose_drop_panics_after_a_load_leaks_no_value() {
    quietly(|| {
        let (made, drops) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let c: Cache<ArmedKey, Counted> = Cache::builder().max_capacity(10).build().unwrap();
        let armed = Arc::new(AtomicBool::new(false));
        let k = ArmedKey {
            id: 1,
            armed: Arc::clone(&armed),
        };
        // The first key dropped once the load has its value is the leader's own copy, at the
        // end of the load: its panic reaches this call, and the value it was returning must
        // still be dropped (rust-lang/rust#47949 leaks a return value built before a local's
        // drop panics).
        let r = catch_unwind(AssertUnwindSafe(|| {
            c.get_or_load(&k, |_| {
                armed.store(true, Ordering::SeqCst);
                Ok::<_, ()>(Counted::new(&made, &drops))
            })
        }));
        assert!(
            r.is_err() || !armed.load(Ordering::SeqCst),
            "the key's drop ran"
        );
        drop(r);
        drop(c);
        assert_eq!(
            drops.load(Ordering::SeqCst),
            made.load(Ordering::SeqCst),
            "every value made was dropped"
        );
    });
}

#[test]
fn a_key_and_a_value_whose_drops_both_panic_do_not_abort() {
    in_child_process(
        "a_key_and_a_value_whose_drops_both_panic_do_not_abort",
        || {
            quietly(|| {
                let (made, drops) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
                let c: Cache<ArmedKey, Counted> = Cache::builder().max_capacity(1).build().unwrap();
                let armed = Arc::new(AtomicBool::new(false));
                let mut v = Counted::new(&made, &drops);
                v.drop_panics = true;
                c.insert(
                    ArmedKey {
                        id: 1,
                        armed: Arc::clone(&armed),
                    },
                    v,
                );
                armed.store(true, Ordering::SeqCst);
                // The entry is evicted and freed, in some later collection or with the cache:
                // its key's and its value's drops both panic, which must not abort.
                for id in 2..200 {
                    let _ = catch_unwind(AssertUnwindSafe(|| {
                        c.insert(
                            ArmedKey {
                                id,
                                armed: Arc::default(),
                            },
                            Counted::new(&made, &drops),
                        )
                    }));
                }
                let _ = catch_unwind(AssertUnwindSafe(|| drop(c)));
                assert_eq!(drops.load(Ordering::SeqCst), made.load(Ordering::SeqCst));
            })
        },
    );
}

/// A listener whose every call writes a new key to its full cache makes a chain of writes
/// that never ends by itself. The cache bounds it: past `MAX_LISTENER_CHAIN` notifications
/// in one chain, the rest of the chain's evictions go untold (counted), so the write that
/// started it returns and the memory the chain held (every value it evicted, pinned until
/// it ends) is freed. (The chain used to run until memory ran out: 23 GB within seconds.
/// Here the listener itself stops after 200,000 writes, so that the test ends either way.)
#[test]
fn a_listener_whose_writes_keep_evicting_is_cut_off_at_the_chain_bound() {
    const STOP: usize = 200_000;
    let (c, writes, cell) = self_writing_cache(STOP);
    for k in 0..11 {
        c.insert(k, k);
    }
    let heard = writes.load(Ordering::SeqCst);
    assert!(
        heard <= herdcache::MAX_LISTENER_CHAIN + 1,
        "the chain ran {heard} listener calls"
    );
    assert!(c.stats().listener_skipped >= 1, "{:?}", c.stats());
    assert!(c.entry_count() <= 10);
    // The next write starts a chain of its own.
    c.insert(100, 100);
    assert!(writes.load(Ordering::SeqCst) > heard);
    cell.lock().unwrap().take();
}
