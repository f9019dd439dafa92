//! Per-thread state for each cache: an epoch handle on the cache's private collector and the
//! thread's counter block, found through one thread-local lookup on every operation.
//!
//! crossbeam-epoch pins through a `LocalHandle` registered with a collector; registering is
//! far too slow for every read, so each thread keeps its handles in a small thread-local list,
//! most recently used first. An entry whose cache has been dropped is pruned the next time the
//! thread misses in the list (and at thread exit); the cache's drop removes the dropping
//! thread's own entry at once, so single-threaded use frees all retired entries on drop.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crossbeam_epoch::{Collector, Guard, LocalHandle};

use crate::table::VerifiedGuard;

use crate::stats::{Counter, CounterBlock, CounterRegistry};

/// Identity and shared state of one cache's reclamation domain.
#[derive(Debug)]
pub(crate) struct Domain {
    id: u64,
    collector: Collector,
    counters: CounterRegistry,
    alive: Arc<()>,
    #[cfg(herdcache_loom)]
    loom_handles: std::sync::Mutex<Vec<(loom::thread::ThreadId, LoomHandle)>>,
}

/// A loom thread's handle, kept in the domain (loom runs every model thread on one OS thread).
#[cfg(herdcache_loom)]
#[derive(Debug)]
struct LoomHandle(Box<LocalHandle>);

// SAFETY: each handle is used only by the loom thread whose id it is stored under (and
// dropped with the domain, when no thread uses the cache any more); loom runs all model
// threads on one OS thread, so the handle never crosses OS threads.
#[cfg(herdcache_loom)]
unsafe impl Send for LoomHandle {}

struct Local {
    id: u64,
    handle: LocalHandle,
    block: Arc<CounterBlock>,
    alive: Weak<()>,
}

impl Drop for Local {
    fn drop(&mut self) {
        self.block.release();
    }
}

thread_local! {
    static LOCALS: RefCell<Vec<Local>> = const { RefCell::new(Vec::new()) };
}

/// A pinned epoch plus where this thread's counters go, for one operation.
pub(crate) struct Pinned<'a> {
    guard: VerifiedGuard,
    counters: &'a CounterBlock,
    owned: bool,
}

impl Pinned<'_> {
    /// The guard alone, if it was pinned through this thread's own handle: then it is a
    /// nested pin of any guard this thread already holds for the cache, so it keeps what
    /// that guard protects alive as long as it lives. `None` for a one-off handle.
    pub(crate) fn into_nested_guard(self) -> Option<Guard> {
        self.owned.then(|| self.guard.into_inner())
    }

    /// The pinned guard, which the cache's table takes.
    #[inline]
    pub(crate) fn guard(&self) -> &VerifiedGuard {
        &self.guard
    }

    /// Counts one event of kind `c`.
    #[inline]
    pub(crate) fn count(&self, c: Counter) {
        if self.owned {
            self.counters.bump_owned(c);
        } else {
            self.counters.bump_shared(c);
        }
    }

    /// Records a load that took `nanos`.
    pub(crate) fn latency(&self, nanos: u64) {
        if self.owned {
            self.counters.latency_owned(nanos);
        } else {
            self.counters.latency_shared(nanos);
        }
    }
}

impl Domain {
    pub(crate) fn new() -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Domain {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            collector: Collector::new(),
            counters: CounterRegistry::new(),
            alive: Arc::new(()),
            #[cfg(herdcache_loom)]
            loom_handles: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// The collector the cache's table retires its nodes on.
    pub(crate) fn collector(&self) -> &Collector {
        &self.collector
    }

    pub(crate) fn counters(&self) -> &CounterRegistry {
        &self.counters
    }

    /// Pins this cache's epoch on the calling thread. Under loom, handles must not outlive a
    /// model execution, and loom destroys thread-locals only after it: each loom thread's
    /// handle lives in the domain instead (one per thread, as in production).
    #[cfg(herdcache_loom)]
    pub(crate) fn pin(&self) -> Pinned<'_> {
        // The lock is never held across a loom operation: loom runs every model thread on one
        // OS thread, so a thread switch inside it would deadlock.
        let me = loom::thread::current().id();
        let find = || {
            let handles = self.loom_handles.lock().unwrap_or_else(|e| e.into_inner());
            handles
                .iter()
                .find(|(id, _)| *id == me)
                .map(|(_, h)| &*h.0 as *const LocalHandle)
        };
        let handle = match find() {
            Some(h) => h,
            None => {
                let fresh = Box::new(self.collector.register());
                let ptr = &*fresh as *const LocalHandle;
                let mut handles = self.loom_handles.lock().unwrap_or_else(|e| e.into_inner());
                handles.push((me, LoomHandle(fresh)));
                ptr
            }
        };
        // SAFETY: handles are boxed (their address survives the vector growing) and dropped
        // only with the domain, which outlives `&self`; only this loom thread uses this one.
        let guard = unsafe { &*handle }.pin();
        Pinned {
            // SAFETY: pinned on this domain's collector, the one its table was built with.
            guard: unsafe { VerifiedGuard::new_unchecked(guard) },
            counters: self.counters.shared(),
            owned: false,
        }
    }

    /// Pins this cache's epoch on the calling thread.
    #[cfg(not(herdcache_loom))]
    #[inline]
    pub(crate) fn pin(&self) -> Pinned<'_> {
        let fast = LOCALS.try_with(|locals| {
            let locals = locals.try_borrow().ok()?;
            let local = locals.first().filter(|l| l.id == self.id)?;
            if cfg!(debug_assertions) && !local.handle.is_pinned() {
                crate::sync::user_code_may_run("a first pin, which may collect retired entries");
            }
            Some((local.handle.pin(), Arc::as_ptr(&local.block)))
        });
        match fast {
            Ok(Some((guard, block))) => Pinned {
                // SAFETY: pinned through this thread's handle of this domain's collector,
                // the one its table was built with.
                guard: unsafe { VerifiedGuard::new_unchecked(guard) },
                // SAFETY: `self.counters` holds an `Arc` to every block it handed out, so
                // the block lives at least as long as `&self`.
                counters: unsafe { &*block },
                owned: true,
            },
            _ => self.pin_slow(),
        }
    }

    #[cold]
    #[cfg(not(herdcache_loom))]
    fn pin_slow(&self) -> Pinned<'_> {
        let registered = LOCALS.try_with(|locals| {
            let mut list = locals.try_borrow_mut().ok()?;
            // Pruned entries are dropped after the borrow ends: dropping a handle may run
            // deferred destructors, which are user code that may use a cache.
            let mut dead = Vec::new();
            let mut i = 0;
            while i < list.len() {
                if list[i].alive.strong_count() == 0 {
                    dead.push(list.swap_remove(i));
                } else {
                    i += 1;
                }
            }
            match list.iter().position(|l| l.id == self.id) {
                Some(pos) => list.swap(0, pos),
                None => {
                    let local = Local {
                        id: self.id,
                        handle: self.collector.register(),
                        block: self.counters.claim(),
                        alive: Arc::downgrade(&self.alive),
                    };
                    list.insert(0, local);
                }
            }
            if cfg!(debug_assertions) && !list[0].handle.is_pinned() {
                crate::sync::user_code_may_run("a first pin, which may collect retired entries");
            }
            let out = (list[0].handle.pin(), Arc::as_ptr(&list[0].block));
            drop(list);
            drop(dead);
            Some(out)
        });
        match registered {
            Ok(Some((guard, block))) => Pinned {
                // SAFETY: as in `pin`.
                guard: unsafe { VerifiedGuard::new_unchecked(guard) },
                // SAFETY: as in `pin`.
                counters: unsafe { &*block },
                owned: true,
            },
            // Thread-local storage is being torn down, or we were called re-entrantly from
            // a destructor run inside the slow path: use a one-off handle (the guard keeps
            // its registration alive until it unpins) and the shared counters.
            _ => {
                crate::sync::user_code_may_run("a one-off pin, which may collect retired entries");
                Pinned {
                    // SAFETY: as in `pin`, through a handle of its own.
                    guard: unsafe { VerifiedGuard::new_unchecked(self.collector.register().pin()) },
                    counters: self.counters.shared(),
                    owned: false,
                }
            }
        }
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        let id = self.id;
        let mine = LOCALS
            .try_with(|locals| {
                let mut list = locals.try_borrow_mut().ok()?;
                let pos = list.iter().position(|l| l.id == id)?;
                Some(list.swap_remove(pos))
            })
            .ok()
            .flatten();
        // Dropped outside the borrow, for the reason given in `pin_slow`.
        drop(mine);
    }
}
