//! A fixed number of one operation, for profilers: run it under cachegrind (or perf) at two
//! operation counts and divide the difference by the difference in operations, so that the
//! setup (filling the cache) cancels out.
//!
//! Run: `valgrind --tool=cachegrind --cache-sim=yes target/release/opcost --op insert
//! --ops 200000`, then again with `--ops 400000`. Or count the operations alone, in one run:
//! `valgrind --tool=callgrind --cache-sim=yes --toggle-collect='*measured*'
//! target/release/opcost --op insert --ops 200000`, and divide by `--ops` (the pair's
//! difference also carries the key generation, which grows with `--ops`, and for herdcache
//! the TSC clock's calibration, a wall-clock loop whose length in instructions differs
//! between runs: about ±10 per `get`). Writes vary with the hasher's random seed (where the
//! table's migrations fall): take the median of several runs. Operations: `insert` (keys never seen,
//! on a full cache of `--capacity` entries: each evicts), `get` (uniform hits over the
//! keys the fill left resident, one `get` each), `read-batch` (the same hits read 1,024 at a
//! time through the cache's batched read: one `pin()` for the batch in
//! `herdcache (pin per batch)`, a `get` each elsewhere), `get-or-load` (the same hits through the cache's loading
//! call: `get_with`, quick_cache's `get_or_insert_with`), `cache-aside` (`get`, and `insert` on a miss, Zipf(1.0)
//! over 10x the capacity). Caches: `herdcache` (default), `herdcache (TTL)` (an hour's time to live: writes
//! compute an expiry and sweep), `herdcache (pin per batch)`, `quick_cache`, `Mutex<LruCache>`.

use std::hint::black_box;

use herdcache_bench::args::{exit_usage, Flags};
use herdcache_bench::caches::{
    BenchCache, Herdcache, HerdcachePinned, HerdcacheTtl, MutexLru, QuickCache,
};
use herdcache_bench::workload::{keys, Distribution};

const USAGE: &str = "opcost --op insert|get|read-batch|get-or-load|cache-aside [--ops N] \
     [--capacity N] [--cache NAME]";

/// Reads per batch in `read-batch`: the throughput bench's.
const BATCH: usize = 1_024;

fn run<C: BenchCache>(op: &str, ops: usize, capacity: u64) {
    let cache = C::with_capacity(capacity as usize);
    for k in 0..capacity {
        cache.insert(k, k);
    }
    cache.settle();
    // Generated before the operations, in both runs of a pair alike.
    let seq = match op {
        // Hits only: drawn from the keys the fill left resident (a cache at capacity may have
        // turned some away), so that no miss (for `get-or-load`, a load) skews the mean. The
        // look is setup, alike in both runs of a pair.
        "get" | "read-batch" | "get-or-load" => {
            let resident: Vec<u64> = (0..capacity).filter(|&k| cache.get(k).is_some()).collect();
            keys(Distribution::Uniform, resident.len() as u64, ops, 1)
                .into_iter()
                .map(|i| resident[i as usize])
                .collect()
        }
        "cache-aside" => keys(Distribution::Zipf(1.0), capacity * 10, ops, 1),
        _ => Vec::new(),
    };
    black_box(measured(&cache, op, &seq, ops, capacity));
}

/// The operations alone, out of line so that callgrind can count them and nothing else
/// (`--toggle-collect='*measured*'`): one run then gives the cost per operation, without the
/// fill, the key generation, or one-time costs such as the TSC clock's calibration, whose
/// length in instructions varies from run to run.
#[inline(never)]
fn measured<C: BenchCache>(cache: &C, op: &str, seq: &[u64], ops: usize, capacity: u64) -> u64 {
    let mut found = 0u64;
    match op {
        "insert" => {
            for k in capacity..capacity + ops as u64 {
                cache.insert(k, k);
            }
        }
        "get" => {
            for &k in seq {
                found += u64::from(cache.get(k).is_some());
            }
        }
        "read-batch" => {
            for batch in seq.chunks(BATCH) {
                found += cache.read_batch(batch);
            }
        }
        "get-or-load" => {
            for &k in seq {
                found += cache.get_or_load(k, |k| k);
            }
        }
        _ => {
            for &k in seq {
                if cache.get(k).is_some() {
                    found += 1;
                } else {
                    cache.insert(k, k);
                }
            }
        }
    }
    found
}

fn main() {
    let flags = Flags::parse(&["--op", "--ops", "--capacity", "--cache"], &[])
        .unwrap_or_else(|e| exit_usage(&e, USAGE));
    let op = flags.raw("--op").pop().unwrap_or_else(|| "insert".into());
    if !["insert", "get", "read-batch", "get-or-load", "cache-aside"].contains(&op.as_str()) {
        exit_usage(&format!("unknown operation {op:?}"), USAGE);
    }
    let ops: usize = flags
        .get("--ops", 200_000)
        .unwrap_or_else(|e| exit_usage(&e, USAGE));
    let capacity: u64 = flags
        .get("--capacity", 100_000)
        .unwrap_or_else(|e| exit_usage(&e, USAGE));
    if capacity == 0 {
        exit_usage("--capacity must be at least 1", USAGE);
    }
    match flags.raw("--cache").pop().as_deref().unwrap_or("herdcache") {
        "herdcache" => run::<Herdcache>(&op, ops, capacity),
        "herdcache (TTL)" => run::<HerdcacheTtl>(&op, ops, capacity),
        "herdcache (pin per batch)" => run::<HerdcachePinned>(&op, ops, capacity),
        "quick_cache" => run::<QuickCache>(&op, ops, capacity),
        "Mutex<LruCache>" => run::<MutexLru>(&op, ops, capacity),
        other => exit_usage(&format!("unknown cache {other:?}"), USAGE),
    }
}
