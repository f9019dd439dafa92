//! A hot key expiring under concurrent load, with and without protection.
//!
//! N reader threads read one hot key at a fixed total rate; the source behind the cache takes
//! L ms per load, and the key's TTL makes it expire again and again. The configurations run
//! in turn: a plain cache read with get-then-insert (no coalescing), single flight,
//! single flight + XFetch (beta 1 and 2, or `--beta`), single flight + a soft TTL
//! (stale-while-revalidate), and the soft TTL again with refreshes handed to a spawner
//! thread, so that the refreshing reader does not wait either. For each it prints the source
//! loads, the loads per TTL period (1 is the ideal: one load per lifetime of the value), the
//! most loads in flight at once, how many reads blocked (took at least half a load time,
//! i.e. waited for a load), and read latency percentiles.
//!
//! Run: `cargo run --release -p herdcache-demo --example stampede -- [--readers N]
//! [--load-ms L] [--ttl-ms T] [--seconds S] [--rate R] [--beta B]`

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use herdcache::Cache;

#[derive(Debug, Clone, Copy)]
struct Args {
    readers: usize,
    load: Duration,
    ttl: Duration,
    run: Duration,
    rate: u64,
    /// XFetch's betas to run.
    betas: &'static [f64],
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        readers: 8,
        load: Duration::from_millis(20),
        ttl: Duration::from_millis(250),
        run: Duration::from_secs(3),
        rate: 20_000,
        betas: &[1.0, 2.0],
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| format!("{flag} needs a value"))
                .and_then(|v| v.parse::<f64>().map_err(|e| format!("{flag} {v}: {e}")))
        };
        match flag.as_str() {
            "--readers" => a.readers = value()?.max(1.0) as usize,
            "--load-ms" => a.load = Duration::from_secs_f64(value()?.max(0.0) / 1e3),
            "--ttl-ms" => a.ttl = Duration::from_secs_f64(value()?.max(1.0) / 1e3),
            "--seconds" => a.run = Duration::from_secs_f64(value()?.max(0.1)),
            "--rate" => a.rate = value()?.max(1.0) as u64,
            "--beta" => a.betas = Vec::leak(vec![value()?]),
            "--help" | "-h" => return Err(String::new()),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

/// The slow source: counts loads and the most in flight at once.
#[derive(Default)]
struct Source {
    loads: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
}

impl Source {
    fn load(&self, latency: Duration) -> u64 {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(latency);
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.loads.fetch_add(1, Ordering::SeqCst)
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Naive,
    SingleFlight,
    XFetch(f64),
    SoftTtl,
    SoftTtlSpawned,
}

impl Mode {
    fn name(self) -> String {
        match self {
            Mode::Naive => "no coalescing (get, then insert)".into(),
            Mode::SingleFlight => "single flight".into(),
            Mode::XFetch(beta) => format!("single flight + XFetch (beta {beta})"),
            Mode::SoftTtl => "single flight + soft TTL (80%)".into(),
            Mode::SoftTtlSpawned => "  ... refreshed on a spawner thread".into(),
        }
    }
}

struct Report {
    loads: u64,
    max_in_flight: u64,
    reads: usize,
    blocked: usize,
    p50: Duration,
    p99: Duration,
    max: Duration,
    /// TTL periods in the run.
    ttls: f64,
}

fn run(mode: Mode, a: Args) -> Report {
    let mut b = Cache::builder().max_capacity(1_000).time_to_live(a.ttl);
    match mode {
        Mode::XFetch(beta) => b = b.xfetch(beta),
        Mode::SoftTtl => b = b.refresh_after(a.ttl.mul_f64(0.8)),
        Mode::SoftTtlSpawned => {
            b = b
                .refresh_after(a.ttl.mul_f64(0.8))
                .spawner(herdcache::ThreadSpawner)
        }
        _ => {}
    }
    let cache: Cache<u64, u64> = b.build().expect("valid settings");
    let source = Arc::new(Source::default());
    // Warm the key so that every configuration starts from a hit.
    cache.insert(0, source.load(a.load));
    source.loads.store(0, Ordering::SeqCst);
    let stop = Arc::new(AtomicBool::new(false));
    let per_reader = Duration::from_secs_f64(a.readers as f64 / a.rate as f64);
    let start = Instant::now();
    let readers: Vec<_> = (0..a.readers)
        .map(|r| {
            let (cache, source, stop) = (cache.clone(), Arc::clone(&source), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut latencies = Vec::new();
                // Stagger the readers across one period.
                let mut next = Instant::now() + per_reader.mul_f64(r as f64 / a.readers as f64);
                while !stop.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    if now < next {
                        std::thread::sleep(next - now);
                    }
                    next += per_reader;
                    let t = Instant::now();
                    let v = match mode {
                        Mode::Naive => match cache.get(&0) {
                            Some(v) => v,
                            None => {
                                let v = source.load(a.load);
                                cache.insert(0, v);
                                v
                            }
                        },
                        Mode::SoftTtlSpawned => {
                            let source = Arc::clone(&source);
                            cache
                                .get_or_load_background(&0, move |_| {
                                    Ok::<_, ()>(source.load(a.load))
                                })
                                .expect("the source does not fail")
                        }
                        _ => cache
                            .get_or_load(&0, |_| Ok::<_, ()>(source.load(a.load)))
                            .expect("the source does not fail"),
                    };
                    black_box(v);
                    latencies.push(t.elapsed());
                }
                latencies
            })
        })
        .collect();
    std::thread::sleep(a.run);
    stop.store(true, Ordering::Relaxed);
    let mut all: Vec<Duration> = readers
        .into_iter()
        .flat_map(|h| h.join().expect("reader panicked"))
        .collect();
    let elapsed = start.elapsed();
    all.sort_unstable();
    let pct = |p: f64| all[((all.len() - 1) as f64 * p) as usize];
    Report {
        loads: source.loads.load(Ordering::SeqCst),
        max_in_flight: source.max_in_flight.load(Ordering::SeqCst),
        reads: all.len(),
        blocked: all.iter().filter(|d| **d >= a.load / 2).count(),
        p50: pct(0.5),
        p99: pct(0.99),
        max: *all.last().unwrap_or(&Duration::ZERO),
        ttls: elapsed.as_secs_f64() / a.ttl.as_secs_f64(),
    }
}

fn main() {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("error: {e}");
            }
            eprintln!(
                "usage: stampede [--readers N] [--load-ms L] [--ttl-ms T] [--seconds S] \
                 [--rate R] [--beta B]"
            );
            std::process::exit(2);
        }
    };
    println!(
        "{} readers, {} reads/s in total, source load {:?}, TTL {:?}, {:?} per configuration\n",
        a.readers, a.rate, a.load, a.ttl, a.run
    );
    println!(
        "{:<36} {:>6} {:>9} {:>8} {:>8} {:>9} {:>9} {:>9}",
        "configuration", "loads", "per TTL", "max conc", "blocked", "p50", "p99", "max"
    );
    let mut modes = vec![Mode::Naive, Mode::SingleFlight];
    modes.extend(a.betas.iter().map(|&b| Mode::XFetch(b)));
    modes.extend([Mode::SoftTtl, Mode::SoftTtlSpawned]);
    for mode in modes {
        let r = run(mode, a);
        println!(
            "{:<36} {:>6} {:>9.2} {:>8} {:>7.2}% {:>9.1?} {:>9.1?} {:>9.1?}",
            mode.name(),
            r.loads,
            r.loads as f64 / r.ttls,
            r.max_in_flight,
            100.0 * r.blocked as f64 / r.reads.max(1) as f64,
            r.p50,
            r.p99,
            r.max,
        );
    }
    println!(
        "\nper TTL: source loads per TTL period of the run (1 is one load per lifetime of the \
         value; more is a herd or refreshes storming). max conc: most loads in flight at once \
         (1 with single flight). blocked: share of reads that took at least half a load time, \
         i.e. waited for a load; early refresh keeps them near 0."
    );
}
