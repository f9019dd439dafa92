//! Warming from a recorded hot set: a service records the keys its cache values most when it
//! shuts down (or periodically), and the next instance loads them before taking traffic, so
//! its first requests hit instead of stampeding the source.
//!
//! Run: `cargo run --release -p herdcache-demo --example hot_set`

use std::time::Instant;

use herdcache::Cache;

/// The source behind the cache: slow, as sources are.
fn load(key: &u64) -> Result<String, std::io::Error> {
    std::thread::sleep(std::time::Duration::from_millis(2));
    Ok(format!("value {key}"))
}

/// A day of traffic: a few thousand hot keys among a million, Zipf-like.
fn traffic(n: usize) -> impl Iterator<Item = u64> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..n).map(move |_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Log-uniform over 1..1,000,000: key k comes up about as often as 1/k (Zipf-like).
        let u = (x >> 11) as f64 / (1u64 << 53) as f64;
        1_000_000f64.powf(u) as u64
    })
}

/// Serves `requests` requests (loading only on a miss, with `load`): their hit ratio.
fn serve(
    cache: &Cache<u64, String>,
    requests: usize,
    load: fn(&u64) -> Result<String, std::io::Error>,
) -> f64 {
    let before = cache.stats();
    for key in traffic(requests) {
        let _ = cache.get_or_load(&key, load);
    }
    let hits = cache.stats().hits - before.hits;
    hits as f64 / requests as f64
}

fn build() -> Result<Cache<u64, String>, herdcache::BuildError> {
    Cache::builder().max_capacity(5_000).build()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join("herdcache-hot-set.txt");

    // Yesterday's instance: serves, then records its hot set at shutdown.
    let old = build()?;
    // (Its source answers at once here, to keep the demonstration short.)
    serve(&old, 50_000, |k| Ok(format!("value {k}")));
    let hot = old.hottest(2_000);
    let text: Vec<String> = hot.iter().map(u64::to_string).collect();
    std::fs::write(&path, text.join("\n"))?;
    println!("recorded {} hot keys to {}", hot.len(), path.display());

    // Today's instances: one starts cold, one warms from the recorded keys first.
    let recorded: Vec<u64> = std::fs::read_to_string(&path)?
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect();
    for warmed in [false, true] {
        let cache = build()?;
        let start = Instant::now();
        if warmed {
            let report = cache.warm(recorded.iter().copied(), load, 8);
            println!(
                "warmed {} keys in {:.2?} before taking traffic",
                report.loaded,
                start.elapsed()
            );
        }
        let first = Instant::now();
        let hit_ratio = serve(&cache, 2_000, load);
        println!(
            "{:>5}: first 2,000 requests hit {:>5.1}% (served in {:.2?})",
            if warmed { "warm" } else { "cold" },
            hit_ratio * 100.0,
            first.elapsed()
        );
    }
    Ok(())
}
