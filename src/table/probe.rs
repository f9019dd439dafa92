//! The probe sequence: linear probing from the hash's low bits.
//!
//! Linear probing keeps a probe inside one or two cache lines of tag bytes, which is where
//! almost every probe ends (the load factor stays under 3/4, see `array.rs`).

/// Visits every index of a power-of-two array exactly once, starting at the home slot.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    index: usize,
    mask: usize,
    remaining: usize,
}

impl Probe {
    /// The sequence for `hash` in an array of `mask + 1` slots.
    #[inline]
    pub(crate) fn new(hash: u64, mask: usize) -> Self {
        Probe {
            index: (hash as usize) & mask,
            mask,
            remaining: mask + 1,
        }
    }
}

impl Iterator for Probe {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let i = self.index;
        self.index = (self.index + 1) & self.mask;
        Some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::Probe;

    #[test]
    fn visits_every_slot_once_from_home() {
        let mut seen: Vec<usize> = Probe::new(0xFFFF_FFFF_FFFF_FFF5, 15).collect();
        assert_eq!(seen[0], 5);
        seen.sort_unstable();
        assert_eq!(seen, (0..16).collect::<Vec<_>>());
    }
}
