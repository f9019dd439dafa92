//! The fleet coherence benchmark: a writer changes the source and invalidates one key at a
//! steady rate through its own instance, while K reader instances (this binary re-executed)
//! read the key through a shared Redis tier. Every read's time and version are recorded;
//! afterwards each read is judged against the writes that had completed by then.
//!
//! - A read is *stale beyond the bound* if a newer write had completed more than the tier's
//!   coherence bound before it (the promise: none).
//! - *Propagation*: for each write and instance, the time from the writer's `invalidate`
//!   returning to that instance's first read of the new version (read spacing included).
//! - *Loads per invalidation*: source loads across the fleet divided by writes (single flight
//!   across the fleet: about 1).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use herdcache::fleet::{RedisTier, Utf8};
use herdcache::Cache;
use serde::Serialize;

const CHILD: &str = "HERDCACHE_COHERENCE_BENCH_CHILD";
const PREFIX: &str = "coherence-bench:";

/// The coherence benchmark's settings.
#[derive(Debug, Clone, Copy)]
pub struct CoherenceSettings {
    /// Reader instance processes (the writer is one more).
    pub instances: usize,
    /// Reads per second per instance (one reader thread each).
    pub rate: u64,
    /// Writes (source change, then `invalidate`) per second.
    pub writes: u64,
    /// The tier's coherence bound.
    pub bound: Duration,
    /// Time one source load takes.
    pub load: Duration,
    /// Length of the run.
    pub run: Duration,
}

impl Default for CoherenceSettings {
    fn default() -> Self {
        CoherenceSettings {
            instances: 4,
            rate: 2_000,
            writes: 20,
            bound: Duration::from_millis(100),
            load: Duration::from_millis(2),
            run: Duration::from_secs(3),
        }
    }
}

/// One measured configuration.
#[derive(Debug, Clone, Serialize)]
pub struct CoherenceReport {
    /// Reader instances.
    pub instances: usize,
    /// Writes made.
    pub writes: usize,
    /// Reads made across the readers.
    pub reads: usize,
    /// Reads older than a write completed more than the bound before them.
    pub stale_beyond_bound: usize,
    /// Reads older than a write completed before them, within the bound.
    pub stale_within_bound: usize,
    /// The coherence bound, microseconds.
    pub bound_us: u64,
    /// Propagation, write to each instance's first read of it: percentiles, microseconds.
    pub propagation_p50_us: u64,
    /// 99th percentile.
    pub propagation_p99_us: u64,
    /// Slowest.
    pub propagation_max_us: u64,
    /// Source loads across the fleet (readers and writer).
    pub loads: usize,
    /// Loads per write.
    pub loads_per_write: f64,
}

fn micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn instance(url: &str, bound: Duration) -> Cache<u64, String> {
    let tier = RedisTier::builder(url)
        .key_prefix(PREFIX)
        .lease(Duration::from_secs(5))
        .wait_bound(Duration::from_secs(2))
        .coherence_bound(bound)
        .build(|k: &u64| k.to_string(), Utf8)
        .expect("valid tier settings");
    Cache::builder()
        .max_capacity(100)
        .time_to_live(Duration::from_secs(600))
        .shared_tier(tier)
        .build()
        .expect("valid cache settings")
}

/// The shared source: its version in a file (replaced atomically), each load appended to
/// another.
struct Source {
    version: PathBuf,
    loads: PathBuf,
    load: Duration,
}

impl Source {
    fn read(&self) -> u64 {
        std::fs::read_to_string(&self.version)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    fn set(&self, v: u64) {
        let tmp = self.version.with_extension("tmp");
        if std::fs::write(&tmp, v.to_string()).is_ok() {
            let _ = std::fs::rename(&tmp, &self.version);
        }
    }

    fn loader(&self) -> impl Fn(&u64) -> Result<String, ()> + '_ {
        move |_| {
            let v = self.read();
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.loads)
            {
                let _ = writeln!(f, "{v}");
            }
            std::thread::sleep(self.load);
            Ok(v.to_string())
        }
    }

    fn loads(&self) -> usize {
        std::fs::read_to_string(&self.loads).map_or(0, |s| s.lines().count())
    }
}

/// Runs this process as a reader instance if it was started as one (then exits).
pub fn child_main_if_requested() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let f: Vec<&str> = spec.split(' ').collect();
    let [url, version, loads, out, rate, bound_us, load_us, run_ms] = f[..] else {
        eprintln!("bad {CHILD}: {spec}");
        std::process::exit(2);
    };
    let num = |s: &str| s.parse::<u64>().unwrap_or(0);
    let source = Source {
        version: version.into(),
        loads: loads.into(),
        load: Duration::from_micros(num(load_us)),
    };
    let cache = instance(url, Duration::from_micros(num(bound_us)));
    let period = Duration::from_secs_f64(1.0 / num(rate).max(1) as f64);
    let end = Instant::now() + Duration::from_millis(num(run_ms));
    let loader = source.loader();
    let mut reads: Vec<u8> = Vec::new();
    let mut next = Instant::now();
    while next < end {
        let now = Instant::now();
        if now < next {
            std::thread::sleep(next - now);
        }
        next += period;
        let v: u64 = match cache.get_or_load(&0, &loader) {
            Ok(s) => s.parse().unwrap_or(0),
            Err(_) => continue,
        };
        reads.extend_from_slice(&micros().to_le_bytes());
        reads.extend_from_slice(&v.to_le_bytes());
    }
    if let Err(e) = std::fs::write(out, reads) {
        eprintln!("writing reads: {e}");
        std::process::exit(1);
    }
    std::process::exit(0);
}

/// Runs the writer here and `s.instances` readers as processes, on the Redis at `url`.
pub fn run(s: &CoherenceSettings, url: &str) -> Result<CoherenceReport, String> {
    let dir =
        std::env::temp_dir().join(format!("herdcache-coherence-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let source = Source {
        version: dir.join("version"),
        loads: dir.join("loads"),
        load: s.load,
    };
    source.set(0);
    // A fresh start: the key's stale value from an earlier run is invalidated first.
    let writer = instance(url, s.bound);
    writer.invalidate(&0);
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let children: Vec<(Child, PathBuf)> = (0..s.instances)
        .map(|id| {
            let out = dir.join(format!("reads-{id}"));
            let spec = format!(
                "{url} {} {} {} {} {} {} {}",
                source.version.display(),
                source.loads.display(),
                out.display(),
                s.rate,
                s.bound.as_micros(),
                s.load.as_micros(),
                s.run.as_millis()
            );
            let child = Command::new(&exe)
                .env(CHILD, spec)
                .stdout(Stdio::null())
                .spawn()
                .map_err(|e| e.to_string())?;
            Ok((child, out))
        })
        .collect::<Result<_, String>>()?;
    // Let the readers start and subscribe before the first write.
    std::thread::sleep(Duration::from_millis(300));
    let version = AtomicU64::new(0);
    let mut written: Vec<u64> = vec![0]; // completion time of write m at index m
    let period = Duration::from_secs_f64(1.0 / s.writes.max(1) as f64);
    let end = Instant::now() + s.run.saturating_sub(Duration::from_millis(600));
    let mut next = Instant::now() + period;
    while next < end {
        let now = Instant::now();
        if now < next {
            std::thread::sleep(next - now);
        }
        next += period;
        let v = version.fetch_add(1, Ordering::SeqCst) + 1;
        source.set(v);
        writer.invalidate(&0);
        written.push(micros());
    }
    let mut reads: Vec<Vec<(u64, u64)>> = Vec::new();
    for (mut child, out) in children {
        let status = child.wait().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("a reader failed: {status}"));
        }
        reads.push(read_pairs(&out)?);
    }
    let loads = source.loads();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(judge(s, &written, &reads, loads))
}

fn read_pairs(path: &Path) -> Result<Vec<(u64, u64)>, String> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| e.to_string())?;
    Ok(bytes
        .chunks_exact(16)
        .map(|c| {
            let n = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
            (n(&c[..8]), n(&c[8..]))
        })
        .collect())
}

/// Judges every read against the writes completed before it.
fn judge(
    s: &CoherenceSettings,
    written: &[u64],
    reads: &[Vec<(u64, u64)>],
    loads: usize,
) -> CoherenceReport {
    let bound = s.bound.as_micros() as u64;
    // The newest write completed at or before `t` (0: none).
    let newest_by = |t: u64| written.partition_point(|&w| w <= t).saturating_sub(1) as u64;
    let (mut beyond, mut within, mut total) = (0, 0, 0);
    let mut propagation: Vec<u64> = Vec::new();
    for inst in reads {
        total += inst.len();
        for &(t, v) in inst {
            if v < newest_by(t.saturating_sub(bound)) {
                beyond += 1;
            } else if v < newest_by(t) {
                within += 1;
            }
        }
        for (m, &w) in written.iter().enumerate().skip(1) {
            if let Some(&(t, _)) = inst.iter().find(|&&(t, v)| t >= w && v >= m as u64) {
                propagation.push(t - w);
            }
        }
    }
    propagation.sort_unstable();
    let pct = |p: f64| {
        propagation
            .get(((propagation.len().max(1) - 1) as f64 * p) as usize)
            .copied()
            .unwrap_or(0)
    };
    let writes = written.len() - 1;
    CoherenceReport {
        instances: s.instances,
        writes,
        reads: total,
        stale_beyond_bound: beyond,
        stale_within_bound: within,
        bound_us: bound,
        propagation_p50_us: pct(0.5),
        propagation_p99_us: pct(0.99),
        propagation_max_us: propagation.last().copied().unwrap_or(0),
        loads,
        loads_per_write: loads.saturating_sub(1) as f64 / writes.max(1) as f64,
    }
}

/// The reports as a Markdown table.
pub fn table(reports: &[CoherenceReport]) -> String {
    let us = |v: u64| format!("{:.1?}", Duration::from_micros(v));
    let mut t = String::from(
        "| reader instances | writes | reads | stale beyond the bound | stale within it | propagation p50 | p99 | max | source loads per write |\n\
         | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in reports {
        t.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.2} |\n",
            r.instances,
            r.writes,
            r.reads,
            r.stale_beyond_bound,
            r.stale_within_bound,
            us(r.propagation_p50_us),
            us(r.propagation_p99_us),
            us(r.propagation_max_us),
            r.loads_per_write
        ));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_judged_against_the_writes_completed_before_them() {
        let s = CoherenceSettings {
            instances: 1,
            bound: Duration::from_micros(100),
            ..CoherenceSettings::default()
        };
        // Write 1 completes at t=1000, write 2 at t=2000.
        let written = [0, 1_000, 2_000];
        let reads = vec![vec![
            (500, 0),   // fresh
            (1_050, 0), // stale within the bound
            (1_200, 0), // stale beyond it
            (1_300, 1), // propagation of write 1: 300
            (2_500, 2), // propagation of write 2: 500
        ]];
        let r = judge(&s, &written, &reads, 3);
        assert_eq!((r.stale_within_bound, r.stale_beyond_bound), (1, 1));
        assert_eq!((r.propagation_p50_us, r.propagation_max_us), (300, 500));
        assert_eq!(r.loads_per_write, 1.0);
    }
}
