//! Single-threaded cost of a hit: `Cache::get`, `CacheGuard::get` (one pin for the whole
//! batch), and `std::collections::HashMap` with the same hasher as the floor.
//!
//! Run: `cargo bench --bench hit_path`. Each iteration reads a pre-generated sequence of
//! `BATCH` keys; criterion reports time per batch, and throughput in hits per second.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use herdcache::{Cache, DefaultHashBuilder};

const KEYS: u64 = 100_000;
const BATCH: usize = 1_024;

/// Pre-generated uniform keys, outside the timed loop.
fn key_sequence() -> Vec<u64> {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    (0..BATCH)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % KEYS
        })
        .collect()
}

fn hit_path(c: &mut Criterion) {
    let keys = key_sequence();
    let hasher = DefaultHashBuilder::default();
    let cache: Cache<u64, u64, _> = Cache::builder()
        .max_capacity(KEYS * 2)
        .initial_capacity(KEYS as usize)
        .hasher(hasher.clone())
        .build()
        .unwrap();
    let mut map: HashMap<u64, u64, _> = HashMap::with_hasher(hasher.clone());
    for k in 0..KEYS {
        cache.insert(k, k);
        map.insert(k, k);
    }
    // Let every frequency saturate, as on a hot read path.
    for _ in 0..4 {
        for k in 0..KEYS {
            black_box(cache.get(&k));
        }
    }

    let mut g = c.benchmark_group("hit_100k_uniform");
    g.throughput(Throughput::Elements(BATCH as u64));
    g.bench_function("herdcache_get", |b| {
        b.iter(|| {
            for k in &keys {
                black_box(cache.get(k));
            }
        })
    });
    g.bench_function("herdcache_pin_get", |b| {
        b.iter(|| {
            let guard = cache.pin();
            for k in &keys {
                black_box(guard.get(k));
            }
        })
    });
    g.bench_function("std_hashmap_same_hasher", |b| {
        b.iter(|| {
            for k in &keys {
                black_box(map.get(k));
            }
        })
    });
    g.bench_function("hash_only", |b| {
        b.iter(|| {
            for k in &keys {
                black_box(hasher.hash_one(k));
            }
        })
    });
    g.finish();
}

criterion_group!(benches, hit_path);
criterion_main!(benches);
