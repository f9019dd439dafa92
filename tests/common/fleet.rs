//! What the fleet tests share: tier settings generous enough for a loaded test machine, an
//! instance over them, and a wait for instances to hear the fleet. Included by the fleet test
//! crates with `#[path]`, beside `mod common;`.

// `pub` here means "for the including crate", and each crate uses some of these.
#![allow(unreachable_pub, dead_code)]

use std::time::Duration;

use herdcache::fleet::{RedisTier, RedisTierBuilder, Utf8};
use herdcache::Cache;

use crate::common::wait_until;

/// Long enough that a loaded test machine does not starve a subscriber into declaring its
/// link lost (which drops every copy: correct, but not what the tests look at).
pub const BOUND: Duration = Duration::from_secs(2);

/// The tests' tier settings, for a test to adjust before [`build`].
pub fn settings(url: &str, prefix: &str) -> RedisTierBuilder {
    RedisTier::builder(url)
        .key_prefix(prefix)
        .lease(Duration::from_secs(30))
        .wait_bound(Duration::from_secs(30))
        .coherence_bound(BOUND)
        // Generous: a loaded test machine must not turn a slow reply into a local load.
        .op_timeout(Duration::from_secs(5))
        .retry_after(Duration::from_millis(200))
}

/// A tier of `String` keys and values, named as they are.
pub fn build(settings: RedisTierBuilder) -> RedisTier<String, String> {
    settings
        .build(|k: &String| k.clone(), Utf8)
        .expect("valid tier settings")
}

pub fn tier(url: &str, prefix: &str) -> RedisTier<String, String> {
    build(settings(url, prefix))
}

/// An instance: a cache of 100 entries living a minute, over `tier`.
pub fn instance_of(tier: RedisTier<String, String>) -> Cache<String, String> {
    Cache::builder()
        .max_capacity(100)
        .time_to_live(Duration::from_secs(60))
        .shared_tier(tier)
        .build()
        .expect("valid cache settings")
}

pub fn instance(url: &str, prefix: &str) -> Cache<String, String> {
    instance_of(tier(url, prefix))
}

/// Waits until each instance hears the fleet.
pub fn linked(instances: &[&Cache<String, String>]) {
    wait_until("instances subscribed", || {
        instances
            .iter()
            .all(|c| c.shared_status().is_some_and(|s| s.subscribed))
    });
}
