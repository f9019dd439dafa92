//! A per-thread xoshiro256++ generator for XFetch's draws: no shared state, seeded lazily
//! from the process's random hasher keys and the thread's identity.

use std::cell::RefCell;
use std::hash::{BuildHasher, RandomState};

use rand_xoshiro::rand_core::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

thread_local! {
    static RNG: RefCell<Option<Xoshiro256PlusPlus>> = const { RefCell::new(None) };
}

/// A uniform draw from (0, 1] with 53 bits of precision, so `-ln(u) <= 53 ln 2 < 36.8`.
pub(crate) fn unit_open_closed() -> f64 {
    let bits = RNG
        .try_with(|cell| {
            let mut slot = cell.try_borrow_mut().ok()?;
            let rng = slot.get_or_insert_with(|| {
                let seed = RandomState::new().hash_one(std::thread::current().id());
                Xoshiro256PlusPlus::seed_from_u64(seed)
            });
            Some(rng.next_u64())
        })
        .ok()
        .flatten()
        // Thread teardown or re-entry: a draw of 1 means "no early refresh" for this read.
        .unwrap_or(u64::MAX);
    to_unit(bits)
}

/// Maps 64 random bits to (0, 1].
#[inline]
pub(crate) fn to_unit(bits: u64) -> f64 {
    ((bits >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_in_the_half_open_unit_interval() {
        assert_eq!(to_unit(u64::MAX), 1.0);
        assert!(to_unit(0) > 0.0);
        assert!((-to_unit(0).ln()) < 36.8);
        for _ in 0..1000 {
            let u = unit_open_closed();
            assert!(u > 0.0 && u <= 1.0);
        }
    }
}
