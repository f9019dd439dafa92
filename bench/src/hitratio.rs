//! The hit-ratio grid: every trace at every capacity, replayed single-threaded through each
//! cache (get, and insert on a miss), next to Belady's OPT.

use serde::Serialize;

use crate::caches::{BenchCache, Herdcache, Moka, MutexLru, QuickCache};
use crate::trace::Trace;

/// The rows of each cell, in table order.
pub const POLICIES: [&str; 5] = ["herdcache", "moka", "quick_cache", "LRU", "OPT"];

/// One trace at one capacity.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// Trace name.
    pub trace: String,
    /// Cache capacity in entries.
    pub capacity: usize,
    /// Accesses replayed.
    pub accesses: usize,
    /// Hit ratio in percent for each of [`POLICIES`], in that order.
    pub hit_ratio: Vec<f64>,
}

impl Cell {
    /// The hit ratio (percent) of `policy`, one of [`POLICIES`].
    pub fn of(&self, policy: &str) -> f64 {
        let i = POLICIES
            .iter()
            .position(|p| *p == policy)
            .expect("a known policy");
        self.hit_ratio[i]
    }
}

/// Replays `keys` through `C` with room for `capacity` entries: the hit ratio in [0, 1].
pub fn replay<C: BenchCache>(keys: &[u64], capacity: usize) -> f64 {
    let cache = C::with_capacity(capacity);
    let mut hits = 0u64;
    for &k in keys {
        if cache.get(k).is_some() {
            hits += 1;
        } else {
            cache.insert(k, k);
        }
    }
    hits as f64 / keys.len().max(1) as f64
}

/// Measures one cell.
pub fn cell(trace: &Trace, capacity: usize) -> Cell {
    let keys = &trace.keys;
    let ratios = [
        replay::<Herdcache>(keys, capacity),
        replay::<Moka>(keys, capacity),
        replay::<QuickCache>(keys, capacity),
        replay::<MutexLru>(keys, capacity),
        crate::opt::hit_ratio(keys, capacity),
    ];
    Cell {
        trace: trace.name.clone(),
        capacity,
        accesses: keys.len(),
        hit_ratio: ratios.iter().map(|r| r * 100.0).collect(),
    }
}

/// The cells as a text table, with herdcache's distance from the better of moka and
/// quick_cache in the last column.
pub fn table(cells: &[Cell]) -> String {
    let mut out = format!("{:<20} {:>8} {:>9}", "trace", "capacity", "accesses");
    for p in POLICIES {
        out += &format!(" {p:>11}");
    }
    out += &format!(" {:>13}\n", "vs best peer");
    for c in cells {
        out += &format!("{:<20} {:>8} {:>9}", c.trace, c.capacity, c.accesses);
        for r in &c.hit_ratio {
            out += &format!(" {:>10.2}%", r);
        }
        let best_peer = c.of("moka").max(c.of("quick_cache"));
        out += &format!(" {:>+12.2}\n", c.of("herdcache") - best_peer);
    }
    if !cells.is_empty() {
        out += &format!("{:<39}", "mean");
        for i in 0..POLICIES.len() {
            let mean = cells.iter().map(|c| c.hit_ratio[i]).sum::<f64>() / cells.len() as f64;
            out += &format!(" {:>10.2}%", mean);
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
        let c = cell(&trace, 100);
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
        let c = cell(&trace, 200);
        for p in &POLICIES[..4] {
            assert!(
                c.of(p) <= c.of("OPT") + 1e-9,
                "{p} {} > OPT {}",
                c.of(p),
                c.of("OPT")
            );
        }
    }
}
