//! Where writes shipped here by XDR landed, for this node's own XDR: a
//! shipped write keeps its source's last-update time (LUT), which may be
//! behind what a local DC's scan has passed already, so a DC that
//! forwards (`forward`) must be told to look again.
//!
//! Owns, per partition, the oldest LUT of a shipped write or delete
//! applied since the XDR thread last took them ([`XdrArrivals::take`]).
//! Only shipped writes touch it; a client's write never does.
//!
//! Invariant: a shipped write applied before a `take` is either in that
//! take's answer or in a later one's (a note sets its partition's slot
//! before the flag; a take clears the flag before the slots).

use citrine_types::{PartitionId, PARTITIONS};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The oldest arrived LUT of each partition (`u64::MAX`: none).
pub struct XdrArrivals {
    any: AtomicBool,
    oldest: Box<[AtomicU64]>,
}

impl Default for XdrArrivals {
    fn default() -> Self {
        XdrArrivals {
            any: AtomicBool::new(false),
            oldest: (0..PARTITIONS).map(|_| AtomicU64::new(u64::MAX)).collect(),
        }
    }
}

impl XdrArrivals {
    /// A shipped write or delete with the source's `lut_ms` was applied
    /// in `partition`.
    pub fn note(&self, partition: PartitionId, lut_ms: u64) {
        if let Some(slot) = self.oldest.get(partition.index()) {
            slot.fetch_min(lut_ms, Ordering::AcqRel);
            self.any.store(true, Ordering::Release);
        }
    }

    /// Each partition's oldest arrived LUT since the last take, cleared.
    pub fn take(&self) -> Vec<(u16, u64)> {
        if !self.any.swap(false, Ordering::AcqRel) {
            return Vec::new();
        }
        self.oldest
            .iter()
            .enumerate()
            .filter_map(
                |(index, slot)| match slot.swap(u64::MAX, Ordering::AcqRel) {
                    u64::MAX => None,
                    lut_ms => Some((index as u16, lut_ms)),
                },
            )
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_oldest_arrival_of_each_partition_is_taken_once() {
        let arrivals = XdrArrivals::default();
        assert!(arrivals.take().is_empty());
        let (p3, p9) = (PartitionId::new(3).unwrap(), PartitionId::new(9).unwrap());
        arrivals.note(p9, 500);
        arrivals.note(p3, 700);
        arrivals.note(p3, 600);
        arrivals.note(p3, 650);
        assert_eq!(arrivals.take(), vec![(3, 600), (9, 500)]);
        assert!(arrivals.take().is_empty());
    }
}
