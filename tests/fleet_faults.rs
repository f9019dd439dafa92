//! The fleet tier under the faults of real Redis deployments (feature `redis`): connections
//! the server closed while they idled, outages and stalls, two caches on one server, corrupt
//! bookkeeping keys, dead lock holders. Each test starts its own `redis-server` and brings
//! the fault about itself; every wait is bounded, with a message.
#![cfg(feature = "redis")]

#[path = "common/redis_server.rs"]
mod redis_server;

mod common;
use common::wait_until;

#[path = "common/fleet.rs"]
mod fleet_common;
use fleet_common::{build, instance, instance_of, linked, settings};

use std::time::Duration;

use herdcache::fleet::{RedisTier, Utf8};
use herdcache::Cache;
use redis_server::RedisServer;

fn load(v: &str) -> impl FnOnce(&String) -> Result<String, ()> + '_ {
    move |_| Ok(v.to_owned())
}

/// A write made on a pooled connection that the server closed while it idled (`timeout 1`,
/// as a proxy or a restart would) reaches Redis and the other instances: the dead
/// connection is replaced and the write sent again. (It used to fail at once, counted as a
/// shared error, and reach nobody while Redis was up.)
#[test]
fn a_write_on_a_connection_the_server_closed_reaches_the_fleet() {
    let Some(redis) = RedisServer::start("a_write_on_a_connection_the_server_closed") else {
        return;
    };
    let (a, b) = (instance(&redis.url(), "f1:"), instance(&redis.url(), "f1:"));
    linked(&[&a, &b]);
    let k = "k".to_owned();
    assert_eq!(a.get_or_load(&k, load("v1")).as_deref(), Ok("v1"));
    assert_eq!(b.get_or_load(&k, load("other")).as_deref(), Ok("v1"));
    a.insert("warm".to_owned(), "w".to_owned()); // a write: its connection goes to the pool
    let mut admin = redis.client();
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("timeout")
        .arg("1")
        .query::<()>(&mut admin)
        .unwrap();
    // Idle past the server's timeout: it closes A's pooled connection.
    std::thread::sleep(Duration::from_secs(3));
    let errors = a.stats().shared_errors;
    assert!(a.invalidate(&k));
    assert_eq!(
        a.stats().shared_errors,
        errors,
        "the write failed: {:?}",
        a.stats()
    );
    wait_until("B hears the invalidation", || b.get(&k).is_none());
    assert_eq!(
        b.get_or_load(&k, load("v2")).as_deref(),
        Ok("v2"),
        "B loads afresh"
    );
}

/// A cache's keys and channel are its own: under another prefix, or the same prefix in
/// another database, nothing crosses; and a value written for another value type under the
/// same prefix is a miss, never a wrong value. (Caches on one Redis used to share the
/// default prefix, and the channel spans databases: one cache's `invalidate` dropped the
/// other's copies.)
#[test]
fn caches_on_one_redis_keep_to_their_namespaces() {
    let Some(redis) = RedisServer::start("caches_on_one_redis_keep_to_their_namespaces") else {
        return;
    };
    let k = "42".to_owned();
    // Two prefixes, one database.
    let (users, orders) = (
        instance(&redis.url(), "users:"),
        instance(&redis.url(), "orders:"),
    );
    linked(&[&users, &orders]);
    assert_eq!(
        users.get_or_load(&k, load("user:Ada")).as_deref(),
        Ok("user:Ada")
    );
    assert_eq!(
        orders.get_or_load(&k, load("order:7")).as_deref(),
        Ok("order:7")
    );
    // One prefix, two databases: an invalidation in one does not reach the other.
    let db1 = format!("redis://127.0.0.1:{}/1", redis.port);
    let (x, y) = (instance(&redis.url(), "p:"), instance(&db1, "p:"));
    linked(&[&x, &y]);
    assert_eq!(x.get_or_load(&k, load("x")).as_deref(), Ok("x"));
    assert_eq!(y.get_or_load(&k, load("y")).as_deref(), Ok("y"));
    assert!(x.invalidate(&k));
    assert!(orders.invalidate(&k));
    // What must not arrive cannot be waited for: give it well past a loopback delivery.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        y.get(&k).as_deref(),
        Some("y"),
        "another database's invalidation reached Y"
    );
    assert_eq!(
        users.get(&k).as_deref(),
        Some("user:Ada"),
        "another prefix's invalidation reached users"
    );
    // One prefix and database, another value type: the bytes are not taken for its own.
    let raw: Cache<String, Vec<u8>> = Cache::builder()
        .max_capacity(10)
        .shared_tier(
            RedisTier::builder(redis.url())
                .key_prefix("users:")
                .build(|k: &String| k.clone(), herdcache::fleet::Raw)
                .unwrap(),
        )
        .build()
        .unwrap();
    let got = raw.get_or_load(&k, |_| Ok::<_, ()>(b"raw".to_vec()));
    assert_eq!(
        got.as_deref(),
        Ok(&b"raw"[..]),
        "the String cache's value decoded as bytes"
    );
}

/// One corrupt bookkeeping key is repaired by the next script that meets it, and never takes
/// the tier down: garbage in the generation counter, in the epoch, in a key's generation
/// (even a key of another Redis type). (Garbage in `seq` failed every write, in `epoch` every
/// load, and a bad `g:` key marked the whole tier down each time it was read.)
#[test]
fn corrupt_bookkeeping_keys_heal_and_take_nothing_down() {
    let Some(redis) = RedisServer::start("corrupt_bookkeeping_keys_heal") else {
        return;
    };
    let (a, b) = (instance(&redis.url(), "h:"), instance(&redis.url(), "h:"));
    linked(&[&a, &b]);
    let mut admin = redis.client();
    let mut set = |key: &str, v: &str| {
        redis::cmd("SET")
            .arg(key)
            .arg(v)
            .query::<()>(&mut admin)
            .unwrap();
    };
    let k = "k".to_owned();
    // The generation counter: writes still reach the fleet.
    set("h:seq", "garbage");
    assert_eq!(a.get_or_load(&k, load("v1")).as_deref(), Ok("v1"));
    assert_eq!(b.get_or_load(&k, load("other")).as_deref(), Ok("v1"));
    a.insert(k.clone(), "v2".to_owned());
    wait_until("B hears the insert", || b.get(&k).is_none());
    assert_eq!(
        b.get_or_load(&k, load("other")).as_deref(),
        Ok("v2"),
        "B reads A's insert"
    );
    // The epoch: loads still go through the tier, and invalidate_all still works.
    set("h:epoch", "not a number");
    let shared = b.stats().shared_hits + b.stats().shared_loads;
    let j = "j".to_owned();
    assert_eq!(a.get_or_load(&j, load("j1")).as_deref(), Ok("j1"));
    assert_eq!(b.get_or_load(&j, load("other")).as_deref(), Ok("j1"));
    assert!(b.stats().shared_hits + b.stats().shared_loads > shared);
    a.invalidate_all();
    wait_until("B hears invalidate_all", || b.get(&j).is_none());
    // A key's generation of another type: the key still loads, and the tier stays up.
    let mut admin = redis.client();
    let generations: Vec<String> = redis::cmd("KEYS").arg("h:g:*").query(&mut admin).unwrap();
    assert!(!generations.is_empty());
    for g in &generations {
        redis::cmd("DEL").arg(g).query::<()>(&mut admin).unwrap();
        redis::cmd("RPUSH")
            .arg(g)
            .arg("x")
            .query::<()>(&mut admin)
            .unwrap();
    }
    a.invalidate(&k);
    let errors = (a.stats().shared_errors, b.stats().shared_errors);
    assert_eq!(a.get_or_load(&k, load("v3")).as_deref(), Ok("v3"));
    assert_eq!(b.get_or_load(&k, load("other")).as_deref(), Ok("v3"));
    assert_eq!((a.stats().shared_errors, b.stats().shared_errors), errors);
    assert!(
        a.shared_status().is_some_and(|s| s.reachable)
            && b.shared_status().is_some_and(|s| s.reachable)
    );
}

/// A tier whose operations give up quickly, for the outage tests.
fn impatient(url: &str, prefix: &str) -> Cache<String, String> {
    instance_of(build(
        settings(url, prefix)
            .wait_bound(Duration::from_secs(5))
            .op_timeout(Duration::from_millis(300))
            .retry_after(Duration::from_millis(100)),
    ))
}

/// A write made while Redis is stalled (SIGSTOP) is not lost: the writer is told it was
/// deferred, keeps it, and replays it once Redis answers, so the old shared value never comes
/// back. (Writes during a stall were dropped, the caller learned nothing, and the old value
/// was current again after the stall: 691 stale reads, up to 8 s old.)
#[test]
fn a_write_during_a_stall_is_deferred_and_replayed() {
    let Some(redis) = RedisServer::start("a_write_during_a_stall_is_deferred") else {
        return;
    };
    let (a, b) = (impatient(&redis.url(), "s:"), impatient(&redis.url(), "s:"));
    linked(&[&a, &b]);
    let k = "k".to_owned();
    assert_eq!(a.get_or_load(&k, load("old")).as_deref(), Ok("old"));
    assert_eq!(b.get_or_load(&k, load("other")).as_deref(), Ok("old"));
    redis.pause();
    let r = a.try_invalidate(&k);
    redis.resume();
    assert_eq!(r, Err(herdcache::fleet::SharedWriteError::Deferred));
    assert_eq!(a.get(&k), None, "the local half is done");
    // B loads through the tier until the replay reaches it: the old value must go.
    wait_until("the old shared value is invalidated", || {
        b.invalidate(&"unrelated".to_owned());
        b.get(&k).is_none() && b.get_or_load(&k, load("new")).as_deref() == Ok("new")
    });
    // The write may also have landed late, when the stall ended: replayed anyway (an
    // invalidation twice is one).
    wait_until("A replays its deferred write", || {
        a.stats().shared_writes_replayed >= 1
    });
    assert!(a.stats().shared_writes_failed >= 1);
    // Its outbox empty, A uses the tier again (the replay invalidated B's load too: a later
    // write of the key counts as newer than B's read of it).
    let used = a.stats().shared_hits + a.stats().shared_loads;
    assert!(a.get_or_load(&k, load("newer")).is_ok());
    assert!(
        a.stats().shared_hits + a.stats().shared_loads > used,
        "A reads the tier again"
    );
}

/// A write made while Redis is down is replayed when it comes back, so a restart that
/// restores the old data (an append-only file) does not make the old value current again.
#[test]
fn a_write_during_an_outage_outlives_a_restart_that_restores_old_data() {
    let Some(mut redis) = RedisServer::start_persistent("a_write_during_an_outage") else {
        return;
    };
    let a = impatient(&redis.url(), "o:");
    linked(&[&a]);
    let k = "k".to_owned();
    assert_eq!(a.get_or_load(&k, load("old")).as_deref(), Ok("old"));
    redis.stop();
    assert_eq!(
        a.try_insert(k.clone(), "new".to_owned()),
        Err(herdcache::fleet::SharedWriteError::Deferred)
    );
    redis.restart(); // the append-only file brings "old" back
    wait_until("A replays its write", || {
        a.stats().shared_writes_replayed >= 1
    });
    // A new instance does not read the value the write replaced.
    let fresh = impatient(&redis.url(), "o:");
    assert_eq!(
        fresh.get_or_load(&k, load("from the source")).as_deref(),
        Ok("from the source")
    );
}

/// A value too large for the tier stays in the instance that has it: an insert still
/// invalidates the key in the tier, a load releases its lock without publishing, and nothing
/// fails or times out. (32 MB values made writes that were applied report failure, reads
/// time out and mark the tier down, and a publish that timed out left its lock behind.)
#[test]
fn a_value_too_large_for_the_tier_stays_local_and_takes_nothing_down() {
    let Some(redis) = RedisServer::start("a_value_too_large_for_the_tier") else {
        return;
    };
    let small =
        |prefix: &str| instance_of(build(settings(&redis.url(), prefix).max_value_size(1_000)));
    let (a, b) = (small("big:"), small("big:"));
    linked(&[&a, &b]);
    let (k, big) = ("k".to_owned(), "x".repeat(2_000));
    assert_eq!(b.get_or_load(&k, load("old")).as_deref(), Ok("old"));
    a.insert(k.clone(), big.clone());
    wait_until("B drops the value A's insert replaced", || {
        b.get(&k).is_none()
    });
    // B's load finds no shared value (A's stayed local) and loads for itself, at once.
    assert_eq!(b.get_or_load(&k, load("b's own")).as_deref(), Ok("b's own"));
    // A load of a large value publishes nothing, and frees its lock for the next instance.
    let j = "j".to_owned();
    assert_eq!(
        a.get_or_load(&j, |_| Ok::<_, ()>(big.clone()))
            .map(|v| v.len()),
        Ok(2_000)
    );
    assert_eq!(b.get_or_load(&j, load("small")).as_deref(), Ok("small"));
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!((sa.shared_errors, sb.shared_errors), (0, 0));
    assert_eq!(
        sb.shared_wait_timeouts, 0,
        "B waited for a lock A left behind"
    );
    assert_eq!(sa.shared_too_large, 2, "{sa:?}");
}

/// A live holder whose load runs many heartbeats keeps its lock: another instance waits for
/// its value instead of loading too, though the lock was set to live two heartbeats.
#[test]
fn a_live_holder_keeps_its_lock_through_a_long_load() {
    let Some(redis) = RedisServer::start("a_live_holder_keeps_its_lock") else {
        return;
    };
    let beating = |prefix: &str| {
        instance_of(build(
            settings(&redis.url(), prefix).heartbeat(Duration::from_millis(20)),
        ))
    };
    let (a, b) = (beating("live:"), beating("live:"));
    linked(&[&a, &b]);
    let k = "k".to_owned();
    let mut check = redis.client();
    std::thread::scope(|s| {
        let holder = s.spawn(|| {
            a.get_or_load(&k, |_| {
                // Twenty lock lifetimes.
                std::thread::sleep(Duration::from_millis(800));
                Ok::<_, ()>("a's".to_owned())
            })
        });
        wait_until("A takes the lock", || {
            redis::cmd("EXISTS")
                .arg("live:l:k")
                .query::<bool>(&mut check)
                .unwrap()
        });
        let got = b.get_or_load(&k, |_| Err::<String, ()>(()));
        assert_eq!(got.as_deref(), Ok("a's"), "B waited for A's value");
        assert_eq!(holder.join().unwrap().as_deref(), Ok("a's"));
    });
    assert_eq!(b.stats().shared_hits, 1);
}

/// Scripts travel by their hash (`EVALSHA`), not as source with every call, and a server
/// that lost them (`SCRIPT FLUSH`, a restart) is given them again at once: nothing fails.
/// (Every call sent the whole Lua source: 1.2 KB per instance per key-expiry.)
#[test]
fn scripts_travel_by_hash_and_survive_a_script_flush() {
    let Some(redis) = RedisServer::start("scripts_travel_by_hash") else {
        return;
    };
    let (a, b) = (
        instance(&redis.url(), "sha:"),
        instance(&redis.url(), "sha:"),
    );
    linked(&[&a, &b]);
    let mut raw = redis.client();
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut raw)
        .unwrap();
    let k = "k".to_owned();
    assert_eq!(a.get_or_load(&k, load("one")).as_deref(), Ok("one"));
    let () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut raw).unwrap();
    assert_eq!(a.try_insert(k.clone(), "two".into()), Ok(()));
    wait_until("B drops its copy", || b.get(&k).is_none());
    assert_eq!(b.get_or_load(&k, load("unused")).as_deref(), Ok("two"));
    assert_eq!((a.stats().shared_errors, b.stats().shared_errors), (0, 0));
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut raw)
        .unwrap();
    assert!(
        !info.contains("cmdstat_eval:"),
        "no script sent as source: {info}"
    );
    assert!(info.contains("cmdstat_evalsha:"), "{info}");
}

/// An idle instance keeps its link alive with about one command a second, not one every
/// quarter of the coherence bound. (It pinged 40 times a second: 20,000 commands a second
/// from 500 idle pods.)
#[test]
fn an_idle_instance_sends_about_one_command_a_second() {
    let Some(redis) = RedisServer::start("an_idle_instance_sends_about_one_command") else {
        return;
    };
    // The default bound (100 ms) and keep-alive.
    let idle: Cache<String, String> = Cache::builder()
        .max_capacity(100)
        .shared_tier(
            RedisTier::builder(redis.url())
                .key_prefix("idle:")
                .build(|k: &String| k.clone(), Utf8)
                .unwrap(),
        )
        .build()
        .unwrap();
    linked(&[&idle]);
    let mut raw = redis.client();
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut raw)
        .unwrap();
    let window = Duration::from_secs(3);
    std::thread::sleep(window);
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut raw)
        .unwrap();
    let calls = |cmd: &str| -> u64 {
        info.lines()
            .find_map(|l| {
                l.strip_prefix(&format!("cmdstat_{cmd}:calls="))?
                    .split(',')
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    };
    // Our own CONFIG and INFO aside; a loaded machine only ever pings less.
    let sent = calls("ping");
    assert!(
        sent <= 2 * window.as_secs(),
        "{sent} pings in {window:?} from an idle instance: {info}"
    );
    assert!(idle.shared_status().is_some_and(|s| s.subscribed));
}

/// What the crate logged, at warning level and above.
static LOGGED: std::sync::Mutex<Vec<(log::Level, String)>> = std::sync::Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            let mut logged = LOGGED.lock().unwrap_or_else(|p| p.into_inner());
            logged.push((r.level(), r.args().to_string()));
        }
    }
    fn flush(&self) {}
}

/// The error lines logged so far that contain `needle`.
fn errors_logged(needle: &str) -> usize {
    let logged = LOGGED.lock().unwrap_or_else(|p| p.into_inner());
    logged
        .iter()
        .filter(|(level, line)| *level == log::Level::Error && line.contains(needle))
        .count()
}

/// A tier whose credentials Redis refuses says so: `check` tells before a cache is built,
/// and a cache built anyway logs it at error level at its first connection, once. (A wrong
/// password silently turned the tier into 100 ms local copies: 20 loads in 2 s instead of
/// one, and a warning at most once per log interval, like a passing outage.)
#[test]
fn a_tier_that_cannot_authenticate_says_so_at_once_and_loudly() {
    let Some(redis) = RedisServer::start("a_tier_that_cannot_authenticate") else {
        return;
    };
    if log::set_logger(&Capture).is_ok() {
        log::set_max_level(log::LevelFilter::Warn);
    }
    let mut raw = redis.client();
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("secret")
        .query(&mut raw)
        .unwrap();
    let at = |userinfo: &str| {
        RedisTier::builder(format!("redis://{userinfo}127.0.0.1:{}/", redis.port))
            .key_prefix("auth:")
            .op_timeout(Duration::from_secs(2))
            .build(|k: &String| k.clone(), Utf8)
            .unwrap()
    };
    use herdcache::fleet::CheckError;
    let wrong = at(":wrong@").check();
    assert!(matches!(wrong, Err(CheckError::Auth(_))), "{wrong:?}");
    let none = at("").check();
    assert!(matches!(none, Err(CheckError::Auth(_))), "{none:?}");
    assert_eq!(at(":secret@").check(), Ok(()));
    let closed = RedisTier::builder("redis://127.0.0.1:1/")
        .key_prefix("auth:")
        .build::<String, String>(|k| k.clone(), Utf8)
        .unwrap()
        .check();
    assert!(
        matches!(closed, Err(CheckError::Unreachable(_))),
        "{closed:?}"
    );

    let needle = "refused the shared tier's credentials";
    let cache: Cache<String, String> = Cache::builder()
        .max_capacity(10)
        .shared_tier(at(":wrong@"))
        .build()
        .unwrap();
    wait_until("the refused credentials are logged as an error", || {
        errors_logged(needle) > 0
    });
    // Loads still answer, locally, and the error is not said again.
    let k = "k".to_owned();
    assert_eq!(cache.get_or_load(&k, load("local")).as_deref(), Ok("local"));
    assert!(cache.stats().shared_errors >= 1);
    assert_eq!(errors_logged(needle), 1, "said once per tier");
}
