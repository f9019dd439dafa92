//! A model check of fleet coherence without Redis: instances run the real protocol
//! ([`coordinate`]) and the real coherence state ([`Coherence`]) against a store with the
//! scripts' semantics in memory; broadcasts wait in per-instance queues until the test
//! delivers them. Proptest chooses the interleaving of loads (started, stepped and finished
//! separately, their loaders reading the source when they start), invalidations, inserts,
//! deliveries and lost links.
//!
//! The property: a local read returns a value at least as new as the last completed write
//! unless a broadcast to that instance is still undelivered (the coherence bound, in time);
//! the shared tier never holds an older value under the current stamp; and once every load
//! has ended and every broadcast is delivered, every instance reads the newest value.

use std::cell::Cell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::coherence::{Coherence, Seen};
use super::protocol::tests::{Counts, Memory, KEYS};
use super::protocol::{coordinate, Keys, Outcome, Plan, Snapshot, Stamp, Store, StoreError};

/// The one key's policy key.
const PKEY: u64 = 42;
const INSTANCES: usize = 3;

/// The in-memory store, yielding once after each read (the reply is on its way back while
/// other instances act) and in each wait (so a loser waiting on a lock gives the other
/// instances a turn instead of spinning in one poll).
struct Yielding(&'static Memory);

impl Store for Yielding {
    async fn read(&self, keys: Keys<'_>, claim: Option<Duration>) -> Result<Snapshot, StoreError> {
        let snapshot = self.0.read(keys, claim).await;
        YieldOnce(false).await;
        snapshot
    }
    async fn try_lock(&self, lock: &str, token: &str, ttl: Duration) -> Result<bool, StoreError> {
        self.0.try_lock(lock, token, ttl).await
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
        self.0
            .publish(keys, token, expected, payload, ttl, generation_ttl)
            .await
    }
    async fn release(&self, lock: &str, token: &str) -> Result<bool, StoreError> {
        self.0.release(lock, token).await
    }
    fn release_detached(&self, lock: &str, token: &str) {
        self.0.release_detached(lock, token)
    }
    async fn sleep(&self, _: Duration) {
        YieldOnce(false).await
    }
}

struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            Poll::Pending
        }
    }
}

/// A loader: reads the source's version when first polled, returns it once its gate opens.
struct Loader {
    source: &'static AtomicU64,
    read: Option<u64>,
    gate: Rc<Cell<bool>>,
}

impl Future for Loader {
    type Output = Result<u64, ()>;
    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        let source = self.source;
        let v = *self
            .read
            .get_or_insert_with(|| source.load(Ordering::SeqCst));
        if self.gate.get() {
            Poll::Ready(Ok(v))
        } else {
            Poll::Pending
        }
    }
}

type Coordinating = Pin<Box<dyn Future<Output = Outcome<u64, ()>>>>;

struct Load {
    fut: Coordinating,
    gate: Rc<Cell<bool>>,
    seen: Seen,
}

struct Instance {
    coherence: Coherence,
    local: Option<u64>,
    inbox: VecDeque<u64>,
    load: Option<Load>,
}

#[derive(Debug, Clone)]
enum Op {
    Start(usize),
    Step(usize),
    Finish(usize),
    Invalidate(usize),
    Insert(usize),
    Deliver(usize),
    LoseLink(usize),
    Read(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let i = 0..INSTANCES;
    prop_oneof![
        3 => i.clone().prop_map(Op::Start),
        2 => i.clone().prop_map(Op::Step),
        3 => i.clone().prop_map(Op::Finish),
        2 => i.clone().prop_map(Op::Invalidate),
        1 => i.clone().prop_map(Op::Insert),
        3 => i.clone().prop_map(Op::Deliver),
        1 => i.clone().prop_map(Op::LoseLink),
        3 => i.prop_map(Op::Read),
    ]
}

struct Sim {
    store: &'static Memory,
    hooks: &'static Counts,
    /// The source's version. One thread runs the whole sim (`Rc`, `Cell`), so the SeqCst
    /// of its accesses pairs with nothing: any ordering would do.
    source: &'static AtomicU64,
    /// The version of the last completed write (invalidate or insert).
    last_write: u64,
    instances: Vec<Instance>,
}

const TOKENS: [&str; INSTANCES] = ["i0", "i1", "i2"];

impl Sim {
    fn new() -> Self {
        let coherence = || {
            let c = Coherence::new(Duration::from_millis(100), 7);
            c.set_link(true);
            c
        };
        Sim {
            store: Box::leak(Box::default()),
            hooks: Box::leak(Box::default()),
            source: Box::leak(Box::new(AtomicU64::new(0))),
            last_write: 0,
            instances: (0..INSTANCES)
                .map(|_| Instance {
                    coherence: coherence(),
                    local: None,
                    inbox: VecDeque::new(),
                    load: None,
                })
                .collect(),
        }
    }

    fn start(&mut self, i: usize) {
        let inst = &mut self.instances[i];
        if inst.load.is_some() || inst.local.is_some() {
            return; // single flight; a hit loads nothing
        }
        let seen = inst.coherence.before_load(PKEY);
        let gate = Rc::new(Cell::new(false));
        let plan = Plan {
            keys: KEYS,
            token: TOKENS[i],
            lease: Duration::from_secs(3600),
            lock_ttl: Duration::from_secs(3600),
            wait_bound: Duration::from_secs(3600),
            deadline: None,
            ttl: Duration::from_secs(10),
            generation_ttl: Duration::from_secs(7200),
            refreshing: None,
        };
        let loader = Loader {
            source: self.source,
            read: None,
            gate: Rc::clone(&gate),
        };
        let store: &'static Yielding = Box::leak(Box::new(Yielding(self.store)));
        let fut = Box::pin(coordinate(store, self.hooks, plan, loader));
        inst.load = Some(Load { fut, gate, seen });
        self.step(i);
    }

    fn step(&mut self, i: usize) {
        let inst = &mut self.instances[i];
        let Some(load) = inst.load.as_mut() else {
            return;
        };
        let mut cx = Context::from_waker(Waker::noop());
        let Poll::Ready(out) = load.fut.as_mut().poll(&mut cx) else {
            return;
        };
        let seen = load.seen;
        inst.load = None;
        // The cache's `conclude_keeping` then `recheck`.
        match out {
            Outcome::Shared(v, _) | Outcome::Loaded(Ok(v)) => inst.local = Some(v),
            Outcome::Refused(_) => {}
            Outcome::Loaded(Err(())) | Outcome::Failed(..) => unreachable!("nothing fails here"),
        }
        if inst.coherence.changed_since(seen) {
            inst.local = None;
        }
    }

    fn finish(&mut self, i: usize) {
        if let Some(load) = &self.instances[i].load {
            load.gate.set(true);
        }
        self.step(i);
    }

    /// An invalidate (`value`: `None`) or an insert on instance `i`, as `write_through` and
    /// the local write do it.
    fn write(&mut self, i: usize, insert: bool) {
        let v = self.source.fetch_add(1, Ordering::SeqCst) + 1;
        let inst = &mut self.instances[i];
        inst.coherence.heard_key(PKEY);
        let seen = inst.coherence.before_load(PKEY);
        if insert {
            self.store.insert(v.to_string().as_bytes());
            inst.local = Some(v);
        } else {
            self.store.invalidate();
            inst.local = None;
        }
        if inst.coherence.changed_since(seen) {
            inst.local = None;
        }
        self.last_write = v;
        for (j, other) in self.instances.iter_mut().enumerate() {
            if j != i {
                other.inbox.push_back(PKEY);
            }
        }
    }

    fn deliver(&mut self, i: usize) {
        let inst = &mut self.instances[i];
        if let Some(pkey) = inst.inbox.pop_front() {
            inst.coherence.heard_key(pkey);
            inst.local = None;
        }
    }

    fn lose_link(&mut self, i: usize) {
        let inst = &mut self.instances[i];
        inst.inbox.clear();
        inst.coherence.set_link(false);
        inst.local = None;
        inst.coherence.set_link(true);
    }

    fn check(&self, i: usize) {
        let inst = &self.instances[i];
        if let (Some(v), true) = (inst.local, inst.inbox.is_empty()) {
            assert!(
                v >= self.last_write,
                "instance {i} read {v} with nothing undelivered; last write {}",
                self.last_write
            );
        }
        if let Some(bytes) = self.store.current() {
            let v: u64 = std::str::from_utf8(&bytes).unwrap().parse().unwrap();
            assert!(
                v >= self.last_write,
                "the tier holds {v} under the current stamp; last write {}",
                self.last_write
            );
        }
    }

    fn run(&mut self, op: &Op) {
        match *op {
            Op::Start(i) => self.start(i),
            Op::Step(i) => self.step(i),
            Op::Finish(i) => self.finish(i),
            Op::Invalidate(i) => self.write(i, false),
            Op::Insert(i) => self.write(i, true),
            Op::Deliver(i) => self.deliver(i),
            Op::LoseLink(i) => self.lose_link(i),
            Op::Read(i) => self.check(i),
        }
        for i in 0..INSTANCES {
            self.check(i);
        }
    }

    /// Ends every load and delivers every broadcast; then every instance that holds a value
    /// holds the newest, and a fresh load everywhere reads it.
    fn settle(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.instances.iter().any(|i| i.load.is_some()) {
            assert!(Instant::now() < deadline, "loads did not end");
            for i in 0..INSTANCES {
                self.finish(i);
            }
        }
        for i in 0..INSTANCES {
            while !self.instances[i].inbox.is_empty() {
                self.deliver(i);
            }
        }
        for i in 0..INSTANCES {
            self.start(i);
            for _ in 0..10 {
                self.finish(i);
            }
            let inst = &self.instances[i];
            assert!(inst.load.is_none(), "instance {i}'s load ended");
            assert_eq!(
                inst.local,
                Some(self.source.load(Ordering::SeqCst)),
                "instance {i} after everything settled"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    #[cfg_attr(miri, ignore = "a model check of thousands of interleavings, no unsafe code")]
    fn no_read_is_older_than_the_last_write_beyond_an_undelivered_broadcast(
        ops in proptest::collection::vec(op(), 1..60)
    ) {
        let mut sim = Sim::new();
        for op in &ops {
            sim.run(op);
        }
        sim.settle();
    }
}
