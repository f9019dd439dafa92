//! Writes docs/BENCHMARKS.md and its SVG plots from fresh measurements.
//!
//! - Throughput: read from criterion's results in `target/criterion` (run
//!   `cargo bench -p herdcache-bench --bench throughput` first; it is not re-run here because
//!   it takes minutes and wants an otherwise idle machine).
//! - Stampedes: every configuration of `stampede-bench`, run now.
//! - Hit ratio: the default grid of `hitratio`, run now (skipped with a message if no traces).
//! - Fleet: `fleet-bench`'s default runs and its coherence mode, now (skipped with a message
//!   without `redis-server`).
//!
//! Run: `cargo run --release -p herdcache-bench --bin bench-report -- [--out DIR]
//! [--seconds S] [--traces DIR]`. `--out` defaults to the workspace's `docs/`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use herdcache_bench::args::{exit_usage, Flags};
use herdcache_bench::coherence::{self, CoherenceReport, CoherenceSettings};
use herdcache_bench::fleet::{self, FleetReport, FleetSettings, RedisServer};
use herdcache_bench::hitratio::{self, Cell, POLICIES};
use herdcache_bench::memory::{self, Footprint};
use herdcache_bench::stampede::{self, Config, Report, Settings};
use herdcache_bench::{svg, trace};

const USAGE: &str = "bench-report [--out DIR] [--seconds S] [--traces DIR]";

/// Entries per cache in the memory section.
const MEMORY_ENTRIES: u64 = 1_000_000;

/// One criterion measurement: workload, cache, threads, operations per second.
#[derive(Debug, Clone)]
struct Throughput {
    workload: String,
    cache: String,
    threads: usize,
    ops_per_sec: f64,
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bench/ has a parent")
        .to_path_buf()
}

fn read_json(path: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// Every `new/benchmark.json` under criterion's output directory, with its median.
fn criterion_results(dir: &Path) -> Vec<Throughput> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n == "new") {
                    if let Some(t) = one_result(&p) {
                        out.push(t);
                    }
                } else {
                    stack.push(p);
                }
            }
        }
    }
    out
}

fn one_result(new: &Path) -> Option<Throughput> {
    let bench = read_json(&new.join("benchmark.json"))?;
    let est = read_json(&new.join("estimates.json"))?;
    let elements = bench["throughput"]["Elements"].as_f64()?;
    let median_ns = est["median"]["point_estimate"].as_f64()?;
    Some(Throughput {
        workload: bench["group_id"].as_str()?.to_owned(),
        cache: bench["function_id"].as_str()?.to_owned(),
        threads: bench["value_str"].as_str()?.parse().ok()?,
        ops_per_sec: elements / (median_ns * 1e-9),
    })
}

const WORKLOADS: [(&str, &str); 6] = [
    ("read_uniform", "100k keys, uniform reads, all hits"),
    ("read_zipf1", "100k keys, Zipf(1.0) reads, all hits"),
    ("read_hot_key", "one hot key, all hits"),
    (
        "mixed_90_10",
        "90% reads / 10% inserts, Zipf(1.0) over 1M keys, capacity 100k",
    ),
    ("insert_churn", "inserts of new keys at capacity 100k"),
    (
        "cache_aside",
        "get, and insert on a miss, Zipf(1.0) over 1M keys, capacity 100k",
    ),
];

const CACHE_ORDER: [&str; 10] = [
    "herdcache",
    "herdcache (pin per batch)",
    "papaya",
    "papaya (pin per batch)",
    "quick_cache",
    "moka",
    "Mutex<LruCache>",
    "RwLock<HashMap>",
    "dashmap",
    "std HashMap",
];

fn lookup(t: &[Throughput], w: &str, c: &str, threads: usize) -> Option<f64> {
    t.iter()
        .find(|x| x.workload == w && x.cache == c && x.threads == threads)
        .map(|x| x.ops_per_sec)
}

/// Millions per second, to three significant digits below 10 (a source-bound run reads
/// fewer than 100,000 a second).
fn mops(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| {
        let m = v / 1e6;
        match m {
            m if m < 1.0 => format!("{m:.3}"),
            m if m < 10.0 => format!("{m:.2}"),
            m => format!("{m:.1}"),
        }
    })
}

/// The cache-aside hit ratios the throughput bench wrote: (cache, threads) → ratio.
fn cache_aside_hit_ratios(criterion: &Path) -> BTreeMap<(String, usize), f64> {
    let text = std::fs::read_to_string(criterion.join("cache_aside").join("hit_ratio.tsv"))
        .unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut it = l.split('\t');
            let cache = it.next()?.to_owned();
            let threads = it.next()?.parse().ok()?;
            let ratio = it.next()?.parse().ok()?;
            Some(((cache, threads), ratio))
        })
        .collect()
}

/// One cache-aside-with-a-source run: reads made and loads the source served.
struct SourceRun {
    reads: u64,
    loads: u64,
}

/// The cache-aside-with-a-source runs the throughput bench wrote: (cache, source µs,
/// threads) → run.
fn source_runs(criterion: &Path) -> BTreeMap<(String, u64, usize), SourceRun> {
    let text = std::fs::read_to_string(criterion.join("cache_aside_source").join("loads.tsv"))
        .unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let [cache, micros, threads, reads, loads] = f[..] else {
                return None;
            };
            let run = SourceRun {
                reads: reads.parse().ok()?,
                loads: loads.parse().ok()?,
            };
            Some((
                (
                    cache.to_owned(),
                    micros.parse().ok()?,
                    threads.parse().ok()?,
                ),
                run,
            ))
        })
        .collect()
}

/// The cache-aside workload with a simulated source: throughput, hit ratio and the source's
/// loads per thousand reads, per cache, source latency and thread count.
fn source_section(
    t: &[Throughput],
    runs: &BTreeMap<(String, u64, usize), SourceRun>,
    md: &mut String,
) {
    if runs.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## Cache-aside with a source\n\n\
         Each read goes through the cache's loading call (herdcache `get_with`, quick_cache \
         `get_or_insert_with`, moka `get_with`; get, then insert, for `Mutex<LruCache>`); a \
         miss costs a load from a simulated source that keeps its core busy for 1, 10 or \
         100 µs, as a remote call keeps a request waiting. Zipf(1.0) over 1M keys at capacity \
         100k. Throughput in millions of reads per second; the hit ratio is the share of reads \
         that cost no load; loads per 1,000 reads are what the source sees. What the numbers \
         mean: once a miss costs microseconds, the cache that turns fewer reads into loads is \
         the faster one, whatever its own per-operation cost, and single flight keeps threads \
         that miss one key together from loading it twice.\n"
    );
    let mut micros: Vec<u64> = runs.keys().map(|k| k.1).collect();
    micros.sort_unstable();
    micros.dedup();
    let mut threads: Vec<usize> = runs.keys().map(|k| k.2).collect();
    threads.sort_unstable();
    threads.dedup();
    let _ = writeln!(
        md,
        "| cache | source | threads | M reads/s | hit ratio | loads per 1,000 reads |\n| --- | ---: | ---: | ---: | ---: | ---: |"
    );
    for c in CACHE_ORDER {
        for &us in &micros {
            for &n in &threads {
                let Some(run) = runs.get(&(c.to_owned(), us, n)) else {
                    continue;
                };
                let per_read = run.loads as f64 / run.reads.max(1) as f64;
                let _ = writeln!(
                    md,
                    "| {} | {us} µs | {n} | {} | {:.1}% | {:.1} |",
                    c.replace('<', "&lt;").replace('>', "&gt;"),
                    mops(lookup(t, &format!("cache_aside_source_{us}us"), c, n)),
                    100.0 * (1.0 - per_read),
                    1_000.0 * per_read
                );
            }
        }
    }
    let _ = writeln!(md);
}

fn throughput_section(
    t: &[Throughput],
    hit_ratios: &BTreeMap<(String, usize), f64>,
    out_dir: &Path,
    md: &mut String,
) {
    let _ = writeln!(md, "## Throughput\n");
    if t.is_empty() {
        let _ = writeln!(
            md,
            "No criterion results were found in `target/criterion`: run \
             `cargo bench -p herdcache-bench --bench throughput`, then this report again.\n"
        );
        return;
    }
    let mut threads: Vec<usize> = t.iter().map(|x| x.threads).collect();
    threads.sort_unstable();
    threads.dedup();
    let _ = writeln!(
        md,
        "Millions of operations per second, more is better (criterion medians from \
         `cargo bench -p herdcache-bench --bench throughput`). Thread counts: {:?}. Each thread reads its own pre-generated key \
         sequence; every cache uses foldhash's seeded hasher. \"pin per batch\" reads 1,024 keys \
         per epoch pin (`Cache::pin`, papaya's `pin()`); the others pin (or lock) per read. \
         Unbounded maps (papaya, dashmap, `RwLock<HashMap>`) do not take part in the workloads \
         that evict. std's `HashMap` runs on one thread only, as the floor.\n",
        threads
    );
    for (w, desc) in WORKLOADS {
        let present: Vec<&str> = CACHE_ORDER
            .iter()
            .copied()
            .filter(|c| threads.iter().any(|&n| lookup(t, w, c, n).is_some()))
            .collect();
        if present.is_empty() {
            continue;
        }
        let _ = writeln!(md, "### `{w}`: {desc}\n");
        let mut head = String::from("| cache |");
        let mut rule = String::from("| --- |");
        for n in &threads {
            let _ = write!(head, " {n} thread{} |", if *n == 1 { "" } else { "s" });
            rule += " ---: |";
        }
        let with_ratio = w == "cache_aside";
        if with_ratio {
            for n in &threads {
                let _ = write!(head, " hit ratio, {n} thr. |");
                rule += " ---: |";
            }
        }
        let _ = writeln!(md, "{head}\n{rule}");
        for c in &present {
            let mut row = format!("| {} |", c.replace('<', "&lt;").replace('>', "&gt;"));
            for &n in &threads {
                let _ = write!(row, " {} |", mops(lookup(t, w, c, n)));
            }
            if with_ratio {
                for &n in &threads {
                    let r = hit_ratios.get(&(c.to_string(), n));
                    let _ = write!(
                        row,
                        " {} |",
                        r.map_or("–".into(), |r| format!("{:.1}%", r * 100.0))
                    );
                }
            }
            let _ = writeln!(md, "{row}");
        }
        let series: Vec<String> = threads.iter().map(|n| format!("{n} threads")).collect();
        let values: Vec<Vec<f64>> = threads
            .iter()
            .map(|&n| {
                present
                    .iter()
                    .map(|c| lookup(t, w, c, n).unwrap_or(0.0) / 1e6)
                    .collect()
            })
            .collect();
        let cats: Vec<String> = present.iter().map(|c| short_name(c)).collect();
        let file = format!("throughput_{w}.svg");
        write_file(
            &out_dir.join("bench").join(&file),
            &svg::bars(&format!("{w}: {desc}"), "Mops/s", &cats, &series, &values),
        );
        let _ = writeln!(md, "\n![{w}](bench/{file})\n");
    }
    targets(t, &threads, md);
    let _ = writeln!(
        md,
        "What a herdcache hit does beyond a map lookup: it checks the entry's state (and its \
         expiry, once the cache holds an entry that can expire), \
         runs the eviction policy's hit hook (a test-before-set of the entry's hit counter) and bumps \
         this thread's hit counter; cachegrind (`opcost --op get`) puts the \
         rest of the difference to papaya in the epoch pin (crossbeam-epoch's pin is a locked \
         instruction; papaya's collector pins with a lighter fence). The writes \
         (`mixed_90_10`, `insert_churn`, `cache_aside`) pay for one node per insert \
         (its memory recycled through a per-thread pool) and one retirement, and take a lock \
         of the eviction policy (W-TinyLFU's bookkeeping: the sketch, the window, the duel \
         and the key's record, and its victims' removal from the table by node: about 2,100 \
         instructions and 11.4 L1 read misses per insert at capacity, `opcost --op insert` \
         under callgrind counting the operations alone, against quick_cache's 463 and 3.5). \
         A cache of 100k entries \
         splits its policy into shards \
         with a lock each, so inserts of different keys rarely wait for each other.\n"
    );
}

fn short_name(c: &str) -> String {
    c.replace(" (pin per batch)", "/pin")
        .replace("Mutex<LruCache>", "Mutex<LRU>")
        .replace("RwLock<HashMap>", "RwLock<Map>")
        .replace("std HashMap", "std")
}

fn targets(t: &[Throughput], threads: &[usize], md: &mut String) {
    let _ = writeln!(md, "### Targets\n");
    let _ = writeln!(
        md,
        "Each ratio comes from the one run above. On a machine shared with other work, the \
         memory-bound rows (`read_uniform`, `read_zipf1`) and the 2-thread rows move from run to \
         run with what else the host runs, so compare several runs before reading one cell.\n"
    );
    let _ = writeln!(md, "| target | measured | met |\n| --- | ---: | :---: |");
    let mut row = |what: String, ratio: Option<f64>, goal: f64| {
        let (m, ok) = match ratio {
            Some(r) => (format!("{r:.2}x"), if r >= goal { "yes" } else { "no" }),
            None => ("–".into(), "–"),
        };
        let _ = writeln!(md, "| {what} | {m} | {ok} |");
    };
    let ratio = |a: Option<f64>, b: Option<f64>| Some(a? / b?);
    for w in ["read_uniform", "read_zipf1", "read_hot_key"] {
        for &n in threads {
            row(
                format!("`{w}`, {n} threads: herdcache `get` / papaya `pin().get` per read, ≥ 1"),
                ratio(lookup(t, w, "herdcache", n), lookup(t, w, "papaya", n)),
                1.0,
            );
            row(
                format!("`{w}`, {n} threads: herdcache / papaya, one pin per batch, ≥ 1"),
                ratio(
                    lookup(t, w, "herdcache (pin per batch)", n),
                    lookup(t, w, "papaya (pin per batch)", n),
                ),
                1.0,
            );
        }
        row(
            format!("`{w}`, 2 threads: herdcache `get` / quick_cache, ≥ 3"),
            ratio(lookup(t, w, "herdcache", 2), lookup(t, w, "quick_cache", 2)),
            3.0,
        );
        row(
            format!("`{w}`, 2 threads: herdcache `get` / moka, ≥ 10"),
            ratio(lookup(t, w, "herdcache", 2), lookup(t, w, "moka", 2)),
            10.0,
        );
    }
    for w in ["read_uniform", "read_hot_key"] {
        row(
            format!("`{w}`, 1 thread: herdcache `get` / quick_cache, ≥ 1"),
            ratio(lookup(t, w, "herdcache", 1), lookup(t, w, "quick_cache", 1)),
            1.0,
        );
    }
    for w in ["insert_churn", "mixed_90_10", "cache_aside"] {
        for &n in threads {
            let best = ["quick_cache", "moka", "Mutex<LruCache>"]
                .iter()
                .filter_map(|c| lookup(t, w, c, n))
                .reduce(f64::max);
            row(
                format!(
                    "`{w}`, {n} threads: herdcache / the best of quick_cache, moka and \
                     `Mutex<LruCache>`, ≥ 1"
                ),
                ratio(lookup(t, w, "herdcache", n), best),
                1.0,
            );
        }
    }
    row(
        "`insert_churn`, herdcache: 2 threads / 1 thread, > 1".into(),
        ratio(
            lookup(t, "insert_churn", "herdcache", 2),
            lookup(t, "insert_churn", "herdcache", 1),
        ),
        1.0001,
    );
    for c in ["herdcache", "herdcache (pin per batch)"] {
        row(
            format!("`read_hot_key`, {c}: 2 threads / 1 thread, ≥ 1.8"),
            ratio(
                lookup(t, "read_hot_key", c, 2),
                lookup(t, "read_hot_key", c, 1),
            ),
            1.8,
        );
    }
    row(
        "`read_uniform`, 1 thread: std `HashMap` time / herdcache pin-per-batch time, ≥ 1/1.5 \
         (0.67)"
            .into(),
        ratio(
            lookup(t, "read_uniform", "herdcache (pin per batch)", 1),
            lookup(t, "read_uniform", "std HashMap", 1),
        ),
        1.0 / 1.5,
    );
    let _ = writeln!(md);
}

fn memory_section(memory: &[(&str, Option<Footprint>)], entries: u64, md: &mut String) {
    let _ = writeln!(md, "## Memory\n");
    let _ = writeln!(
        md,
        "Bytes per resident entry, less is better: each cache filled with {entries} `u64 → u64` \
         entries (capacity {entries}) in a process of its own, the growth of the resident set \
         divided by the entries still held (`cargo run --release -p herdcache-bench --bin \
         memory`; median of three processes). The resident set counts what the allocator \
         keeps, freed or not: a table that grew by doubling still holds its last growth's \
         slack.\n"
    );
    let _ = writeln!(
        md,
        "| cache | entries held | bytes per entry |\n| --- | ---: | ---: |"
    );
    for (name, f) in memory {
        let name = name.replace('<', "&lt;").replace('>', "&gt;");
        match f {
            Some(f) => {
                let _ = writeln!(md, "| {name} | {} | {:.1} |", f.resident, f.per_entry());
            }
            None => {
                let _ = writeln!(md, "| {name} | – | – |");
            }
        }
    }
    let _ = writeln!(md);
}

fn stampede_section(reports: &[Report], s: &Settings, out_dir: &Path, md: &mut String) {
    let _ = writeln!(
        md,
        "## Stampedes\n\n`cargo run --release -p herdcache-bench --bin stampede-bench` \
         ({} readers, {} reads/s in total, source load {:?}, TTL {:?}, {:?} per \
         configuration). Loads per expiry: source loads / (run time / (TTL + load time)); \
         per TTL: source loads / (run time / TTL), at most about 1.25 with early refresh; \
         blocked: reads that took at least half a load.\n",
        s.readers, s.rate, s.load, s.ttl, s.run
    );
    let _ = writeln!(
        md,
        "| configuration | loads | per expiry | per TTL | max at once | blocked | p50 | p99 | p99.9 | max |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    let ns = |v: u64| format!("{:.1?}", std::time::Duration::from_nanos(v));
    for r in reports {
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} | {:.2} | {} | {} | {} | {} | {} | {} |",
            r.name.trim_start().replace("  + ", "+ "),
            r.loads,
            r.loads_per_expiry,
            r.loads_per_ttl,
            r.max_concurrent_loads,
            r.blocked,
            ns(r.p50_ns),
            ns(r.p99_ns),
            ns(r.p999_ns),
            ns(r.max_ns)
        );
    }
    let series: Vec<(String, Vec<(f64, f64)>)> = reports
        .iter()
        .map(|r| {
            let mut pts = vec![(0.0, 0.0)];
            for (i, &t) in r.load_start_ms.iter().enumerate() {
                pts.push((t, (i + 1) as f64));
            }
            pts.push((s.run.as_secs_f64() * 1e3, r.load_start_ms.len() as f64));
            (r.name.trim_start().to_owned(), pts)
        })
        .collect();
    write_file(
        &out_dir.join("bench/stampede_loads.svg"),
        &svg::lines(
            "Source loads over time (each step is one load)",
            "ms since start",
            "source loads so far",
            &series,
            true,
        ),
    );
    let _ = writeln!(
        md,
        "\n![source loads over time](bench/stampede_loads.svg)\n"
    );
}

fn fleet_section(fleet: &Result<Vec<FleetReport>, String>, out_dir: &Path, md: &mut String) {
    let s = FleetSettings::default();
    let _ = writeln!(
        md,
        "## Fleet stampedes\n\n`cargo run --release -p herdcache-bench --bin fleet-bench`: K \
         instance processes on this machine, each with its own cache and {} reader threads at \
         {} reads/s, read one hot key (source load {:?}, TTL {:?}, {:?} per run), with local \
         single flight only and then coordinated through a private `redis-server` \
         (`RedisTier`). Expiries: groups of source loads closer than half a TTL. Redis \
         commands: the calls of the commands clients send (`EVALSHA`, `SET`, `PING`, ...) in \
         the server's `INFO commandstats` over the run, all instances together, startup and \
         keep-alives included; bytes: its `total_net_input_bytes` and \
         `total_net_output_bytes`.\n",
        s.readers, s.rate, s.load, s.ttl, s.run
    );
    let reports = match fleet {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(md, "Not measured: {e}.\n");
            return;
        }
    };
    md.push_str(&fleet::table(reports));
    let mut ks: Vec<usize> = reports.iter().map(|r| r.instances).collect();
    ks.dedup();
    let per = |mode: &str| -> Vec<f64> {
        ks.iter()
            .map(|&k| {
                reports
                    .iter()
                    .find(|r| r.instances == k && r.mode == mode)
                    .map_or(0.0, |r| r.per_expiry)
            })
            .collect()
    };
    write_file(
        &out_dir.join("bench/fleet_loads.svg"),
        &svg::bars(
            "Source loads per expiry across the fleet",
            "loads per expiry",
            &ks.iter()
                .map(|k| format!("{k} instances"))
                .collect::<Vec<_>>(),
            &[
                "local single flight only".to_owned(),
                "Redis soft lock".to_owned(),
            ],
            &[per("local"), per("redis")],
        ),
    );
    let _ = writeln!(md, "\n![fleet loads per expiry](bench/fleet_loads.svg)\n");
}

fn coherence_section(
    coherence: &Result<Vec<CoherenceReport>, String>,
    out_dir: &Path,
    md: &mut String,
) {
    let s = CoherenceSettings::default();
    let _ = writeln!(
        md,
        "## Fleet coherence\n\n`cargo run --release -p herdcache-bench --bin fleet-bench -- \
         --coherence`: a writer changes the source and calls `invalidate` {} times a second \
         through its own instance, while K reader instance processes read the key at {} \
         reads/s each through the shared tier (coherence bound {:?}, source load {:?}, {:?} \
         per run). Each read is judged against the writes completed before it: *stale beyond \
         the bound* if a newer write had completed more than the bound earlier (the promise: \
         none). Propagation: from `invalidate` returning to each instance's first read of the \
         new value (the source load and the read spacing included).\n",
        s.writes, s.rate, s.bound, s.load, s.run
    );
    let reports = match coherence {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(md, "Not measured: {e}.\n");
            return;
        }
    };
    md.push_str(&coherence::table(reports));
    let ms = |v: u64| v as f64 / 1e3;
    write_file(
        &out_dir.join("bench/coherence_propagation.svg"),
        &svg::bars(
            "Invalidation propagation: write to each instance's first fresh read",
            "milliseconds",
            &reports
                .iter()
                .map(|r| format!("{} readers", r.instances))
                .collect::<Vec<_>>(),
            &["p50".to_owned(), "p99".to_owned(), "max".to_owned()],
            &[
                reports.iter().map(|r| ms(r.propagation_p50_us)).collect(),
                reports.iter().map(|r| ms(r.propagation_p99_us)).collect(),
                reports.iter().map(|r| ms(r.propagation_max_us)).collect(),
            ],
        ),
    );
    let _ = writeln!(
        md,
        "\n![invalidation propagation](bench/coherence_propagation.svg)\n"
    );
}

fn hitratio_section(cells: &[Cell], note: &str, out_dir: &Path, md: &mut String) {
    let _ = writeln!(
        md,
        "## Hit ratio\n\n`cargo run --release -p herdcache-bench --bin hitratio`: each trace \
         replayed on one thread (get, insert on a miss) at each capacity; each cache's figure \
         is the mean of three replays through newly seeded caches. OPT is Belady's \
         clairvoyant policy with bypass, the limit for any policy. Every cache holds at most \
         its capacity: `moka` runs moka's pending maintenance after each insert. Left to \
         itself moka applies writes in batches and holds more than its capacity in between \
         (121 entries on average, up to 163, at capacity 100 on lirs_sprite); that is the \
         `moka (deferred)` column, shown for reference. The last column is herdcache minus \
         the better of moka and quick_cache, in points.\n"
    );
    if cells.is_empty() {
        let _ = writeln!(md, "{note}\n");
        return;
    }
    let _ = write!(md, "| trace | capacity |");
    for p in POLICIES {
        let _ = write!(md, " {p} |");
    }
    let _ = writeln!(md, " vs best peer |");
    let _ = writeln!(
        md,
        "| --- | ---: |{} ---: |",
        " ---: |".repeat(POLICIES.len())
    );
    for c in cells {
        let _ = write!(md, "| {} | {} |", c.trace, c.capacity);
        for r in &c.hit_ratio {
            let _ = write!(md, " {r:.2}% |");
        }
        let _ = writeln!(md, " {:+.2} |", c.vs_best_peer());
    }
    let _ = write!(md, "| mean | |");
    for i in 0..POLICIES.len() {
        let m = cells.iter().map(|c| c.hit_ratio[i]).sum::<f64>() / cells.len() as f64;
        let _ = write!(md, " {m:.2}% |");
    }
    let _ = writeln!(md, " |\n");
    let mut by_trace: BTreeMap<&str, Vec<&Cell>> = BTreeMap::new();
    for c in cells {
        by_trace.entry(&c.trace).or_default().push(c);
    }
    for (name, cs) in by_trace {
        let series: Vec<(String, Vec<(f64, f64)>)> = POLICIES
            .iter()
            .map(|p| {
                (
                    p.to_string(),
                    cs.iter().map(|c| (c.capacity as f64, c.of(p))).collect(),
                )
            })
            .collect();
        let file = format!("hitratio_{name}.svg");
        write_file(
            &out_dir.join("bench").join(&file),
            &svg::lines(
                &format!("{name}: hit ratio by capacity"),
                "capacity (entries)",
                "hit ratio (%)",
                &series,
                false,
            ),
        );
        let _ = writeln!(md, "![{name}](bench/{file})");
    }
    let _ = writeln!(md);
}

fn write_file(path: &Path, text: &str) {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .unwrap_or_else(|e| exit_usage(&format!("{}: {e}", dir.display()), USAGE));
    }
    std::fs::write(path, text)
        .unwrap_or_else(|e| exit_usage(&format!("{}: {e}", path.display()), USAGE));
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let rustc = std::process::Command::new("rustc")
        .arg("-V")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "rustc (unknown version)".into());
    format!("{cpu}, {cores} hardware threads available; {rustc}; release profile")
}

fn versions() -> String {
    let lock = std::fs::read_to_string(workspace().join("Cargo.lock")).unwrap_or_default();
    let mut out = Vec::new();
    for name in [
        "moka",
        "quick_cache",
        "lru",
        "parking_lot",
        "dashmap",
        "papaya",
        "crossbeam-epoch",
        "foldhash",
        "criterion",
    ] {
        let needle = format!("name = \"{name}\"\nversion = \"");
        // A crate can be in the lock file at several versions (peers pull in their own).
        let found: Vec<&str> = lock
            .match_indices(&needle)
            .filter_map(|(i, _)| lock[i + needle.len()..].split('"').next())
            .collect();
        if !found.is_empty() {
            out.push(format!("{name} {}", found.join(" and ")));
        }
    }
    out.join(", ")
}

fn main() {
    fleet::child_main_if_requested();
    let flags = Flags::parse(
        &["--out", "--seconds", "--traces", "--one", "--entries"],
        &["--help"],
    )
    .unwrap_or_else(|e| exit_usage(&e, USAGE));
    // A child process of the memory section: measures one configuration.
    if let Some(name) = flags.raw("--one").first() {
        let entries = flags
            .get("--entries", MEMORY_ENTRIES)
            .unwrap_or_else(|e| exit_usage(&e, USAGE));
        match memory::measure(name, entries) {
            Ok(f) => println!("{}", f.to_line()),
            Err(e) => exit_usage(&e, USAGE),
        }
        return;
    }
    if flags.has("--help") {
        exit_usage("", USAGE);
    }
    let out_dir = flags
        .raw("--out")
        .last()
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("docs"));
    let secs: f64 = flags
        .get("--seconds", 3.0)
        .unwrap_or_else(|e| exit_usage(&e, USAGE));
    if !(secs >= 0.1 && secs.is_finite()) {
        exit_usage("--seconds must be at least 0.1", USAGE);
    }
    let settings = Settings {
        run: std::time::Duration::from_secs_f64(secs),
        ..Settings::default()
    };

    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"));
    let throughput = criterion_results(&target.join("criterion"));
    let hit_ratios = cache_aside_hit_ratios(&target.join("criterion"));
    let sources = source_runs(&target.join("criterion"));
    eprintln!("throughput: {} criterion results", throughput.len());

    eprintln!("memory: {MEMORY_ENTRIES} entries per cache, each in a fresh process");
    let exe = std::env::current_exe().expect("the report's own path");
    let footprints = memory::median_footprints(&exe, MEMORY_ENTRIES, 3);

    eprintln!(
        "stampedes: {} configurations, {secs} s each",
        Config::ALL.len()
    );
    let reports: Vec<Report> = Config::ALL
        .iter()
        .map(|&c| stampede::run(c, &settings))
        .collect();

    let trace_dir = flags
        .raw("--traces")
        .last()
        .map(PathBuf::from)
        .or_else(trace::default_dir);
    let (cells, note) = match trace_dir.as_deref().map(trace::files_in) {
        Some(Ok(files)) if !files.is_empty() => {
            eprintln!("hit ratio: {} traces", files.len());
            let mut cells = Vec::new();
            for f in files {
                let t = trace::read(&f).unwrap_or_else(|e| exit_usage(&e, USAGE));
                for &cap in t.format.default_capacities() {
                    cells.push(hitratio::cell(&t, cap, hitratio::DEFAULT_RUNS));
                }
            }
            (cells, String::new())
        }
        _ => (
            Vec::new(),
            "No traces were found (pass `--traces DIR` or set `HERDCACHE_TRACES`), so this \
             section was not measured."
                .to_owned(),
        ),
    };

    eprintln!("fleet: 2, 4 and 8 instances, local and Redis");
    let fleet_reports = RedisServer::start().and_then(|server| {
        let mut out = Vec::new();
        for k in [2, 4, 8] {
            let s = FleetSettings {
                instances: k,
                ..FleetSettings::default()
            };
            out.push(fleet::run(&s, None)?);
            out.push(fleet::run(&s, Some(&server.url()))?);
        }
        Ok(out)
    });

    eprintln!("fleet coherence: 2, 4 and 8 reader instances");
    let coherence_reports = RedisServer::start().and_then(|server| {
        [2, 4, 8]
            .into_iter()
            .map(|k| {
                let s = CoherenceSettings {
                    instances: k,
                    ..CoherenceSettings::default()
                };
                coherence::run(&s, &server.url())
            })
            .collect::<Result<Vec<_>, String>>()
    });

    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Benchmarks\n\nGenerated by `cargo run --release -p herdcache-bench --bin \
         bench-report` (after `cargo bench -p herdcache-bench --bench throughput`); do not \
         edit by hand, re-run it.\n\n- Machine: {}\n- Versions: {}\n- Hit-path details \
         (single-threaded cost of one hit next to std's `HashMap`): `cargo bench --bench \
         hit_path`.\n",
        machine(),
        versions()
    );
    throughput_section(&throughput, &hit_ratios, &out_dir, &mut md);
    source_section(&throughput, &sources, &mut md);
    memory_section(&footprints, MEMORY_ENTRIES, &mut md);
    stampede_section(&reports, &settings, &out_dir, &mut md);
    fleet_section(&fleet_reports, &out_dir, &mut md);
    coherence_section(&coherence_reports, &out_dir, &mut md);
    hitratio_section(&cells, &note, &out_dir, &mut md);
    write_file(&out_dir.join("BENCHMARKS.md"), &md);
    eprintln!("wrote {}", out_dir.join("BENCHMARKS.md").display());
}
