//! The fleet tier under the faults of real Redis deployments (feature `redis`): connections
//! the server closed while they idled, outages and stalls, two caches on one server, corrupt
//! bookkeeping keys, dead lock holders. Each test starts its own `redis-server` and brings
//! the fault about itself; every wait is bounded, with a message.
#![cfg(feature = "redis")]

#[path = "common/redis_server.rs"]
mod redis_server;

mod common;
use common::wait_until;

use std::time::Duration;

use herdcache::fleet::{RedisTier, Utf8};
use herdcache::Cache;
use redis_server::RedisServer;

/// Long enough that a loaded test machine does not starve a subscriber into declaring its
/// link lost.
const BOUND: Duration = Duration::from_secs(2);

fn tier(url: &str, prefix: &str) -> RedisTier<String, String> {
    RedisTier::builder(url)
        .key_prefix(prefix)
        .wait_bound(Duration::from_secs(5))
        .coherence_bound(BOUND)
        .op_timeout(Duration::from_secs(2))
        .retry_after(Duration::from_millis(100))
        .build(|k: &String| k.clone(), Utf8)
        .expect("valid tier settings")
}

fn instance(url: &str, prefix: &str) -> Cache<String, String> {
    Cache::builder()
        .max_capacity(100)
        .time_to_live(Duration::from_secs(60))
        .shared_tier(tier(url, prefix))
        .build()
        .expect("valid cache settings")
}

/// Waits until each instance hears the fleet.
fn linked(instances: &[&Cache<String, String>]) {
    wait_until("instances subscribed", || {
        instances
            .iter()
            .all(|c| c.shared_status().is_some_and(|s| s.subscribed))
    });
}

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
