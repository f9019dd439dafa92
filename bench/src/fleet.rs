//! The fleet stampede benchmark: K instance processes (this binary re-executed) read one hot
//! key that expires again and again, with local single flight only or coordinated through
//! Redis; source loads per expiry across the fleet, read latency percentiles, and the Redis
//! commands and bytes each expiry cost.
//!
//! It starts its own `redis-server` (loopback, a free port, a temporary directory, no
//! persistence) and needs one installed.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use herdcache::fleet::{RedisTier, Utf8};
use herdcache::Cache;
use serde::Serialize;

/// The environment variable that makes a process a fleet child.
const CHILD: &str = "HERDCACHE_FLEET_BENCH_CHILD";

/// The fleet benchmark's settings.
#[derive(Debug, Clone, Copy)]
pub struct FleetSettings {
    /// Instance processes.
    pub instances: usize,
    /// Reader threads per instance.
    pub readers: usize,
    /// Reads per second per instance.
    pub rate: u64,
    /// Time one source load takes.
    pub load: Duration,
    /// The key's TTL.
    pub ttl: Duration,
    /// Length of the run.
    pub run: Duration,
}

impl Default for FleetSettings {
    fn default() -> Self {
        FleetSettings {
            instances: 4,
            readers: 2,
            rate: 2_000,
            load: Duration::from_millis(20),
            ttl: Duration::from_millis(250),
            run: Duration::from_secs(3),
        }
    }
}

/// One measured configuration.
#[derive(Debug, Clone, Serialize)]
pub struct FleetReport {
    /// "local" or "redis".
    pub mode: String,
    /// Instance processes.
    pub instances: usize,
    /// Source loads across the fleet.
    pub loads: usize,
    /// Expiries seen (groups of loads closer than half a TTL).
    pub expiries: usize,
    /// Mean source loads per expiry.
    pub per_expiry: f64,
    /// Most source loads for one expiry.
    pub worst_expiry: usize,
    /// Reads across the fleet.
    pub reads: usize,
    /// Read latency percentiles, nanoseconds.
    pub p50_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// Slowest read.
    pub max_ns: u64,
    /// Redis commands per expiry sent by all instances together (0 without Redis), keep-alives
    /// and subscriptions included: the calls of the commands a client sends (`EVALSHA`,
    /// `EVAL`, `SET`, `PING`, `SUBSCRIBE`, `SCRIPT LOAD`) in `INFO commandstats`, so not the
    /// commands a script runs inside Redis (a few of which are `SET`s too).
    pub commands_per_expiry: f64,
    /// Bytes into Redis per expiry (`total_net_input_bytes`).
    pub bytes_in_per_expiry: f64,
    /// Bytes out of Redis per expiry (`total_net_output_bytes`: replies and messages).
    pub bytes_out_per_expiry: f64,
}

/// A private `redis-server`, killed on drop.
pub struct RedisServer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl RedisServer {
    /// Starts one, or says why it cannot.
    pub fn start() -> Result<Self, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let dir = std::env::temp_dir().join(format!("herdcache-bench-redis-{port}"));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "redis-server did not start ({e}); install it (apt-get install redis-server)"
                )
            })?;
        let s = RedisServer { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err("redis-server did not start listening".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(s)
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

/// Runs this process as a fleet child if it was started as one (then exits).
pub fn child_main_if_requested() {
    crate::coherence::child_main_if_requested();
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let f: Vec<&str> = spec.split(' ').collect();
    let [id, url, source, latencies, readers, rate, load_ms, ttl_ms, run_ms] = f[..] else {
        eprintln!("bad {CHILD}: {spec}");
        std::process::exit(2);
    };
    let num = |s: &str| s.parse::<u64>().unwrap_or(0);
    let (id, readers, rate) = (num(id), num(readers).max(1), num(rate).max(1));
    let (load, ttl, run) = (num(load_ms), num(ttl_ms), num(run_ms));
    let mut b = Cache::builder()
        .max_capacity(100)
        .time_to_live(Duration::from_millis(ttl));
    if url != "-" {
        let tier = RedisTier::builder(url)
            .key_prefix("fleet-bench:")
            .lease(Duration::from_secs(5))
            .wait_bound(Duration::from_secs(2))
            .build(|k: &u64| k.to_string(), Utf8)
            .expect("valid tier settings");
        b = b.shared_tier(tier);
    }
    let cache: Cache<u64, String> = b.build().expect("valid cache settings");
    let source = PathBuf::from(source);
    let loader = |_: &u64| {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&source)
        {
            let _ = writeln!(f, "{id} {}", now_ms());
        }
        std::thread::sleep(Duration::from_millis(load));
        Ok::<_, ()>(format!("value from instance {id}"))
    };
    let period = Duration::from_secs_f64(readers as f64 / rate as f64);
    let end = Instant::now() + Duration::from_millis(run);
    let all: Vec<u32> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..readers)
            .map(|r| {
                let (cache, loader) = (&cache, &loader);
                s.spawn(move || {
                    let mut lat = Vec::new();
                    let mut next = Instant::now() + period.mul_f64(r as f64 / readers as f64);
                    while next < end {
                        let now = Instant::now();
                        if now < next {
                            std::thread::sleep(next - now);
                        }
                        next += period;
                        let t = Instant::now();
                        let _ = cache.get_or_load(&0, loader);
                        lat.push(t.elapsed().as_nanos().min(u32::MAX as u128) as u32);
                    }
                    lat
                })
            })
            .collect();
        hs.into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let bytes: Vec<u8> = all.iter().flat_map(|v| v.to_le_bytes()).collect();
    if let Err(e) = std::fs::write(latencies, bytes) {
        eprintln!("writing latencies: {e}");
        std::process::exit(1);
    }
    std::process::exit(0);
}

/// Runs K instances, coordinated through the server at `url` or (`None`) local only.
pub fn run(s: &FleetSettings, url: Option<&str>) -> Result<FleetReport, String> {
    let dir = std::env::temp_dir().join(format!("herdcache-fleet-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let source = dir.join("source");
    let _ = std::fs::remove_file(&source);
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    if let Some(url) = url {
        traffic(url, true)?;
    }
    let children: Vec<(Child, PathBuf)> = (0..s.instances)
        .map(|id| {
            let lat = dir.join(format!("latencies-{id}"));
            let spec = format!(
                "{id} {} {} {} {} {} {} {} {}",
                url.unwrap_or("-"),
                source.display(),
                lat.display(),
                s.readers,
                s.rate,
                s.load.as_millis(),
                s.ttl.as_millis(),
                s.run.as_millis()
            );
            let child = Command::new(&exe)
                .env(CHILD, spec)
                .stdout(Stdio::null())
                .spawn()
                .map_err(|e| e.to_string())?;
            Ok((child, lat))
        })
        .collect::<Result<_, String>>()?;
    let mut lat: Vec<u32> = Vec::new();
    for (mut child, path) in children {
        let status = child.wait().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("an instance failed: {status}"));
        }
        let mut bytes = Vec::new();
        std::fs::File::open(&path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(|e| e.to_string())?;
        lat.extend(
            bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        );
    }
    let used = match url {
        Some(url) => traffic(url, false)?,
        None => Traffic::default(),
    };
    let groups = loads_per_expiry(&source, s.ttl.as_millis() as u64 / 2);
    let _ = std::fs::remove_dir_all(&dir);
    let per_expiry = |n: u64| n as f64 / groups.len().max(1) as f64;
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len().max(1) - 1) as f64 * p) as usize)
            .copied()
            .unwrap_or(0) as u64
    };
    let loads: usize = groups.iter().sum();
    Ok(FleetReport {
        mode: if url.is_some() { "redis" } else { "local" }.into(),
        instances: s.instances,
        loads,
        expiries: groups.len(),
        per_expiry: loads as f64 / groups.len().max(1) as f64,
        worst_expiry: groups.iter().copied().max().unwrap_or(0),
        reads: lat.len(),
        p50_ns: pct(0.5),
        p99_ns: pct(0.99),
        max_ns: lat.last().copied().unwrap_or(0) as u64,
        commands_per_expiry: per_expiry(used.commands),
        bytes_in_per_expiry: per_expiry(used.bytes_in),
        bytes_out_per_expiry: per_expiry(used.bytes_out),
    })
}

/// What a Redis server has done since its counters were last reset.
#[derive(Debug, Default, Clone, Copy)]
struct Traffic {
    commands: u64,
    bytes_in: u64,
    bytes_out: u64,
}

/// Reads the server's traffic counters (`INFO stats`) and, with `reset`, zeroes them
/// (`CONFIG RESETSTAT`) after.
fn traffic(url: &str, reset: bool) -> Result<Traffic, String> {
    let addr = url
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let mut conn = TcpStream::connect(&addr).map_err(|e| format!("{addr}: {e}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    conn.write_all(b"INFO stats\r\nINFO commandstats\r\n")
        .map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(conn.try_clone().map_err(|e| e.to_string())?);
    let mut bulk = || -> Result<String, String> {
        let mut header = String::new();
        reader.read_line(&mut header).map_err(|e| e.to_string())?;
        let len: usize = header
            .trim()
            .strip_prefix('$')
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("INFO replied {header:?}"))?;
        let mut body = vec![0; len + 2];
        reader.read_exact(&mut body).map_err(|e| e.to_string())?;
        Ok(String::from_utf8_lossy(&body).into_owned())
    };
    let (stats, commands) = (bulk()?, bulk()?);
    let field = |name: &str| -> u64 {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
            .unwrap_or(0)
    };
    let calls = |name: &str| -> u64 {
        commands
            .lines()
            .find_map(|l| {
                let rest = l.strip_prefix("cmdstat_")?.strip_prefix(name)?;
                rest.strip_prefix(":calls=")?
                    .split(',')
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    };
    let t = Traffic {
        commands: ["evalsha", "eval", "set", "ping", "subscribe", "script|load"]
            .iter()
            .map(|c| calls(c))
            .sum(),
        bytes_in: field("total_net_input_bytes"),
        bytes_out: field("total_net_output_bytes"),
    };
    if reset {
        conn.write_all(b"CONFIG RESETSTAT\r\n")
            .map_err(|e| e.to_string())?;
        let mut ok = String::new();
        BufReader::new(conn)
            .read_line(&mut ok)
            .map_err(|e| e.to_string())?;
    }
    Ok(t)
}

/// Groups the source's loads (one line `<instance> <unix ms>` each) into expiries: loads less
/// than `gap` ms apart answer the same one.
fn loads_per_expiry(source: &Path, gap: u64) -> Vec<usize> {
    let mut times: Vec<u64> = std::fs::File::open(source)
        .map(|f| {
            BufReader::new(f)
                .lines()
                .map_while(Result::ok)
                .filter_map(|l| l.split_once(' ')?.1.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    times.sort_unstable();
    let mut groups: Vec<usize> = Vec::new();
    let mut last: Option<u64> = None;
    for t in times {
        match (last, groups.last_mut()) {
            (Some(prev), Some(g)) if t - prev < gap => *g += 1,
            _ => groups.push(1),
        }
        last = Some(t);
    }
    groups
}

/// The reports as a Markdown table.
pub fn table(reports: &[FleetReport]) -> String {
    let ns = |v: u64| format!("{:.1?}", Duration::from_nanos(v));
    let mut t = String::from(
        "| instances | coordination | source loads | expiries | loads per expiry | most for one expiry | reads | p50 | p99 | max | Redis commands per expiry | bytes in / out per expiry |\n\
         | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in reports {
        t.push_str(&format!(
            "| {} | {} | {} | {} | {:.2} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.instances,
            if r.mode == "redis" {
                "Redis soft lock"
            } else {
                "local single flight only"
            },
            r.loads,
            r.expiries,
            r.per_expiry,
            r.worst_expiry,
            r.reads,
            ns(r.p50_ns),
            ns(r.p99_ns),
            ns(r.max_ns),
            if r.mode == "redis" {
                format!("{:.1}", r.commands_per_expiry)
            } else {
                "-".into()
            },
            if r.mode == "redis" {
                format!(
                    "{:.0} / {:.0}",
                    r.bytes_in_per_expiry, r.bytes_out_per_expiry
                )
            } else {
                "-".into()
            },
        ));
    }
    t
}
