//! Sizing W-TinyLFU's window by marginal utility: would a slightly larger window have caught
//! more hits than a slightly smaller main space loses?
//!
//! - Gain: a candidate that lost its duel at the window's exit and is missed again within
//!   the next `delta` units of new keys would have been a hit in a window `delta` larger
//!   (it would still have been in it). The sizer remembers rejections in a ghost (a tag of
//!   the policy key and when it left, no values) and counts the returns.
//! - Loss: a main-space victim hit while it was within `delta` of the main space's cold end
//!   would have been evicted before that hit by a main space `delta` smaller. The policy
//!   looks at each probation entry as it comes within `delta` of the cold end (its cold
//!   zone), so the hits it finds at the cold end came inside the zone, and each such victim
//!   counts one.
//!
//! Once there are `DECIDE_AFTER` units of evidence, a decision points toward the larger
//! side if it is larger by more than chance would make it (`SIGNIFICANT`), and waits for
//! more evidence otherwise (up to `GIVE_UP_AFTER` units, then starts over). Where the window
//! is near its best size the two sides balance, and a decision by majority would move it
//! on chance: a walk that cannot go below nothing drifts up, and on a stationary workload
//! it took the window far past its best size the longer the cache ran. The window moves
//! `STEP` of the capacity that way, unless the decision before pointed the other way: then
//! it waits for a second decision that agrees. Decisions
//! are at least `DECIDE_EVERY` of the reach apart in new keys, so that a burst of correlated
//! evidence (a run of rejected keys coming back together) counts once. Both signals come
//! from writes and looks the policy makes anyway, so the sizer adds nothing to hits. It
//! reacts within a few hundred new keys, where a hit-ratio hill climbing needs samples of
//! many lookups per entry of capacity, too few on short traces at large capacities.
//!
//! A loop longer than the cache that follows a recency-heavy phase is the sizer's blind
//! spot: in a large window such a loop looks like near misses (each rejected key returns
//! shortly after leaving, in misses counted), so it would keep the window large while the
//! cache thrashes. The cache's own hit ratio guards that case: when one sample of lookups
//! hits far less than the one before, the window starts over from its initial size.

/// The reach, `delta`, of the ghost and of the cold zone: this share of the capacity (at
/// least one unit).
const REACH: f64 = 1.0 / 32.0;
/// How far the window moves per decision, as a share of the capacity (at least one unit):
/// large enough that a cache needing a large window gets there.
const STEP: f64 = 0.01;
/// Evidence (gain plus loss) per decision: enough that a loss arriving in a burst (many
/// second chances in one write) does not count as one decision against several small gains.
const DECIDE_AFTER: f64 = 8.0;
/// The fewest new keys between two decisions, as a share of the reach: evidence arriving
/// sooner waits for the next decision, so that a run of rejected keys returning together
/// counts once.
const DECIDE_EVERY: f64 = 0.5;
/// Lookups per sample of the hit ratio: this many per unit of capacity, within bounds.
const SAMPLE_PER_UNIT: u64 = 20;
const SAMPLE_MIN: u64 = 300;
const SAMPLE_MAX: u64 = 1 << 21;
/// New keys between two readings of the cache's lookup counters.
const CHECK_EVERY: u32 = 16;
/// A sample whose hit ratio is this much (absolute) below the previous one means the
/// workload changed under the cache: the window starts over.
const COLLAPSE: f64 = 0.25;

/// Lookups the cache has served so far: its hit and miss counters (they only grow).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Requests {
    pub(crate) hits: u64,
    pub(crate) misses: u64,
}

/// The cache's side of the sizer: its lookup counters, read now.
pub(crate) type Served<'a> = dyn Fn() -> Requests + 'a;

/// What the sizer decided on a new key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resize {
    /// Keep the window as it is.
    Keep,
    /// Grow the window by this many units.
    Grow(u64),
    /// Shrink the window by this many units.
    Shrink(u64),
    /// The workload changed: back to the initial window.
    Restart,
}

/// The hit ratio per sample, watched for a collapse.
#[derive(Debug)]
struct Watch {
    /// The counters when the sample began.
    start: Requests,
    /// New keys since the counters were last read.
    unchecked: u32,
    sample: u64,
    /// The previous sample's hit ratio (none yet: negative).
    previous: f64,
}

/// Evidence decides only when its imbalance is this many standard deviations of the
/// imbalance that chance gives equal odds (`gain - loss` against `sqrt(gain + loss)`): a
/// decision by majority moves the window on noise where the two sides balance (see
/// [`Sizer::new_key`]).
const SIGNIFICANT: f64 = 2.0;
/// Evidence still not significant at this many units is dropped: gathered over that many
/// new keys, it says that the window is about right.
const GIVE_UP_AFTER: f64 = 8.0 * DECIDE_AFTER;

/// Ghost slots per unit of reach: with four, few rejections within reach share a slot. At
/// most `MAX_SLOTS` (8 MiB): beyond about 8 million units of capacity the ghost forgets
/// some rejections early, which only makes it slower to grow the window.
const SLOTS_PER_REACH: u64 = 4;
const MAX_SLOTS: u64 = 1 << 20;

#[derive(Debug)]
pub(crate) struct Sizer {
    /// `delta`, in units of weight (entries, without a weigher).
    reach: u64,
    /// Units per move: whole, so that growing and shrinking move the window alike.
    step: u64,
    /// Weight of the new keys written so far (wrapping): the clock of the ghost.
    clock: u32,
    /// Rejected keys, direct-mapped by policy key (already a seeded hash): in each slot the
    /// key's upper half as a tag (made odd, so 0 is an empty slot) above the `clock` when it
    /// was rejected. A rejection overwrites whatever held its slot, and a slot older than
    /// `reach` is stale, so no list of the last rejections is kept: a write costs one slot
    /// read, a rejection one slot write. Zeroed memory, so a large ghost costs no time to
    /// make and its pages only when used.
    ghost: Box<[u64]>,
    gain: f64,
    loss: f64,
    /// The `clock` at the last decision.
    decided_at: u32,
    /// The direction of the last decision that was not a tie (`true`: grow), whether or not
    /// the window moved on it; none at the start and after a restart.
    heading: Option<bool>,
    watch: Watch,
}

impl Sizer {
    pub(crate) fn new(max: u64) -> Self {
        // Within u32: ages are measured with a wrapping u32 clock.
        let reach = ((max as f64 * REACH) as u64).clamp(1, 1 << 30);
        let slots = (reach * SLOTS_PER_REACH).next_power_of_two().min(MAX_SLOTS) as usize;
        Sizer {
            reach,
            step: ((max as f64 * STEP).round() as u64).max(1),
            clock: 0,
            ghost: vec![0; slots].into_boxed_slice(),
            gain: 0.0,
            loss: 0.0,
            decided_at: 0,
            heading: None,
            watch: Watch {
                start: Requests::default(),
                unchecked: 0,
                sample: max
                    .saturating_mul(SAMPLE_PER_UNIT)
                    .clamp(SAMPLE_MIN, SAMPLE_MAX),
                previous: -1.0,
            },
        }
    }

    /// A candidate lost its duel at the window's exit and was evicted.
    pub(crate) fn rejected(&mut self, pkey: u64) {
        let (slot, tag) = self.slot(pkey);
        self.ghost[slot] = u64::from(tag) << 32 | u64::from(self.clock);
    }

    fn slot(&self, pkey: u64) -> (usize, u32) {
        let slot = pkey as usize & (self.ghost.len() - 1);
        (slot, (pkey >> 32) as u32 | 1)
    }

    /// `delta`: how far from the main space's cold end a hit counts as loss, in weight.
    pub(crate) fn reach(&self) -> u64 {
        self.reach
    }

    /// A main-space victim was hit while within `reach` of the cold end.
    pub(crate) fn cold_hit(&mut self) {
        self.loss += 1.0;
    }

    /// The loss counted since the last decision.
    #[cfg(test)]
    pub(crate) fn pending_loss(&self) -> f64 {
        self.loss
    }

    /// A key the policy did not hold was written, weighing `weight`: counts a ghost's return
    /// and decides whether the window moves.
    pub(crate) fn new_key(&mut self, pkey: u64, weight: u64, served: &Served<'_>) -> Resize {
        self.clock = self
            .clock
            .wrapping_add(weight.clamp(1, u64::from(u32::MAX)) as u32);
        let (slot, tag) = self.slot(pkey);
        let g = self.ghost[slot];
        let at = g as u32;
        if (g >> 32) as u32 == tag && u64::from(self.clock.wrapping_sub(at)) <= self.reach {
            self.gain += 1.0;
            self.ghost[slot] = 0;
        }
        if self.collapsed(served) {
            self.gain = 0.0;
            self.loss = 0.0;
            self.heading = None;
            return Resize::Restart;
        }
        if self.gain + self.loss < DECIDE_AFTER
            || (self.clock.wrapping_sub(self.decided_at) as f64) < DECIDE_EVERY * self.reach as f64
        {
            return Resize::Keep;
        }
        let (gain, loss) = (self.gain, self.loss);
        let (n, d) = (gain + loss, gain - loss);
        if d * d < SIGNIFICANT * SIGNIFICANT * n {
            // Not yet told apart from chance (a tie never is): more evidence may tell.
            if n >= GIVE_UP_AFTER {
                self.start_evidence();
            }
            return Resize::Keep;
        }
        self.start_evidence();
        let grow = gain > loss;
        let reverses = self.heading == Some(!grow);
        self.heading = Some(grow);
        if reverses {
            // One decision against the one before is often noise: moving back and forth
            // costs hits where no fixed size does. Wait for a second decision.
            return Resize::Keep;
        }
        if grow {
            Resize::Grow(self.step)
        } else {
            Resize::Shrink(self.step)
        }
    }

    /// Drops the evidence gathered so far: the next decision weighs only what comes after
    /// now, and waits `DECIDE_EVERY` of the reach in new keys.
    fn start_evidence(&mut self) {
        self.decided_at = self.clock;
        self.gain = 0.0;
        self.loss = 0.0;
    }

    /// Whether the sample that just ended hit far less than the one before.
    fn collapsed(&mut self, served: &Served<'_>) -> bool {
        let w = &mut self.watch;
        w.unchecked += 1;
        if w.unchecked < CHECK_EVERY {
            return false;
        }
        w.unchecked = 0;
        let now = served();
        let hits = now.hits.wrapping_sub(w.start.hits);
        let lookups = hits.wrapping_add(now.misses.wrapping_sub(w.start.misses));
        if lookups < w.sample {
            return false;
        }
        w.start = now;
        let rate = hits as f64 / lookups as f64;
        let collapsed = w.previous >= 0.0 && rate < w.previous - COLLAPSE;
        w.previous = rate;
        collapsed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle() -> Requests {
        Requests::default()
    }

    /// A policy key: a hash, as the cache makes them.
    fn key(k: u64) -> u64 {
        (k + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    #[test]
    fn rejected_keys_that_return_soon_grow_the_window() {
        let mut s = Sizer::new(1_000); // reach 31, step 10
        let mut decisions = Vec::new();
        for k in 0..16u64 {
            s.rejected(key(k));
            decisions.push(s.new_key(key(k), 1, &idle));
        }
        assert!(decisions.contains(&Resize::Grow(10)), "{decisions:?}");
        assert!(!decisions.iter().any(|d| matches!(d, Resize::Shrink(_))));
    }

    #[test]
    fn a_rejected_key_that_returns_late_is_no_evidence() {
        let mut s = Sizer::new(1_000); // reach 31
        for k in 0..8 {
            s.rejected(key(k));
        }
        for k in 100..200 {
            assert_eq!(s.new_key(key(k), 1, &idle), Resize::Keep);
        }
        // Eight returns would be a decision if they counted.
        for k in 0..8 {
            assert_eq!(
                s.new_key(key(k), 1, &idle),
                Resize::Keep,
                "returned after 100 new keys"
            );
        }
    }

    /// New keys that are no evidence, until the sizer may decide again.
    fn advance(s: &mut Sizer, from: u64) {
        for k in from..from + 16 {
            assert_eq!(s.new_key(key(k), 1, &idle), Resize::Keep);
        }
    }

    /// Rejected keys that come back at once: one unit of gain each.
    fn returns(s: &mut Sizer, keys: std::ops::Range<u64>) -> Vec<Resize> {
        keys.map(|k| {
            s.rejected(key(k));
            s.new_key(key(k), 1, &idle)
        })
        .collect()
    }

    /// Units of evidence per decision.
    const DECISION: u64 = DECIDE_AFTER as u64;

    fn cold_hits(s: &mut Sizer, at: u64) -> Resize {
        for _ in 0..DECISION {
            s.cold_hit();
        }
        s.new_key(key(at), 1, &idle)
    }

    #[test]
    fn hits_at_the_cold_end_of_the_main_space_shrink_the_window() {
        let mut s = Sizer::new(1_000); // reach 31, step 10
        advance(&mut s, 1_000);
        assert_eq!(cold_hits(&mut s, 1), Resize::Shrink(10));
    }

    #[test]
    fn a_tie_or_a_slight_majority_leaves_the_window_as_it_is() {
        let mut s = Sizer::new(1_000);
        advance(&mut s, 1_000);
        let half = DECISION / 2;
        for _ in 0..half {
            s.cold_hit();
        }
        let decided = returns(&mut s, 0..half);
        assert!(decided.iter().all(|d| *d == Resize::Keep), "{decided:?}");
        advance(&mut s, 2_000);
        // Six gains against four losses: a majority, which chance gives often.
        let decided = returns(&mut s, 10..12);
        assert!(decided.iter().all(|d| *d == Resize::Keep), "{decided:?}");
        // More gains decide once the imbalance is significant: twelve against four.
        let decided = returns(&mut s, 20..30);
        assert!(decided.contains(&Resize::Grow(10)), "{decided:?}");
    }

    #[test]
    fn a_reversal_waits_for_a_second_decision_the_same_way() {
        use Resize::{Grow, Keep, Shrink};
        let mut s = Sizer::new(1_000); // step 10
        let mut round = 0;
        let mut decide = |s: &mut Sizer, grow: bool| {
            round += 1;
            advance(s, 1_000 * round);
            if grow {
                *returns(s, 100 * round..100 * round + DECISION)
                    .last()
                    .unwrap()
            } else {
                cold_hits(s, 100 * round)
            }
        };
        let moves: Vec<_> = [false, false, true, false, true, true, true, false, false]
            .into_iter()
            .map(|grow| decide(&mut s, grow))
            .collect();
        assert_eq!(
            moves,
            [
                Shrink(10),
                Shrink(10),
                Keep,
                Keep,
                Keep,
                Grow(10),
                Grow(10),
                Keep,
                Shrink(10)
            ]
        );
    }

    /// On a workload whose best window is where the sizer stands, the evidence balances and
    /// decisions fall either way by chance; the window must not wander on them (it could
    /// not come back below nothing, so it would drift large and the cache towards LRU).
    #[test]
    fn evidence_that_balances_leaves_the_window_near_where_it_was() {
        let mut s = Sizer::new(1_000); // reach 31, step 10
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        // Where the window stands, in steps from its start; it cannot go below the
        // start's distance from nothing, one step here.
        let (mut at, mut farthest, mut moves) = (0i64, 0i64, 0);
        for k in 0..40_000u64 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            if rng & 1 == 0 {
                s.rejected(key(k));
            } else {
                s.cold_hit();
            }
            match s.new_key(key(k), 1, &idle) {
                Resize::Grow(_) => at += 1,
                Resize::Shrink(_) => at = (at - 1).max(-1),
                _ => continue,
            }
            moves += 1;
            farthest = farthest.max(at);
        }
        // A decision by majority, as the sizer made them before, moved 1,253 times here and
        // took the window 40 steps up.
        assert!(
            moves <= 200 && farthest <= 12,
            "{moves} moves on balanced evidence took the window {farthest} steps up"
        );
    }

    #[test]
    fn evidence_that_arrives_in_a_burst_makes_one_decision() {
        let mut s = Sizer::new(1_000); // decisions at least 15.5 new keys apart
        advance(&mut s, 1_000);
        let decided = returns(&mut s, 0..16);
        let moves: Vec<_> = decided.iter().filter(|d| **d != Resize::Keep).collect();
        assert_eq!(moves, [&Resize::Grow(10)], "{decided:?}");
    }

    #[test]
    fn the_ghost_is_sized_by_its_reach_and_bounded() {
        let s = Sizer::new(1_000);
        assert_eq!(
            s.ghost.len(),
            128,
            "31 units of reach, 4 slots each, rounded up"
        );
        let huge = Sizer::new(u64::MAX);
        assert_eq!(huge.reach, 1 << 30, "ages fit the u32 clock");
        assert_eq!(huge.ghost.len(), 1 << 20, "8 MiB at most");
    }

    #[test]
    fn a_collapse_of_the_hit_ratio_restarts() {
        let mut s = Sizer::new(100); // samples of 2,000 lookups
        let served = std::cell::Cell::new(Requests::default());
        let read = || served.get();
        let mut sample = |hits: u64| {
            let r = served.get();
            served.set(Requests {
                hits: r.hits + hits,
                misses: r.misses + 2_000 - hits,
            });
            (0..CHECK_EVERY)
                .map(|i| s.new_key(key(10_000 + u64::from(i)), 1, &read))
                .collect::<Vec<_>>()
        };
        sample(1_800);
        assert!(!sample(1_700).contains(&Resize::Restart), "90% to 85%");
        assert!(sample(200).contains(&Resize::Restart), "85% to 10%");
        assert!(!sample(0).contains(&Resize::Restart), "10% to 0%");
    }
}
