//! A private `redis-server` for the fleet tests: loopback, a free port, a temporary
//! directory, no persistence; killed (also on a failed test) when dropped.

// Included by the fleet tests, for which `pub` means "for the including crate".
#![allow(unreachable_pub)]
// Each test crate uses some of these.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
    /// Whether the server keeps an append-only file in `dir` (restarts then find their data).
    aof: bool,
    /// Certificate, key and CA files: the server then speaks TLS only, on `port`.
    tls: Option<[PathBuf; 3]>,
}

impl RedisServer {
    /// Starts a server, or `None` (with a message) when `redis-server` is not installed and
    /// `HERDCACHE_REQUIRE_REDIS` is unset; CI sets it, so there a missing server fails.
    pub fn start(test: &str) -> Option<Self> {
        let found = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            assert!(
                std::env::var_os("HERDCACHE_REQUIRE_REDIS").is_none(),
                "HERDCACHE_REQUIRE_REDIS is set but redis-server is not installed"
            );
            // Straight to the process's standard error, past the test harness's capture of
            // `eprintln!`, which shows a passing test's output only under `--nocapture`: the
            // skip must show in the normal output, where the test is reported "ok".
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr().lock(),
                "SKIPPED {test}: redis-server is not installed (apt-get install redis-server)"
            );
            return None;
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let dir =
            std::env::temp_dir().join(format!("herdcache-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let mut s = RedisServer {
            child: None,
            port,
            dir,
            aof: false,
            tls: None,
        };
        s.restart();
        Some(s)
    }

    /// As `start`, with an append-only file: a server killed and restarted finds its data.
    pub fn start_persistent(test: &str) -> Option<Self> {
        let mut s = Self::start(test)?;
        s.aof = true;
        s.restart();
        Some(s)
    }

    /// As `start`, speaking TLS only with the certificate, key and CA in these PEM files.
    pub fn start_tls(test: &str, cert: PathBuf, key: PathBuf, ca: PathBuf) -> Option<Self> {
        let mut s = Self::start(test)?;
        s.tls = Some([cert, key, ca]);
        s.restart();
        Some(s)
    }

    /// Its directory, for the files a test makes.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Stops the server in its tracks (SIGSTOP), as a stalled host would; `resume` goes on.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused server go on (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("a running server").id();
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A plain client connection, for the tests' own checks.
    pub fn client(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(2))
            .expect("the test's own Redis connection")
    }

    /// Kills the server (as a crash would).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port, empty; returns once it accepts connections.
    pub fn restart(&mut self) {
        self.stop();
        let port = self.port.to_string();
        let mut args = vec!["--bind", "127.0.0.1"];
        match &self.tls {
            None => args.extend(["--port", &port]),
            Some([cert, key, ca]) => args.extend([
                "--port",
                "0",
                "--tls-port",
                &port,
                "--tls-cert-file",
                cert.to_str().expect("a UTF-8 path"),
                "--tls-key-file",
                key.to_str().expect("a UTF-8 path"),
                "--tls-ca-cert-file",
                ca.to_str().expect("a UTF-8 path"),
                "--tls-auth-clients",
                "no",
            ]),
        }
        let child = Command::new("redis-server")
            .args(&args)
            .args([
                "--save",
                "",
                "--appendonly",
                if self.aof { "yes" } else { "no" },
                "--appendfsync",
                "always",
                "--protected-mode",
                "yes",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not start listening"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
