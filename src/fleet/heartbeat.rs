//! Keeps the soft locks this instance holds alive while their loads run.
//!
//! A lock is set with a short time to live (two heartbeats) and renewed every heartbeat by
//! one thread, for all the locks the instance holds in one script, until its holder releases
//! it or its lease passes. So a holder that dies (killed, frozen, cut off) costs the others
//! about two heartbeats, not its lease, and a lock restored from a snapshot after a restart
//! lapses as fast. The thread blocks on Redis, never on a runtime: a loader that blocks its
//! runtime's thread still has its lock renewed, up to its lease.

use std::collections::HashMap;
use std::sync::Arc;

use crate::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::{Client, Connection, Script};

/// KEYS: locks. ARGV: the TTL (ms), then each lock's token. Extends each lock that still
/// holds its token (compare-and-expire, like the release's compare-and-delete).
const RENEW: &str = "
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i + 1] then redis.call('PEXPIRE', key, ARGV[1]) end
end
return 1
";

/// The time to live a lock is set with, and renewed to: two heartbeats, so one late renewal
/// is not a lapse.
pub(crate) fn lock_ttl(heartbeat: Duration) -> Duration {
    2 * heartbeat
}

/// How long the thread waits for a new lock before it ends (a later hold starts another).
const IDLE: Duration = Duration::from_secs(10);

/// The renewing thread's handle: held locks, and the thread's lifetime.
pub(crate) struct Heartbeat {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    client: Client,
    interval: Duration,
    timeout: Duration,
    script: Script,
}

struct Held {
    token: String,
    /// The end of its holder's lease: no renewal past it.
    until: Instant,
    /// When it is next renewed: one heartbeat after it was set or last renewed, so a load
    /// shorter than a heartbeat costs no renewal at all.
    due: Instant,
}

#[derive(Default)]
struct State {
    /// Lock key → what renewing it takes.
    held: HashMap<String, Held>,
    running: bool,
    stopped: bool,
}

impl Heartbeat {
    /// Renews held locks every `interval` to twice that; each command bounded by `timeout`.
    pub(crate) fn new(client: Client, interval: Duration, timeout: Duration) -> Self {
        Heartbeat {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                wake: Condvar::new(),
                client,
                interval,
                timeout,
                script: Script::new(RENEW),
            }),
        }
    }

    /// Renews `lock` while it holds `token`, until `until` or [`unhold`](Self::unhold).
    pub(crate) fn hold(&self, lock: &str, token: &str, until: Instant) {
        let mut state = self.shared.lock();
        let held = Held {
            token: token.to_owned(),
            until,
            due: Instant::now() + self.shared.interval,
        };
        state.held.insert(lock.to_owned(), held);
        if state.running {
            // The thread may be waiting for work rather than for its next beat.
            self.shared.wake.notify_all();
        } else {
            let shared = Arc::clone(&self.shared);
            let spawned = std::thread::Builder::new()
                .name("herdcache-heartbeat".into())
                .spawn(move || shared.run());
            // Without a thread the lock simply lapses at its TTL: the load still runs, and
            // its publish is refused if another instance took the lock meanwhile.
            state.running = spawned.is_ok();
        }
    }

    /// Stops renewing `lock`.
    pub(crate) fn unhold(&self, lock: &str) {
        self.shared.lock().held.remove(lock);
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.shared.lock().stopped = true;
        self.shared.wake.notify_all();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is a map and flags, each update one call: a panic cannot leave it torn.
        self.state.lock()
    }

    fn run(&self) {
        let mut conn: Option<Connection> = None;
        let mut state = self.lock();
        let mut idle_since = Instant::now();
        loop {
            if state.stopped {
                break;
            }
            let now = Instant::now();
            state.held.retain(|_, h| h.until > now);
            let Some(next) = state.held.values().map(|h| h.due).min() else {
                if idle_since.elapsed() >= IDLE {
                    break;
                }
                state = self.wait(state, IDLE);
                continue;
            };
            idle_since = now;
            if next > now {
                state = self.wait(state, next - now);
                continue;
            }
            let mut locks = Vec::new();
            for (lock, h) in state.held.iter_mut().filter(|(_, h)| h.due <= now) {
                h.due = now + self.interval;
                locks.push((lock.clone(), h.token.clone()));
            }
            drop(state);
            if self.renew(&mut conn, &locks).is_err() {
                // Redis unreachable: the locks lapse, and their publishes are refused.
                conn = None;
            }
            state = self.lock();
        }
        state.running = false;
    }

    fn wait<'a>(&'a self, state: MutexGuard<'a, State>, d: Duration) -> MutexGuard<'a, State> {
        self.wake.wait_timeout(state, d)
    }

    fn renew(
        &self,
        conn: &mut Option<Connection>,
        locks: &[(String, String)],
    ) -> redis::RedisResult<()> {
        if conn.is_none() {
            let c = self.client.get_connection_with_timeout(self.timeout)?;
            c.set_read_timeout(Some(self.timeout))?;
            c.set_write_timeout(Some(self.timeout))?;
            *conn = Some(c);
        }
        let c = conn.as_mut().expect("connected above");
        let mut call = self.script.prepare_invoke();
        call.arg(self.ttl_millis());
        for (lock, token) in locks {
            call.key(lock).arg(token);
        }
        call.invoke::<i64>(c).map(drop)
    }

    fn ttl_millis(&self) -> u64 {
        lock_ttl(self.interval).as_millis().max(1) as u64
    }
}
