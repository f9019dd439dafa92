//! A hot key expiring under concurrent load, read by tokio tasks: with and without
//! protection, and with and without a task spawner, under callers that give up early.
//!
//! N reader tasks read one hot key at a fixed total rate; the source behind the cache takes
//! L ms per load (an async sleep), and the key's TTL makes it expire again and again. Each
//! configuration prints the source loads per expiry, the loads cancelled half-way, the reads
//! that got no value, and read latency percentiles.
//!
//! The last four rows show what cancellation does. Their readers wrap each read in
//! `tokio::time::timeout` at a fraction of the load time, as services wrap calls in a budget.
//! A load led inline by such a reader dies with it and has to start over; a load on the
//! spawner outlives it, is cached, and serves the readers that come next.
//!
//! Run: `cargo run --release -p herdcache-demo --example async_stampede --features tokio --
//! [--readers N] [--load-ms L] [--ttl-ms T] [--seconds S] [--rate R]`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use herdcache::{Cache, LoadError};

#[derive(Debug, Clone, Copy)]
struct Args {
    readers: usize,
    load: Duration,
    ttl: Duration,
    run: Duration,
    rate: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        readers: 64,
        load: Duration::from_millis(20),
        ttl: Duration::from_millis(250),
        run: Duration::from_secs(2),
        rate: 20_000,
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
            "--help" | "-h" => return Err(String::new()),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

/// The slow source: counts loads started and finished.
#[derive(Default)]
struct Source {
    started: AtomicU64,
    finished: AtomicU64,
}

impl Source {
    async fn load(&self, latency: Duration) -> u64 {
        let n = self.started.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(latency).await;
        self.finished.fetch_add(1, Ordering::SeqCst);
        n
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// `get`, then load and `insert` on a miss.
    Naive,
    /// `get_or_load_async`: the load runs in the reader that wins it.
    Inline,
    /// `get_or_load_spawned` with a soft TTL: loads and refreshes run on the spawner.
    SpawnedSoftTtl,
    /// Each read wrapped in a timeout of a quarter of the load time.
    NaiveTimeout,
    InlineTimeout,
    SpawnedTimeout,
    /// `get_or_load_spawned_until` with that deadline: the expired value instead of nothing.
    SpawnedUntil,
}

impl Mode {
    const ALL: [Mode; 7] = [
        Mode::Naive,
        Mode::Inline,
        Mode::SpawnedSoftTtl,
        Mode::NaiveTimeout,
        Mode::InlineTimeout,
        Mode::SpawnedTimeout,
        Mode::SpawnedUntil,
    ];

    fn name(self) -> &'static str {
        match self {
            Mode::Naive => "no coalescing (get, then insert)",
            Mode::Inline => "get_or_load_async (inline)",
            Mode::SpawnedSoftTtl => "get_or_load_spawned + soft TTL",
            Mode::NaiveTimeout => "no coalescing, reads time out",
            Mode::InlineTimeout => "inline, reads time out",
            Mode::SpawnedTimeout => "spawned, reads time out",
            Mode::SpawnedUntil => "spawned, deadline serves stale",
        }
    }

    fn budget(self, load: Duration) -> Option<Duration> {
        match self {
            Mode::Naive | Mode::Inline | Mode::SpawnedSoftTtl => None,
            _ => Some(load / 4),
        }
    }
}

struct Report {
    loads: u64,
    cancelled: u64,
    reads: usize,
    failed: usize,
    p50: Duration,
    p99: Duration,
    max: Duration,
    expiries: f64,
}

async fn read(mode: Mode, cache: &Cache<u64, u64>, source: &Arc<Source>, a: Args) -> Option<u64> {
    let load = a.load;
    let loader = {
        let source = Arc::clone(source);
        move |_: &u64| async move { Ok::<_, ()>(source.load(load).await) }
    };
    let budget = mode.budget(load).unwrap_or(Duration::MAX);
    let naive = async {
        match cache.get(&0) {
            Some(v) => v,
            None => {
                let v = source.load(load).await;
                cache.insert(0, v);
                v
            }
        }
    };
    let answer: Result<u64, LoadError<()>> = match mode {
        Mode::Naive => Ok(naive.await),
        Mode::NaiveTimeout => tokio::time::timeout(budget, naive)
            .await
            .map_err(|_| LoadError::Timeout),
        Mode::Inline => cache.get_or_load_async(&0, loader).await,
        Mode::InlineTimeout => tokio::time::timeout(budget, cache.get_or_load_async(&0, loader))
            .await
            .unwrap_or(Err(LoadError::Timeout)),
        Mode::SpawnedSoftTtl => cache.get_or_load_spawned(&0, loader).await,
        Mode::SpawnedTimeout => tokio::time::timeout(budget, cache.get_or_load_spawned(&0, loader))
            .await
            .unwrap_or(Err(LoadError::Timeout)),
        Mode::SpawnedUntil => {
            cache
                .get_or_load_spawned_until(&0, tokio::time::sleep(budget), loader)
                .await
        }
    };
    answer.ok()
}

async fn run(mode: Mode, a: Args) -> Report {
    let mut b = Cache::builder()
        .max_capacity(1_000)
        .time_to_live(a.ttl)
        .spawner(herdcache::TokioSpawner::new(
            tokio::runtime::Handle::current(),
        ));
    if mode == Mode::SpawnedSoftTtl {
        b = b.refresh_after(a.ttl.mul_f64(0.8));
    }
    let cache: Cache<u64, u64> = b.build().expect("valid settings");
    let source = Arc::new(Source::default());
    cache.insert(0, source.load(a.load).await);
    source.started.store(0, Ordering::SeqCst);
    source.finished.store(0, Ordering::SeqCst);
    let period = Duration::from_secs_f64(a.readers as f64 / a.rate as f64);
    let start = Instant::now();
    let end = tokio::time::Instant::now() + a.run;
    let readers: Vec<_> = (0..a.readers)
        .map(|r| {
            let (cache, source) = (cache.clone(), Arc::clone(&source));
            tokio::spawn(async move {
                // Stagger the readers across one period.
                let first =
                    tokio::time::Instant::now() + period.mul_f64(r as f64 / a.readers as f64);
                let mut tick = tokio::time::interval_at(first, period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let (mut latencies, mut failed) = (Vec::new(), 0);
                while tick.tick().await < end {
                    let t = Instant::now();
                    if read(mode, &cache, &source, a).await.is_none() {
                        failed += 1;
                    }
                    latencies.push(t.elapsed());
                }
                (latencies, failed)
            })
        })
        .collect();
    let (mut all, mut failed) = (Vec::new(), 0);
    for r in readers {
        let (l, f) = r.await.expect("reader panicked");
        all.extend(l);
        failed += f;
    }
    let elapsed = start.elapsed();
    all.sort_unstable();
    let pct = |p: f64| all[((all.len() - 1) as f64 * p) as usize];
    let started = source.started.load(Ordering::SeqCst);
    // A load still running at the end is neither finished nor cancelled.
    tokio::time::sleep(a.load).await;
    Report {
        loads: started,
        cancelled: started - source.finished.load(Ordering::SeqCst),
        reads: all.len(),
        failed,
        p50: pct(0.5),
        p99: pct(0.99),
        max: *all.last().unwrap_or(&Duration::ZERO),
        expiries: elapsed.as_secs_f64() / (a.ttl + a.load).as_secs_f64(),
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
                "usage: async_stampede [--readers N] [--load-ms L] [--ttl-ms T] [--seconds S] \
                 [--rate R]"
            );
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_time()
        .build()
        .expect("a tokio runtime");
    println!(
        "{} reader tasks, {} reads/s in total, source load {:?}, TTL {:?}, {:?} per \
         configuration; timed-out reads give up after {:?}\n",
        a.readers,
        a.rate,
        a.load,
        a.ttl,
        a.run,
        a.load / 4
    );
    println!(
        "{:<34} {:>6} {:>10} {:>9} {:>8} {:>9} {:>9} {:>9}",
        "configuration", "loads", "per expiry", "cancelled", "no value", "p50", "p99", "max"
    );
    for mode in Mode::ALL {
        let r = runtime.block_on(run(mode, a));
        println!(
            "{:<34} {:>6} {:>10.2} {:>9} {:>7.2}% {:>9.1?} {:>9.1?} {:>9.1?}",
            mode.name(),
            r.loads,
            r.loads as f64 / r.expiries,
            r.cancelled,
            100.0 * r.failed as f64 / r.reads.max(1) as f64,
            r.p50,
            r.p99,
            r.max
        );
    }
    println!(
        "\nloads per expiry: source loads / (run time / (TTL + load time)); cancelled: loads \
         dropped before they finished; no value: reads that returned no value (timed out)."
    );
}
