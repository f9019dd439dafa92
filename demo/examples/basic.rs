//! Fills a bounded cache from several threads, reads it back, and prints the statistics.
//!
//! Run: `cargo run --release -p herdcache-demo --example basic`

use std::sync::Arc;
use std::time::{Duration, Instant};

use herdcache::Cache;

fn main() -> Result<(), herdcache::BuildError> {
    let threads = 4u64;
    let keys = 200_000u64;
    let cache: Cache<u64, Arc<String>> = Cache::builder()
        .max_capacity(50_000)
        .time_to_live(Duration::from_secs(60))
        .build()?;

    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let cache = cache.clone();
            s.spawn(move || {
                for k in (t..keys).step_by(threads as usize) {
                    cache.insert(k, Arc::new(format!("value {k}")));
                    // Reread a small hot set often: the policy keeps it resident.
                    let hot = k % 1_000;
                    let _ = cache.get(&hot);
                }
            });
        }
    });
    let elapsed = start.elapsed();

    let guard = cache.pin();
    let resident_hot = (0..1_000u64).filter(|k| guard.get(k).is_some()).count();
    drop(guard);
    let s = cache.stats();
    println!("{threads} threads inserted {keys} keys in {elapsed:.2?}");
    println!(
        "entries: {} (capacity {})",
        cache.entry_count(),
        cache.max_capacity()
    );
    println!("hot keys still resident: {resident_hot} / 1000");
    println!(
        "hits {} misses {} (hit ratio {:.1}%), inserts {}, evictions {}",
        s.hits,
        s.misses,
        100.0 * s.hit_ratio(),
        s.inserts,
        s.evictions
    );
    Ok(())
}
