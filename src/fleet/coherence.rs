//! Keeping an instance's local copies coherent with the shared tier.
//!
//! Every write through the tier (an invalidation, an insert, `invalidate_all`) is published on
//! the tier's channel in the same atomic step that moves the key's generation. Each instance
//! runs one subscriber thread that hears the other instances' writes and drops the local copy
//! each one made stale. Three races are closed here:
//! - a load of a key that runs while a write of it is heard: the load records the key's slot
//!   before reading the tier, installs, then looks again; if a write of a key in that slot
//!   was heard meanwhile it drops what it installed (the handler, for its part, bumps the slot
//!   before it drops, so one of the two always sees the other);
//! - a link that dies: one that closes (a restart, a failover, a kill, a proxy's reset) is
//!   lost at once, as the subscriber's read fails; one that dies without a word (a partition,
//!   a stalled server) is found by a ping when the channel has been quiet for the keep-alive
//!   interval, lost if the ping is not answered within half the bound;
//! - writes missed while the link was down: when it is lost every local copy is dropped, and
//!   until it is back a copy is kept at most the bound.

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::Client;

use super::redis_store::is_auth;
use super::say_refused;

/// Slots of heard writes, by policy key: a write heard for one key makes the loads of the
/// keys sharing its slot drop what they install (an extra miss, never a stale read).
const SLOTS: usize = 4096;

/// What an instance heard on the tier's channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Heard {
    /// Another instance invalidated or wrote the key with this policy key.
    Key(u64),
    /// Another instance called `invalidate_all`.
    All,
    /// The link to the channel was lost: what was missed cannot be known.
    LinkLost,
    /// Nothing for a while (the link answered a ping).
    Quiet,
}

/// One instance's view of the tier's channel, shared by its loads and its subscriber.
#[derive(Debug)]
pub(crate) struct Coherence {
    /// The fingerprint of the tier's namespace (prefix and database): see `new`.
    namespace: u64,
    /// This instance's id in its messages, so it skips its own.
    instance: u64,
    pub(crate) bound: Duration,
    heard: Box<[AtomicU64]>,
    /// This instance's own writes in progress, and ended, by slot: two own writes of a key
    /// that overlap may reach Redis in one order and the local table in the other, so each
    /// drops its local copy if another overlapped it (an extra miss, never a stale read).
    writing: Box<[AtomicU64]>,
    ended: Box<[AtomicU64]>,
    /// Odd while the link is down (the initial state: not yet subscribed); moves at every
    /// change, so a load that ran across a loss sees it.
    link: AtomicU64,
}

/// What a load saw before reading the tier ([`Coherence::before_load`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen {
    slot: usize,
    heard: u64,
    link: u64,
}

fn micros_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Coherence {
    /// Coherence with links checked against `bound`, for the namespace whose fingerprint is
    /// `namespace` (a hash of the tier's prefix and database): messages of any other are
    /// ignored.
    pub(crate) fn new(bound: Duration, namespace: u64) -> Self {
        Coherence {
            namespace,
            instance: super::random_u64(),
            bound,
            heard: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            writing: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            ended: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            link: AtomicU64::new(1),
        }
    }

    fn slot(pkey: u64) -> usize {
        (pkey as usize) % SLOTS
    }

    /// Whether the link is up: what this instance installs now will hear of later writes.
    pub(crate) fn link_up(&self) -> bool {
        // Pairs with the bump in `set_link`. Nothing is read through it: a load that acts on
        // an answer gone stale is caught by `changed_since`, which reads `link` again.
        self.link.load(Ordering::SeqCst) % 2 == 0
    }

    /// The link changed (`up`: subscribed; else lost).
    pub(crate) fn set_link(&self, up: bool) {
        let is_up = self.link_up();
        if is_up != up {
            // The bump and the fence pair with the fence and `link` load in `changed_since`,
            // as in `heard_key`: a load misses a loss's bump only if what it installed is
            // before the fence, where the LinkLost clear (engine/fleet.rs `heard`) finds it.
            self.link.fetch_add(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
        }
    }

    /// Recorded by a load before it reads the tier.
    pub(crate) fn before_load(&self, pkey: u64) -> Seen {
        let slot = Self::slot(pkey);
        // These loads pair with the bumps in `heard_key`, `heard_all` and `set_link`; at least
        // Acquire, so that the tier is read after this snapshot, never before it.
        Seen {
            slot,
            heard: self.heard[slot].load(Ordering::SeqCst),
            link: self.link.load(Ordering::SeqCst),
        }
    }

    /// Checked by a load after it installed: whether a write of a key in its slot was heard,
    /// or the link changed, since [`before_load`](Self::before_load). If so, the load drops
    /// what it installed.
    pub(crate) fn changed_since(&self, seen: Seen) -> bool {
        // Pairs with the fence in `heard_key`: either this load reads the bump, or the
        // handler's removal (after its bump) finds the entry installed before this fence.
        // The `link` load pairs likewise with the bump in `set_link`.
        fence(Ordering::SeqCst);
        self.heard[seen.slot].load(Ordering::SeqCst) != seen.heard
            || self.link.load(Ordering::SeqCst) != seen.link
    }

    /// A write of the key was heard: bump its slot, before dropping the local copy.
    pub(crate) fn heard_key(&self, pkey: u64) {
        // The bump and the fence pair with the fence and `heard` load in `changed_since`:
        // either that load reads this bump, or the removal after this fence (engine/fleet.rs
        // `heard`) finds what the load installed.
        self.heard[Self::slot(pkey)].fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// An own write of the key begins (before it goes to Redis): its slot moves, so this
    /// instance's loads of the key in flight drop what they read before it.
    pub(crate) fn begin_write(&self, pkey: u64) -> OwnWrite<'_> {
        let slot = Self::slot(pkey);
        // Read by an overlapping own write's `may_keep`, as `ended` is (see there).
        self.writing[slot].fetch_add(1, Ordering::SeqCst);
        self.heard_key(pkey);
        OwnWrite {
            coherence: self,
            slot,
            // Pairs with the `ended` bump in `OwnWrite::drop`: what `may_keep` compares with.
            ended: self.ended[slot].load(Ordering::SeqCst),
            seen: self.before_load(pkey),
        }
    }

    /// Every slot moves (an `invalidate_all` heard).
    pub(crate) fn heard_all(&self) {
        // As in `heard_key`: the bumps and the fence pair with the fence in `changed_since`.
        for h in self.heard.iter() {
            h.fetch_add(1, Ordering::SeqCst);
        }
        fence(Ordering::SeqCst);
    }

    /// The message announcing a write of the key with policy key `pkey` (`None`: all keys).
    pub(crate) fn message(&self, pkey: Option<u64>) -> String {
        let (namespace, instance, sent) = (self.namespace, self.instance, micros_now());
        match pkey {
            Some(p) => format!("{namespace:016x} {instance:016x} {sent} k {p:016x}"),
            None => format!("{namespace:016x} {instance:016x} {sent} a"),
        }
    }

    /// What a message says, with its delay since it was sent; `None` for this instance's own
    /// messages, for another namespace's, and for anything malformed.
    pub(crate) fn parse(&self, msg: &str) -> Option<(Heard, Duration)> {
        let mut words = msg.split(' ');
        let namespace = u64::from_str_radix(words.next()?, 16).ok()?;
        if namespace != self.namespace {
            return None;
        }
        let instance = u64::from_str_radix(words.next()?, 16).ok()?;
        if instance == self.instance {
            return None;
        }
        let sent: u64 = words.next()?.parse().ok()?;
        let lag = Duration::from_micros(micros_now().saturating_sub(sent));
        let heard = match (words.next()?, words.next()) {
            ("k", Some(p)) => Heard::Key(u64::from_str_radix(p, 16).ok()?),
            ("a", None) => Heard::All,
            _ => return None,
        };
        Some((heard, lag))
    }
}

/// An own write in progress ([`Coherence::begin_write`]); ends when dropped.
#[derive(Debug)]
pub(crate) struct OwnWrite<'a> {
    coherence: &'a Coherence,
    slot: usize,
    ended: u64,
    seen: Seen,
}

impl OwnWrite<'_> {
    /// After the write's local half: whether its local copy may stay. Not if another
    /// instance's write of a key in its slot was heard or the link changed meanwhile, nor if
    /// another own write of the slot overlapped this one (it is still running, or it ended
    /// meanwhile: an overlapping write ends after its own check in program order, so reading
    /// `writing` before `ended` misses neither).
    pub(crate) fn may_keep(self) -> bool {
        let c = self.coherence;
        // The loads pair with an overlapping write's bumps in `begin_write` and `drop`; `drop`
        // moves `ended` before `writing`, so seeing `writing` drop means seeing `ended` move.
        !(c.changed_since(self.seen)
            || c.writing[self.slot].load(Ordering::SeqCst) > 1
            || c.ended[self.slot].load(Ordering::SeqCst) != self.ended)
    }
}

impl Drop for OwnWrite<'_> {
    fn drop(&mut self) {
        let c = self.coherence;
        // `ended` before `writing`, for the loads in `may_keep` (see there).
        c.ended[self.slot].fetch_add(1, Ordering::SeqCst);
        c.writing[self.slot].fetch_sub(1, Ordering::SeqCst);
    }
}

/// How the subscriber reaches the cache: `false` once the cache is gone (the thread ends).
pub(crate) type OnHeard = Box<dyn Fn(Heard, Duration) -> bool + Send>;

/// Runs `link`'s subscriber on a thread of its own until its `on_heard` says the cache is
/// gone.
pub(crate) fn subscribe(link: Link, retry_after: Duration) {
    let spawned = std::thread::Builder::new()
        .name("herdcache-fleet".into())
        .spawn(move || {
            // However the thread ends (the cache gone, or a panic), the link is down after:
            // nothing would hear the other instances' writes any more.
            let _down = LinkDown(&link.coherence);
            // Reconnects back off from 10 ms to `retry_after`; the link stays down meanwhile.
            let mut pause = Duration::from_millis(10);
            loop {
                match link.listen() {
                    Listened::Gone => return,
                    Listened::WasUp => pause = Duration::from_millis(10),
                    Listened::NeverUp => {
                        if !(link.on_heard)(Heard::Quiet, Duration::ZERO) {
                            return; // the cache is gone
                        }
                        pause = (pause * 2).min(retry_after);
                    }
                }
                std::thread::sleep(pause);
            }
        });
    if spawned.is_err() {
        // No thread: the link stays down, so every local copy lives at most the bound.
        log::warn!("herdcache: no thread for the fleet's channel; local copies live at most the coherence bound");
    }
}

struct LinkDown<'a>(&'a Coherence);

impl Drop for LinkDown<'_> {
    fn drop(&mut self) {
        self.0.set_link(false);
    }
}

/// The subscriber's connection settings and its way to the cache.
pub(crate) struct Link {
    pub(crate) client: Client,
    pub(crate) channel: String,
    pub(crate) coherence: Arc<Coherence>,
    pub(crate) op_timeout: Duration,
    /// How long the channel may be quiet before the subscriber pings.
    pub(crate) keepalive: Duration,
    /// Whether refused credentials were said (see `say_refused`).
    pub(crate) refused: Arc<AtomicBool>,
    pub(crate) on_heard: OnHeard,
}

/// How one connection's life ended.
enum Listened {
    /// The cache is gone.
    Gone,
    /// Subscribed, then lost.
    WasUp,
    /// Could not connect or subscribe.
    NeverUp,
}

impl Link {
    fn never_up(&self, e: &redis::RedisError) -> Listened {
        if is_auth(e) {
            say_refused(&self.refused, &e.to_string());
        }
        Listened::NeverUp
    }

    /// One connection's life: subscribes, hands over what it hears, and returns when the link
    /// is lost or the cache is gone. Only a link that was up and is lost tells the cache
    /// (which then drops every local copy); while it stays down, copies live at most the
    /// bound anyway.
    fn listen(&self) -> Listened {
        let subscribed = (|| {
            let conn = self.client.get_connection_with_timeout(self.op_timeout)?;
            conn.set_read_timeout(Some(self.op_timeout))?;
            conn.set_write_timeout(Some(self.op_timeout))?;
            Ok::<_, redis::RedisError>(conn)
        })();
        let mut conn = match subscribed {
            Ok(conn) => conn,
            Err(e) => return self.never_up(&e),
        };
        let mut pubsub = conn.as_pubsub();
        if let Err(e) = pubsub.subscribe(&self.channel) {
            return self.never_up(&e);
        }
        let quiet = self.keepalive.max(Duration::from_millis(1));
        let answer = (self.coherence.bound / 2).max(Duration::from_millis(1));
        if pubsub.set_read_timeout(Some(quiet)).is_err() {
            return Listened::NeverUp;
        }
        self.coherence.set_link(true);
        let alive = loop {
            match pubsub.get_message() {
                Ok(msg) => {
                    let Ok(text) = msg.get_payload::<String>() else {
                        continue;
                    };
                    if let Some((heard, lag)) = self.coherence.parse(&text) {
                        if !(self.on_heard)(heard, lag) {
                            break false;
                        }
                    }
                }
                // Quiet for the keep-alive interval: the ping must come back within half of
                // the bound, so a link that died without a word just after its last one is
                // found lost within the interval and half the bound.
                Err(e) if e.is_timeout() => {
                    let answered = pubsub.set_read_timeout(Some(answer)).is_ok()
                        && pubsub.ping::<redis::Value>().is_ok()
                        && pubsub.set_read_timeout(Some(quiet)).is_ok();
                    if !answered {
                        break true;
                    }
                    if !(self.on_heard)(Heard::Quiet, Duration::ZERO) {
                        break false;
                    }
                }
                Err(_) => break true,
            }
        };
        self.coherence.set_link(false);
        if alive && (self.on_heard)(Heard::LinkLost, Duration::ZERO) {
            Listened::WasUp
        } else {
            Listened::Gone
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(
        miri,
        ignore = "reads the wall clock, which Miri isolates; no unsafe code"
    )]
    fn an_instance_skips_its_own_messages_and_reads_the_others() {
        let (a, b) = (
            Coherence::new(Duration::from_millis(100), 7),
            Coherence::new(Duration::from_millis(100), 7),
        );
        let msg = a.message(Some(0xabc));
        assert_eq!(a.parse(&msg), None);
        assert_eq!(b.parse(&msg).map(|(h, _)| h), Some(Heard::Key(0xabc)));
        assert_eq!(b.parse(&a.message(None)).map(|(h, _)| h), Some(Heard::All));
        // Another namespace (another prefix, or the same in another database).
        let other = Coherence::new(Duration::from_millis(100), 8);
        assert_eq!(b.parse(&other.message(Some(0xabc))), None);
        assert_eq!(b.parse(&other.message(None)), None);
        for garbage in [
            "",
            "zz 1 k 1",
            "01 x k 1",
            "01 1 q",
            "01 1 k",
            "01 1 a extra",
        ] {
            assert_eq!(b.parse(garbage), None, "{garbage:?}");
        }
    }

    #[test]
    fn overlapping_own_writes_of_a_key_keep_no_local_copy() {
        let c = Coherence::new(Duration::from_millis(100), 7);
        c.set_link(true);
        // T1 and T2 write the key; Redis applies T1 then T2, the table T2 then T1.
        let t1 = c.begin_write(7);
        let t2 = c.begin_write(7);
        assert!(!t2.may_keep(), "T1 still runs");
        assert!(!t1.may_keep(), "T2 ended while T1 ran");
        // Alone, a write keeps its copy.
        assert!(c.begin_write(7).may_keep());
        // One that started and ended while another ran is still seen.
        let t3 = c.begin_write(7);
        drop(c.begin_write(7 + SLOTS as u64));
        assert!(!t3.may_keep());
        // Another slot does not count.
        let t4 = c.begin_write(7);
        let t5 = c.begin_write(8);
        assert!(t4.may_keep());
        drop(t5);
    }

    #[test]
    fn a_load_sees_a_write_heard_while_it_ran_and_a_link_change() {
        let c = Coherence::new(Duration::from_millis(100), 7);
        c.set_link(true);
        let seen = c.before_load(7);
        assert!(!c.changed_since(seen));
        c.heard_key(7 + SLOTS as u64 * 3); // same slot
        assert!(c.changed_since(seen));
        let seen = c.before_load(7);
        c.heard_key(8);
        assert!(!c.changed_since(seen), "another slot");
        c.set_link(false);
        assert!(c.changed_since(seen));
        assert!(!c.link_up());
        let seen = c.before_load(7);
        c.heard_all();
        assert!(c.changed_since(seen));
    }
}
