//! Proactive expiry: expired values are freed and reported as `Expired` without a read of
//! their key, by the writes' sweep (within `max_capacity` writes, as documented) or by
//! `purge_expired`.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Tracked;
use herdcache::{Cache, ManualClock, RemovalCause};

const TTL: Duration = Duration::from_secs(10);
const CAPACITY: u64 = 1_000;

type Heard = Arc<Mutex<Vec<u64>>>;

fn build(clock: &ManualClock, max_stale: Duration) -> (Cache<u64, Tracked>, Heard) {
    let expired: Heard = Arc::default();
    let heard = Arc::clone(&expired);
    let cache = Cache::builder()
        .max_capacity(CAPACITY)
        .time_to_live(TTL)
        .max_stale(max_stale)
        .clock(clock.clone())
        .eviction_listener(move |k: &u64, _v: &Tracked, cause| {
            if cause == RemovalCause::Expired {
                heard.lock().unwrap().push(*k);
            }
        })
        .build()
        .unwrap();
    (cache, expired)
}

/// `CAPACITY` writes of ten keys from `first`, each a fresh value counted in `drops`.
fn churn(cache: &Cache<u64, Tracked>, first: u64, drops: &Arc<AtomicUsize>) {
    for i in 0..CAPACITY {
        cache.insert(first + i % 10, Tracked::new(i, drops));
    }
}

/// Waits (pinning, which lets the collector run) until `n` values were dropped.
fn freed(cache: &Cache<u64, Tracked>, drops: &AtomicUsize, n: usize) {
    common::spin_until("the removed values freed", || {
        drop(cache.pin());
        drops.load(Ordering::Relaxed) >= n
    });
}

#[test]
fn writes_of_other_keys_free_expired_values_without_a_read() {
    let clock = ManualClock::new();
    let (cache, expired) = build(&clock, Duration::ZERO);
    let drops = Arc::new(AtomicUsize::new(0));
    for k in 0..100 {
        cache.insert(k, Tracked::new(k, &drops));
    }
    clock.advance(TTL);
    churn(&cache, 10_000, &Arc::new(AtomicUsize::new(0)));
    let mut heard = expired.lock().unwrap().clone();
    heard.sort_unstable();
    assert_eq!(
        heard,
        (0..100).collect::<Vec<_>>(),
        "expired keys not reported"
    );
    assert_eq!(cache.entry_count(), 10);
    assert_eq!(cache.weighted_size(), 10);
    assert_eq!(cache.stats().expirations, 100);
    freed(&cache, &drops, 100);
}

#[test]
fn the_sweep_keeps_values_within_max_stale_as_fallbacks() {
    let clock = ManualClock::new();
    let (cache, expired) = build(&clock, Duration::from_secs(60));
    let drops = Arc::new(AtomicUsize::new(0));
    for k in 0..100 {
        cache.insert(k, Tracked::new(k, &drops));
    }
    // Long-lived keys push those out of the policy's window (1% of the capacity), which drops
    // expired entries as they leave it, before they expire.
    for k in 1_000..1_020 {
        cache.insert_with_ttl(k, Tracked::new(k, &drops), TTL * 100);
    }
    clock.advance(TTL + Duration::from_secs(30));
    churn(&cache, 10_000, &drops);
    let heard = expired.lock().unwrap().clone();
    assert!(heard.is_empty(), "removed within max_stale: {heard:?}");
    clock.advance(Duration::from_secs(31));
    churn(&cache, 20_000, &drops);
    // Now the first values are more than max_stale past their expiry.
    let heard = expired.lock().unwrap().clone();
    let missed: Vec<_> = (0..100).filter(|k| !heard.contains(k)).collect();
    assert!(missed.is_empty(), "not swept: {missed:?}");
}

#[test]
fn purge_expired_removes_every_expired_value_now() {
    let clock = ManualClock::new();
    let (cache, expired) = build(&clock, Duration::from_secs(60));
    let drops = Arc::new(AtomicUsize::new(0));
    for k in 0..100 {
        cache.insert(k, Tracked::new(k, &drops));
    }
    clock.advance(TTL / 2);
    cache.insert(500, Tracked::new(500, &drops));
    clock.advance(TTL / 2);
    assert_eq!(cache.purge_expired(), 100);
    assert_eq!(expired.lock().unwrap().len(), 100);
    assert_eq!(cache.entry_count(), 1);
    assert!(cache.pin().get(&500).is_some());
    freed(&cache, &drops, 100);
    assert_eq!(cache.purge_expired(), 0);
}

#[test]
fn a_cache_without_expiry_keeps_everything_until_evicted() {
    let cache: Cache<u64, u64> = Cache::builder().max_capacity(CAPACITY).build().unwrap();
    for k in 0..500 {
        cache.insert(k, k);
    }
    assert_eq!(cache.purge_expired(), 0);
    assert_eq!(cache.entry_count(), 500);
}

#[test]
fn a_per_entry_ttl_turns_the_sweep_on() {
    let clock = ManualClock::new();
    let drops = Arc::new(AtomicUsize::new(0));
    let cache: Cache<u64, Tracked> = Cache::builder()
        .max_capacity(CAPACITY)
        .max_stale(Duration::ZERO)
        .clock(clock.clone())
        .build()
        .unwrap();
    for k in 0..50 {
        cache.insert_with_ttl(k, Tracked::new(k, &drops), TTL);
    }
    clock.advance(TTL);
    churn(&cache, 10_000, &Arc::new(AtomicUsize::new(0)));
    assert_eq!(cache.stats().expirations, 50);
    freed(&cache, &drops, 50);
}
