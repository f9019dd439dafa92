use super::*;
use crate::policy::window::Requests;
use std::collections::HashMap;
use std::rc::Rc;

/// The cache's side, as a policy sees it: a table of one node (a shared link) per
/// key, the hits recorded in them (reported and reset at a look), and the lookups served
/// (a hit per `hit`, a miss per write). Writes report in table order unless a test
/// reorders them.
#[derive(Default)]
struct Entries {
    /// Shared, not boxed: the policy writes through its own pointers to the nodes, which
    /// a `Box` moved into the map would claim to own alone.
    table: HashMap<u64, Rc<Link>>,
    hits: HashMap<u64, u8>,
    served: Requests,
}

fn tracked(link: &Link) -> Tracked {
    NonNull::from(link)
}

impl Entries {
    fn hit(&mut self, key: u64) {
        let h = self.hits.entry(key).or_default();
        *h = (*h + 1).min(3);
        self.served.hits += 1;
    }
    /// Whether the table holds `key`: every key the policy has not evicted.
    fn holds(&self, key: u64) -> bool {
        self.table.contains_key(&key)
    }
    /// Takes the victims out of the table, as the cache does, checking each was the
    /// key's node and is detached.
    fn evicted(&mut self, out: &[Victim]) {
        for v in out {
            let node = self
                .table
                .remove(&v.pkey)
                .expect("a victim the table holds");
            assert_eq!(tracked(&node), v.node, "the victim is the key's node");
            assert_eq!(node.record(), DETACHED, "a victim is detached");
            self.hits.remove(&v.pkey);
        }
    }
    /// Writes `key` with `weight` (a new node replacing the key's last, reported at once),
    /// looking at entries with `look` (by default, the hits recorded); returns the
    /// victims, taken out of the table.
    fn put(
        &mut self,
        core: &mut Core,
        key: u64,
        weight: u64,
        look: Option<&mut Probe<'_>>,
    ) -> Vec<Victim> {
        let node = Rc::new(Link::new());
        let write = Write {
            pkey: key,
            node: tracked(&node),
            old: None,
            weight,
        };
        let old = self.table.insert(key, node);
        let write = Write {
            old: old.as_deref().map(tracked),
            ..write
        };
        self.served.misses += 1;
        let served = self.served;
        let mut out = Vec::new();
        let hits = &mut self.hits;
        let mut recorded = |v: &Victim| Look {
            hits: hits.remove(&v.pkey).unwrap_or(0),
            expired: false,
        };
        let look: &mut Probe<'_> = match look {
            Some(look) => look,
            None => &mut recorded,
        };
        // SAFETY: both nodes are live; the old one left the table just now.
        unsafe { core.write(write, &mut out, look, &|| served) };
        self.evicted(&out);
        out
    }
    /// Every node in the table names its record, and each record points back at it.
    fn check(&self, core: &Core) {
        assert_eq!(core.len(), self.table.len(), "one record per key held");
        for (key, node) in &self.table {
            let r = node.record();
            assert!(r < DETACHED, "key {key} has no record");
            assert_eq!(core.nodes[r as usize].node, tracked(node));
            assert_eq!(core.pkey(r), *key);
        }
    }
}

fn write_w(core: &mut Core, e: &mut Entries, key: u64, w: u64) -> Vec<Victim> {
    e.put(core, key, w, None)
}

/// A lookup of `key` as the cache does it: a hit if the table holds the key, else a
/// miss and a write.
fn read(core: &mut Core, e: &mut Entries, key: u64) -> bool {
    if e.holds(key) {
        e.hit(key);
        true
    } else {
        write(core, e, key);
        false
    }
}

fn write(core: &mut Core, e: &mut Entries, key: u64) -> Vec<Victim> {
    write_w(core, e, key, 1)
}

/// Reports a write of weight 1 of `node` for `pkey`, in place of `old`, with no hits to
/// look at; returns the victims. The nodes must live to the end of the test.
fn report(core: &mut Core, pkey: u64, node: &Link, old: Option<&Link>) -> Vec<Victim> {
    let w = Write {
        pkey,
        node: tracked(node),
        old: old.map(tracked),
        weight: 1,
    };
    let mut out = Vec::new();
    // SAFETY: the nodes are live (the caller's word).
    unsafe { core.write(w, &mut out, &mut |_| Look::default(), &Requests::default) };
    out
}

/// A cache configured for far more than it holds pays for the counters of what it holds.
#[test]
fn a_policy_far_from_its_capacity_counts_for_the_keys_it_holds() {
    let mut core = Core::new(10_000_000, 1);
    let mut e = Entries::default();
    let keys = if cfg!(miri) { 300 } else { 20_000 };
    for k in 0..keys {
        write(&mut core, &mut e, k);
    }
    let words = 8 * core.sketch.blocks();
    assert!(
        words <= (keys as usize).next_power_of_two().max(1_024),
        "{keys} keys held, a sketch of {words} words"
    );
    assert!(
        words >= keys as usize,
        "{keys} keys held, a sketch of {words} words"
    );
}

/// A node as the cache lays one out for a policy that reads keys from it: the table
/// hash, and the link.
#[repr(C)]
struct Hashed {
    hash: u64,
    link: Link,
}

fn tracked_in(node: &Hashed) -> Tracked {
    // SAFETY: the link is a field of the node, at this offset.
    unsafe {
        NonNull::from(node)
            .byte_add(std::mem::offset_of!(Hashed, link))
            .cast()
    }
}

/// A policy that reads each record's key from its node (as a cache without the shared
/// tier does) keeps, evicts and counts exactly as one told the same keys with each write
/// and keeping them: the key it reads is the one each write reported.
#[test]
fn a_policy_that_reads_its_keys_from_the_nodes_chooses_as_one_that_keeps_them() {
    let seed = 0x5eed;
    let mut kept = Core::new(40, 7);
    let mut read = Core::new(40, 7);
    // SAFETY: `Hashed` keeps its hash before its link, and `tracked_in` addresses the
    // link from the whole node.
    unsafe { read.derive_pkeys(std::mem::offset_of!(Hashed, link), seed) };
    let mut links: HashMap<u64, Rc<Link>> = HashMap::new();
    let mut nodes: HashMap<u64, Rc<Hashed>> = HashMap::new();
    let mut gone: Vec<Rc<Hashed>> = Vec::new();
    let mut hits: HashMap<u64, u8> = HashMap::new();
    let writes = if cfg!(miri) { 300 } else { 3_000u64 };
    for n in 0..writes {
        // Keys 0..120, the lower ones more often, and every fifth write a hit.
        let key = (n * n + 7 * n) % 120 % (1 + n % 120);
        let pkey = pkey_of_hash(key, seed);
        if n % 5 == 0 && nodes.contains_key(&key) {
            let h = hits.entry(pkey).or_default();
            *h = (*h + 1).min(3);
            continue;
        }
        let link = Rc::new(Link::new());
        let node = Rc::new(Hashed {
            hash: key,
            link: Link::new(),
        });
        let old_link = links.insert(pkey, Rc::clone(&link));
        let old_node = nodes.insert(key, Rc::clone(&node));
        let mut out = [Vec::new(), Vec::new()];
        let mut looks = [Vec::new(), Vec::new()];
        let write = |node, old| Write {
            pkey,
            node,
            old,
            weight: 1,
        };
        for (side, (core, write)) in [
            (
                &mut kept,
                write(tracked(&link), old_link.as_deref().map(tracked)),
            ),
            (
                &mut read,
                write(tracked_in(&node), old_node.as_deref().map(tracked_in)),
            ),
        ]
        .into_iter()
        .enumerate()
        {
            let seen = &mut looks[side];
            let hits = hits.clone();
            let mut probe = |v: &Victim| {
                seen.push(v.pkey);
                Look {
                    hits: hits.get(&v.pkey).copied().unwrap_or(0),
                    expired: false,
                }
            };
            // SAFETY: both nodes are live; the old one left the table just now.
            unsafe { core.write(write, &mut out[side], &mut probe, &Requests::default) };
        }
        for looked in &looks[0] {
            hits.remove(looked);
        }
        gone.extend(old_node);
        let evicted = |out: &Vec<Victim>| out.iter().map(|v| v.pkey).collect::<Vec<_>>();
        assert_eq!(looks[0], looks[1], "write {n}: the same entries looked at");
        assert_eq!(
            evicted(&out[0]),
            evicted(&out[1]),
            "write {n}: the same victims"
        );
        for v in &out[1] {
            let key = nodes
                .iter()
                .find(|(_, h)| tracked_in(h) == v.node)
                .map(|(k, _)| *k);
            gone.extend(key.and_then(|k| nodes.remove(&k)));
            links.remove(&v.pkey);
        }
    }
    assert_eq!(kept.len(), read.len());
    assert!(
        kept.len() <= 40 && kept.len() > 20,
        "{} entries held",
        kept.len()
    );
}

/// Also Miri's look at the policy's pointers into the nodes through eviction churn, so
/// fewer writes there.
#[test]
fn stays_within_capacity_and_reports_each_victim_once() {
    let mut core = Core::new(50, 3);
    let mut e = Entries::default();
    let mut held = std::collections::HashSet::new();
    for v in 0..if cfg!(miri) { 300 } else { 1_000u64 } {
        let key = v * 7 % 300;
        held.insert(key);
        if v % 3 == 0 {
            e.hit(v % 40);
        }
        for victim in write(&mut core, &mut e, key) {
            assert!(
                held.remove(&victim.pkey),
                "victim {victim:?} reported twice"
            );
        }
        assert!(core.weight() <= 50);
        assert_eq!(core.len(), held.len());
    }
    e.check(&core);
}

#[test]
#[cfg_attr(miri, ignore = "safe code, 20,000 writes: too slow under Miri")]
fn a_scan_does_not_flush_frequently_read_keys() {
    let mut core = Core::new(100, 9);
    let mut e = Entries::default();
    for k in 0..50 {
        write(&mut core, &mut e, k);
    }
    // One-off keys stream through while the hot keys keep being read.
    for (i, k) in (1_000..21_000).enumerate() {
        read(&mut core, &mut e, i as u64 % 50);
        read(&mut core, &mut e, k);
    }
    let survivors = (0..50).filter(|&k| e.holds(k)).count();
    assert!(
        survivors >= 45,
        "only {survivors} of 50 hot keys survived the scan"
    );
}

/// A policy of 100 entries filled with keys 0 to 99, none of them hit: 99 in the main
/// space, all entered unchallenged, and one in the window.
fn filled(seed: u64) -> (Core, Entries) {
    let mut core = Core::new(100, seed);
    let mut e = Entries::default();
    for k in 0..100 {
        write(&mut core, &mut e, k);
    }
    (core, e)
}

/// `filled`, then key 98 written again: promoted to protected, so the main space has had
/// a hit and the other 98 fill keys are open to candidates seen twice.
fn filled_and_reused(seed: u64) -> (Core, Entries) {
    let (mut core, mut e) = filled(seed);
    write(&mut core, &mut e, 98);
    (core, e)
}

/// Writes each of `keys` `times` times in a row (each write counts in the sketch).
fn seen(core: &mut Core, e: &mut Entries, keys: std::ops::Range<u64>, times: u32) {
    for k in keys {
        for _ in 0..times {
            write(core, e, k);
        }
    }
}

#[test]
fn keys_seen_twice_replace_keys_from_the_fill_that_were_never_hit() {
    let (mut core, mut e) = filled_and_reused(11);
    seen(&mut core, &mut e, 1_000..1_050, 2);
    write(&mut core, &mut e, 2_000); // pushes the last of them out of the window
    let admitted = (1_000..1_050).filter(|&k| e.holds(k)).count();
    assert_eq!(admitted, 50, "seen twice against fill keys seen once");
}

#[test]
fn the_fill_keeps_the_margin_until_the_main_space_has_a_hit() {
    // The second pass of a loop longer than the cache: every key that misses is seen
    // twice, and the fill keys it would push out come round at the end of the pass.
    let (mut core, mut e) = filled(11);
    seen(&mut core, &mut e, 1_000..1_050, 2);
    write(&mut core, &mut e, 2_000); // pushes the last of them out of the window
    assert_eq!((0..99).filter(|&k| e.holds(k)).count(), 99);

    // A fill key read again: found at the next duel and promoted. From then on, keys
    // seen twice replace the fill keys that were never hit.
    e.hit(0);
    seen(&mut core, &mut e, 3_000..3_050, 2);
    write(&mut core, &mut e, 4_000);
    assert!(e.holds(0), "the key read again stays");
    let admitted = (3_000..3_050).filter(|&k| e.holds(k)).count();
    assert_eq!(admitted, 50, "seen twice against fill keys seen once");
}

#[test]
fn keys_seen_once_do_not_replace_keys_from_the_fill() {
    // A long loop's first keys look like this until it comes round again. 700 newcomers
    // take the sketch through a halving (every 640 increments here): the fill keys are
    // then estimated at 0, and each newcomer after it at 1.
    let (mut core, mut e) = filled_and_reused(11);
    seen(&mut core, &mut e, 1_000..1_700, 1);
    let held = (0..99).filter(|&k| e.holds(k)).count();
    assert_eq!(held, 99, "a newcomer seen once replaced a fill key");
}

#[test]
fn keys_that_won_their_duel_keep_the_margin() {
    let (mut core, mut e) = filled_and_reused(11);
    // Seen twice: they replace the 98 fill keys in probation, and are in the main space
    // by duel.
    seen(&mut core, &mut e, 1_000..1_098, 2);
    // Seen three times: one more than the winners, which is not enough against them.
    seen(&mut core, &mut e, 3_000..3_030, 3);
    write(&mut core, &mut e, 4_000); // pushes the last of them out of the window
    assert_eq!((1_000..1_098).filter(|&k| e.holds(k)).count(), 98);
    assert!((3_000..3_030).all(|k| !e.holds(k)));
}

#[test]
fn only_hits_near_the_cold_end_count_as_the_main_space_s_loss() {
    // 100 entries: a reach of 3, a window of 1, 98 in probation (0 the coldest).
    let (mut core, mut e) = filled_and_reused(11);
    write(&mut core, &mut e, 1_000); // the first duel: 0, 1 and 2 enter the cold zone
    e.hit(1); // in the zone: a main space 3 smaller would have lost this hit
    e.hit(50); // far from it: promoted when it enters the zone, no loss

    // Keys seen twice replace the fill keys one by one, taking the cold end past 50.
    seen(&mut core, &mut e, 2_000..2_060, 2);
    assert!(e.holds(1) && e.holds(50));
    assert!(!e.holds(51), "the cold end went past 50");
    assert_eq!(core.sizer.pending_loss(), 1.0);
}

/// The window's share after `accesses` lookups of `next_key`'s keys through a policy of
/// `capacity` entries, and the hit ratio.
fn run(capacity: u64, accesses: u64, mut next_key: impl FnMut(u64) -> u64) -> (f64, f64) {
    let mut core = Core::new(capacity, 5);
    let mut e = Entries::default();
    let mut hits = 0;
    for i in 0..accesses {
        hits += u64::from(read(&mut core, &mut e, next_key(i)));
    }
    (
        core.window_max as f64 / capacity as f64,
        hits as f64 / accesses as f64,
    )
}

#[test]
#[cfg_attr(miri, ignore = "safe code, 200,000 lookups: too slow under Miri")]
fn the_window_grows_where_recency_pays_and_stays_small_where_it_does_not() {
    // Recency: half the lookups are of a new key, the other half of one of the 80 newest
    // keys. Reads of recent keys pay, frequency says little: at the initial 1% window a
    // new key leaves the window before it is read again and loses the duel against
    // older keys read more often (the first 20,000 lookups hit about 6%).
    let mut rng = 7u64;
    let mut newest = 0u64;
    let recent = |_| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        if rng % 2 == 0 {
            newest += 1;
            newest
        } else {
            newest.saturating_sub((rng >> 8) % 80)
        }
    };
    let (window, hit_ratio) = run(100, 200_000, recent);
    assert!(
        window > 0.5,
        "recency-heavy workload left the window at {window:.2}"
    );
    assert!(
        hit_ratio > 0.35,
        "recency-heavy workload hit only {hit_ratio:.2}"
    );
    // A loop over 120 keys, 20 more than fit: only frequency-based admission keeps most
    // of them (a large window turns the cache into an LRU, which hits nothing here).
    let (window, hit_ratio) = run(100, 200_000, |i| i % 120);
    assert!(
        window < 0.2,
        "looping workload grew the window to {window:.2}"
    );
    assert!(hit_ratio > 0.6, "looping workload hit only {hit_ratio:.2}");
}

const ZIPF_KEYS: usize = 400_000;
const ZIPF_LOOKUPS: u64 = 1_000_000;

#[test]
#[cfg_attr(miri, ignore = "safe code, a million lookups: too slow under Miri")]
fn a_skewed_workload_larger_than_the_cache_keeps_a_small_window() {
    // Zipf(1) over 400,000 keys: frequency pays, recency adds little. Each growth of the
    // window pushes main victims out; evicted unseen, their hits would never count
    // against it, and the window would end at all of the cache (an LRU: 73.0% hits
    // against 75.0% at a 1% window).
    let mut cdf = Vec::with_capacity(ZIPF_KEYS);
    let mut total = 0.0;
    for k in 1..=ZIPF_KEYS {
        total += 1.0 / k as f64;
        cdf.push(total);
    }
    let mut rng = 11u64;
    let zipf = |_| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let u = (rng >> 11) as f64 / (1u64 << 53) as f64 * total;
        // A policy key is a hash: spread the rank over all 64 bits.
        (cdf.partition_point(|&c| c < u) as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    };
    let (window, hit_ratio) = run(25_000, ZIPF_LOOKUPS, zipf);
    assert!(
        window < 0.5,
        "the window grew to {window:.2} of the cache (hit ratio {hit_ratio:.3})"
    );
}

#[test]
#[cfg_attr(miri, ignore = "safe code, 220,000 lookups: too slow under Miri")]
fn a_loop_after_a_recency_phase_gets_the_small_window_back() {
    let (mut core, mut e) = (Core::new(100, 5), Entries::default());
    // Recency first: a third of the lookups are of a new key, the others of one of the
    // 60 newest keys. The window grows to nearly all of the cache; about half the
    // lookups hit.
    let (mut rng, mut newest) = (7u64, 0u64);
    for _ in 0..200_000 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let key = if rng % 3 == 0 {
            newest += 1;
            newest
        } else {
            newest.saturating_sub((rng >> 8) % 60)
        };
        read(&mut core, &mut e, key);
    }
    assert!(
        core.window_max > 80,
        "the recency phase left the window at {}",
        core.window_max
    );
    // Then a loop over 120 new keys, 20 more than fit: the hit ratio collapses, and the
    // window starts over from its initial size. (Without that guard the window stays at
    // all of the cache: in it each rejected key of the loop returns soon after, counted
    // in misses, which looks like a reason to keep it large.)
    let mut hits = 0;
    for i in 0..20_000u64 {
        hits += u64::from(read(&mut core, &mut e, 1 << 40 | (i % 120)));
    }
    assert!(
        core.window_max < 20,
        "the loop left the window at {} of 100",
        core.window_max
    );
    assert!(hits > 10_000, "the loop hit only {hits} of 20,000 lookups");
}

#[test]
fn expired_entries_go_before_live_ones() {
    let mut core = Core::new(4, 1);
    let mut e = Entries::default();
    for k in 0..4 {
        write(&mut core, &mut e, k);
    }
    let look = &mut |v: &Victim| Look {
        hits: 0,
        expired: v.pkey == 0,
    };
    let out = e.put(&mut core, 9, 1, Some(look));
    // 0 is the main space's victim: expired, it goes without a duel (which the candidate
    // leaving the window, 3, would have lost: it is no more frequent than 0).
    assert_eq!(out.iter().map(|v| v.pkey).collect::<Vec<_>>(), [0]);
    assert!(e.holds(3) && e.holds(9));
    e.check(&core);
}

/// Reports of one key's writes and removals in every order the table allows: `A`
/// replaced `O`, then `B` replaced `A` (or a removal took `A` out), reported in the
/// reverse order.
#[test]
fn a_record_follows_the_key_whatever_order_its_writes_report_in() {
    let write = |core: &mut Core, node: &Link, old: Option<&Link>| {
        let out = report(core, 7, node, old);
        assert!(out.is_empty(), "a cache of 10 evicts nothing here");
    };
    let nodes: Vec<Link> = (0..3).map(|_| Link::new()).collect();
    let (o, a, b) = (&nodes[0], &nodes[1], &nodes[2]);

    // In order: each write takes its predecessor's record.
    let mut core = Core::new(10, 1);
    write(&mut core, o, None);
    write(&mut core, a, Some(o));
    write(&mut core, b, Some(a));
    assert_eq!((core.len(), core.weight()), (1, 1));
    assert_eq!(core.nodes[b.record() as usize].node, tracked(b));
    assert_eq!((o.record(), a.record()), (DETACHED, DETACHED));

    // B reports before A: A is detached by B's report, so A's report releases the record
    // it takes from O, and B is the key's one record.
    let nodes: Vec<Link> = (0..3).map(|_| Link::new()).collect();
    let (o, a, b) = (&nodes[0], &nodes[1], &nodes[2]);
    let mut core = Core::new(10, 1);
    write(&mut core, o, None);
    write(&mut core, b, Some(a));
    write(&mut core, a, Some(o));
    assert_eq!((core.len(), core.weight()), (1, 1));
    assert_eq!(core.nodes[b.record() as usize].node, tracked(b));
    assert_eq!((o.record(), a.record()), (DETACHED, DETACHED));

    // A removal of A reports before A's write: nothing of the key is left.
    let nodes: Vec<Link> = (0..2).map(|_| Link::new()).collect();
    let (o, a) = (&nodes[0], &nodes[1]);
    let mut core = Core::new(10, 1);
    write(&mut core, o, None);
    // SAFETY: live.
    unsafe { core.remove(tracked(a)) };
    write(&mut core, a, Some(o));
    assert_eq!((core.len(), core.weight()), (0, 0));

    // A load takes O's place and carries its record; the value that ends it takes it on.
    let nodes: Vec<Link> = (0..3).map(|_| Link::new()).collect();
    let (o, load, done) = (&nodes[0], &nodes[1], &nodes[2]);
    let mut core = Core::new(10, 1);
    write(&mut core, o, None);
    let record = o.record();
    // SAFETY: live.
    unsafe { core.carry(tracked(o), tracked(load), 7) };
    assert_eq!(load.record(), record, "the load carries the key's record");
    write(&mut core, done, Some(load));
    assert_eq!(done.record(), record, "and hands it on");
    assert_eq!(core.len(), 1);

    // A load with no record to carry is not tracked, and its value is a new key.
    let nodes: Vec<Link> = (0..2).map(|_| Link::new()).collect();
    let (load, done) = (&nodes[0], &nodes[1]);
    let mut core = Core::new(10, 1);
    // SAFETY: live.
    unsafe { core.remove(tracked(load)) };
    write(&mut core, done, Some(load));
    assert_eq!(core.len(), 1);
}

#[test]
fn an_evicted_key_s_unreported_successor_is_a_new_key() {
    let nodes: Vec<Link> = (0..3).map(|_| Link::new()).collect();
    let (a, b, successor) = (&nodes[0], &nodes[1], &nodes[2]);
    let mut core = Core::new(1, 1);
    assert!(report(&mut core, 1, a, None).is_empty());
    let out = report(&mut core, 2, b, None);
    assert_eq!(out.len(), 1, "a cache of 1 holds one key");
    let victim = out[0];
    // SAFETY: live.
    assert_eq!(unsafe { victim.node.as_ref() }.record(), DETACHED);
    // A write that replaced the victim in the table before the eviction took it, and
    // reports after: the record is gone, so the write is a new key, and the cache still
    // holds one.
    // SAFETY: live.
    let gone = unsafe { victim.node.as_ref() };
    let out = report(&mut core, victim.pkey, successor, Some(gone));
    assert!(successor.record() < DETACHED, "the successor is tracked");
    assert_eq!(out.len(), 1);
    assert_eq!(core.len(), 1);
}

#[test]
fn a_write_under_another_policy_key_than_its_predecessor_s_is_a_new_key() {
    // A key whose `Hash` disagrees with its `Eq`: the table matched the write with the
    // previous one, the policy key differs.
    let nodes: Vec<Link> = (0..2).map(|_| Link::new()).collect();
    let (first, second) = (&nodes[0], &nodes[1]);
    let mut core = Core::new(10, 1);
    core.index_by_pkey();
    assert!(report(&mut core, 1, first, None).is_empty());
    assert!(report(&mut core, 2, second, Some(first)).is_empty());
    assert_eq!(core.len(), 1, "the first write's record went with it");
    assert_eq!(first.record(), DETACHED);
    assert_eq!(core.pkey(second.record()), 2);
    assert_eq!(core.find(1, &mut |_| true), None);
    assert_eq!(core.find(2, &mut |_| true), Some(tracked(second)));

    // A load in its place, under yet another policy key, carries nothing.
    let load = Link::new();
    // SAFETY: live.
    unsafe { core.carry(tracked(second), tracked(&load), 3) };
    assert_eq!((second.record(), load.record()), (DETACHED, DETACHED));
    assert_eq!(core.len(), 0);
    assert_eq!(core.find(2, &mut |_| true), None);
}

#[test]
fn a_settled_write_is_tracked_as_a_write_is_without_admission() {
    let nodes: Vec<Link> = (0..4).map(|_| Link::new()).collect();
    let (a, b, c, d) = (&nodes[0], &nodes[1], &nodes[2], &nodes[3]);
    let settle = |core: &mut Core, node: &Link, old: Option<&Link>, weight: u64| {
        let w = Write {
            pkey: 7,
            node: tracked(node),
            old: old.map(tracked),
            weight,
        };
        // SAFETY: every node lives to the end of the test.
        unsafe { core.settle(w) };
    };
    let mut core = Core::new(4, 1);
    // A new key, then its rewrite with another weight, which takes its record.
    settle(&mut core, a, None, 2);
    assert_eq!((core.len(), core.weight()), (1, 2));
    settle(&mut core, b, Some(a), 3);
    assert_eq!((core.len(), core.weight()), (1, 3));
    assert_eq!(
        (a.record(), core.nodes[b.record() as usize].node),
        (DETACHED, tracked(b))
    );
    // Over the bound, with no victims: the next write evicts down to it.
    settle(&mut core, d, None, 3);
    assert_eq!(core.weight(), 6, "settling evicts nothing");
    // SAFETY: live.
    unsafe { core.remove(tracked(d)) };
    // A write whose node was already taken out and reported: nothing is kept of it.
    // SAFETY: live.
    unsafe { core.remove(tracked(c)) };
    settle(&mut core, c, Some(b), 1);
    assert_eq!((core.len(), core.weight()), (0, 0));
    // Over the bound again; a write brings it back within.
    let (e, f) = (Link::new(), Link::new());
    settle(&mut core, &e, None, 4);
    let out = report(&mut core, 8, &f, None);
    assert!(core.weight() <= 4, "{} over a bound of 4", core.weight());
    assert!(!out.is_empty());
}

#[test]
fn a_key_s_overlapping_records_are_found_apart_by_node() {
    // Writes a, b, c of one key: b replaces a, c replaces b and reports first, so a
    // (out of the table, its report pending) and c both hold a record for a moment.
    let nodes: Vec<Link> = (0..3).map(|_| Link::new()).collect();
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    let mut core = Core::new(10, 1);
    core.index_by_pkey();
    report(&mut core, 7, a, None);
    report(&mut core, 7, c, Some(b));
    assert_eq!(core.len(), 2, "a's record and c's");
    assert_eq!(core.find(7, &mut |t| t == tracked(c)), Some(tracked(c)));
    assert_eq!(core.find(7, &mut |t| t == tracked(a)), Some(tracked(a)));
    // c is removed first: its own record goes, not a's.
    // SAFETY: live.
    unsafe { core.remove(tracked(c)) };
    assert_eq!(core.len(), 1);
    assert_eq!(core.find(7, &mut |t| t == tracked(c)), None);
    assert_eq!(core.find(7, &mut |_| true), Some(tracked(a)));
    // b's report: a's record goes too, and nothing of the key is left.
    report(&mut core, 7, b, Some(a));
    assert_eq!(core.len(), 0);
    assert_eq!(core.find(7, &mut |_| true), None);
}

/// Two words per key beside the node: a cache without the shared tier keeps no policy
/// key in its records.
#[test]
fn a_record_is_two_words() {
    assert_eq!(std::mem::size_of::<PNode>(), 16);
}

#[test]
fn records_reused_once_weights_appear_weigh_what_their_own_writes_weigh() {
    let mut core = Core::new(8, 1);
    let mut e = Entries::default();
    let mut weighs = HashMap::new();
    let mut write = |core: &mut Core, e: &mut Entries, key: u64, w: u64| {
        weighs.insert(key, w);
        write_w(core, e, key, w);
        e.check(core);
        let held: u64 = e.table.keys().map(|k| weighs[k]).sum();
        assert_eq!(core.weight(), held, "after writing key {key}, weighing {w}");
        assert!(held <= 8, "{held} held by a policy of 8");
    };
    // Evictions leave free records, with no weight kept while every write weighs 1.
    for k in 0..16 {
        write(&mut core, &mut e, k, 1);
    }
    assert!(
        core.weights.is_none(),
        "weights kept for writes that all weigh 1"
    );
    write(&mut core, &mut e, 100, 3);
    // Writes of weight 1 take the records freed since, whatever those weighed.
    for k in 200..216 {
        write(&mut core, &mut e, k, 1 + k % 2);
    }
    // A held key rewritten with another weight.
    let k = *e.table.keys().next().expect("keys are held");
    write(&mut core, &mut e, k, 2);
}

#[test]
fn weights_count_against_the_capacity() {
    let mut core = Core::new(10, 1);
    let mut e = Entries::default();
    assert!(write_w(&mut core, &mut e, 1, 4).is_empty());
    assert!(write_w(&mut core, &mut e, 2, 4).is_empty());
    assert_eq!(write_w(&mut core, &mut e, 3, 4).len(), 1);
    assert!(core.weight() <= 10);
    // Heavier than the whole cache: evicted at once.
    let out = write_w(&mut core, &mut e, 4, 11);
    assert!(out.iter().any(|v| v.pkey == 4));
    assert!(core.weight() <= 10);
}
