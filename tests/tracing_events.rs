//! The `tracing` feature: what an operator's logs receive. One test in its own binary: a
//! `tracing` callsite caches whether anyone listens when it is first hit, and a load on
//! another test's thread hitting it first, before this test's scoped subscriber exists,
//! could hide the events from it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use herdcache::Cache;

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
