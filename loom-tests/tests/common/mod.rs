//! What the cache-level loom models share: a deterministic hasher, a small cache, and the
//! model runner.

use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;

use herdcache::Cache;

/// loom replays executions, which must be deterministic: a fixed hasher, not the default
/// randomly seeded one.
pub type Fixed = BuildHasherDefault<DefaultHasher>;

/// A cache of 8 entries with the fixed hasher.
pub fn cache<V: Clone + Send + Sync + 'static>() -> Cache<u64, V, Fixed> {
    Cache::builder()
        .max_capacity(8)
        .hasher(Fixed::default())
        .build()
        .unwrap()
}

/// Runs a model; cache operations are long straight-line code under loom (pins, probes,
/// the table's teardown), so the branch limit is raised.
pub fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.max_branches = 100_000;
    builder.check(f);
}
