//! The protocol's store on a real Redis: blocking connections for threads, a multiplexed
//! async connection (tokio) for futures. Every operation is bounded by the tier's timeout.

use std::sync::Mutex;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Cmd, Connection, FromRedisValue, Pipeline};

use super::protocol::{Read, Store, StoreError};

/// Compare-and-delete: frees the lock only for the holder of its token.
const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

/// Most idle blocking connections kept for reuse.
const POOL: usize = 16;

fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError(e.to_string())
}

fn get_with_ttl(key: &str) -> Pipeline {
    let mut p = redis::pipe();
    p.get(key).cmd("PTTL").arg(key);
    p
}

/// `PTTL`'s reply: milliseconds left, -1 for no expiry, -2 for no key.
fn read_reply(reply: (Option<Vec<u8>>, i64)) -> Read {
    let (value, pttl) = reply;
    let ttl = u64::try_from(pttl).ok().map(Duration::from_millis);
    value.map(|v| (v, ttl))
}

fn lock_cmd(lock: &str, token: &str, lease: Duration) -> Cmd {
    let mut c = redis::cmd("SET");
    c.arg(lock)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(lease.as_millis().max(1) as u64);
    c
}

fn write_cmd(key: &str, value: Vec<u8>, ttl: Option<Duration>) -> Cmd {
    let mut c = redis::cmd("SET");
    c.arg(key).arg(value);
    if let Some(t) = ttl {
        c.arg("PX").arg(t.as_millis().max(1) as u64);
    }
    c
}

fn release_cmd(lock: &str, token: &str) -> Cmd {
    let mut c = redis::cmd("EVAL");
    c.arg(RELEASE).arg(1).arg(lock).arg(token);
    c
}

/// Blocking connections, pooled.
pub(crate) struct SyncStore {
    client: Client,
    timeout: Duration,
    idle: Mutex<Vec<Connection>>,
}

impl SyncStore {
    pub(crate) fn new(client: Client, timeout: Duration) -> Self {
        SyncStore {
            client,
            timeout,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Runs `f` on a pooled (or new) connection; a connection that failed is dropped, so the
    /// next operation reconnects.
    fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<T, StoreError> {
        let pooled = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => {
                let c = self
                    .client
                    .get_connection_with_timeout(self.timeout)
                    .map_err(err)?;
                c.set_read_timeout(Some(self.timeout)).map_err(err)?;
                c.set_write_timeout(Some(self.timeout)).map_err(err)?;
                c
            }
        };
        let r = f(&mut conn).map_err(err)?;
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < POOL {
            idle.push(conn);
        }
        Ok(r)
    }

    fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, StoreError> {
        self.with(|c| cmd.query(c))
    }
}

impl Store for SyncStore {
    async fn read(&self, key: &str) -> Result<Read, StoreError> {
        let p = get_with_ttl(key);
        self.with(|c| p.query(c)).map(read_reply)
    }

    async fn try_lock(&self, lock: &str, token: &str, lease: Duration) -> Result<bool, StoreError> {
        self.query::<Option<String>>(&lock_cmd(lock, token, lease))
            .map(|r| r.is_some())
    }

    async fn write(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
    ) -> Result<(), StoreError> {
        self.query::<()>(&write_cmd(key, value, ttl))
    }

    async fn release(&self, lock: &str, token: &str) -> Result<bool, StoreError> {
        self.query::<i64>(&release_cmd(lock, token)).map(|n| n == 1)
    }

    async fn sleep(&self, d: Duration) {
        std::thread::sleep(d)
    }
}

/// One multiplexed async connection, made on first use and remade after a failure.
pub(crate) struct AsyncStore {
    client: Client,
    timeout: Duration,
    conn: Mutex<Option<MultiplexedConnection>>,
}

impl AsyncStore {
    pub(crate) fn new(client: Client, timeout: Duration) -> Self {
        AsyncStore {
            client,
            timeout,
            conn: Mutex::new(None),
        }
    }

    async fn connection(&self) -> Result<MultiplexedConnection, StoreError> {
        let cached = self.conn.lock().unwrap_or_else(|p| p.into_inner()).clone();
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
        .map_err(err)?
        .map_err(err)?;
        *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = Some(c.clone());
        Ok(c)
    }

    /// Runs one request; a failure drops the cached connection.
    async fn run<T, F>(&self, f: impl FnOnce(MultiplexedConnection) -> F) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let c = self.connection().await?;
        let r = match tokio::time::timeout(self.timeout, f(c)).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => err(e),
            Err(e) => err(e),
        };
        *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = None;
        Err(r)
    }
}

impl Store for AsyncStore {
    async fn read(&self, key: &str) -> Result<Read, StoreError> {
        let p = get_with_ttl(key);
        self.run(|mut c| async move { p.query_async(&mut c).await })
            .await
            .map(read_reply)
    }

    async fn try_lock(&self, lock: &str, token: &str, lease: Duration) -> Result<bool, StoreError> {
        let cmd = lock_cmd(lock, token, lease);
        self.run(|mut c| async move { cmd.query_async::<Option<String>>(&mut c).await })
            .await
            .map(|r| r.is_some())
    }

    async fn write(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
    ) -> Result<(), StoreError> {
        let cmd = write_cmd(key, value, ttl);
        self.run(|mut c| async move { cmd.query_async::<()>(&mut c).await })
            .await
    }

    async fn release(&self, lock: &str, token: &str) -> Result<bool, StoreError> {
        let cmd = release_cmd(lock, token);
        self.run(|mut c| async move { cmd.query_async::<i64>(&mut c).await })
            .await
            .map(|n| n == 1)
    }

    async fn sleep(&self, d: Duration) {
        tokio::time::sleep(d).await
    }
}
