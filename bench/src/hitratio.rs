//! The hit-ratio grid: every trace at every capacity, replayed single-threaded through each
//! cache (get, and insert on a miss), next to Belady's OPT.
//!
//! Every cache is measured holding at most its capacity. moka applies writes (and so its
//! evictions) in batches: left to itself, a moka cache of 100 entries held 121 on average
//! and up to 163 while replaying `lirs_sprite`, which counts hits on entries a cache of 100
//! could not hold. So its `moka` column runs moka's pending maintenance after each insert;
//! the `moka (deferred)` column shows moka as configured by default, for reference, and is
//! not one of the peers herdcache is compared with.

use serde::Serialize;

use crate::caches::{BenchCache, Herdcache, Moka, MutexLru, QuickCache};
use crate::trace::Trace;

/// The rows of each cell, in table order.
pub const POLICIES: [&str; 6] = [
    "herdcache",
    "moka",
    "moka (deferred)",
    "quick_cache",
    "LRU",
    "OPT",
];

/// The policies herdcache's last column compares with (the better of them, per cell).
pub const PEERS: [&str; 2] = ["moka", "quick_cache"];

/// One trace at one capacity.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// Trace name.
    pub trace: String,
    /// Cache capacity in entries.
    pub capacity: usize,
    /// Accesses replayed.
    pub accesses: usize,
    /// Replays per cache, averaged.
    pub runs: usize,
    /// Hit ratio in percent for each of [`POLICIES`], in that order.
    pub hit_ratio: Vec<f64>,
}

impl Cell {
    /// herdcache's hit ratio minus the better of [`PEERS`], in points.
    pub fn vs_best_peer(&self) -> f64 {
        let best = PEERS.iter().map(|p| self.of(p)).fold(f64::MIN, f64::max);
        self.of("herdcache") - best
    }

    /// The hit ratio (percent) of `policy`, one of [`POLICIES`].
    pub fn of(&self, policy: &str) -> f64 {
        let i = POLICIES
            .iter()
            .position(|p| *p == policy)
            .expect("a known policy");
        self.hit_ratio[i]
    }
}

/// Whether a replay lets the cache defer its maintenance or settles it after each insert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upkeep {
    /// After each insert, [`BenchCache::settle`]: the cache is back within its capacity.
    Settled,
    /// As the cache runs by itself (moka: writes applied in batches, possibly over capacity).
    Deferred,
}

/// Replays `keys` through `C` with room for `capacity` entries: the hit ratio in [0, 1].
pub fn replay<C: BenchCache>(keys: &[u64], capacity: usize, upkeep: Upkeep) -> f64 {
    let cache = C::with_capacity(capacity);
    let mut hits = 0u64;
    for &k in keys {
        if cache.get(k).is_some() {
            hits += 1;
        } else {
            cache.insert(k, k);
            if upkeep == Upkeep::Settled {
                cache.settle();
            }
        }
    }
    hits as f64 / keys.len().max(1) as f64
}

/// Runs per cache and cell when none is asked for: caches seed their hashers (and herdcache
/// its policy) randomly, so one run's hit ratio moves by up to a point on the short traces.
pub const DEFAULT_RUNS: usize = 3;

/// The mean hit ratio of `runs` replays, each through a new cache.
fn mean_of<C: BenchCache>(keys: &[u64], capacity: usize, upkeep: Upkeep, runs: usize) -> f64 {
    let runs = runs.max(1);
    (0..runs)
        .map(|_| replay::<C>(keys, capacity, upkeep))
        .sum::<f64>()
        / runs as f64
}

/// Measures one cell: each cache's mean over `runs` replays (LRU and OPT are deterministic
/// and run once).
pub fn cell(trace: &Trace, capacity: usize, runs: usize) -> Cell {
    let keys = &trace.keys;
    let ratios = [
        mean_of::<Herdcache>(keys, capacity, Upkeep::Settled, runs),
        mean_of::<Moka>(keys, capacity, Upkeep::Settled, runs),
        mean_of::<Moka>(keys, capacity, Upkeep::Deferred, runs),
        mean_of::<QuickCache>(keys, capacity, Upkeep::Settled, runs),
        replay::<MutexLru>(keys, capacity, Upkeep::Settled),
        crate::opt::hit_ratio(keys, capacity),
    ];
    Cell {
        trace: trace.name.clone(),
        capacity,
        accesses: keys.len(),
        runs: runs.max(1),
        hit_ratio: ratios.iter().map(|r| r * 100.0).collect(),
    }
}

/// The cells as a text table, with herdcache's distance from the better of [`PEERS`] in the
/// last column.
pub fn table(cells: &[Cell]) -> String {
    let mut out = format!("{:<20} {:>8} {:>9}", "trace", "capacity", "accesses");
    for p in POLICIES {
        out += &format!(" {p:>15}");
    }
    out += &format!(" {:>13}\n", "vs best peer");
    for c in cells {
        out += &format!("{:<20} {:>8} {:>9}", c.trace, c.capacity, c.accesses);
        for r in &c.hit_ratio {
            out += &format!(" {:>14.2}%", r);
        }
        out += &format!(" {:>+12.2}\n", c.vs_best_peer());
    }
    if !cells.is_empty() {
        out += &format!("{:<39}", "mean");
        for i in 0..POLICIES.len() {
            let mean = cells.iter().map(|c| c.hit_ratio[i]).sum::<f64>() / cells.len() as f64;
            out += &format!(" {:>14.2}%", mean);
        }
        out += "\n";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Format;

    #[test]
    fn a_trace_that_fits_misses_only_once_per_key() {
        let trace = Trace {
            name: "fits".into(),
            format: Format::LirsText,
            keys: (0..1000).map(|i| i % 50).collect(),
        };
        let c = cell(&trace, 100, 1);
        for (p, r) in POLICIES.iter().zip(&c.hit_ratio) {
            assert!((r - 95.0).abs() < 1e-9, "{p}: {r}");
        }
    }

    #[test]
    fn no_policy_beats_opt() {
        let keys = crate::workload::keys(crate::workload::Distribution::Zipf(0.8), 5000, 50_000, 3);
        let trace = Trace {
            name: "zipf".into(),
            format: Format::LirsText,
            keys,
        };
        let c = cell(&trace, 200, 2);
        // The deferred moka may hold more than the capacity, so it is not bound by OPT's limit.
        for p in ["herdcache", "moka", "quick_cache", "LRU"] {
            assert!(
                c.of(p) <= c.of("OPT") + 1e-9,
                "{p} {} > OPT {}",
                c.of(p),
                c.of("OPT")
            );
        }
    }
}
