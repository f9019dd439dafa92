//! The stampede benchmark: source loads per expiry, concurrent loads, blocked reads and read
//! latency percentiles for each way of filling a hot key that expires under load.
//!
//! Run: `cargo run --release -p herdcache-bench --bin stampede-bench -- [--readers N]
//! [--load-ms L] [--ttl-ms T] [--seconds S] [--rate R] [--config NAME,...] [--json]`.
//! `--config` takes names from `--list`.

use std::time::Duration;

use herdcache_bench::args::{exit_usage, Flags};
use herdcache_bench::stampede::{run, table, Config, Settings};

const USAGE: &str = "stampede-bench [--readers N] [--load-ms L] [--ttl-ms T] [--seconds S] \
                     [--rate R] [--config NAME,...] [--list] [--json]";

fn config_key(c: Config) -> String {
    match c {
        Config::Naive => "naive".into(),
        Config::MokaGetWith => "moka".into(),
        Config::QuickCacheGetOrInsertWith => "quick_cache".into(),
        Config::SingleFlight => "single-flight".into(),
        Config::XFetch(b) => format!("xfetch-{b}"),
        Config::SoftTtl => "soft-ttl".into(),
        Config::SoftTtlSpawned => "soft-ttl-spawner".into(),
    }
}

fn settings(f: &Flags) -> Result<Settings, String> {
    let d = Settings::default();
    let ms = |name: &str, default: Duration, min: f64| -> Result<Duration, String> {
        let v: f64 = f.get(name, default.as_secs_f64() * 1e3)?;
        if !(v >= min && v.is_finite()) {
            return Err(format!("{name} must be at least {min}"));
        }
        Ok(Duration::from_secs_f64(v / 1e3))
    };
    let s = Settings {
        readers: f.get("--readers", d.readers)?,
        load: ms("--load-ms", d.load, 0.0)?,
        ttl: ms("--ttl-ms", d.ttl, 1.0)?,
        run: {
            let secs: f64 = f.get("--seconds", d.run.as_secs_f64())?;
            if !(secs >= 0.1 && secs.is_finite()) {
                return Err("--seconds must be at least 0.1".into());
            }
            Duration::from_secs_f64(secs)
        },
        rate: f.get("--rate", d.rate)?,
    };
    if s.readers == 0 || s.rate == 0 {
        return Err("--readers and --rate must be positive".into());
    }
    Ok(s)
}

fn main() {
    let flags = Flags::parse(
        &[
            "--readers",
            "--load-ms",
            "--ttl-ms",
            "--seconds",
            "--rate",
            "--config",
        ],
        &["--json", "--list", "--help"],
    )
    .unwrap_or_else(|e| exit_usage(&e, USAGE));
    if flags.has("--help") {
        exit_usage("", USAGE);
    }
    if flags.has("--list") {
        for c in Config::ALL {
            println!("{:<18} {}", config_key(c), c.name().trim_start());
        }
        return;
    }
    let s = settings(&flags).unwrap_or_else(|e| exit_usage(&e, USAGE));
    let wanted: Vec<String> = flags
        .list("--config")
        .unwrap_or_else(|e| exit_usage(&e, USAGE));
    let configs: Vec<Config> = if wanted.is_empty() {
        Config::ALL.to_vec()
    } else {
        wanted
            .iter()
            .map(|w| {
                Config::ALL
                    .into_iter()
                    .find(|c| config_key(*c) == *w)
                    .unwrap_or_else(|| {
                        exit_usage(&format!("unknown config {w} (see --list)"), USAGE)
                    })
            })
            .collect()
    };
    if !flags.has("--json") {
        println!(
            "{} readers, {} reads/s in total, source load {:?}, TTL {:?}, {:?} per configuration\n",
            s.readers, s.rate, s.load, s.ttl, s.run
        );
    }
    let reports: Vec<_> = configs.iter().map(|&c| run(c, &s)).collect();
    if flags.has("--json") {
        let out = serde_json::json!({ "settings": s, "reports": reports });
        println!(
            "{}",
            serde_json::to_string_pretty(&out).expect("serialisable")
        );
    } else {
        print!("{}", table(&reports));
        println!(
            "\nper expiry: source loads / (run time / (TTL + load time)); max conc: most source \
             loads at once; blocked: reads that took at least half a load."
        );
    }
}
