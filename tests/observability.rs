//! What `Stats` tells an operator about loads: how many run now, how long they take, how
//! many callers each one serves, and how often a stale value stood in for one.

mod common;

use std::time::Duration;

use common::held_load;
use herdcache::{Cache, ManualClock};

#[test]
fn loads_in_flight_counts_the_loads_running_now() {
    let c: Cache<u64, u64> = Cache::builder().max_capacity(100).build().unwrap();
    assert_eq!(c.stats().loads_in_flight, 0);
    let (release_a, a) = held_load(&c, 1, 10);
    let (release_b, b) = held_load(&c, 2, 20);
    assert_eq!(c.stats().loads_in_flight, 2);
    release_a.send(()).unwrap();
    assert_eq!(a.join().unwrap(), 10);
    assert_eq!(c.stats().loads_in_flight, 1);
    release_b.send(()).unwrap();
    assert_eq!(b.join().unwrap(), 20);
    // Failed and panicking loads end too.
    let _ = c.get_or_load(&3, |_| Err::<u64, _>("down"));
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        c.get_or_load(&4, |_| -> Result<u64, ()> {
            panic!("user code: loader panics")
        })
    }));
    let s = c.stats();
    assert_eq!((s.loads, s.loads_in_flight), (4, 0));
}

#[test]
fn load_latency_is_measured_by_the_cache_clock() {
    let clock = ManualClock::new();
    let c: Cache<u64, u64> = Cache::builder()
        .max_capacity(100)
        .clock(clock.clone())
        .build()
        .unwrap();
    let zero = c.stats();
    assert_eq!(
        (zero.load_latency_p50, zero.load_latency_max),
        (Duration::ZERO, Duration::ZERO)
    );
    // 99 loads of 3 ms and one of 2 s.
    for k in 0..100u64 {
        let took = if k == 99 {
            Duration::from_secs(2)
        } else {
            Duration::from_millis(3)
        };
        c.get_or_load(&k, |_| {
            clock.advance(took);
            Ok::<_, ()>(k)
        })
        .unwrap();
    }
    let s = c.stats();
    // Bucket bounds: within a factor of two above the true durations.
    assert!(
        s.load_latency_p50 >= Duration::from_millis(3)
            && s.load_latency_p50 <= Duration::from_millis(6),
        "{:?}",
        s.load_latency_p50
    );
    assert_eq!(
        s.load_latency_p99, s.load_latency_p50,
        "99 of 100 loads took 3 ms"
    );
    assert_eq!(s.load_latency_max, Duration::from_secs(2));
}

#[test]
fn a_stale_value_served_at_a_deadline_counts_apart_from_the_timeout() {
    let clock = ManualClock::new();
    let c: Cache<u64, u64> = Cache::builder()
        .max_capacity(100)
        .time_to_live(Duration::from_secs(10))
        .max_stale(Duration::from_secs(60))
        .clock(clock.clone())
        .build()
        .unwrap();
    c.insert(1, 1);
    clock.advance(Duration::from_secs(11));
    let (release, leader) = held_load(&c, 1, 2);
    // A caller that cannot wait: its (real-time) deadline passes while the load is held.
    let got = c.get_or_load_timeout(&1, Duration::from_millis(20), |_| Ok::<_, ()>(3));
    assert_eq!(got, Ok(1), "the expired value within max_stale");
    let s = c.stats();
    assert_eq!((s.timeouts, s.stale_served), (1, 1));
    assert_eq!(s.waiters_per_load(), 1.0);
    release.send(()).unwrap();
    assert_eq!(leader.join().unwrap(), 2);
    // Without a stale value, a timeout serves nothing.
    let (release, leader) = held_load(&c, 2, 2);
    let got = c.get_or_load_timeout(&2, Duration::from_millis(20), |_| Ok::<_, ()>(3));
    assert!(got.is_err());
    assert_eq!((c.stats().timeouts, c.stats().stale_served), (2, 1));
    release.send(()).unwrap();
    leader.join().unwrap();
}
