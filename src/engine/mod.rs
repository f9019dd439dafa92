//! The cache's private core. [`Engine`] owns the table, the eviction policy, the clock, the
//! per-thread counters, the hooks and the settings, and carries out every operation on them;
//! the public shell (`Cache`, `CacheGuard`, the loading calls, warming, the shared tier) is
//! written in terms of these operations and never reaches a field, as papaya's `map.rs` is a
//! shell over its `raw` table.
//!
//! - this file: construction, lookups and hits, writes, a load's install and end (the miss
//!   path's writes), removals and walks;
//! - `admit.rs`: what the policy hears of each write and removal, and the evictions it names;
//! - `lifecycle.rs`: a load's lifecycle: the look at a key, the driver that waits, the
//!   lead that ends a load with its result, detaching a load past its deadline;
//! - `sweep.rs`: proactive expiry;
//! - `fleet.rs` (feature `redis`): writes through the shared tier, and what its subscriber
//!   hears.

mod admit;

use admit::Unreported;
#[cfg(feature = "redis")]
mod fleet;
pub(crate) mod lifecycle;
mod sweep;

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::Arc;

use crossbeam_epoch::Owned;
use crossbeam_utils::CachePadded;

use crate::clock::OnceNow;
use crate::entry::{expiry_after, Entry, Kind, NEVER};
use crate::flight::Flight;
use crate::idle::Idle;
use crate::local::{Domain, Pinned};
use crate::pacing::Limiter;
use crate::policy::{KeySource, Policy};
use crate::refresh::LoadRecord;
use crate::removal::{Hooks, RemovalCause};
use crate::settings::Settings;
use crate::stats::{Counter, CounterRegistry};
use crate::table::{self, Decision, Node, Outcome, Table, VerifiedGuard};

/// The table's node type: a key with its entry.
pub(crate) type EntryNode<K, V> = Node<K, Entry<V>>;

/// What ends a load in the table in its place.
pub(crate) struct Replacement<K, V> {
    pub(crate) node: Owned<EntryNode<K, V>>,
    /// The weight the cache's weigher gave it.
    pub(crate) weight: u64,
    /// Its key's policy key.
    pub(crate) pkey: u64,
}

/// How a load ends in the table (`Engine::end_load`), and what the listener then hears of
/// the value a refresh served while it ran.
pub(crate) enum LoadEnd<K, V> {
    /// The load's result (a value, or a cached error) takes its place: a refresh's value was
    /// replaced.
    Publish(Replacement<K, V>),
    /// A refresh's value goes back in its place (the refresh failed, or was detached): it
    /// never left, and the listener hears nothing.
    PutBack(Replacement<K, V>),
    /// The load is removed: a refresh's value leaves for `cause`.
    Remove(RemovalCause),
}

/// The state of one cache, behind every handle to it.
pub(crate) struct Engine<K, V, S> {
    table: Table<K, Entry<V>>,
    policy: Policy,
    /// Hashes keys into policy keys where the shared tier fixes them (seeded alike across
    /// its fleet, independent of the user's hasher); `None`: policy keys derive from the
    /// table hash (`Policy::pkey_of_hash`), and no write hashes its key twice.
    pkeys: Option<foldhash::fast::FixedState>,
    hooks: Hooks<K, V>,
    hasher: S,
    settings: Settings,
    limiter: Option<Arc<Limiter>>,
    /// Coordinates loads across instances.
    #[cfg(feature = "redis")]
    shared: Option<crate::fleet::RedisTier<K, V>>,
    /// Writes that took their share of the sweep (see sweep.rs). On a line of its own:
    /// every write of an expiring cache bumps it, and a line shared with what every read
    /// loads (the table's root, the hasher) would be taken from the readers' cores each time.
    sweep: CachePadded<AtomicUsize>,
    /// Set from the start when the settings can give entries an expiry, else by the first
    /// write of an entry that has one, before that entry is published; never cleared. While
    /// it is clear, writes do not sweep (see sweep.rs) and hits read no entry's expiry
    /// (`Entry::live_value_in`). An std atomic, not modelled under loom: a hit's Relaxed load
    /// follows the Acquire load that found the entry, which the store precedes.
    expiring: AtomicBool,
    /// The capacity now: `settings.max_capacity` until `Cache::set_capacity` changes it.
    capacity: AtomicU64,
    // Dropped last: dropping the domain frees this thread's handle, letting the collector
    // run the destructors of the entries retired above.
    domain: Domain,
}

impl<K, V, S> Engine<K, V, S> {
    /// The validated settings the cache was built with.
    #[inline]
    pub(crate) fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The limiter of concurrent loads (`max_concurrent_loads`), if one is set.
    pub(crate) fn limiter(&self) -> Option<&Arc<Limiter>> {
        self.limiter.as_ref()
    }

    /// The shared tier, if one is set.
    #[cfg(feature = "redis")]
    pub(crate) fn shared(&self) -> Option<&crate::fleet::RedisTier<K, V>> {
        self.shared.as_ref()
    }

    /// This thread's pin of the cache's epoch, with its counters.
    #[inline]
    pub(crate) fn pin(&self) -> Pinned<'_> {
        self.domain.pin()
    }

    /// The counters of every thread.
    pub(crate) fn counters(&self) -> &CounterRegistry {
        self.domain.counters()
    }

    /// Counts an event on the calling thread: for code that counts from wherever it runs
    /// (the shared tier's loads, which may move between threads).
    #[cfg(feature = "redis")]
    pub(crate) fn counting(&self) -> impl Fn(Counter) + Send + Sync + '_ {
        let domain = &self.domain;
        move |c| domain.pin().count(c)
    }

    /// The clock's time, in nanoseconds.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.settings.clock.now_nanos()
    }

    /// A reading of the clock taken at most once, when first asked for. A write takes one
    /// for all it does (its expiry, its refresh plan, the replaced entry's cause, the
    /// admission's looks at victims, its share of the sweep), so that it reads the clock at
    /// most once, and not at all when nothing it meets can expire; user code that runs in
    /// between (a listener) makes it read again after (`OnceNow::renew`).
    #[inline]
    pub(crate) fn once_now(&self) -> OnceNow<'_> {
        OnceNow::new(&self.settings.clock)
    }

    /// The capacity now (`max_capacity`, or what `set_capacity` made it).
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Entries held, including expired ones and loads in progress.
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    /// Total weight of the entries the policy tracks.
    pub(crate) fn weight(&self) -> u64 {
        self.policy.weight()
    }

    /// The table's nodes, weakly consistent (see `Table::iter`).
    pub(crate) fn nodes<'g>(&self, guard: &'g VerifiedGuard) -> table::Iter<'g, K, Entry<V>> {
        self.table.iter(guard)
    }
}

impl<K, V, S> Engine<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// A cache with `settings`, `hooks` and `hasher` (and a shared tier).
    pub(crate) fn new(
        settings: Settings,
        hooks: Hooks<K, V>,
        #[cfg(feature = "redis")] shared: Option<crate::fleet::RedisTier<K, V>>,
        hasher: S,
    ) -> Result<Self, crate::BuildError> {
        // Random, unless instances of a fleet must agree on them: the tier's channel names
        // keys by their policy key.
        let random = || foldhash::fast::RandomState::default().hash_one(0u64);
        #[cfg(feature = "redis")]
        let pkey_seed = shared.as_ref().map_or_else(random, |t| t.pkey_seed());
        #[cfg(not(feature = "redis"))]
        let pkey_seed = random();
        // The shared tier's broadcasts name keys by policy key.
        #[cfg(feature = "redis")]
        let by_pkey = shared.is_some();
        #[cfg(not(feature = "redis"))]
        let by_pkey = false;
        let fixed = foldhash::fast::FixedState::with_seed(pkey_seed);
        let seed = fixed.hash_one(0x5eed_u64);
        let (pkeys, keys) = if by_pkey || stored_pkeys_for_tests() {
            (Some(fixed), KeySource::INDEXED)
        } else {
            // SAFETY: a node's hash is written once, when it is made; `tracked` addresses the
            // link from the whole node.
            (None, unsafe {
                KeySource::derived(admit::hash_before_link::<K, V>())
            })
        };
        // A write at capacity replaces an entry: the table need not make room for more (a
        // weight is at least 1, so the capacity bounds the entries the policy tracks).
        let domain = Domain::new();
        let table = Table::try_with_capacity(settings.initial_capacity, domain.collector())
            .map(|t| t.with_bound(settings.max_capacity))
            .ok_or(crate::BuildError::Invalid {
                setting: "initial_capacity",
                reason: "its table cannot be allocated on this machine",
            })?;
        Ok(Engine {
            table,
            policy: Policy::new(
                settings.max_capacity as u64,
                seed,
                hooks.weigher.is_some(),
                keys,
            ),
            pkeys,
            hooks,
            hasher,
            limiter: settings
                .max_concurrent_loads
                .map(|n| Arc::new(Limiter::new(n, settings.load_timeout))),
            #[cfg(feature = "redis")]
            shared,
            sweep: CachePadded::new(AtomicUsize::new(0)),
            expiring: AtomicBool::new(
                settings.time_to_live.is_some()
                    || settings.time_to_idle.is_some()
                    || settings.negative_ttl.is_some(),
            ),
            capacity: AtomicU64::new(settings.max_capacity as u64),
            settings,
            domain,
        })
    }

    /// The table hash of `key` (any borrowed form hashes alike).
    #[inline]
    pub(crate) fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Shards of the policy.
    pub(crate) fn policy_shards(&self) -> usize {
        self.policy.shards()
    }

    /// The policy key of `key`, whose table hash is `hash` (any borrowed form hashes alike).
    #[inline]
    pub(crate) fn pkey<Q: Hash + ?Sized>(&self, hash: u64, key: &Q) -> u64 {
        self.pkey_with(|| hash, key)
    }

    /// The policy key of `key`, whose table hash `hash` computes if it is needed.
    #[inline]
    pub(crate) fn pkey_with<Q: Hash + ?Sized>(&self, hash: impl FnOnce() -> u64, key: &Q) -> u64 {
        match &self.pkeys {
            Some(pkeys) => pkeys.hash_one(key),
            None => self.policy.pkey_of_hash(hash()),
        }
    }

    /// The policy shard of the key with policy key `pkey`, which its entries name.
    #[inline]
    pub(crate) fn shard_of(&self, pkey: u64) -> u8 {
        self.policy.shard_of(pkey)
    }

    /// The node of `key` (hash `hash`), whatever its state, uncounted.
    #[inline]
    pub(crate) fn find<'g, Q>(
        &self,
        hash: u64,
        key: &Q,
        guard: &'g VerifiedGuard,
    ) -> Option<&'g EntryNode<K, V>>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.table.get(hash, |k| k.borrow() == key, guard)
    }

    /// Finds a live value, counting the hit or miss and removing an expired entry found.
    #[inline(always)]
    pub(crate) fn lookup<'g, Q>(&self, key: &Q, pinned: &'g Pinned<'_>) -> Option<&'g V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let Some(node) = self.find(self.hash(key), key, pinned.guard()) else {
            pinned.count(Counter::Misses);
            return None;
        };
        let entry = &node.value;
        if let Some(value) = self.hit(entry, || self.now(), pinned) {
            return Some(value);
        }
        pinned.count(Counter::Misses);
        if entry.is_expired(|| self.now()) {
            self.remove_expired(node, pinned);
        }
        None
    }

    /// The hit path shared by every read (`get`, `pin().get`, the loading calls): `entry`'s
    /// live value, if it has one, with the hit recorded. The loading calls then look at the
    /// value's refresh plan; a miss is theirs to count.
    ///
    /// `now` reads the clock, if the entry can expire: lazily, and in `get` a second time
    /// for a `time_to_idle` (a cache without one pays nothing for it on a hit).
    #[inline(always)]
    pub(crate) fn hit<'g>(
        &self,
        entry: &'g Entry<V>,
        now: impl Fn() -> u64,
        pinned: &Pinned<'_>,
    ) -> Option<&'g V> {
        // Relaxed: a writer notes an expiry before it publishes the entry, which the caller
        // found with an Acquire load (see `note_expiry`).
        let value = entry.live_value_in(
            self.expiring.load(std::sync::atomic::Ordering::Relaxed),
            &now,
        )?;
        // The entry's hit counter and, with a `time_to_idle`, its idle deadline: both test
        // before set.
        entry.policy.on_hit();
        if let Some(units) = self.settings.time_to_idle {
            entry.used(now(), units);
        }
        pinned.count(Counter::Hits);
        Some(value)
    }

    /// The live value for `key`, without counting a lookup or touching the policy.
    pub(crate) fn peek<'g, Q>(&self, key: &Q, pinned: &'g Pinned<'_>) -> Option<&'g V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.find(self.hash(key), key, pinned.guard())
            .and_then(|n| n.value.live_value(|| self.now()))
    }

    #[cold]
    fn remove_expired(&self, node: &EntryNode<K, V>, pinned: &Pinned<'_>) {
        self.remove_node(node, RemovalCause::Expired, pinned);
    }

    /// A ready entry written at `now`, with its refresh plan (`load`: the load that wrote
    /// it, default for an insert).
    pub(crate) fn ready_entry(
        &self,
        pkey: u64,
        value: V,
        expires_at: u64,
        load: LoadRecord,
        now: &OnceNow<'_>,
    ) -> Entry<V> {
        // Without a refresh rule or a time to idle, the time is not needed.
        let refresh = &self.settings.refresh;
        let refresh = refresh
            .active()
            .then(|| refresh.state(now.get(), expires_at, load));
        let idle = self
            .settings
            .time_to_idle
            .map(|units| Idle::new(now.get(), units));
        self.note_expiry(expires_at);
        let shard = self.shard_of(pkey);
        Entry::ready(shard, value, expires_at, refresh, idle)
    }

    /// Writes `value` for `key`, to live `ttl` nanoseconds (`None`: forever), replacing any
    /// entry of the key, and admits it (which may evict others).
    pub(crate) fn insert(&self, key: K, value: V, ttl: Option<u64>, pinned: &Pinned<'_>) {
        let hash = self.hash(&key);
        self.table.prefetch(hash, pinned.guard());
        let weight = self.weight_of(&key, &value);
        let pkey = self.pkey(hash, &key);
        self.policy.prefetch(pkey);
        let now = self.once_now();
        let expires_at = ttl.map_or(NEVER, |t| expiry_after(now.get(), t));
        let entry = self.ready_entry(pkey, value, expires_at, LoadRecord::default(), &now);
        let node = Node::owned(hash, key, entry);
        let key_ptr: *const K = &node.key;
        let outcome = self.table.update(
            hash,
            // SAFETY: `key_ptr` points into the node's heap allocation, which does not move
            // when the `Owned` does. While `update` runs the node is either still ours
            // (handed back and forth across CAS retries) or published, and then it is freed
            // only after our guard unpins. `update` calls this only before it returns.
            |k| k == unsafe { &*key_ptr },
            Some(node),
            |_| Decision::Put,
            pinned.guard(),
        );
        let write = match outcome {
            Outcome::Inserted(new) => {
                pinned.count(Counter::Inserts);
                Unreported::new(&self.policy, None, new, (pkey, weight))
            }
            Outcome::Replaced(old, new) => {
                pinned.count(Counter::Updates);
                // The policy tracks the key on: our write takes the old one's record.
                let write = Unreported::new(&self.policy, Some(old), new, (pkey, weight));
                if self.replaced(old, true, &now, pinned) {
                    now.renew();
                }
                write
            }
            Outcome::Removed(_) | Outcome::Kept(..) => unreachable!("Put always stores"),
        };
        self.admit(write, &now, pinned);
    }

    /// Installs `node`, a load's `Loading` entry for `key` (hash `hash`, policy key `pkey`),
    /// if the key's entry is still the one the caller looked at (`seen`, `None`: there was
    /// none). `seen` is a node read under a pin that still lasts (its lifetime says so), so
    /// no other node can have its address: the address names the write. The value it
    /// replaces leaves the table and is told to the listener (a refresh's old value, which
    /// the flight still serves, is not counted as an expiration); the policy tracks the key
    /// on until the load ends. Returns false, and installs nothing, if the key changed
    /// first.
    pub(crate) fn install_load<Q>(
        &self,
        (hash, pkey): (u64, u64),
        key: &Q,
        node: Owned<EntryNode<K, V>>,
        seen: Option<&EntryNode<K, V>>,
        refresh: bool,
        pinned: &Pinned<'_>,
    ) -> bool
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let decide = |cur: Option<&EntryNode<K, V>>| {
            let unchanged = match (cur, seen) {
                (Some(cur), Some(seen)) => std::ptr::eq(cur, seen),
                (None, None) => true,
                _ => false,
            };
            if unchanged {
                Decision::Put
            } else {
                Decision::Keep
            }
        };
        let outcome = self.table.update(
            hash,
            |k| k.borrow() == key,
            Some(node),
            decide,
            pinned.guard(),
        );
        match outcome {
            Outcome::Inserted(_) => true,
            Outcome::Replaced(old, load) => {
                self.carry_in_policy(old, load, pkey);
                // A refresh's value stays in the cache's keeping (readers are served it)
                // until the refresh ends: the listener hears of it then (`end_load`).
                if !refresh {
                    self.replaced(old, true, &self.once_now(), pinned);
                }
                true
            }
            Outcome::Removed(_) | Outcome::Kept(..) => false,
        }
    }

    /// Ends the table's part of a load: if the table still holds `flight`'s `Loading` entry
    /// (key hash `hash`), replaces it with the node `end` gives (with its weight and its
    /// key's policy key, admitted at `now`) or removes it (the policy forgets the record the
    /// load carried); the listener hears of a refresh's value as `end` says.
    /// Returns whether it did: an insert, an invalidation, a `forget` or a time-out may have
    /// come first. The entry is matched by its flight, so no key comparison (user code)
    /// runs, and a load's drop can end it too.
    pub(crate) fn end_load(
        &self,
        hash: u64,
        flight: &Arc<Flight<V>>,
        end: LoadEnd<K, V>,
        now: &OnceNow<'_>,
        pinned: &Pinned<'_>,
    ) -> bool {
        let (node, weight, pkey, tell) = match end {
            LoadEnd::Publish(r) => (Some(r.node), r.weight, r.pkey, Some(RemovalCause::Replaced)),
            LoadEnd::PutBack(r) => (Some(r.node), r.weight, r.pkey, None),
            LoadEnd::Remove(cause) => (None, 0, 0, Some(cause)),
        };
        let replacing = node.is_some();
        let ours = |n: &EntryNode<K, V>| matches!(n.value.kind(), Kind::Loading(f) if Arc::ptr_eq(f, flight));
        // `ours` lets only the flight's own entry through.
        let decide = |cur: Option<&EntryNode<K, V>>| match cur {
            Some(_) if replacing => Decision::Put,
            Some(_) => Decision::Remove,
            None => Decision::Keep,
        };
        match self
            .table
            .update_node(hash, ours, node, decide, pinned.guard())
        {
            Outcome::Replaced(load, new) => {
                let write = Unreported::new(&self.policy, Some(load), new, (pkey, weight));
                self.admit(write, now, pinned);
                if let Some(cause) = tell {
                    self.refresh_ended(load, cause, pinned);
                }
                true
            }
            Outcome::Removed(load) => {
                self.forget_in_policy(load);
                if let Some(cause) = tell {
                    self.refresh_ended(load, cause, pinned);
                }
                true
            }
            Outcome::Inserted(_) | Outcome::Kept(..) => false,
        }
    }

    /// The listener hears that the value a refresh served (`load`'s, if it is a refresh)
    /// left for `cause`, or, if it had expired meanwhile, as expired.
    fn refresh_ended(&self, load: &EntryNode<K, V>, cause: RemovalCause, pinned: &Pinned<'_>) {
        let Kind::Loading(flight) = load.value.kind() else {
            return;
        };
        if !flight.is_refresh() {
            return;
        }
        if flight.serving(|| self.now()).is_none() {
            pinned.count(Counter::Expirations);
            self.notify(load, RemovalCause::Expired);
        } else {
            self.notify(load, cause);
        }
    }

    /// Removes `key`'s node (hash `hash`), whatever its state, with the bookkeeping of a
    /// removal for `cause`: `None` if there was none, else the live value it held, if any,
    /// judged before the listener ran (readable under the guard).
    pub(crate) fn remove<'g, Q>(
        &self,
        hash: u64,
        key: &Q,
        cause: RemovalCause,
        pinned: &'g Pinned<'_>,
    ) -> Option<Option<&'g V>>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let node = self
            .table
            .remove(hash, |k| k.borrow() == key, pinned.guard())?;
        // Before the clock (user code) is read for `live`.
        self.forget_in_policy(node);
        let live = node.value.live_value(|| self.now());
        self.after_removal(node, cause, pinned);
        Some(live)
    }

    /// Removes `node` if the table still holds it (not a newer write of its key), with the
    /// bookkeeping of a removal for `cause`; returns whether it did.
    pub(crate) fn remove_node(
        &self,
        node: &EntryNode<K, V>,
        cause: RemovalCause,
        pinned: &Pinned<'_>,
    ) -> bool {
        let gone = self.table.remove_node(node, pinned.guard());
        if gone {
            self.removed(node, cause, pinned);
        }
        gone
    }

    /// Removes every entry (detaching loads in progress): how many held a live value.
    pub(crate) fn clear(&self) -> u64 {
        let pinned = self.pin();
        let mut live = 0;
        for node in self.table.iter(pinned.guard()) {
            // Read before the removal's bookkeeping, which may run the listener.
            let was_live = node.value.live_value(|| self.now()).is_some();
            if self.remove_node(node, RemovalCause::Invalidated, &pinned) {
                live += u64::from(was_live);
            }
        }
        live
    }

    /// Removes the entry (or load in progress, detached) of the key with policy key `pkey`,
    /// found through the policy, as an invalidation: whether there was one. What the policy
    /// tracks is the key's last reported write; a write still on its way to the policy stays
    /// (its writer checks the shared tier after it, see `fleet.rs`).
    #[cfg(feature = "redis")]
    pub(crate) fn remove_by_pkey(&self, pkey: u64) -> bool {
        let pinned = self.pin();
        let guard = pinned.guard();
        let table = &self.table;
        let removed = self.policy.with(self.shard_of(pkey), |p| {
            // The record whose node the table holds, taken out here.
            let tracked = p.find(pkey, &mut |tracked| {
                // SAFETY: a tracked node is live under its shard's lock, which we hold.
                table.remove_node(unsafe { admit::node_of::<K, V>(tracked) }, guard)
            })?;
            // SAFETY: we took it out of the table, under our pin, and hold the lock.
            unsafe { p.remove(tracked) };
            // SAFETY: taken out of the table under our pin, which keeps it alive past the
            // lock, for the removal's bookkeeping.
            Some(unsafe { admit::node_of::<K, V>(tracked) })
        });
        match removed {
            Some(node) => {
                self.after_removal(node, RemovalCause::Invalidated, &pinned);
                true
            }
            None => false,
        }
    }

    /// The keys of the `n` live entries the policy values most (`hottest`) or least, in that
    /// order (see `Cache::hottest`).
    pub(crate) fn ranked_keys(&self, n: usize, hottest: bool) -> Vec<K>
    where
        K: Clone,
    {
        let pinned = self.pin();
        let table = &self.table;
        let look = |tracked| {
            // SAFETY: read under the shard's lock, where a tracked node is live.
            let node = unsafe { admit::node_of::<K, V>(tracked) };
            (u64::from(node.value.policy.pending_hits()), node.hash)
        };
        let ranked = self.policy.ranked(n, hottest, &look);
        let now = self.now();
        ranked
            .iter()
            .filter_map(|r| {
                // Found again by address: only a node the table holds may be read now.
                let node =
                    table.get_node(r.hash, |n| admit::tracked(n) == r.node, pinned.guard())?;
                node.value.live_value(|| now)?;
                Some(node.key.clone())
            })
            .collect()
    }
}

#[cfg(test)]
std::thread_local! {
    /// Makes the caches this thread builds keep their policy keys, hashed from the key as
    /// with the shared tier, without one: only such keys can disagree with the table about
    /// which writes are of one key (a `Hash` that disagrees with `Eq`), and the policy's
    /// paths for that are tested through it.
    pub(crate) static STORED_PKEYS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread's tests asked for stored policy keys (see `STORED_PKEYS`).
#[cfg(test)]
fn stored_pkeys_for_tests() -> bool {
    STORED_PKEYS.with(std::cell::Cell::get)
}

#[cfg(not(test))]
fn stored_pkeys_for_tests() -> bool {
    false
}
