//! Churn at capacity: insert cycles that each evict, on a full cache, reporting throughput and
//! resident memory per block of cycles. Both must stay flat: tombstones left by evictions
//! are dropped by same-size rehashes, so neither the table nor the time per insert grows.
//!
//! Run: `cargo bench --bench churn -- [cycles] [capacity]` (defaults: 10^7 cycles, 100,000
//! entries).

use std::hint::black_box;
use std::time::Instant;

use herdcache::Cache;

fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn main() {
    // `cargo bench` passes `--bench`; take the first two numeric arguments.
    let nums: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let cycles = nums.first().copied().unwrap_or(10_000_000);
    let capacity = nums.get(1).copied().unwrap_or(100_000);
    let cache: Cache<u64, u64> = Cache::builder().max_capacity(capacity).build().unwrap();
    for k in 0..capacity {
        cache.insert(k, k);
    }
    let blocks = 10;
    let per_block = (cycles / blocks).max(1);
    println!("churn: {cycles} insert/evict cycles at capacity {capacity}");
    println!(
        "{:>6} {:>14} {:>12} {:>10}",
        "block", "inserts/s", "rss_kib", "entries"
    );
    let mut next = capacity;
    let mut rates = Vec::new();
    for block in 0..blocks {
        let start = Instant::now();
        for _ in 0..per_block {
            cache.insert(next, next);
            next += 1;
        }
        black_box(cache.get(&(next - 1)));
        let rate = per_block as f64 / start.elapsed().as_secs_f64();
        rates.push(rate);
        let rss = rss_kib().map_or_else(|| "n/a".to_owned(), |r| r.to_string());
        println!(
            "{block:>6} {rate:>14.0} {rss:>12} {:>10}",
            cache.entry_count()
        );
    }
    let (min, max) = rates
        .iter()
        .fold((f64::MAX, 0f64), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
    println!("slowest block / fastest block: {:.2}", min / max);
    let s = cache.stats();
    println!(
        "evictions {} (expected {})",
        s.evictions,
        cycles / blocks * blocks
    );
}
