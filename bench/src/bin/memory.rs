//! Bytes per resident `u64 → u64` entry for herdcache (default, and with TTL and early
//! refresh) and the caches and maps it is compared with, each measured in a fresh process.
//!
//! Run: `cargo run --release -p herdcache-bench --bin memory -- [--entries N] [--runs R]`
//! (defaults: 1,000,000 entries, 3 runs; the median of the runs is printed).

use herdcache_bench::args::{exit_usage, Flags};
use herdcache_bench::memory;

const USAGE: &str = "memory [--entries N] [--runs R]  (internal: --one NAME)";

fn main() {
    let flags = Flags::parse(&["--entries", "--runs", "--one"], &[])
        .unwrap_or_else(|e| exit_usage(&e, USAGE));
    let entries: u64 = flags
        .get("--entries", 1_000_000)
        .unwrap_or_else(|e| exit_usage(&e, USAGE));
    if let Some(name) = flags.raw("--one").first() {
        match memory::measure(name, entries) {
            Ok(f) => println!("{}", f.to_line()),
            Err(e) => {
                eprintln!("memory: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    let runs: usize = flags
        .get("--runs", 3)
        .unwrap_or_else(|e| exit_usage(&e, USAGE));
    if entries == 0 || runs == 0 {
        exit_usage("--entries and --runs must be at least 1", USAGE);
    }
    println!("bytes per resident entry, {entries} u64 → u64 entries, median of {runs} runs");
    println!("{:<34} {:>12} {:>16}", "cache", "resident", "bytes/entry");
    let exe = std::env::current_exe().expect("the bench's own path");
    for (name, f) in memory::median_footprints(&exe, entries, runs) {
        match f {
            Some(f) => println!("{name:<34} {:>12} {:>16.1}", f.resident, f.per_entry()),
            None => println!("{name:<34} {:>12} {:>16}", "-", "failed"),
        }
    }
}
