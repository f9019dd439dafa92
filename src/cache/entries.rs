//! The cache as a collection: walking its entries (`CacheGuard::iter`, `Cache::retain`),
//! reading one without counting it (`peek`), taking one out (`remove`), its total weight,
//! and its keys as the eviction policy ranks them (`hottest`, `coldest`).

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};

use crate::cache::{Cache, CacheGuard};
use crate::entry::Entry;
use crate::removal::RemovalCause;
use crate::table::{self, Node};

impl<K, V, S> Cache<K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// The value for `key`, cloned, without counting a lookup in [`stats`](Self::stats) or
    /// telling the eviction policy of a hit: for inspecting the cache without changing what
    /// it keeps. Expired values are not returned (nor removed).
    ///
    /// ```
    /// let cache = herdcache::Cache::builder().max_capacity(10).build()?;
    /// cache.insert("k".to_string(), 7);
    /// assert_eq!(cache.peek("k"), Some(7));
    /// assert_eq!(cache.stats().requests(), 0);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn peek<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
        V: Clone,
    {
        self.inner.peek(key, &self.inner.pin()).cloned()
    }

    /// Removes `key`'s entry and returns its value, if it held one that [`get`](Self::get)
    /// would have returned. Otherwise as [`invalidate`](Self::invalidate): an expired entry
    /// is removed too (and `None` returned), a load in progress is detached, the listener
    /// hears [`RemovalCause::Invalidated`], and with a shared tier the key is invalidated
    /// there and on every instance.
    ///
    /// ```
    /// let cache = herdcache::Cache::builder().max_capacity(10).build()?;
    /// cache.insert(1, "one");
    /// assert_eq!(cache.remove(&1), Some("one"));
    /// assert_eq!(cache.remove(&1), None);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn remove<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
        V: Clone,
    {
        self.invalidate_with(key, V::clone).0.flatten()
    }

    /// Clones of the cache's live entries, in no particular order: a walk that holds no
    /// guard (papaya's `pin_owned().iter()`, moka's `iter()`). The entries are cloned under
    /// one epoch pin, as [`CacheGuard::iter`] sees them (weakly consistent), before the first
    /// is yielded: O(entries) memory at once. To walk a large cache without copies, hold a
    /// guard: `cache.pin().iter()`.
    ///
    /// ```
    /// let cache = herdcache::Cache::builder().max_capacity(100).build()?;
    /// cache.insert(1, "one".to_owned());
    /// cache.insert(2, "two".to_owned());
    /// let mut all: Vec<(u32, String)> = cache.iter().collect();
    /// all.sort();
    /// assert_eq!(all, [(1, "one".to_owned()), (2, "two".to_owned())]);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn iter(&self) -> std::vec::IntoIter<(K, V)>
    where
        K: Clone,
        V: Clone,
    {
        let guard = self.pin();
        let all: Vec<(K, V)> = guard.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        all.into_iter()
    }

    /// Total weight of the entries held: with a [`weigher`](crate::CacheBuilder::weigher),
    /// the sum of their weights, else their count. This is what
    /// [`max_capacity`](Self::max_capacity) bounds; it counts the entries the eviction policy
    /// has been told of (exact when no write is in progress).
    ///
    /// ```
    /// let cache = herdcache::Cache::builder()
    ///     .max_capacity(100)
    ///     .weigher(|_k: &u32, v: &String| v.len() as u64)
    ///     .build()?;
    /// cache.insert(1, "four".to_string());
    /// cache.insert(2, "three".to_string());
    /// assert_eq!(cache.weighted_size(), 9);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn weighted_size(&self) -> u64 {
        self.inner.weight()
    }

    /// The keys of the `n` live entries the eviction policy values most, most valued first:
    /// by how often their keys have been used recently (the policy's frequency estimate, and
    /// the entry's hits the policy has not looked at yet), then by how long they would stay. With [`warm`](Self::warm) this restores a hot set
    /// after a restart: record it at shutdown or periodically, warm from it at start.
    ///
    /// It walks every entry the policy tracks, each shard of the policy under its lock in
    /// turn (writes to that shard wait meanwhile): O(entries * log n); an occasional call,
    /// not one per request.
    ///
    /// ```
    /// let cache = herdcache::Cache::builder().max_capacity(100).build()?;
    /// for k in 0..10u32 {
    ///     cache.insert(k, k);
    /// }
    /// for _ in 0..3 {
    ///     cache.get(&7);
    /// }
    /// assert_eq!(cache.hottest(1), [7]);
    /// assert!(!cache.coldest(9).contains(&7));
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn hottest(&self, n: usize) -> Vec<K>
    where
        K: Clone,
    {
        self.inner.ranked_keys(n, true)
    }

    /// The keys of the `n` live entries the eviction policy values least, least valued first:
    /// roughly the next to be evicted. The same walk as [`hottest`](Self::hottest).
    ///
    /// ```
    /// let cache = herdcache::Cache::builder().max_capacity(100).build()?;
    /// for k in 0..5u32 {
    ///     cache.insert(k, k);
    /// }
    /// for _ in 0..3 {
    ///     for k in 1..5 {
    ///         cache.get(&k); // every key but 0 is read
    ///     }
    /// }
    /// assert_eq!(cache.coldest(1), [0]);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn coldest(&self, n: usize) -> Vec<K>
    where
        K: Clone,
    {
        self.inner.ranked_keys(n, false)
    }

    /// Keeps only the entries for which `keep` returns true: every other live value is removed
    /// as by [`invalidate`](Self::invalidate) (the listener hears
    /// [`RemovalCause::Invalidated`]; with a shared tier, the key is invalidated there too).
    ///
    /// Weakly consistent, as [`CacheGuard::iter`]: each entry present for the whole call is
    /// offered once, entries written meanwhile may or may not be. A value written for a key
    /// after `keep` saw its older one is not removed. Expired values and keys whose first
    /// load is in progress (no value yet) are not offered; a key being refreshed is offered
    /// with the value it still serves, and rejecting it also detaches the refresh. `keep`
    /// runs without any lock held, so it may use the cache; if it panics, the entries
    /// removed before stay removed. The walk holds one epoch pin throughout, so nothing
    /// removed meanwhile is freed until it ends: keep `keep` quick.
    ///
    /// ```
    /// let cache = herdcache::Cache::builder().max_capacity(100).build()?;
    /// for i in 0..10 {
    ///     cache.insert(i, i * 10);
    /// }
    /// cache.retain(|k, _v| k % 2 == 0);
    /// assert_eq!(cache.get(&4), Some(40));
    /// assert_eq!(cache.get(&5), None);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn retain(&self, mut keep: impl FnMut(&K, &V) -> bool) {
        let pinned = self.inner.pin();
        let now = self.inner.now();
        for node in self.inner.nodes(pinned.guard()) {
            let Some(value) = node.value.live_value(|| now) else {
                continue;
            };
            if keep(&node.key, value) {
                continue;
            }
            // In progress in the tier until the local removal is done, as for `invalidate`.
            #[cfg(feature = "redis")]
            let _written = self.inner.write_through(&node.key, None, None);
            self.inner
                .remove_node(node, RemovalCause::Invalidated, &pinned);
        }
    }
}

impl<'g, K, V, S> CacheGuard<'g, K, V, S>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: BuildHasher,
{
    /// The cache's live entries, borrowed for as long as the guard lives, in no particular
    /// order. Counts no lookups and touches no policy state.
    ///
    /// Weakly consistent: each entry present for the whole iteration is yielded once;
    /// entries written or removed meanwhile may or may not be, and a key written during the
    /// iteration may appear with its old value. Expired values (as of the iteration's start)
    /// and keys whose first load is in progress are skipped; a key being refreshed appears
    /// with the value it still serves. Writes and removals by other threads go on
    /// meanwhile; no removed value is freed while the guard lives.
    ///
    /// ```
    /// let cache = herdcache::Cache::builder().max_capacity(100).build()?;
    /// cache.insert("a", 1);
    /// cache.insert("b", 2);
    /// let guard = cache.pin();
    /// let mut entries: Vec<_> = guard.iter().map(|(k, v)| (*k, *v)).collect();
    /// entries.sort();
    /// assert_eq!(entries, [("a", 1), ("b", 2)]);
    /// # Ok::<(), herdcache::BuildError>(())
    /// ```
    pub fn iter(&self) -> Iter<'_, K, V> {
        Iter {
            nodes: self.cache.inner.nodes(self.pinned.guard()),
            now: self.cache.inner.now(),
        }
    }
}

/// The live entries of a cache, from [`CacheGuard::iter`].
///
/// ```
/// let cache = herdcache::Cache::builder().max_capacity(100).build()?;
/// cache.insert(1, 10);
/// cache.insert(2, 20);
/// let guard = cache.pin();
/// let entries: herdcache::Iter<'_, u32, u32> = guard.iter();
/// assert_eq!(entries.map(|(_k, v)| *v).sum::<u32>(), 30);
/// # Ok::<(), herdcache::BuildError>(())
/// ```
pub struct Iter<'g, K, V> {
    nodes: table::Iter<'g, K, Entry<V>>,
    now: u64,
}

impl<'g, K, V> Iterator for Iter<'g, K, V> {
    type Item = (&'g K, &'g V);

    fn next(&mut self) -> Option<Self::Item> {
        let now = self.now;
        self.nodes.find_map(|node: &'g Node<K, Entry<V>>| {
            node.value.live_value(|| now).map(|v| (&node.key, v))
        })
    }
}

impl<K, V> fmt::Debug for Iter<'_, K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Iter").finish_non_exhaustive()
    }
}

#[cfg(all(test, not(herdcache_loom)))]
mod tests {
    //! The walk over the table's slots while another thread writes, sized for Miri.
    use crate::Cache;

    #[test]
    fn iter_and_retain_run_beside_a_writer() {
        let n = if cfg!(miri) { 30 } else { 3_000 };
        let cache: Cache<u32, u32> = Cache::builder().max_capacity(64).build().unwrap();
        for k in 0..16 {
            cache.insert(k, k);
        }
        let writer = {
            let cache = cache.clone();
            std::thread::spawn(move || {
                for k in 0..n {
                    cache.insert(100 + k % 200, k);
                    cache.invalidate(&(100 + (k + 7) % 200));
                }
            })
        };
        for _ in 0..if cfg!(miri) { 3 } else { 100 } {
            let guard = cache.pin();
            let stable = guard.iter().filter(|(k, v)| *k < &16 && k == v).count();
            assert!(stable <= 16);
            drop(guard);
            cache.retain(|k, _| *k < 16 || k % 2 == 0);
        }
        writer.join().unwrap();
        cache.retain(|k, _| *k < 16);
        assert_eq!(cache.pin().iter().count(), cache.entry_count() as usize);
    }
}
