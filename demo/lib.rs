//! Nothing here: the demonstrations are this crate's examples (`demo/examples/`), run with
//! `cargo run --release -p herdcache-demo --example stampede` (see the README).
