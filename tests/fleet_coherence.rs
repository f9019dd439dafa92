//! Fleet coherence against a real Redis (feature `redis`): writes made on one instance reach
//! the shared tier and every other instance, a load that raced a write never puts its value
//! back, and a lost link does not leave stale copies behind.
//!
//! Each test starts its own `redis-server` (see `common/redis_server.rs`) and is skipped with
//! a message when none is installed, unless `HERDCACHE_REQUIRE_REDIS` is set. Propagation is
//! waited for with a generous bound (a loaded machine); the bench measures the delay itself.
#![cfg(feature = "redis")]

#[path = "common/redis_server.rs"]
mod redis_server;

mod common;
use common::wait_until;

#[path = "common/fleet.rs"]
mod fleet_common;
use fleet_common::{instance, linked, tier, BOUND};

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use herdcache::fleet::{RedisTier, Utf8};
use herdcache::{Cache, LoadError};
use redis::Commands;
use redis_server::RedisServer;

/// A source whose value is `v<version>`, counting its loads.
#[derive(Default)]
struct Source {
    version: AtomicU64,
    loads: AtomicUsize,
}

impl Source {
    fn load(&self) -> impl FnOnce(&String) -> Result<String, ()> + '_ {
        move |_| {
            self.loads.fetch_add(1, Ordering::SeqCst);
            Ok(format!("v{}", self.version.load(Ordering::SeqCst)))
        }
    }

    fn change(&self) -> String {
        let v = self.version.fetch_add(1, Ordering::SeqCst) + 1;
        format!("v{v}")
    }
}

/// Waits until each of these instances says it is subscribed (Redis counts a subscriber a
/// moment before the instance has seen its subscription confirmed, and a load that began
/// before then drops what it installed, as the link changed under it).
/// Waits until `instances` subscribers (other processes) are subscribed to the tier's
/// channel, as Redis counts them.
fn subscribed(redis: &RedisServer, prefix: &str, instances: usize) {
    let mut c = redis.client();
    // The tier announces on `<prefix>inv@<db>`; these tests use database 0.
    let channel = format!("{prefix}inv@0");
    wait_until("instances subscribed", || {
        let counts: Vec<(String, usize)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query(&mut c)
            .unwrap();
        counts.first().is_some_and(|(_, n)| *n >= instances)
    });
}

fn read(cache: &Cache<String, String>, source: &Source) -> String {
    cache
        .get_or_load(&"k".to_owned(), source.load())
        .expect("the source never fails")
}

#[test]
fn an_invalidate_reaches_the_shared_tier_and_every_instance() {
    let Some(redis) = RedisServer::start("an_invalidate_reaches_every_instance") else {
        return;
    };
    let (a, b) = (instance(&redis.url(), "c1:"), instance(&redis.url(), "c1:"));
    linked(&[&a, &b]);
    let source = Source::default();
    assert_eq!(read(&a, &source), "v0");
    assert_eq!(read(&b, &source), "v0");
    assert_eq!(source.loads.load(Ordering::SeqCst), 1, "B took A's value");
    // Quiet for longer than a quarter of the bound: the link is pinged and stays up.
    std::thread::sleep(BOUND / 4 + Duration::from_millis(200));
    assert_eq!(
        b.get("k").as_deref(),
        Some("v0"),
        "a quiet link drops nothing"
    );

    let new = source.change();
    // By a borrowed form of the key: `&str` for a `String` key.
    a.invalidate("k");
    assert_eq!(read(&a, &source), new, "A's own next read");
    let took = wait_until("B drops its copy", || b.get("k").is_none());
    assert_eq!(read(&b, &source), new, "B, after the broadcast");
    let c = instance(&redis.url(), "c1:");
    assert_eq!(read(&c, &source), new, "a brand-new instance");
    assert_eq!(
        source.loads.load(Ordering::SeqCst),
        2,
        "one load for the fleet per invalidation"
    );
    assert_eq!(a.stats().shared_writes_sent, 1);
    assert!(b.stats().shared_writes_heard >= 1);
    assert_eq!(b.stats().shared_stale_dropped, 1);
    eprintln!("B dropped its copy {took:?} after A's invalidate returned");
}

#[test]
fn an_insert_reaches_the_shared_tier_and_every_instance() {
    let Some(redis) = RedisServer::start("an_insert_reaches_every_instance") else {
        return;
    };
    let (a, b) = (instance(&redis.url(), "c2:"), instance(&redis.url(), "c2:"));
    linked(&[&a, &b]);
    let source = Source::default();
    assert_eq!(read(&b, &source), "v0");
    a.insert("k".to_owned(), "written".to_owned());
    assert_eq!(a.get("k").as_deref(), Some("written"), "read-your-write");
    wait_until("B drops its copy", || b.get("k").is_none());
    assert_eq!(
        read(&b, &source),
        "written",
        "B reads A's insert from Redis"
    );
    let c = instance(&redis.url(), "c2:");
    assert_eq!(read(&c, &source), "written");
    assert_eq!(source.loads.load(Ordering::SeqCst), 1);
    let ttl: i64 = redis.client().pttl("c2:v:k").unwrap();
    assert!(
        ttl > 0 && ttl <= 60_000,
        "written with the cache's TTL: {ttl} ms"
    );
}

#[test]
fn invalidate_all_reaches_the_shared_tier_and_every_instance() {
    let Some(redis) = RedisServer::start("invalidate_all_reaches_every_instance") else {
        return;
    };
    let (a, b) = (instance(&redis.url(), "c3:"), instance(&redis.url(), "c3:"));
    linked(&[&a, &b]);
    let source = Source::default();
    let key = |i: usize| format!("k{i}");
    for i in 0..10 {
        b.get_or_load(&key(i), source.load()).unwrap();
    }
    let new = source.change();
    a.invalidate_all();
    wait_until("B clears its copies", || {
        (0..10).all(|i| b.get(&key(i)).is_none())
    });
    for cache in [&a, &b, &instance(&redis.url(), "c3:")] {
        for i in 0..10 {
            assert_eq!(cache.get_or_load(&key(i), source.load()).unwrap(), new);
        }
    }
    assert_eq!(
        source.loads.load(Ordering::SeqCst),
        20,
        "once per key, twice"
    );
}

#[test]
fn remove_and_retain_invalidate_in_the_shared_tier_and_every_instance() {
    let Some(redis) = RedisServer::start("remove_and_retain_reach_every_instance") else {
        return;
    };
    let (a, b) = (
        instance(&redis.url(), "c11:"),
        instance(&redis.url(), "c11:"),
    );
    linked(&[&a, &b]);
    let source = Source::default();
    let key = |i: usize| format!("k{i}");
    for i in 0..4 {
        a.get_or_load(&key(i), source.load()).unwrap();
        b.get_or_load(&key(i), source.load()).unwrap();
    }
    assert_eq!(source.loads.load(Ordering::SeqCst), 4, "B took A's values");
    let new = source.change();
    assert_eq!(a.remove("k0").as_deref(), Some("v0"));
    a.retain(|k, _| k != "k1");
    wait_until("B drops its copies", || {
        b.get("k0").is_none() && b.get("k1").is_none()
    });
    for cache in [&a, &b, &instance(&redis.url(), "c11:")] {
        for (i, expected) in [(0, &new), (1, &new), (2, &"v0".to_owned())] {
            let v = cache.get_or_load(&key(i), source.load()).unwrap();
            assert_eq!(&v, expected, "{}", key(i));
        }
    }
    assert_eq!(
        source.loads.load(Ordering::SeqCst),
        6,
        "one load for the fleet per key removed"
    );
}

#[test]
fn a_load_that_raced_an_invalidation_never_puts_the_old_value_back() {
    let Some(redis) = RedisServer::start("a_load_that_raced_an_invalidation") else {
        return;
    };
    let (a, b) = (instance(&redis.url(), "c4:"), instance(&redis.url(), "c4:"));
    linked(&[&a, &b]);
    let source = Arc::new(Source::default());
    // B loads: it reads the source's old value, then stalls before returning it.
    let (read_old, b_has_read) = mpsc::channel();
    let (finish, b_gate) = mpsc::channel::<()>();
    let b_call = {
        let (b, source) = (b.clone(), Arc::clone(&source));
        std::thread::spawn(move || {
            b.get_or_load(&"k".to_owned(), |_| {
                let old = format!("v{}", source.version.load(Ordering::SeqCst));
                read_old.send(()).unwrap();
                b_gate.recv().unwrap();
                Ok::<_, ()>(old)
            })
        })
    };
    b_has_read
        .recv_timeout(Duration::from_secs(20))
        .expect("B's load started");
    // The source changes and A invalidates while B's load is in flight.
    let new = source.change();
    a.invalidate("k");
    finish.send(()).unwrap();
    let got = b_call.join().expect("B's caller").expect("B's load");
    assert_eq!(got, "v0", "B's own caller gets what its load read");
    assert_eq!(b.stats().shared_conflicts, 1, "the tier refused B's value");
    let mut check = redis.client();
    let stored: Option<Vec<u8>> = check.get("c4:v:k").unwrap();
    assert!(stored.is_none(), "the old value was not written to Redis");
    // Afterwards no instance ever reads the old value.
    let c = instance(&redis.url(), "c4:");
    for cache in [&a, &b, &c] {
        assert_eq!(read(cache, &source), new);
    }
    assert_eq!(b.get("k").as_deref(), Some(new.as_str()));
}

#[test]
fn a_generation_lost_while_a_load_runs_does_not_let_the_old_value_back() {
    let Some(redis) = RedisServer::start("a_generation_lost_while_a_load_runs") else {
        return;
    };
    let (a, b) = (
        instance(&redis.url(), "c10:"),
        instance(&redis.url(), "c10:"),
    );
    linked(&[&a, &b]);
    let (read_old, b_has_read) = mpsc::channel();
    let (finish, b_gate) = mpsc::channel::<()>();
    let b_call = {
        let b = b.clone();
        std::thread::spawn(move || {
            b.get_or_load(&"k".to_owned(), |_| {
                read_old.send(()).unwrap();
                b_gate.recv().unwrap();
                Ok::<_, ()>("old".to_owned())
            })
        })
    };
    b_has_read
        .recv_timeout(Duration::from_secs(20))
        .expect("B's load started");
    a.invalidate("k");
    // The generation that invalidation wrote is lost (an eviction, a failover to a replica
    // that never had it): the key reads as having none again.
    let mut check = redis.client();
    let generations: Vec<String> = check.keys("c10:g:*").unwrap();
    assert_eq!(generations.len(), 1, "{generations:?}");
    let _: () = check.del(&generations[0]).unwrap();
    finish.send(()).unwrap();
    assert_eq!(b_call.join().unwrap().as_deref(), Ok("old"));
    let stored: Option<Vec<u8>> = check.get("c10:v:k").unwrap();
    assert!(stored.is_none(), "the old value was not written to Redis");
    assert_eq!(b.stats().shared_conflicts, 1);
}

#[test]
fn without_a_ttl_a_shared_value_lives_at_most_the_tiers_bound() {
    let Some(redis) = RedisServer::start("without_a_ttl_a_shared_value_lives") else {
        return;
    };
    let t = RedisTier::builder(redis.url())
        .key_prefix("c5:")
        .max_shared_ttl(Duration::from_secs(90))
        .op_timeout(Duration::from_secs(5))
        .build(|k: &String| k.clone(), Utf8)
        .unwrap();
    let cache: Cache<String, String> = Cache::builder()
        .max_capacity(10)
        .shared_tier(t)
        .build()
        .unwrap();
    cache
        .get_or_load(&"k".to_owned(), |_| Ok::<_, ()>("v".to_owned()))
        .unwrap();
    let ttl: i64 = redis.client().pttl("c5:v:k").unwrap();
    assert!(ttl > 0 && ttl <= 90_000, "shared copy's TTL: {ttl} ms");
}

#[test]
fn after_the_link_is_lost_no_instance_serves_a_value_older_than_the_bound() {
    let Some(mut redis) = RedisServer::start("after_the_link_is_lost") else {
        return;
    };
    let (a, b) = (instance(&redis.url(), "c6:"), instance(&redis.url(), "c6:"));
    linked(&[&a, &b]);
    let source = Source::default();
    assert_eq!(read(&b, &source), "v0");
    redis.stop();
    // Written while Redis is down: A cannot tell B.
    let new = source.change();
    a.invalidate("k");
    // B lost its link: it drops its copies and keeps what it loads at most the bound.
    let took = wait_until("B stops serving the old value", || read(&b, &source) == new);
    assert!(b.stats().shared_stale_dropped >= 1);
    eprintln!("B served the new value {took:?} after the write (bound {BOUND:?})");
    redis.restart();
    linked(&[&a, &b]);
    for cache in [&a, &b] {
        assert_eq!(read(cache, &source), new);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cancelled_at_its_deadline_releases_its_lock() {
    let Some(redis) = RedisServer::start("a_holder_cancelled_at_its_deadline") else {
        return;
    };
    let cache: Cache<String, String> = Cache::builder()
        .max_capacity(10)
        .load_timeout(Duration::from_millis(100))
        .shared_tier(tier(&redis.url(), "c7:"))
        .build()
        .unwrap();
    let hung = cache
        .get_or_load_async(&"k".to_owned(), |_| {
            std::future::pending::<Result<String, ()>>()
        })
        .await;
    assert!(matches!(hung, Err(LoadError::LoadTimedOut)), "{hung:?}");
    let mut check = redis.client();
    wait_until("the lock is released", || {
        !check.exists::<_, bool>("c7:l:k").unwrap()
    });
    // The next caller takes the lock at once, not after the lease (30 s) or the wait bound.
    let start = Instant::now();
    let v = cache
        .get_or_load_async(&"k".to_owned(), |_| async { Ok::<_, ()>("v".to_owned()) })
        .await;
    assert_eq!(v.as_deref(), Ok("v"));
    assert_eq!(
        cache.stats().shared_lock_waits,
        0,
        "no wait on a lock left behind"
    );
    eprintln!("next load took {:?}", start.elapsed());
}

#[test]
fn a_waiters_deadline_cuts_its_wait_on_another_instances_lock() {
    let Some(redis) = RedisServer::start("a_waiters_deadline_cuts_its_wait") else {
        return;
    };
    // Another instance holds the lock (a long lease) and never finishes.
    let mut c = redis.client();
    let _: () = redis::cmd("SET")
        .arg("c8:l:k")
        .arg("someone")
        .arg("PX")
        .arg(60_000)
        .query(&mut c)
        .unwrap();
    let cache: Cache<String, String> = Cache::builder()
        .max_capacity(10)
        .load_timeout(Duration::from_millis(200))
        .shared_tier(tier(&redis.url(), "c8:"))
        .build()
        .unwrap();
    let start = Instant::now();
    let v = cache.get_or_load(&"k".to_owned(), |_| Ok::<_, ()>("mine".to_owned()));
    let took = start.elapsed();
    // The wait bound is 30 s; the load's own deadline (200 ms) ends the wait, and it loads.
    assert!(
        took < Duration::from_secs(15),
        "waited {took:?}: the wait bound, not the deadline"
    );
    assert!(
        matches!(v.as_deref(), Ok("mine") | Err(LoadError::LoadTimedOut)),
        "{v:?}"
    );
    assert_eq!(cache.stats().shared_wait_timeouts, 1);
}

/// A reader instance as a process of its own (this test binary re-executed): it reads `k`
/// once (the source's value is in the file `COHERENCE_SOURCE`), says `READY`, then reads
/// every millisecond until the value changes and says `SAW <value> <unix µs>`.
#[test]
#[ignore = "the coherence test's child instance: runs only when that test starts it"]
fn coherence_child_entry() {
    let Ok(url) = std::env::var("COHERENCE_CHILD_URL") else {
        return;
    };
    let source = std::env::var("COHERENCE_SOURCE").expect("COHERENCE_SOURCE is set");
    let cache = instance(&url, "c9:");
    let load = |_: &String| {
        let v = std::fs::read_to_string(&source).expect("the source file");
        let mut log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(format!("{source}.loads"))
            .expect("the loads file");
        std::io::Write::write_all(&mut log, b"load\n").unwrap();
        Ok::<_, ()>(v)
    };
    let first = cache.get_or_load(&"k".to_owned(), load).unwrap();
    println!("COHERENCE READY {first}");
    let start = Instant::now();
    loop {
        let v = cache.get_or_load(&"k".to_owned(), load).unwrap();
        if v != first {
            println!("COHERENCE SAW {v} {}", unix_micros());
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "never saw a change"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn unix_micros() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

#[test]
fn an_invalidate_reaches_every_instance_process_with_one_load_for_the_fleet() {
    let Some(redis) = RedisServer::start("an_invalidate_reaches_every_instance_process") else {
        return;
    };
    const K: usize = 3;
    let source = std::env::temp_dir().join(format!("herdcache-coherence-{}", std::process::id()));
    let loads = source.with_extension("loads");
    let _ = std::fs::remove_file(&loads);
    std::fs::write(&source, "v0").unwrap();
    let (lines, heard) = mpsc::channel::<String>();
    let children: Vec<std::process::Child> = (0..K)
        .map(|_| {
            let mut child = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "coherence_child_entry",
                    "--exact",
                    "--ignored",
                    "--nocapture",
                ])
                .args(["--test-threads=1"])
                .env("COHERENCE_CHILD_URL", redis.url())
                .env("COHERENCE_SOURCE", &source)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("the test binary re-executes as a child");
            let out = child.stdout.take().unwrap();
            let lines = lines.clone();
            std::thread::spawn(move || {
                use std::io::BufRead;
                for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                    if let Some((_, said)) = l.split_once("COHERENCE ") {
                        let _ = lines.send(said.to_owned());
                    }
                }
            });
            child
        })
        .collect();
    let next = || {
        heard
            .recv_timeout(Duration::from_secs(30))
            .expect("a child instance spoke within 30 s")
    };
    for _ in 0..K {
        assert_eq!(next(), "READY v0");
    }
    subscribed(&redis, "c9:", K);
    let before = std::fs::read_to_string(&loads).unwrap().lines().count();
    assert_eq!(before, 1, "the fleet loaded v0 once");
    // The source changes; this process invalidates through its own instance.
    let writer = instance(&redis.url(), "c9:");
    std::fs::write(&source, "v1").unwrap();
    writer.invalidate("k");
    let written = unix_micros();
    let mut delays = Vec::new();
    for _ in 0..K {
        let said = next();
        let mut words = said.split(' ');
        assert_eq!(words.next(), Some("SAW"));
        assert_eq!(
            words.next(),
            Some("v1"),
            "every instance reads the new value"
        );
        let at: u128 = words.next().unwrap().parse().unwrap();
        delays.push(Duration::from_micros(at.saturating_sub(written) as u64));
    }
    for mut c in children {
        assert!(c.wait().unwrap().success(), "a child instance failed");
    }
    let after = std::fs::read_to_string(&loads).unwrap().lines().count();
    assert_eq!(after - before, 1, "one load for the whole fleet");
    let _ = std::fs::remove_file(&source);
    let _ = std::fs::remove_file(&loads);
    eprintln!("instances read the new value after {delays:?}");
}
