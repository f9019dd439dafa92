//! Atomic read-modify-write of one key: `Cache::compute`.
//!
//! A compute is a flight of its own, led like a load: it installs a `Loading` entry in place
//! of what it read (the key's live value, which the flight serves to readers meanwhile, as a
//! refresh does), runs the caller's closure on that value, and ends the flight with the
//! closure's decision. So it is atomic with respect to the key's other writes and loads as
//! single flight makes them: a load of the key in flight when it starts is waited for, like a
//! waiter; a load that starts while it runs waits for it (or, the key holding a value, is
//! served that value); an `insert` or `invalidate` made while the closure runs wins, as it
//! wins over a load, and the compute is ordered before it.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

use super::Cache;
use crate::flight::FlightResult;
use crate::removal::RemovalCause;
use crate::stats::Counter;

/// What a [`Cache::compute`] closure decides for its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compute<V> {
    /// Store this value (with the cache's expiry, weigher and admission, as an insert).
    Put(V),
    /// Remove the key's value, if it has one (told to the listener as invalidated).
    Remove,
    /// Leave the key as it is.
    Keep,
}

/// What [`Cache::compute`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Computed<V> {
    /// The key had no value; it has `new` now.
    Inserted(V),
    /// The key's value `old` was replaced by `new`.
    Replaced {
        /// The value the closure saw.
        old: V,
        /// The value it put.
        new: V,
    },
    /// The key's value was removed.
    Removed(V),
    /// The key was left as it was: its value, if it had one.
    Unchanged(Option<V>),
}

impl<K, V, S> Cache<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    /// Atomically computes the entry of `key` from its current value: `f` sees the live value
    /// (or `None`) and decides to [`Put`](Compute::Put) a new one, [`Remove`](Compute::Remove)
    /// it, or [`Keep`](Compute::Keep) it as it is.
    ///
    /// No other write or load of the key comes between what `f` reads and what it decides:
    /// a load of the key in flight is waited for first (as a waiter waits, with the cache's
    /// [`load_timeout`](crate::CacheBuilder::load_timeout)), and a load that starts while `f`
    /// runs waits for its decision (if the key has a value, readers keep being served it
    /// meanwhile). An [`insert`](Self::insert) or [`invalidate`](Self::invalidate) made while
    /// `f` runs wins, as it wins over a load: the compute counts as made just before it. A
    /// value put goes through the cache's expiry, weigher, admission and listener as an
    /// insert's does; a value removed is told to the listener as
    /// [`Invalidated`](crate::RemovalCause::Invalidated). `f` runs once, on this thread.
    ///
    /// A kept value stays as it was, but counts as written now for an early refresh's soft
    /// TTL ([`refresh_after`](crate::CacheBuilder::refresh_after)).
    ///
    /// # Panics
    ///
    /// If `f` panics (the key keeps the value it had), or if this is called for the key that
    /// a loader running on this thread is loading (it would wait for itself).
    ///
    /// ```
    /// use herdcache::{Compute, Computed};
    /// let hits: herdcache::Cache<String, u64> = herdcache::Cache::builder().max_capacity(100).build()?;
    /// // A counter that no concurrent increment can lose.
    /// let bump = |c: Option<&u64>| Compute::Put(c.map_or(1, |n| n + 1));
    /// assert_eq!(hits.compute("page", bump), Computed::Inserted(1));
    /// assert_eq!(hits.compute("page", bump), Computed::Replaced { old: 1, new: 2 });
    /// // Remove it once it reaches 2.
    /// let r = hits.compute("page", |c| match c {
    ///     Some(&n) if n >= 2 => Compute::Remove,
    ///     _ => Compute::Keep,
    /// });
    /// assert_eq!(r, Computed::Removed(2));
    /// assert_eq!(hits.get("page"), None);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn compute<Q, F>(&self, key: &Q, f: F) -> Computed<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(Option<&V>) -> Compute<V>,
    {
        let (mut lead, old) = self.inner.lead_for_compute(key);
        // A panic in `f` leaves through `Lead`'s drop, which puts the value back.
        match (f(old.as_ref()), old) {
            (Compute::Put(new), old) => {
                let started = self.inner.now();
                let put = lead.conclude(started, Ok::<V, std::convert::Infallible>(new));
                let new = put.unwrap_or_else(|never| match never {
                    crate::LoadError::Failed(e) => match *e {},
                    _ => unreachable!("a value that was put is the result"),
                });
                match old {
                    Some(old) => Computed::Replaced { old, new },
                    None => Computed::Inserted(new),
                }
            }
            (Compute::Remove, Some(old)) => {
                if lead.remove_loading_as(RemovalCause::Invalidated) {
                    self.inner.pin().count(Counter::Invalidations);
                }
                lead.finish(FlightResult::Abandoned);
                Computed::Removed(old)
            }
            (Compute::Keep, Some(old)) => {
                lead.put_back(&old);
                lead.finish(FlightResult::Value(old.clone()));
                Computed::Unchanged(Some(old))
            }
            (Compute::Remove | Compute::Keep, None) => {
                // Nothing was there and nothing is: the waiters look again (one loads).
                lead.remove_loading_as(RemovalCause::Invalidated);
                lead.finish(FlightResult::Abandoned);
                Computed::Unchanged(None)
            }
        }
    }
}
