//! Bytes per resident entry: each cache filled with `u64 → u64` entries in a process of its
//! own, measured as the growth of the process's resident set over the fill, divided by the
//! entries the cache still holds afterwards (a sharded cache may already have evicted a few).
//!
//! The resident set counts what the allocator keeps for the process, freed or not: what a
//! service pays. Keys are `0..entries`, inserted in order, so no key list is resident.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::caches::{BenchCache, Hasher, Moka, MutexLru, Papaya, QuickCache};

/// The configurations measured, by name.
pub const CONFIGS: [&str; 11] = [
    "herdcache",
    "herdcache (capacity 10x the entries)",
    "herdcache (TTL)",
    "herdcache (TTL + early refresh)",
    "herdcache (time to idle)",
    "herdcache (after as many churn inserts)",
    "quick_cache",
    "moka",
    "Mutex<LruCache>",
    "papaya",
    "std HashMap",
];

/// One measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct Footprint {
    /// The configuration's name (one of [`CONFIGS`]).
    pub name: String,
    /// Entries held after the fill.
    pub resident: u64,
    /// Growth of the resident set over construction and fill, in bytes.
    pub bytes: u64,
}

impl Footprint {
    /// Bytes per entry held.
    pub fn per_entry(&self) -> f64 {
        self.bytes as f64 / self.resident.max(1) as f64
    }

    /// The line a child process prints and the parent parses.
    pub fn to_line(&self) -> String {
        format!("{}\t{}\t{}", self.name, self.resident, self.bytes)
    }

    /// Parses [`Footprint::to_line`]'s output.
    pub fn from_line(line: &str) -> Option<Footprint> {
        let mut it = line.trim_end().split('\t');
        let name = it.next()?.to_owned();
        let resident = it.next()?.parse().ok()?;
        let bytes = it.next()?.parse().ok()?;
        Some(Footprint {
            name,
            resident,
            bytes,
        })
    }
}

/// The process's resident set in bytes (Linux), or `None` elsewhere.
pub fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Builds, fills and measures `entries` entries of configuration `name` in this process.
/// Run it in a fresh process: what earlier measurements freed would be reused.
pub fn measure(name: &str, entries: u64) -> Result<Footprint, String> {
    let before = rss_bytes().ok_or("no /proc/self/statm: the memory bench needs Linux")?;
    let (resident, after) = match name {
        "herdcache" => fill_herdcache(entries, Timing::None, false),
        "herdcache (capacity 10x the entries)" => {
            fill_herdcache_in(entries, 10 * entries, Timing::None, false)
        }
        "herdcache (TTL)" => fill_herdcache(entries, Timing::Ttl, false),
        "herdcache (TTL + early refresh)" => fill_herdcache(entries, Timing::Refresh, false),
        "herdcache (time to idle)" => fill_herdcache(entries, Timing::Idle, false),
        "herdcache (after as many churn inserts)" => fill_herdcache(entries, Timing::None, true),
        "quick_cache" => fill::<QuickCache>(entries),
        "moka" => fill::<Moka>(entries),
        "Mutex<LruCache>" => fill::<MutexLru>(entries),
        "papaya" => fill::<Papaya>(entries),
        "std HashMap" => {
            let mut map: std::collections::HashMap<u64, u64, Hasher> = Default::default();
            for k in 0..entries {
                map.insert(k, k);
            }
            let after = rss_bytes();
            std::hint::black_box(&map);
            (map.len() as u64, after)
        }
        other => return Err(format!("unknown configuration {other:?}")),
    };
    let after = after.ok_or("the resident set could not be read after the fill")?;
    Ok(Footprint {
        name: name.to_owned(),
        resident,
        bytes: after.saturating_sub(before),
    })
}

/// Fills a bounded cache of capacity `entries` (the throughput bench's constructor).
fn fill<C: BenchCache>(entries: u64) -> (u64, Option<u64>) {
    let cache = C::with_capacity(entries as usize);
    for k in 0..entries {
        cache.insert(k, k);
    }
    cache.settle();
    let after = rss_bytes();
    let resident = (0..entries).filter(|&k| cache.get(k).is_some()).count() as u64;
    std::hint::black_box(&cache);
    (resident, after)
}

/// What expires in a herdcache configuration: entries keep what their settings need.
#[derive(Clone, Copy)]
enum Timing {
    /// Nothing.
    None,
    /// A time to live.
    Ttl,
    /// A time to live and early refresh.
    Refresh,
    /// A time to idle.
    Idle,
}

/// herdcache with the default builder (only `max_capacity` and the shared hasher) and the
/// `timing` settings; with `churn`, measured after as many inserts of new keys again (each
/// evicts), when the table has been rebuilt at its steady-state size.
fn fill_herdcache(entries: u64, timing: Timing, churn: bool) -> (u64, Option<u64>) {
    fill_herdcache_in(entries, entries, timing, churn)
}

/// `fill_herdcache` in a cache of capacity `capacity` (at least `entries`): what a cache
/// configured for more than it holds pays.
fn fill_herdcache_in(
    entries: u64,
    capacity: u64,
    timing: Timing,
    churn: bool,
) -> (u64, Option<u64>) {
    let builder = herdcache::Cache::builder()
        .max_capacity(capacity)
        .hasher(Hasher::default());
    let hour = Duration::from_secs(3600);
    let builder = match timing {
        Timing::None => builder,
        Timing::Ttl => builder.time_to_live(hour),
        Timing::Refresh => builder.time_to_live(hour).refresh_after(hour / 2),
        Timing::Idle => builder.time_to_idle(hour),
    };
    let cache: herdcache::Cache<u64, u64, Hasher> = builder.build().expect("valid settings");
    let keys = if churn { 0..2 * entries } else { 0..entries };
    for k in keys.clone() {
        cache.insert(k, k);
    }
    let after = rss_bytes();
    let resident = keys.filter(|k| cache.get(k).is_some()).count() as u64;
    std::hint::black_box(&cache);
    (resident, after)
}

/// Each configuration measured `runs` times, each in a fresh process of `exe` (a binary that
/// answers `--one NAME --entries N` with [`measure`]'s [`Footprint::to_line`]); the run with
/// the median bytes per entry, or `None` if every run failed.
pub fn median_footprints(
    exe: &Path,
    entries: u64,
    runs: usize,
) -> Vec<(&'static str, Option<Footprint>)> {
    CONFIGS
        .iter()
        .map(|&name| {
            let mut got: Vec<Footprint> = (0..runs)
                .filter_map(|_| {
                    let out = Command::new(exe)
                        .args(["--one", name, "--entries", &entries.to_string()])
                        .output()
                        .ok()?;
                    if !out.status.success() {
                        eprintln!("{name}: {}", String::from_utf8_lossy(&out.stderr).trim());
                        return None;
                    }
                    Footprint::from_line(&String::from_utf8_lossy(&out.stdout))
                })
                .collect();
            got.sort_by(|a, b| a.per_entry().total_cmp(&b.per_entry()));
            let median = (!got.is_empty()).then(|| got.swap_remove(got.len() / 2));
            (name, median)
        })
        .collect()
}
