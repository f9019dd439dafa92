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
//! - `cache_aside_source_1us`, `_10us`, `_100us`: cache-aside as a service does it, through
//!   each cache's loading call (herdcache's `get_with`, quick_cache's `get_or_insert_with`,
//!   moka's `get_with`; get, then insert, for the others), where a miss costs a load from a
//!   simulated source that spins for 1, 10 or 100 µs; Zipf(1.0) over 1M keys at capacity
//!   100k. The reads and the source's loads of every measured run are written to
//!   `target/criterion/cache_aside_source/loads.tsv` (cache, source µs, threads, reads,
//!   loads) for `bench-report`: there the hit ratio and single flight pay.
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
/// Reads that bring a cache-aside-with-a-source cache to its steady state before it is
/// measured (a few times the distinct keys a capacity's worth of Zipf(1.0) reads touch).
const WARM_READS: usize = 1 << 22;

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
    /// Cache-aside through the loading call, a miss costing the source this many µs.
    Source(u64),
}

/// How long the simulated source spends on one load, in nanoseconds.
static SOURCE_NANOS: AtomicU64 = AtomicU64::new(0);
/// Loads the simulated source served.
static SOURCE_LOADS: AtomicU64 = AtomicU64::new(0);

/// A load from the simulated source: it keeps the core busy for `SOURCE_NANOS` (a remote
/// call's latency, which a spin stands for without the scheduler's noise), and is counted.
fn source_load(key: u64) -> u64 {
    SOURCE_LOADS.fetch_add(1, Ordering::Relaxed);
    let spin = Duration::from_nanos(SOURCE_NANOS.load(Ordering::Relaxed));
    let start = Instant::now();
    while start.elapsed() < spin {
        std::hint::spin_loop();
    }
    key
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
                    Op::CacheAside | Op::Source(_) => {
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
                                Op::Source(_) => {
                                    for &k in &seq[at..at + BATCH] {
                                        found =
                                            found.wrapping_add(cache.get_or_load(k, source_load));
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
                        match op {
                            Op::CacheAside => {
                                reads.fetch_add(n * BATCH as u64, Ordering::Relaxed);
                                hits.fetch_add(found, Ordering::Relaxed);
                            }
                            Op::Source(_) => {
                                reads.fetch_add(n * BATCH as u64, Ordering::Relaxed);
                            }
                            _ => {}
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
    if !matches!(op, Op::Read(_)) && !C::BOUNDED {
        return;
    }
    // Read workloads leave room to spare (sharded caches such as quick_cache bound each shard,
    // so a cache sized exactly to the keys would already evict some); the others evict.
    let capacity = match op {
        Op::Read(_) => 2 * PRELOADED as usize,
        Op::Mixed | Op::Churn | Op::CacheAside | Op::Source(_) => CAPACITY,
    };
    let cache = Arc::new(C::with_capacity(capacity));
    if let Op::Read(_) | Op::Mixed | Op::CacheAside | Op::Source(_) = op {
        for k in 0..PRELOADED {
            cache.insert(k, k);
        }
    }
    if let Op::Source(_) = op {
        // To its steady state first, through the loading call, with a source that costs
        // nothing: the measured runs are then a service's, not a cold start's.
        SOURCE_NANOS.store(0, Ordering::Relaxed);
        for k in keys(Distribution::Zipf(1.0), MIXED_KEYS, WARM_READS, 0xC01D) {
            cache.get_or_load(k, source_load);
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
        if let Op::Source(micros) = op {
            SOURCE_NANOS.store(micros * 1_000, Ordering::Relaxed);
        }
        let loads_before = SOURCE_LOADS.load(Ordering::Relaxed);
        g.bench_with_input(BenchmarkId::new(C::NAME, t), &t, |b, _| {
            b.iter_custom(|iters| workers.run(iters))
        });
        match op {
            Op::CacheAside => record_hit_ratio(C::NAME, t, workers.hit_ratio()),
            Op::Source(micros) => record_source_loads(
                C::NAME,
                micros,
                t,
                workers.reads.load(Ordering::Relaxed),
                SOURCE_LOADS.load(Ordering::Relaxed) - loads_before,
            ),
            _ => {}
        }
    }
}

/// The directory of a criterion group's results, where the extra figures go beside them.
fn group_dir(group: &str) -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("target")
        })
        .join("criterion")
        .join(group)
}

/// Writes `line` (its first `key_fields` tab-separated fields name it) to `file` in `dir`,
/// replacing an earlier line with the same name.
fn record_line(dir: &std::path::Path, file: &str, line: &str, key_fields: usize) {
    let path = dir.join(file);
    let key: Vec<&str> = line.split('\t').take(key_fields).collect();
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    let mut text: String = old
        .lines()
        .filter(|l| l.split('\t').take(key_fields).collect::<Vec<_>>() != key)
        .map(|l| format!("{l}\n"))
        .collect();
    text.push_str(line);
    text.push('\n');
    if let Err(e) = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, text)) {
        eprintln!("could not write {}: {e}", path.display());
    }
}

/// Records a cache-aside-with-source run's reads and source loads in
/// `target/criterion/cache_aside_source/loads.tsv`.
fn record_source_loads(cache: &str, micros: u64, threads: usize, reads: u64, loads: u64) {
    eprintln!(
        "cache_aside_source_{micros}us: {cache} at {threads} thread(s): {loads} source loads for {reads} reads ({:.2}% hit)",
        100.0 * (1.0 - loads as f64 / reads.max(1) as f64)
    );
    let line = format!("{cache}\t{micros}\t{threads}\t{reads}\t{loads}");
    record_line(&group_dir("cache_aside_source"), "loads.tsv", &line, 3);
}

/// Records a cache-aside hit ratio in `target/criterion/cache_aside/hit_ratio.tsv`.
fn record_hit_ratio(cache: &str, threads: usize, ratio: f64) {
    eprintln!(
        "cache_aside: {cache} at {threads} thread(s): hit ratio {:.1}%",
        ratio * 100.0
    );
    let line = format!("{cache}\t{threads}\t{ratio:.4}");
    record_line(&group_dir("cache_aside"), "hit_ratio.tsv", &line, 2);
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
        ("cache_aside_source_1us", Op::Source(1)),
        ("cache_aside_source_10us", Op::Source(10)),
        ("cache_aside_source_100us", Op::Source(100)),
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
