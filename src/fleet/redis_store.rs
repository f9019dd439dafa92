//! The protocol's store on a real Redis: blocking connections for threads, a multiplexed
//! async connection (tokio) for futures. Every operation is bounded by the tier's timeout.

use std::sync::{Arc, LazyLock};

use crate::sync::Mutex;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, Cmd, Connection, ConnectionLike, FromRedisValue, RedisResult,
    Script, ScriptInvocation,
};

use super::heartbeat::Heartbeat;
use super::protocol::{Keys, Snapshot, Stamp, Store, StoreError};

/// The tier-wide keys: the epoch `invalidate_all` moves, and the sequence every generation
/// is drawn from.
#[derive(Debug, Clone)]
pub(crate) struct TierKeys {
    pub(crate) epoch: String,
    pub(crate) sequence: String,
    /// Tagged bytes longer than this (the value limit and its tag) are not read.
    pub(crate) max_value_size: usize,
}

/// Compare-and-delete: frees the lock only for the holder of its token.
const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

/// A counter that never repeats a value, even if Redis lost it (restarted without persistence,
/// or evicted it): a missing counter starts again from the server's clock in microseconds,
/// past every value it handed out before. Digits are kept as strings (Lua's numbers are
/// doubles, and print large ones in exponent form).
///
/// Bookkeeping keys heal themselves: one that does not hold a number (garbage written by
/// hand, a key of another type) counts as missing, and is deleted by whichever script meets
/// it, so the next write gives it a fresh value. One corrupt key used to fail every write
/// (`seq`), every load (`epoch`), or mark the whole tier down each time it was read (`g:`).
const FRESH: &str = "
local function num(key)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' or (v and not tonumber(v)) then
    redis.call('DEL', key)
    return nil
  end
  return v or nil
end
local function fresh(key)
  if not num(key) then
    local t = redis.call('TIME')
    redis.call('SET', key, t[1] .. string.format('%06d', tonumber(t[2])))
  end
  redis.call('INCR', key)
  return redis.call('GET', key)
end
local function current(key)
  return num(key) or '0'
end
local function value(key)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' then return false end
  return v
end
";

/// KEYS: value, generation, epoch, sequence. ARGV: the largest value to return (longer ones
/// read as missing: they would not cross the wire in time), then a generation TTL (ms) to
/// claim with, or nothing. The value, its PTTL, and the key's stamp. Claiming (the lock's holder, before it
/// loads) first gives a key without a generation (or a tier without an epoch) one, so the
/// stamp it loads under is never "not set": a generation that disappears while it loads (an
/// eviction, a failover) then fails its compare-and-set instead of matching again.
const READ: &str = "
if ARGV[2] then
  if not num(KEYS[2]) then
    redis.call('SET', KEYS[2], fresh(KEYS[4]), 'PX', ARGV[2])
  end
  if not num(KEYS[3]) then fresh(KEYS[3]) end
end
local v = false
if redis.pcall('STRLEN', KEYS[1]) <= tonumber(ARGV[1]) then v = value(KEYS[1]) end
local t = redis.call('PTTL', KEYS[1])
return {v, t, num(KEYS[2]) or false, num(KEYS[3]) or false}
";

/// KEYS: value, generation, epoch, lock. ARGV: expected generation and epoch, payload, TTL
/// (ms), generation TTL (ms), the lock's token. Writes `epoch:generation:payload` only if the
/// writer still holds the lock (a holder frozen past its heartbeat may have been replaced)
/// and the stamp is still the expected one (never "not set": the holder claimed a stamp
/// before loading), and keeps the generation at least as long as the value.
const PUBLISH: &str = "
if redis.call('GET', KEYS[4]) ~= ARGV[6] then return 0 end
local g = current(KEYS[2])
local e = current(KEYS[3])
if g == '0' or e == '0' or g ~= ARGV[1] or e ~= ARGV[2] then return 0 end
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[5]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
end
redis.call('SET', KEYS[1], e .. ':' .. g .. ':' .. ARGV[3], 'PX', ARGV[4])
return 1
";

/// KEYS: generation, sequence, epoch, then the value to write, if any. ARGV: generation TTL
/// (ms), channel, message, then payload and TTL (ms) if writing. Moves the key's generation
/// (so every value written before is stale, and every load in flight is refused), writes the
/// new value under it, and tells the other instances.
const WRITE: &str = "
local g = fresh(KEYS[2])
redis.call('SET', KEYS[1], g, 'PX', ARGV[1])
if KEYS[4] then
  local e = current(KEYS[3])
  if e == '0' then e = fresh(KEYS[3]) end
  redis.call('SET', KEYS[4], e .. ':' .. g .. ':' .. ARGV[4], 'PX', ARGV[5])
end
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
";

/// KEYS: epoch. ARGV: channel, message. Every value written before is stale.
const INVALIDATE_ALL: &str = "
fresh(KEYS[1])
redis.call('PUBLISH', ARGV[1], ARGV[2])
return 1
";

/// Most idle blocking connections kept for reuse.
const POOL: usize = 16;

/// A Redis error: Redis unreachable (a connection that failed or timed out), which marks
/// the tier down for a while, or an error reply about one key, which does not.
fn err(e: redis::RedisError) -> StoreError {
    let auth = is_auth(&e);
    // Refused credentials fail every command alike: skipped for a while, like an outage.
    let unreachable = auth
        || e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal();
    StoreError {
        auth,
        ..StoreError::new(e.to_string(), unreachable)
    }
}

/// Whether Redis refused the connection's credentials (a wrong user or password), or wants
/// some that the URL does not give.
pub(crate) fn is_auth(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM"))
}

/// An operation that ran past the tier's timeout.
fn timed_out(e: tokio::time::error::Elapsed) -> StoreError {
    StoreError::new(e.to_string(), true)
}

/// One Redis operation: a plain command, or a script sent by its SHA1 (`EVALSHA`, the
/// script loaded once per server on `NOSCRIPT`, so a restarted or flushed server gets it
/// again). Sending each script's source with every call cost 1.2 KB per instance per
/// key-expiry.
enum Op {
    Cmd(Cmd),
    Script(ScriptInvocation<'static>),
}

impl Op {
    fn run<T: FromRedisValue>(&self, c: &mut Connection) -> RedisResult<T> {
        match self {
            Op::Cmd(cmd) => cmd.query(c),
            Op::Script(s) => s.invoke(c),
        }
    }

    async fn run_async<T: FromRedisValue>(&self, c: &mut MultiplexedConnection) -> RedisResult<T> {
        match self {
            Op::Cmd(cmd) => cmd.query_async(c).await,
            Op::Script(s) => s.invoke_async(c).await,
        }
    }
}

/// A script with the shared helpers (`FRESH`) in front of `body`.
fn with_helpers(body: &str) -> Script {
    Script::new(&format!("{FRESH}{body}"))
}

static READ_SCRIPT: LazyLock<Script> = LazyLock::new(|| with_helpers(READ));
static PUBLISH_SCRIPT: LazyLock<Script> = LazyLock::new(|| with_helpers(PUBLISH));
static WRITE_SCRIPT: LazyLock<Script> = LazyLock::new(|| with_helpers(WRITE));
static INVALIDATE_ALL_SCRIPT: LazyLock<Script> = LazyLock::new(|| with_helpers(INVALIDATE_ALL));
static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE));

fn read_cmd(keys: Keys<'_>, tier: &TierKeys, claim: Option<Duration>) -> Op {
    let mut c = READ_SCRIPT.prepare_invoke();
    c.key(keys.value)
        .key(keys.generation)
        .key(&tier.epoch)
        .key(&tier.sequence)
        .arg(tier.max_value_size);
    if let Some(ttl) = claim {
        c.arg(millis(ttl));
    }
    Op::Script(c)
}

/// `READ`'s reply: the value, `PTTL` (milliseconds left, negative for no expiry or no key),
/// and the stamp (nil parts are 0).
type ReadReply = (Option<Vec<u8>>, i64, Option<u64>, Option<u64>);

fn snapshot(reply: ReadReply) -> Snapshot {
    let (value, pttl, generation, epoch) = reply;
    // Every value the tier writes has an expiry; one without (written by hand) counts as
    // expiring now, which a refresh never takes and a miss does.
    let ttl = Duration::from_millis(u64::try_from(pttl).unwrap_or(0));
    Snapshot {
        value: value.map(|v| (v, ttl)),
        current: Stamp {
            epoch: epoch.unwrap_or(0),
            generation: generation.unwrap_or(0),
        },
    }
}

fn millis(d: Duration) -> u64 {
    d.as_millis().clamp(1, u64::MAX as u128) as u64
}

fn publish_cmd(
    keys: Keys<'_>,
    tier: &TierKeys,
    token: &str,
    expected: Stamp,
    payload: Vec<u8>,
    ttl: Duration,
    generation_ttl: Duration,
) -> Op {
    let mut c = PUBLISH_SCRIPT.prepare_invoke();
    c.key(keys.value)
        .key(keys.generation)
        .key(&tier.epoch)
        .key(keys.lock)
        .arg(expected.generation.to_string())
        .arg(expected.epoch.to_string())
        .arg(payload)
        .arg(millis(ttl))
        .arg(millis(generation_ttl))
        .arg(token);
    Op::Script(c)
}

/// A write through the tier: an invalidation (no value), or an insert.
pub(crate) struct Write<'a> {
    pub(crate) generation_key: &'a str,
    pub(crate) generation_ttl: Duration,
    pub(crate) value: Option<(&'a str, Vec<u8>, Duration)>,
    pub(crate) channel: &'a str,
    pub(crate) message: &'a str,
}

fn write_cmd(w: Write<'_>, tier: &TierKeys) -> Op {
    let mut c = WRITE_SCRIPT.prepare_invoke();
    c.key(w.generation_key).key(&tier.sequence).key(&tier.epoch);
    if let Some((key, _, _)) = &w.value {
        c.key(*key);
    }
    c.arg(millis(w.generation_ttl))
        .arg(w.channel)
        .arg(w.message);
    if let Some((_, payload, ttl)) = w.value {
        c.arg(payload).arg(millis(ttl));
    }
    Op::Script(c)
}

fn invalidate_all_cmd(tier: &TierKeys, channel: &str, message: &str) -> Op {
    let mut c = INVALIDATE_ALL_SCRIPT.prepare_invoke();
    c.key(&tier.epoch).arg(channel).arg(message);
    Op::Script(c)
}

fn lock_cmd(lock: &str, token: &str, ttl: Duration) -> Op {
    let mut c = redis::cmd("SET");
    c.arg(lock).arg(token).arg("NX").arg("PX").arg(millis(ttl));
    Op::Cmd(c)
}

fn release_cmd(lock: &str, token: &str) -> Op {
    let mut c = RELEASE_SCRIPT.prepare_invoke();
    c.key(lock).arg(token);
    Op::Script(c)
}

/// Blocking connections, pooled.
pub(crate) struct SyncStore {
    client: Client,
    timeout: Duration,
    tier: TierKeys,
    idle: Mutex<Vec<Connection>>,
    heartbeat: Arc<Heartbeat>,
}

impl SyncStore {
    pub(crate) fn new(
        client: Client,
        timeout: Duration,
        tier: TierKeys,
        heartbeat: Arc<Heartbeat>,
    ) -> Self {
        SyncStore {
            client,
            timeout,
            tier,
            idle: Mutex::new(Vec::new()),
            heartbeat,
        }
    }

    /// A new connection, with the tier's timeouts.
    fn connect(&self) -> Result<Connection, StoreError> {
        let c = self
            .client
            .get_connection_with_timeout(self.timeout)
            .map_err(err)?;
        c.set_read_timeout(Some(self.timeout)).map_err(err)?;
        c.set_write_timeout(Some(self.timeout)).map_err(err)?;
        Ok(c)
    }

    /// Runs `f` on a pooled (or new) connection; a connection that failed is dropped, so the
    /// next operation reconnects. A pooled connection found dead (the server closed it while
    /// it idled: a `timeout` setting, a proxy, a restart, a failover) is dropped and `f`
    /// runs again, once, on a new one: the command never reached a live server, and without
    /// this second try a write on a dead connection was lost while Redis was up.
    fn with<T>(
        &self,
        f: impl Fn(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<T, StoreError> {
        let pooled = self.idle.lock().pop();
        let (conn, r) = match pooled {
            Some(mut c) => match f(&mut c) {
                Err(e) if e.is_connection_dropped() => {
                    drop(c);
                    let mut fresh = self.connect()?;
                    let r = f(&mut fresh);
                    (fresh, r)
                }
                r => (c, r),
            },
            None => {
                let mut fresh = self.connect()?;
                let r = f(&mut fresh);
                (fresh, r)
            }
        };
        let r = r.map_err(err)?;
        let mut idle = self.idle.lock();
        if idle.len() < POOL && conn.is_open() {
            idle.push(conn);
        }
        Ok(r)
    }

    fn query<T: FromRedisValue>(&self, op: &Op) -> Result<T, StoreError> {
        self.with(|c| op.run(c))
    }

    /// An invalidation or an insert, with its broadcast.
    pub(crate) fn write(&self, w: Write<'_>) -> Result<(), StoreError> {
        self.query::<i64>(&write_cmd(w, &self.tier)).map(drop)
    }

    /// Makes every value written so far stale, with its broadcast.
    pub(crate) fn invalidate_all(&self, channel: &str, message: &str) -> Result<(), StoreError> {
        self.query::<i64>(&invalidate_all_cmd(&self.tier, channel, message))
            .map(drop)
    }
}

impl Store for SyncStore {
    async fn read(&self, keys: Keys<'_>, claim: Option<Duration>) -> Result<Snapshot, StoreError> {
        self.query::<ReadReply>(&read_cmd(keys, &self.tier, claim))
            .map(snapshot)
    }

    async fn try_lock(&self, lock: &str, token: &str, ttl: Duration) -> Result<bool, StoreError> {
        self.query::<Option<String>>(&lock_cmd(lock, token, ttl))
            .map(|r| r.is_some())
    }

    fn hold(&self, lock: &str, token: &str, until: Instant) {
        self.heartbeat.hold(lock, token, until)
    }

    fn unhold(&self, lock: &str) {
        self.heartbeat.unhold(lock)
    }

    async fn publish(
        &self,
        keys: Keys<'_>,
        token: &str,
        expected: Stamp,
        payload: Vec<u8>,
        ttl: Duration,
        generation_ttl: Duration,
    ) -> Result<bool, StoreError> {
        let cmd = publish_cmd(
            keys,
            &self.tier,
            token,
            expected,
            payload,
            ttl,
            generation_ttl,
        );
        self.query::<i64>(&cmd).map(|n| n == 1)
    }

    async fn release(&self, lock: &str, token: &str) -> Result<bool, StoreError> {
        self.query::<i64>(&release_cmd(lock, token)).map(|n| n == 1)
    }

    fn release_detached(&self, lock: &str, token: &str) {
        // A thread's holder is only ever dropped while unwinding: blocking is fine.
        let _ = self.query::<i64>(&release_cmd(lock, token));
    }

    async fn sleep(&self, d: Duration) {
        std::thread::sleep(d)
    }
}

/// How an async command failed: on a connection found dead (worth one more try on a new
/// one), or otherwise.
enum Failure {
    Dropped(StoreError),
    Other(StoreError),
}

/// One multiplexed async connection, made on first use and remade after a failure.
pub(crate) struct AsyncStore {
    client: Client,
    timeout: Duration,
    tier: TierKeys,
    conn: Mutex<Option<MultiplexedConnection>>,
    heartbeat: Arc<Heartbeat>,
}

impl AsyncStore {
    pub(crate) fn new(
        client: Client,
        timeout: Duration,
        tier: TierKeys,
        heartbeat: Arc<Heartbeat>,
    ) -> Self {
        AsyncStore {
            client,
            timeout,
            tier,
            conn: Mutex::new(None),
            heartbeat,
        }
    }

    async fn connection(&self) -> Result<MultiplexedConnection, StoreError> {
        let cached = self.conn.lock().clone();
        if let Some(c) = cached {
            return Ok(c);
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let c = tokio::time::timeout(
            self.timeout,
            self.client
                .get_multiplexed_async_connection_with_config(&config),
        )
        .await
        .map_err(timed_out)?
        .map_err(err)?;
        *self.conn.lock() = Some(c.clone());
        Ok(c)
    }

    /// Runs one command; a failure drops the cached connection. A cached connection found
    /// dead (closed by the server while it idled) is replaced and the command runs again,
    /// once, on the new one (see `SyncStore::with`).
    async fn query<T: FromRedisValue + Send>(&self, cmd: Op) -> Result<T, StoreError> {
        let cached = self.conn.lock().clone();
        if let Some(c) = cached {
            match self.query_on(c, &cmd).await {
                Ok(v) => return Ok(v),
                Err(Failure::Dropped(_)) => self.forget_connection(),
                Err(Failure::Other(e)) => {
                    self.forget_connection();
                    return Err(e);
                }
            }
        }
        let c = self.connection().await?;
        match self.query_on(c, &cmd).await {
            Ok(v) => Ok(v),
            Err(Failure::Dropped(e) | Failure::Other(e)) => {
                self.forget_connection();
                Err(e)
            }
        }
    }

    /// Runs `cmd` on `c`, within the timeout.
    async fn query_on<T: FromRedisValue + Send>(
        &self,
        mut c: MultiplexedConnection,
        cmd: &Op,
    ) -> Result<T, Failure> {
        match tokio::time::timeout(self.timeout, cmd.run_async::<T>(&mut c)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if e.is_connection_dropped() => Err(Failure::Dropped(err(e))),
            Ok(Err(e)) => Err(Failure::Other(err(e))),
            Err(e) => Err(Failure::Other(timed_out(e))),
        }
    }

    fn forget_connection(&self) {
        *self.conn.lock() = None;
    }
}

impl Store for AsyncStore {
    async fn read(&self, keys: Keys<'_>, claim: Option<Duration>) -> Result<Snapshot, StoreError> {
        self.query::<ReadReply>(read_cmd(keys, &self.tier, claim))
            .await
            .map(snapshot)
    }

    async fn try_lock(&self, lock: &str, token: &str, ttl: Duration) -> Result<bool, StoreError> {
        self.query::<Option<String>>(lock_cmd(lock, token, ttl))
            .await
            .map(|r| r.is_some())
    }

    fn hold(&self, lock: &str, token: &str, until: Instant) {
        self.heartbeat.hold(lock, token, until)
    }

    fn unhold(&self, lock: &str) {
        self.heartbeat.unhold(lock)
    }

    async fn publish(
        &self,
        keys: Keys<'_>,
        token: &str,
        expected: Stamp,
        payload: Vec<u8>,
        ttl: Duration,
        generation_ttl: Duration,
    ) -> Result<bool, StoreError> {
        let cmd = publish_cmd(
            keys,
            &self.tier,
            token,
            expected,
            payload,
            ttl,
            generation_ttl,
        );
        self.query::<i64>(cmd).await.map(|n| n == 1)
    }

    async fn release(&self, lock: &str, token: &str) -> Result<bool, StoreError> {
        self.query::<i64>(release_cmd(lock, token))
            .await
            .map(|n| n == 1)
    }

    fn release_detached(&self, lock: &str, token: &str) {
        // A cancelled holder: the release runs as a task of its own on the runtime that was
        // running the holder, on the shared connection if there is one.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let conn = self.conn.lock().clone();
        let Some(mut conn) = conn else {
            return; // no connection: the lock lapses, unrenewed, within two heartbeats
        };
        let (cmd, timeout) = (release_cmd(lock, token), self.timeout);
        runtime.spawn(async move {
            let _ = tokio::time::timeout(timeout, cmd.run_async::<i64>(&mut conn)).await;
        });
    }

    async fn sleep(&self, d: Duration) {
        tokio::time::sleep(d).await
    }
}
