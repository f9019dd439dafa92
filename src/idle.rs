//! An entry's idle deadline (`time_to_idle`): 32 bits of idle units (see
//! `clock::IDLE_SHIFT`), compared with wrapping arithmetic, moved forward by its uses.

use crate::clock::{idle_unit, IDLE_SHIFT};
use crate::sync::{AtomicU32, Ordering};

/// The idle unit from which an entry counts as expired for want of use.
#[derive(Debug)]
pub(crate) struct Idle {
    until: AtomicU32,
}

impl Idle {
    /// The deadline of an entry written at `now` (nanoseconds) that expires after `units`
    /// idle units unused.
    pub(crate) fn new(now: u64, units: u32) -> Self {
        Idle {
            until: AtomicU32::new(deadline(now, units)),
        }
    }

    /// A use at `now` moves the deadline to `units` from now. Test before set: the deadline
    /// moves once per idle unit, so a hot entry's is written about 60 times a second at
    /// most, not per hit. Only forward, from what this use read: two racing uses may still
    /// leave the earlier of their deadlines (one unit apart at most). Relaxed: a hint, like
    /// the hit counter.
    #[inline]
    pub(crate) fn used(&self, now: u64, units: u32) {
        let next = deadline(now, units);
        let current = self.until.load(Ordering::Relaxed);
        if (next.wrapping_sub(current) as i32) > 0 {
            self.until.store(next, Ordering::Relaxed);
        }
    }

    /// The deadline in nanoseconds, as seen at `now`: the 32-bit deadline is placed within
    /// 2^31 units of `now`.
    pub(crate) fn nanos(&self, now: u64) -> u64 {
        let until = self.until.load(Ordering::Relaxed);
        let ahead = i64::from(until.wrapping_sub(idle_unit(now)) as i32);
        let units = (now >> IDLE_SHIFT).saturating_add_signed(ahead);
        units.saturating_mul(1 << IDLE_SHIFT)
    }

    /// Whether the entry has gone unused past its deadline at `now` (nanoseconds).
    #[inline]
    pub(crate) fn expired(&self, now: u64) -> bool {
        (idle_unit(now).wrapping_sub(self.until.load(Ordering::Relaxed)) as i32) >= 0
    }
}

/// The deadline of a use at `now` (nanoseconds): `units` idle units later. One more unit:
/// `now` is rounded down to its unit, and the deadline must be at least `units` whole units
/// after `now` itself, never before.
fn deadline(now: u64, units: u32) -> u32 {
    idle_unit(now).wrapping_add(units).wrapping_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNIT: u64 = 1 << IDLE_SHIFT;

    #[test]
    fn an_entry_idles_out_no_earlier_than_its_time_to_idle_after_its_last_use() {
        let idle = Idle::new(10 * UNIT + 5, 3);
        assert!(
            !idle.expired(13 * UNIT + 5),
            "expired before three whole units"
        );
        assert!(
            idle.expired(14 * UNIT),
            "still alive a unit past its deadline"
        );
        assert_eq!(idle.nanos(10 * UNIT), 14 * UNIT);
        idle.used(12 * UNIT, 3);
        assert!(
            !idle.expired(15 * UNIT + 5),
            "a use did not move the deadline"
        );
        assert_eq!(idle.nanos(12 * UNIT), 16 * UNIT);
        // An older use racing in late never moves it back.
        idle.used(11 * UNIT, 3);
        assert_eq!(idle.nanos(12 * UNIT), 16 * UNIT);
    }

    #[test]
    fn deadlines_compare_across_the_wrap_of_their_units() {
        let near_wrap = u64::from(u32::MAX - 1) * UNIT;
        let idle = Idle::new(near_wrap, 4);
        assert!(
            !idle.expired(near_wrap + 3 * UNIT),
            "expired early across the wrap"
        );
        assert!(
            idle.expired(near_wrap + 6 * UNIT),
            "never expired across the wrap"
        );
    }
}
