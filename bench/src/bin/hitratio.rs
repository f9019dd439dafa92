//! The hit-ratio benchmark: replays traces single-threaded through herdcache, moka,
//! quick_cache and LRU (get, insert on a miss) next to Belady's OPT.
//!
//! Run: `cargo run --release -p herdcache-bench --bin hitratio -- [--traces DIR]
//! [--trace PATH]... [--capacity N,...] [--runs N] [--json]`. Without `--trace`, every `*.trace.gz` and
//! `*.trace.xz` in the trace directory (default: `HERDCACHE_TRACES`, else `../shared/traces`)
//! is replayed; without `--capacity`, each at its family's default capacities. Each cache's
//! figure is the mean of `--runs` replays (default 3), each through a new, newly seeded cache.

use std::path::PathBuf;

use herdcache_bench::args::{exit_usage, Flags};
use herdcache_bench::hitratio::{cell, table, DEFAULT_RUNS};
use herdcache_bench::trace;

const USAGE: &str =
    "hitratio [--traces DIR] [--trace PATH]... [--capacity N,...] [--runs N] [--json]";

fn main() {
    let flags = Flags::parse(
        &["--traces", "--trace", "--capacity", "--runs"],
        &["--json", "--help"],
    )
    .unwrap_or_else(|e| exit_usage(&e, USAGE));
    if flags.has("--help") {
        exit_usage("", USAGE);
    }
    let capacities: Vec<usize> = flags
        .list("--capacity")
        .unwrap_or_else(|e| exit_usage(&e, USAGE));
    if capacities.contains(&0) {
        exit_usage("--capacity must be positive", USAGE);
    }
    let runs: usize = match flags
        .list("--runs")
        .unwrap_or_else(|e| exit_usage(&e, USAGE))
        .as_slice()
    {
        [] => DEFAULT_RUNS,
        [n] if *n > 0 => *n,
        _ => exit_usage("--runs takes one positive number", USAGE),
    };
    let mut paths: Vec<PathBuf> = flags
        .raw("--trace")
        .into_iter()
        .map(PathBuf::from)
        .collect();
    if paths.is_empty() {
        let dir = flags
            .raw("--traces")
            .last()
            .map(PathBuf::from)
            .or_else(trace::default_dir);
        let Some(dir) = dir else {
            eprintln!(
                "no traces: pass --trace PATH or --traces DIR, or set HERDCACHE_TRACES \
                 (../shared/traces does not exist here); skipping"
            );
            return;
        };
        paths = trace::files_in(&dir).unwrap_or_else(|e| exit_usage(&e, USAGE));
        if paths.is_empty() {
            eprintln!("no *.gz or *.xz traces in {}; skipping", dir.display());
            return;
        }
    }
    let mut cells = Vec::new();
    for p in &paths {
        let t = trace::read(p).unwrap_or_else(|e| exit_usage(&e, USAGE));
        let caps: &[usize] = if capacities.is_empty() {
            t.format.default_capacities()
        } else {
            &capacities
        };
        for &c in caps {
            cells.push(cell(&t, c, runs));
        }
    }
    if flags.has("--json") {
        println!(
            "{}",
            serde_json::to_string_pretty(&cells).expect("serialisable")
        );
    } else {
        print!("{}", table(&cells));
    }
}
