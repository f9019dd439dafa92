//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A value that counts its drops (and its clones, which are drops too when they go).
#[derive(Debug)]
pub struct Tracked {
    pub id: u64,
    drops: Arc<AtomicUsize>,
}

impl Tracked {
    pub fn new(id: u64, drops: &Arc<AtomicUsize>) -> Self {
        Tracked {
            id,
            drops: Arc::clone(drops),
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::Relaxed);
    }
}
