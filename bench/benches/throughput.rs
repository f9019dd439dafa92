//! Throughput of herdcache against the caches and maps people use today, in operations per
//! second, at each thread count.
//!
//! Workloads (keys pre-generated outside the timed loop, a different sequence per thread):
//! - `read_uniform`, `read_zipf1`, `read_hot_key`: 100k preloaded `u64` keys, every read a hit;
//! - `mixed_90_10`: 90% reads and 10% inserts of Zipf(1.0) keys over 1M, capacity 100k, so
//!   inserts evict (bounded caches only);
//! - `insert_churn`: inserts of keys never seen before at capacity 100k (bounded caches only);
//! - `cache_aside`: a `get` of a Zipf(1.0) key over 1M, and an `insert` of it on a miss, at
//!   capacity 100k (bounded caches only). Each cache's hit ratio over the measured runs is
//!   written beside criterion's results, to `target/criterion/cache_aside/hit_ratio.tsv`
//!   (cache, threads, hit ratio), where `bench-report` reads it.
//!
//! Threads: `HERDCACHE_BENCH_THREADS` (comma-separated, default `1,2`). std's `HashMap` runs
//! single-threaded only, as the floor for a read. Run:
//! `cargo bench -p herdcache-bench --bench throughput`; `bench-report` turns the results in
//! `target/criterion` into the tables and plots of docs/BENCHMARKS.md.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use herdcache_bench::caches::*;
use herdcache_bench::workload::{keys, Distribution};

const PRELOADED: u64 = 100_000;
const CAPACITY: usize = 100_000;
const MIXED_KEYS: u64 = 1_000_000;
/// Operations per thread per criterion iteration.
const BATCH: usize = 1_024;
/// Length of each thread's key sequence (cycled).
const SEQUENCE: usize = 1 << 16;
/// Length of a cache-aside thread's sequence: long enough to hold several times the
/// capacity in distinct keys, so that the cache misses and evicts as a service's would.
const LONG_SEQUENCE: usize = 1 << 21;

fn thread_counts() -> Vec<usize> {
    let spec = std::env::var("HERDCACHE_BENCH_THREADS").unwrap_or_else(|_| "1,2".into());
    let counts: Vec<usize> = spec
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .filter(|&n| n > 0)
        .collect();
    if counts.is_empty() {
        eprintln!("HERDCACHE_BENCH_THREADS={spec:?} names no thread count; using 1,2");
        vec![1, 2]
    } else {
        counts
    }
}

#[derive(Clone, Copy)]
enum Op {
    Read(Distribution),
    Mixed,
    Churn,
    CacheAside,
}

/// Long-lived worker threads (as in a service), each with its key sequence, that run
/// `iters` batches per measurement, timed from the moment all are released.
struct Workers {
    threads: Vec<std::thread::JoinHandle<()>>,
    start: Arc<Barrier>,
    done: Arc<Barrier>,
    iters: Arc<AtomicU64>,
    /// Reads and hits of every run so far (cache-aside only).
    reads: Arc<AtomicU64>,
    hits: Arc<AtomicU64>,
}

/// `iters` value that tells the workers to exit.
const STOP: u64 = u64::MAX;

impl Workers {
    fn new<C: BenchCache>(cache: &Arc<C>, threads: usize, op: Op) -> Self {
        let start = Arc::new(Barrier::new(threads + 1));
        let done = Arc::new(Barrier::new(threads + 1));
        let iters = Arc::new(AtomicU64::new(0));
        let reads = Arc::new(AtomicU64::new(0));
        let hits = Arc::new(AtomicU64::new(0));
        let handles = (0..threads)
            .map(|t| {
                let (cache, start, done, iters) =
                    (cache.clone(), start.clone(), done.clone(), iters.clone());
                let (reads, hits) = (reads.clone(), hits.clone());
                let seed = 0x5EED + t as u64;
                let seq = match op {
                    Op::Read(d) => keys(d, PRELOADED, SEQUENCE, seed),
                    Op::Mixed => keys(Distribution::Zipf(1.0), MIXED_KEYS, SEQUENCE, seed),
                    Op::CacheAside => {
                        keys(Distribution::Zipf(1.0), MIXED_KEYS, LONG_SEQUENCE, seed)
                    }
                    Op::Churn => Vec::new(),
                };
                std::thread::spawn(move || {
                    // Churn keys: this thread's own range, never repeated.
                    let mut fresh = (t as u64 + 1) << 48;
                    let mut at = 0;
                    loop {
                        start.wait();
                        let n = iters.load(Ordering::Acquire);
                        if n == STOP {
                            return;
                        }
                        let mut found = 0u64;
                        for _ in 0..n {
                            match op {
                                Op::Read(_) => found += cache.read_batch(&seq[at..at + BATCH]),
                                Op::Mixed => {
                                    for (i, &k) in seq[at..at + BATCH].iter().enumerate() {
                                        if i % 10 == 0 {
                                            cache.insert(k, k);
                                        } else if cache.get(k).is_some() {
                                            found += 1;
                                        }
                                    }
                                }
                                Op::CacheAside => {
                                    for &k in &seq[at..at + BATCH] {
                                        if cache.get(k).is_some() {
                                            found += 1;
                                        } else {
                                            cache.insert(k, k);
                                        }
                                    }
                                }
                                Op::Churn => {
                                    for _ in 0..BATCH {
                                        fresh += 1;
                                        cache.insert(fresh, fresh);
                                    }
                                }
                            }
                            at = (at + BATCH) % seq.len().max(BATCH);
                        }
                        if let Op::CacheAside = op {
                            reads.fetch_add(n * BATCH as u64, Ordering::Relaxed);
                            hits.fetch_add(found, Ordering::Relaxed);
                        }
                        black_box(found);
                        done.wait();
                    }
                })
            })
            .collect();
        Workers {
            threads: handles,
            start,
            done,
            iters,
            reads,
            hits,
        }
    }

    /// Hits per read over every run so far (cache-aside).
    fn hit_ratio(&self) -> f64 {
        self.hits.load(Ordering::Relaxed) as f64 / self.reads.load(Ordering::Relaxed).max(1) as f64
    }

    /// Runs `iters` batches on every worker; the time until the last one finishes.
    fn run(&self, iters: u64) -> Duration {
        self.iters.store(iters, Ordering::Release);
        self.start.wait();
        let t = Instant::now();
        self.done.wait();
        t.elapsed()
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.iters.store(STOP, Ordering::Release);
        self.start.wait();
        for h in self.threads.drain(..) {
            h.join().expect("bench thread panicked");
        }
    }
}

fn bench_one<C: BenchCache>(g: &mut BenchmarkGroup<'_, WallTime>, op: Op, threads: &[usize]) {
    if matches!(op, Op::Mixed | Op::Churn | Op::CacheAside) && !C::BOUNDED {
        return;
    }
    // Read workloads leave room to spare (sharded caches such as quick_cache bound each shard,
    // so a cache sized exactly to the keys would already evict some); the others evict.
    let capacity = match op {
        Op::Read(_) => 2 * PRELOADED as usize,
        Op::Mixed | Op::Churn | Op::CacheAside => CAPACITY,
    };
    let cache = Arc::new(C::with_capacity(capacity));
    if let Op::Read(_) | Op::Mixed | Op::CacheAside = op {
        for k in 0..PRELOADED {
            cache.insert(k, k);
        }
    }
    cache.settle();
    if let Op::Read(d) = op {
        // Every read is a hit, and any per-entry policy state is warm.
        let seq = keys(d, PRELOADED, SEQUENCE, 1);
        for _ in 0..4 {
            assert_eq!(cache.read_batch(&seq), seq.len() as u64, "{}", C::NAME);
        }
    }
    for &t in threads {
        g.throughput(Throughput::Elements((BATCH * t) as u64));
        let workers = Workers::new(&cache, t, op);
        g.bench_with_input(BenchmarkId::new(C::NAME, t), &t, |b, _| {
            b.iter_custom(|iters| workers.run(iters))
        });
        if let Op::CacheAside = op {
            record_hit_ratio(C::NAME, t, workers.hit_ratio());
        }
    }
}

/// Appends a cache-aside hit ratio to `target/criterion/cache_aside/hit_ratio.tsv`,
/// replacing an earlier line of the same cache and thread count.
fn record_hit_ratio(cache: &str, threads: usize, ratio: f64) {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("target")
        })
        .join("criterion")
        .join("cache_aside");
    let path = dir.join("hit_ratio.tsv");
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    let prefix = format!("{cache}\t{threads}\t");
    let mut text: String = old
        .lines()
        .filter(|l| !l.starts_with(&prefix))
        .map(|l| format!("{l}\n"))
        .collect();
    text.push_str(&format!("{prefix}{ratio:.4}\n"));
    eprintln!(
        "cache_aside: {cache} at {threads} thread(s): hit ratio {:.1}%",
        ratio * 100.0
    );
    if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, text)) {
        eprintln!("cache_aside: could not write {}: {e}", path.display());
    }
}

fn bench_std_hashmap(g: &mut BenchmarkGroup<'_, WallTime>, d: Distribution) {
    let mut map: HashMap<u64, u64, Hasher> =
        HashMap::with_capacity_and_hasher(CAPACITY, Hasher::default());
    for k in 0..PRELOADED {
        map.insert(k, k);
    }
    let seq = keys(d, PRELOADED, SEQUENCE, 0x5EED);
    g.throughput(Throughput::Elements(BATCH as u64));
    g.bench_with_input(BenchmarkId::new("std HashMap", 1), &1, |b, _| {
        let mut at = 0;
        b.iter(|| {
            let found = seq[at..at + BATCH]
                .iter()
                .filter(|k| map.contains_key(*k))
                .count();
            at = (at + BATCH) % SEQUENCE;
            black_box(found)
        })
    });
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    let threads = thread_counts();
    let workloads = [
        ("read_uniform", Op::Read(Distribution::Uniform)),
        ("read_zipf1", Op::Read(Distribution::Zipf(1.0))),
        ("read_hot_key", Op::Read(Distribution::HotKey)),
        ("mixed_90_10", Op::Mixed),
        ("insert_churn", Op::Churn),
        ("cache_aside", Op::CacheAside),
    ];
    for (name, op) in workloads {
        let mut g = c.benchmark_group(name);
        bench_one::<Herdcache>(&mut g, op, &threads);
        bench_one::<Papaya>(&mut g, op, &threads);
        if let Op::Read(_) = op {
            // One pin per batch of reads; their writes are the unpinned ones above.
            bench_one::<HerdcachePinned>(&mut g, op, &threads);
            bench_one::<PapayaPinned>(&mut g, op, &threads);
        }
        bench_one::<QuickCache>(&mut g, op, &threads);
        bench_one::<Moka>(&mut g, op, &threads);
        bench_one::<MutexLru>(&mut g, op, &threads);
        bench_one::<RwLockMap>(&mut g, op, &threads);
        bench_one::<DashMap>(&mut g, op, &threads);
        if let Op::Read(d) = op {
            bench_std_hashmap(&mut g, d);
        }
        g.finish();
    }
    c.final_summary();
}
