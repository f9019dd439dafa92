//! The `metrics` feature: what an operator's dashboards receive.

use herdcache::Cache;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;

#[test]
fn export_metrics_sends_every_counter_and_gauge_labelled_with_the_cache() {
    let cache: Cache<u32, u32> = Cache::builder().max_capacity(10).build().unwrap();
    cache.insert(1, 1);
    let _ = (cache.get(&1), cache.get(&1), cache.get(&2));
    let _ = cache.get_or_load(&3, |_| Ok::<_, ()>(3));
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || cache.export_metrics("users"));
    let metrics = snapshotter.snapshot().into_vec();
    let find = |name: &str, kind: MetricKind| {
        metrics
            .iter()
            .find(|(k, _, _, _)| {
                k.kind() == kind
                    && k.key().name() == name
                    && k.key()
                        .labels()
                        .any(|l| l.key() == "cache" && l.value() == "users")
            })
            .map(|(_, _, _, v)| v)
    };
    assert!(matches!(
        find("herdcache_hits_total", MetricKind::Counter),
        Some(DebugValue::Counter(2))
    ));
    assert!(matches!(
        find("herdcache_misses_total", MetricKind::Counter),
        Some(DebugValue::Counter(2))
    ));
    assert!(matches!(
        find("herdcache_loads_total", MetricKind::Counter),
        Some(DebugValue::Counter(1))
    ));
    match find("herdcache_entries", MetricKind::Gauge) {
        Some(DebugValue::Gauge(v)) => assert_eq!(v.into_inner(), 2.0),
        other => panic!("herdcache_entries: {other:?}"),
    }
    let latencies = metrics
        .iter()
        .filter(|(k, ..)| k.key().name() == "herdcache_load_latency_seconds")
        .count();
    assert_eq!(latencies, 3, "p50, p99 and max");
    let counters = metrics
        .iter()
        .filter(|(k, ..)| k.kind() == MetricKind::Counter)
        .count();
    assert!(counters >= 29, "every counter of Stats: {counters}");
}
