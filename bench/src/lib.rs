//! Shared code of herdcache's comparative benchmarks: one adapter per cache under test, the
//! workloads, trace readers, Belady's OPT, the stampede harness and a small SVG writer.
//!
//! The binaries (`stampede-bench`, `hitratio`, `bench-report`) and the criterion bench
//! (`benches/throughput.rs`) are thin front ends over these modules. None of this is part of
//! the herdcache crate: the caches compared against are dependencies of this unpublished
//! crate only.

#![warn(missing_docs)]

pub mod args;
pub mod caches;
pub mod coherence;
pub mod fleet;
pub mod hitratio;
pub mod memory;
pub mod opt;
pub mod stampede;
pub mod svg;
pub mod trace;
pub mod workload;
