//! The fleet tier over TLS (feature `tls`): a `rediss://` URL reaches a `redis-server` that
//! speaks only TLS, with a certificate from a CA made for the test and trusted through
//! `SSL_CERT_FILE`. Skipped, with a message, without `redis-server` or `openssl`.
#![cfg(feature = "tls")]

#[path = "common/redis_server.rs"]
mod redis_server;

mod common;
use common::wait_until;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use herdcache::fleet::{RedisTier, Utf8};
use herdcache::Cache;
use redis_server::RedisServer;

/// Runs `openssl` with `args` in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let ok = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "openssl {args:?}");
}

/// A CA, and a certificate it signed for 127.0.0.1: (CA, certificate, key).
fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    openssl(
        dir,
        &[
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ]
        .iter()
        .chain(&[
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-subj",
            "/CN=herdcache test CA",
        ])
        .copied()
        .collect::<Vec<_>>(),
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ]
        .iter()
        .chain(&["-subj", "/CN=127.0.0.1"])
        .copied()
        .collect::<Vec<_>>(),
    );
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
        ]
        .iter()
        .chain(&[
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "san.ext",
            "-out",
            "server.pem",
        ])
        .copied()
        .collect::<Vec<_>>(),
    );
    (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    )
}

/// Two instances share a value through a TLS-only Redis. (`rediss://` URLs were rejected.)
#[test]
fn a_tier_reaches_redis_over_tls() {
    let has_openssl = Command::new("openssl")
        .arg("version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_openssl {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr().lock(),
            "SKIPPED a_tier_reaches_redis_over_tls: openssl is not installed"
        );
        return;
    }
    let dir = std::env::temp_dir().join(format!("herdcache-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca, cert, key) = certificates(&dir);
    let Some(redis) =
        RedisServer::start_tls("a_tier_reaches_redis_over_tls", cert, key, ca.clone())
    else {
        return;
    };
    // The only test in this binary: nothing else reads the environment meanwhile.
    std::env::set_var("SSL_CERT_FILE", &ca);
    let url = format!("rediss://127.0.0.1:{}/", redis.port);
    let tier = || {
        RedisTier::builder(&url)
            .key_prefix("tls:")
            .op_timeout(Duration::from_secs(2))
            .coherence_bound(Duration::from_secs(2))
            .build(|k: &String| k.clone(), Utf8)
            .expect("a rediss:// URL with the tls feature")
    };
    assert_eq!(tier().check(), Ok(()));
    let instance = || {
        Cache::builder()
            .max_capacity(10)
            .shared_tier(tier())
            .build()
            .unwrap()
    };
    let (a, b): (Cache<String, String>, Cache<String, String>) = (instance(), instance());
    wait_until("both instances subscribed over TLS", || {
        [&a, &b]
            .iter()
            .all(|c| c.shared_status().is_some_and(|s| s.subscribed))
    });
    let k = "k".to_owned();
    assert_eq!(
        a.get_or_load(&k, |_| Ok::<_, ()>("a's".into())).as_deref(),
        Ok("a's")
    );
    assert_eq!(
        b.get_or_load(&k, |_| Err::<String, ()>(())).as_deref(),
        Ok("a's"),
        "B read A's value from Redis"
    );
    a.invalidate(&k);
    wait_until("B hears A's invalidation over TLS", || b.get(&k).is_none());
    assert_eq!((a.stats().shared_errors, b.stats().shared_errors), (0, 0));
    let _ = std::fs::remove_dir_all(&dir);
}
