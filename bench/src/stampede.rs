//! The stampede benchmark: N reader threads read one hot key at a fixed total rate while the
//! key expires again and again; the source behind the cache takes L per load. Each
//! configuration is a way of filling the cache on a miss: a plain get-then-insert, moka's
//! `get_with`, quick_cache's `get_or_insert_with` (with the expiry kept beside the value,
//! since quick_cache has no TTL), and herdcache's single flight alone or with early refresh.
//!
//! Reported per configuration: source loads per expiry, the most source loads at once, reads
//! that blocked (took at least half a load), read latency percentiles from an HDR histogram,
//! and the time of every source load (for the plot of loads over time).

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::caches::Hasher;

/// The workload.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Settings {
    /// Reader threads.
    pub readers: usize,
    /// Time one source load takes.
    pub load: Duration,
    /// Time to live of the hot key.
    pub ttl: Duration,
    /// How long each configuration runs.
    pub run: Duration,
    /// Reads per second, all readers together.
    pub rate: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            readers: 8,
            load: Duration::from_millis(20),
            ttl: Duration::from_millis(250),
            run: Duration::from_secs(3),
            rate: 20_000,
        }
    }
}

/// A way of filling the cache on a miss.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Config {
    /// herdcache `get`, and on a miss load and `insert`: no coalescing.
    Naive,
    /// moka `sync::Cache::get_with` with a TTL.
    MokaGetWith,
    /// quick_cache `get_or_insert_with`, expiry checked by the reader.
    QuickCacheGetOrInsertWith,
    /// herdcache `get_or_load`.
    SingleFlight,
    /// herdcache `get_or_load` with XFetch at this beta.
    XFetch(f64),
    /// herdcache `get_or_load` with a soft TTL at 80% of the TTL, refreshed inline.
    SoftTtl,
    /// As `SoftTtl`, with refreshes handed to a spawner thread (`get_or_load_background`).
    SoftTtlSpawned,
}

impl Config {
    /// Every configuration, in report order.
    pub const ALL: [Config; 8] = [
        Config::Naive,
        Config::MokaGetWith,
        Config::QuickCacheGetOrInsertWith,
        Config::SingleFlight,
        Config::XFetch(1.0),
        Config::XFetch(2.0),
        Config::SoftTtl,
        Config::SoftTtlSpawned,
    ];

    /// Row name.
    pub fn name(self) -> String {
        match self {
            Config::Naive => "herdcache get, then insert".into(),
            Config::MokaGetWith => "moka get_with".into(),
            Config::QuickCacheGetOrInsertWith => "quick_cache get_or_insert_with".into(),
            Config::SingleFlight => "herdcache single flight".into(),
            Config::XFetch(b) => format!("  + XFetch (beta {b})"),
            Config::SoftTtl => "  + soft TTL (80%)".into(),
            Config::SoftTtlSpawned => "  + soft TTL, spawner".into(),
        }
    }
}

/// The slow source: counts loads, the most in flight at once, and when each started.
struct Source {
    latency: Duration,
    origin: Instant,
    loads: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    started: Mutex<Vec<Duration>>,
}

impl Source {
    fn load(&self) -> u64 {
        // SeqCst on these statistics is fine: loads are rare and slow.
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.origin.elapsed());
        std::thread::sleep(self.latency);
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.loads.fetch_add(1, Ordering::SeqCst)
    }
}

/// What one configuration did.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Row name.
    pub name: String,
    /// Source loads during the run.
    pub loads: u64,
    /// Expiries during the run: run time / (TTL + load time).
    pub expiries: f64,
    /// `loads / expiries`.
    pub loads_per_expiry: f64,
    /// Source loads per TTL period of the run: 1 is one load per lifetime of the value; an
    /// early refresh that storms shows here.
    pub loads_per_ttl: f64,
    /// Most source loads at once.
    pub max_concurrent_loads: u64,
    /// Reads made.
    pub reads: u64,
    /// Reads that took at least half a load time.
    pub blocked: u64,
    /// Read latency percentiles and maximum, in nanoseconds.
    pub p50_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p999_ns: u64,
    /// Slowest read.
    pub max_ns: u64,
    /// When each source load started, in milliseconds from the start of the run.
    pub load_start_ms: Vec<f64>,
}

/// Something the readers read the hot key through.
trait Reader: Send + Sync {
    fn read(&self, source: &Source) -> u64;
}

struct NaiveReader(herdcache::Cache<u64, u64, Hasher>);
impl Reader for NaiveReader {
    fn read(&self, source: &Source) -> u64 {
        match self.0.get(&0) {
            Some(v) => v,
            None => {
                let v = source.load();
                self.0.insert(0, v);
                v
            }
        }
    }
}

struct SingleFlightReader(herdcache::Cache<u64, u64, Hasher>);
impl Reader for SingleFlightReader {
    fn read(&self, source: &Source) -> u64 {
        self.0
            .get_or_load(&0, |_| Ok::<_, ()>(source.load()))
            .expect("the source does not fail")
    }
}

struct BackgroundReader(herdcache::Cache<u64, u64, Hasher>, Arc<Source>);
impl Reader for BackgroundReader {
    fn read(&self, _: &Source) -> u64 {
        let source = Arc::clone(&self.1);
        self.0
            .get_or_load_background(&0, move |_| Ok::<_, ()>(source.load()))
            .expect("the source does not fail")
    }
}

struct MokaReader(moka::sync::Cache<u64, u64, Hasher>);
impl Reader for MokaReader {
    fn read(&self, source: &Source) -> u64 {
        self.0.get_with(0, || source.load())
    }
}

/// quick_cache has no expiry: the value carries its own, and a reader that sees it passed
/// removes it (only if it is still the expired one) before `get_or_insert_with`.
struct QuickCacheReader(QuickCacheWithExpiry, Duration);

/// quick_cache holding each value with its expiry.
type QuickCacheWithExpiry = quick_cache::sync::Cache<
    u64,
    (u64, Instant),
    quick_cache::UnitWeighter,
    Hasher,
    quick_cache::sync::DefaultLifecycle<u64, (u64, Instant)>,
>;
impl Reader for QuickCacheReader {
    fn read(&self, source: &Source) -> u64 {
        let now = Instant::now();
        if let Some((v, expires)) = self.0.get(&0) {
            if now < expires {
                return v;
            }
            self.0.remove_if(&0, |(_, e)| *e <= now);
        }
        let ttl = self.1;
        self.0
            .get_or_insert_with(&0, || {
                let v = source.load();
                Ok::<_, ()>((v, Instant::now() + ttl))
            })
            .expect("the source does not fail")
            .0
    }
}

fn herdcache_for(config: Config, s: &Settings) -> herdcache::Cache<u64, u64, Hasher> {
    let mut b = herdcache::Cache::builder()
        .max_capacity(1_000)
        .time_to_live(s.ttl)
        .hasher(Hasher::default());
    match config {
        Config::XFetch(beta) => b = b.xfetch(beta),
        Config::SoftTtl => b = b.refresh_after(s.ttl.mul_f64(0.8)),
        Config::SoftTtlSpawned => {
            b = b
                .refresh_after(s.ttl.mul_f64(0.8))
                .spawner(herdcache::ThreadSpawner)
        }
        _ => {}
    }
    b.build().expect("valid settings")
}

fn reader_for(config: Config, s: &Settings, source: &Arc<Source>) -> Arc<dyn Reader> {
    match config {
        Config::Naive => Arc::new(NaiveReader(herdcache_for(config, s))),
        Config::SingleFlight | Config::XFetch(_) | Config::SoftTtl => {
            Arc::new(SingleFlightReader(herdcache_for(config, s)))
        }
        Config::SoftTtlSpawned => Arc::new(BackgroundReader(
            herdcache_for(config, s),
            Arc::clone(source),
        )),
        Config::MokaGetWith => Arc::new(MokaReader(
            moka::sync::Cache::builder()
                .max_capacity(1_000)
                .time_to_live(s.ttl)
                .build_with_hasher(Hasher::default()),
        )),
        Config::QuickCacheGetOrInsertWith => Arc::new(QuickCacheReader(
            quick_cache::sync::Cache::with(
                1_000,
                1_000,
                quick_cache::UnitWeighter,
                Hasher::default(),
                Default::default(),
            ),
            s.ttl,
        )),
    }
}

/// Runs one configuration.
pub fn run(config: Config, s: &Settings) -> Report {
    let source = Arc::new(Source {
        latency: s.load,
        origin: Instant::now(),
        loads: AtomicU64::new(0),
        in_flight: AtomicU64::new(0),
        max_in_flight: AtomicU64::new(0),
        started: Mutex::new(Vec::new()),
    });
    let reader = reader_for(config, s, &source);
    // Warm the key so that every configuration starts from a hit, then reset the counts.
    reader.read(&source);
    source.loads.store(0, Ordering::SeqCst);
    source.max_in_flight.store(0, Ordering::SeqCst);
    source
        .started
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clear();

    let stop = Arc::new(AtomicBool::new(false));
    let period = Duration::from_secs_f64(s.readers as f64 / s.rate.max(1) as f64);
    let blocked_at = s.load / 2;
    let start = Instant::now();
    let offset = start - source.origin;
    let threads: Vec<_> = (0..s.readers)
        .map(|r| {
            let (reader, source, stop) = (reader.clone(), source.clone(), stop.clone());
            let phase = period.mul_f64(r as f64 / s.readers as f64);
            std::thread::spawn(move || {
                let mut hist = Histogram::<u64>::new(3).expect("3 significant figures");
                let mut blocked = 0u64;
                let mut next = Instant::now() + phase;
                while !stop.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    if now < next {
                        std::thread::sleep(next - now);
                    }
                    next += period;
                    let t = Instant::now();
                    black_box(reader.read(&source));
                    let took = t.elapsed();
                    if took >= blocked_at {
                        blocked += 1;
                    }
                    hist.record(took.as_nanos().max(1) as u64)
                        .expect("auto-resizing histogram");
                }
                (hist, blocked)
            })
        })
        .collect();
    std::thread::sleep(s.run);
    stop.store(true, Ordering::Relaxed);
    let mut hist = Histogram::<u64>::new(3).expect("3 significant figures");
    let mut blocked = 0;
    for t in threads {
        let (h, b) = t.join().expect("reader panicked");
        hist.add(h).expect("same settings");
        blocked += b;
    }
    let elapsed = start.elapsed();
    let loads = source.loads.load(Ordering::SeqCst);
    let expiries = elapsed.as_secs_f64() / (s.ttl + s.load).as_secs_f64();
    let load_start_ms = source
        .started
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|d| d.saturating_sub(offset).as_secs_f64() * 1e3)
        .collect();
    Report {
        name: config.name(),
        loads,
        expiries,
        loads_per_expiry: loads as f64 / expiries,
        loads_per_ttl: loads as f64 / (elapsed.as_secs_f64() / s.ttl.as_secs_f64()),
        max_concurrent_loads: source.max_in_flight.load(Ordering::SeqCst),
        reads: hist.len(),
        blocked,
        p50_ns: hist.value_at_quantile(0.5),
        p99_ns: hist.value_at_quantile(0.99),
        p999_ns: hist.value_at_quantile(0.999),
        max_ns: hist.max(),
        load_start_ms,
    }
}

fn fmt_ns(ns: u64) -> String {
    format!("{:.1?}", Duration::from_nanos(ns))
}

/// The reports as a text table.
pub fn table(reports: &[Report]) -> String {
    let mut out = format!(
        "{:<32} {:>6} {:>10} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9}\n",
        "configuration",
        "loads",
        "per expiry",
        "per TTL",
        "max conc",
        "blocked",
        "p50",
        "p99",
        "p99.9",
        "max"
    );
    for r in reports {
        out += &format!(
            "{:<32} {:>6} {:>10.2} {:>8.2} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9}\n",
            r.name,
            r.loads,
            r.loads_per_expiry,
            r.loads_per_ttl,
            r.max_concurrent_loads,
            r.blocked,
            fmt_ns(r.p50_ns),
            fmt_ns(r.p99_ns),
            fmt_ns(r.p999_ns),
            fmt_ns(r.max_ns)
        );
    }
    out
}
