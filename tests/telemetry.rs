//! The `metrics` and `tracing` features: what an operator's dashboards and logs receive.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

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

/// Counts the events at each level that reach it.
#[derive(Default)]
struct Events {
    debug: AtomicUsize,
    warn: AtomicUsize,
}

struct Counting(Arc<Events>);

impl tracing::Subscriber for Counting {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        assert_eq!(event.metadata().target(), "herdcache");
        match *event.metadata().level() {
            tracing::Level::DEBUG => self.0.debug.fetch_add(1, Ordering::Relaxed),
            tracing::Level::WARN => self.0.warn.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn loads_and_panicking_loaders_are_traced() {
    let events = Arc::new(Events::default());
    let cache: Cache<u32, u32> = Cache::builder().max_capacity(10).build().unwrap();
    tracing::subscriber::with_default(Counting(Arc::clone(&events)), || {
        let _ = cache.get_or_load(&1, |_| Ok::<_, ()>(1));
        let _ = cache.get_or_load(&2, |_| Err::<u32, _>("down"));
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            cache.get_or_load(&3, |_| -> Result<u32, ()> {
                panic!("user code: loader panics")
            })
        }));
    });
    assert_eq!(
        events.debug.load(Ordering::Relaxed),
        2,
        "one event per finished load"
    );
    assert_eq!(events.warn.load(Ordering::Relaxed), 1, "the panic");
}
