//! loom models of herdcache's concurrent orderings live in `tests/`; they compile to nothing
//! unless built with `RUSTFLAGS="--cfg herdcache_loom --cfg crossbeam_loom"`.
