//! The fleet stampede benchmark: K instance processes hammer one hot key that expires again
//! and again, first with local single flight only, then coordinated through Redis; prints
//! source loads per expiry across the fleet and read latency percentiles.
//!
//! With `--coherence`, the coherence mode instead: a writer changes the source and
//! invalidates through its own instance `--writes` times a second while K reader instances
//! read; prints stale reads beyond the tier's coherence bound (the promise: none),
//! propagation percentiles and source loads per write.
//!
//! The stampede mode also reports the Redis commands and bytes each expiry cost the fleet.
//!
//! Needs `redis-server` installed (it starts a private one). Run:
//! `cargo run --release -p herdcache-bench --bin fleet-bench -- [--instances K,...]
//! [--readers N] [--rate R] [--load-ms L] [--ttl-ms T] [--seconds S] [--json]
//! [--coherence [--writes W] [--bound-ms B]]`.

use std::time::Duration;

use herdcache_bench::args::{exit_usage, Flags};
use herdcache_bench::coherence::{self, CoherenceSettings};
use herdcache_bench::fleet::{self, FleetSettings, RedisServer};

const USAGE: &str = "fleet-bench [--instances K,...] [--readers N] [--rate R] [--load-ms L] \
                     [--ttl-ms T] [--seconds S] [--json] [--coherence [--writes W] [--bound-ms B]]";

fn main() {
    fleet::child_main_if_requested();
    let flags = Flags::parse(
        &[
            "--instances",
            "--readers",
            "--rate",
            "--load-ms",
            "--ttl-ms",
            "--seconds",
            "--writes",
            "--bound-ms",
        ],
        &["--json", "--help", "--coherence"],
    )
    .unwrap_or_else(|e| exit_usage(&e, USAGE));
    if flags.has("--help") {
        exit_usage("", USAGE);
    }
    let d = FleetSettings::default();
    let ms = |name: &str, default: Duration| -> Duration {
        let v: f64 = flags
            .get(name, default.as_secs_f64() * 1e3)
            .unwrap_or_else(|e| exit_usage(&e, USAGE));
        if !(v >= 1.0 && v.is_finite()) {
            exit_usage(&format!("{name} must be at least 1"), USAGE);
        }
        Duration::from_secs_f64(v / 1e3)
    };
    let secs: f64 = flags
        .get("--seconds", d.run.as_secs_f64())
        .unwrap_or_else(|e| exit_usage(&e, USAGE));
    if !(secs >= 0.1 && secs.is_finite()) {
        exit_usage("--seconds must be at least 0.1", USAGE);
    }
    let base = FleetSettings {
        readers: flags
            .get("--readers", d.readers)
            .unwrap_or_else(|e| exit_usage(&e, USAGE)),
        rate: flags
            .get("--rate", d.rate)
            .unwrap_or_else(|e| exit_usage(&e, USAGE)),
        load: ms("--load-ms", d.load),
        ttl: ms("--ttl-ms", d.ttl),
        run: Duration::from_secs_f64(secs),
        ..d
    };
    if base.readers == 0 || base.rate == 0 {
        exit_usage("--readers and --rate must be positive", USAGE);
    }
    let instances: Vec<usize> = match flags.raw("--instances").last() {
        None => vec![2, 4, 8],
        Some(list) => list
            .split(',')
            .map(|k| k.trim().parse::<usize>().ok().filter(|&k| k > 0))
            .collect::<Option<_>>()
            .unwrap_or_else(|| exit_usage("--instances takes positive numbers", USAGE)),
    };
    let server = RedisServer::start().unwrap_or_else(|e| {
        eprintln!("fleet-bench: {e}");
        std::process::exit(1);
    });
    if flags.has("--coherence") {
        let c = CoherenceSettings::default();
        let writes: u64 = flags
            .get("--writes", c.writes)
            .unwrap_or_else(|e| exit_usage(&e, USAGE));
        if writes == 0 {
            exit_usage("--writes must be positive", USAGE);
        }
        let base = CoherenceSettings {
            rate: base.rate,
            writes,
            bound: ms("--bound-ms", c.bound),
            load: flags.raw("--load-ms").last().map_or(c.load, |_| base.load),
            run: base.run,
            ..c
        };
        let runs = instances.iter().map(|&k| {
            let s = CoherenceSettings {
                instances: k,
                ..base
            };
            coherence::run(&s, &server.url())
        });
        let header = format!(
            "{} writes/s, {} reads/s per reader instance, source load {:?}, coherence bound {:?}, {:?} per run",
            base.writes, base.rate, base.load, base.bound, base.run
        );
        print_reports(runs, flags.has("--json"), &header, coherence::table);
        return;
    }
    let runs = instances.iter().flat_map(|&k| {
        let s = FleetSettings {
            instances: k,
            ..base
        };
        [None, Some(server.url())].map(move |url| fleet::run(&s, url.as_deref()))
    });
    let header = format!(
        "{} readers x {} reads/s per instance, source load {:?}, TTL {:?}, {:?} per run",
        base.readers, base.rate, base.load, base.ttl, base.run
    );
    print_reports(runs, flags.has("--json"), &header, fleet::table);
}

/// Collects the runs (exiting on the first failure) and prints them as JSON or as a table.
fn print_reports<R: serde::Serialize>(
    runs: impl Iterator<Item = Result<R, String>>,
    json: bool,
    header: &str,
    table: fn(&[R]) -> String,
) {
    let reports: Vec<R> = runs.collect::<Result<_, String>>().unwrap_or_else(|e| {
        eprintln!("fleet-bench: {e}");
        std::process::exit(1);
    });
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&reports).expect("reports serialise")
        );
    } else {
        println!("{header}\n");
        print!("{}", table(&reports));
    }
}
