//! Where client connections live: the placement of new connections and the
//! rebalancing of live ones between service threads, as pure functions of
//! the threads' measured loads (sans-I/O: the service threads measure,
//! these decide), plus the load meter itself.
//!
//! The policy packs connections onto as few service threads as carry the
//! load. A thread that sleeps and wakes for a handful of requests costs
//! more CPU per request than one that finds many ready connections at each
//! wake-up (measured on 2 cores: one thread for 32 connections was ~2 µs a
//! request cheaper than two threads of 16, bench/RESULTS.md), so a lightly
//! loaded node runs on one thread, and a node whose thread saturates
//! spreads onto the others:
//!
//! - a new connection goes to the lowest-numbered thread under the spill
//!   threshold (all busy: the least loaded);
//! - a thread over the spill threshold moves some of its active
//!   connections to the least loaded thread, if that one is clearly less
//!   loaded (by [`MIN_GAP_PERMILLE`]); it moves a quarter of the gap's
//!   share at a time, so loads converge without oscillating;
//! - a thread hands all its active connections to a lower-numbered thread
//!   when both together use less than [`MERGE_PCT`] of the threshold, so a
//!   node returns to few threads after a burst. Merged, they use less than
//!   the sum (fewer wake-ups), so a merge never pushes a thread over the
//!   threshold and spilling and merging do not chase each other.
//!
//! Invariants: loads are per-mille of one core (0..=1000 and a bit over
//! when the measurement window stretches); a decision never moves
//! connections to the deciding thread itself, and never more than it has.

/// Least difference (per-mille of a core) between a hot thread and the
/// thread it spills to: moving work between two nearly equal threads only
/// churns.
pub const MIN_GAP_PERMILLE: u32 = 150;

/// Two threads whose loads add up to less than this share (percent) of
/// the spill threshold are merged into one.
pub const MERGE_PCT: u32 = 90;

/// What a service thread does after measuring the loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rebalance {
    Stay,
    /// Move `count` of this thread's active connections to thread `to`.
    Move {
        to: usize,
        count: usize,
    },
}

/// The thread a new connection goes to.
pub fn place(loads: &[u32], spill_permille: u32) -> usize {
    debug_assert!(!loads.is_empty());
    if let Some(index) = loads.iter().position(|&load| load < spill_permille) {
        return index;
    }
    least_loaded(loads, None).unwrap_or(0)
}

/// The rebalancing decision of thread `me`, which has `active` connections
/// that carried requests in the last measurement window.
pub fn rebalance(me: usize, loads: &[u32], active: usize, spill_permille: u32) -> Rebalance {
    debug_assert!(me < loads.len());
    if active == 0 || loads.len() < 2 {
        return Rebalance::Stay;
    }
    let mine = loads[me];
    if mine > spill_permille {
        if let Some(to) = least_loaded(loads, Some(me)) {
            let theirs = loads[to];
            if theirs + MIN_GAP_PERMILLE < mine {
                // Half the gap evens the two out; move a quarter of the
                // connections that share represents, at least one.
                let share = (mine - theirs) as usize * active / (4 * mine as usize);
                let count = share.clamp(1, active);
                return Rebalance::Move { to, count };
            }
        }
        return Rebalance::Stay;
    }
    if me > 0 {
        let merged_limit = spill_permille * MERGE_PCT / 100;
        if let Some(to) = (0..me).find(|&to| loads[to] + mine < merged_limit) {
            return Rebalance::Move { to, count: active };
        }
    }
    Rebalance::Stay
}

/// The least loaded thread other than `except` (lowest index on ties).
fn least_loaded(loads: &[u32], except: Option<usize>) -> Option<usize> {
    loads
        .iter()
        .enumerate()
        .filter(|(index, _)| Some(*index) != except)
        .min_by_key(|(index, load)| (**load, *index))
        .map(|(index, _)| index)
}

/// Measures one service thread's CPU use over windows of wall time.
///
/// The CPU time comes from `/proc/thread-self/schedstat` (nanoseconds on a
/// CPU, read once a window); where that file is missing the meter falls
/// back to the wall time the thread spent outside its poll, which also
/// counts time the thread was runnable but preempted.
pub struct LoadMeter {
    window_start: std::time::Instant,
    cpu_start_ns: Option<u64>,
    busy_wall: std::time::Duration,
}

impl LoadMeter {
    pub fn new() -> LoadMeter {
        LoadMeter {
            window_start: std::time::Instant::now(),
            cpu_start_ns: thread_cpu_ns(),
            busy_wall: std::time::Duration::ZERO,
        }
    }

    /// Whether the meter reads the thread's CPU time (else it needs
    /// [`LoadMeter::add_busy`]).
    pub fn counts_cpu(&self) -> bool {
        self.cpu_start_ns.is_some()
    }

    /// Adds wall time spent serving (the fallback measure).
    pub fn add_busy(&mut self, busy: std::time::Duration) {
        self.busy_wall += busy;
    }

    /// When the current window ends.
    pub fn window_end(&self, window: std::time::Duration) -> std::time::Instant {
        self.window_start + window
    }

    /// Closes the window at `now`: the load in per-mille of one core.
    pub fn close_window(&mut self, now: std::time::Instant) -> u32 {
        let wall = now.saturating_duration_since(self.window_start);
        let cpu_now = thread_cpu_ns();
        let used_ns = match (self.cpu_start_ns, cpu_now) {
            (Some(start), Some(end)) => u128::from(end.saturating_sub(start)),
            _ => self.busy_wall.as_nanos(),
        };
        self.window_start = now;
        self.cpu_start_ns = cpu_now;
        self.busy_wall = std::time::Duration::ZERO;
        if wall.is_zero() {
            return 0;
        }
        (used_ns * 1000 / wall.as_nanos()).min(u128::from(u32::MAX)) as u32
    }
}

/// Nanoseconds this thread has run on a CPU, if the kernel tells.
fn thread_cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPILL: u32 = 850;

    #[test]
    fn new_connections_pack_onto_the_first_thread_with_room() {
        assert_eq!(place(&[0, 0, 0], SPILL), 0);
        assert_eq!(place(&[900, 100, 0], SPILL), 1);
        assert_eq!(place(&[900, 870, 0], SPILL), 2);
        // Everyone busy: the least loaded, lowest index on ties.
        assert_eq!(place(&[990, 900, 900], SPILL), 1);
        assert_eq!(place(&[5], SPILL), 0);
    }

    #[test]
    fn a_saturated_thread_spills_a_share_to_the_least_loaded() {
        // 1000 vs 0: the gap's half is half the load; a quarter of the
        // connections move.
        assert_eq!(
            rebalance(0, &[1000, 0], 32, SPILL),
            Rebalance::Move { to: 1, count: 8 }
        );
        assert_eq!(
            rebalance(0, &[1000, 400, 100], 40, SPILL),
            Rebalance::Move { to: 2, count: 9 }
        );
        // At least one connection moves.
        assert_eq!(
            rebalance(1, &[0, 1000], 1, SPILL),
            Rebalance::Move { to: 0, count: 1 }
        );
    }

    #[test]
    fn no_move_below_the_threshold_or_between_equals() {
        assert_eq!(rebalance(0, &[800, 0], 32, SPILL), Rebalance::Stay);
        assert_eq!(rebalance(0, &[950, 900], 32, SPILL), Rebalance::Stay);
        assert_eq!(rebalance(0, &[1000, 0], 0, SPILL), Rebalance::Stay);
        assert_eq!(rebalance(0, &[1000], 10, SPILL), Rebalance::Stay);
    }

    #[test]
    fn threads_that_fit_in_one_merge_into_the_lower() {
        assert_eq!(
            rebalance(1, &[300, 100], 5, SPILL),
            Rebalance::Move { to: 0, count: 5 }
        );
        // Both half busy (seen after a burst spilled connections): one
        // thread carries them for less.
        assert_eq!(
            rebalance(1, &[490, 230], 16, SPILL),
            Rebalance::Move { to: 0, count: 16 }
        );
        // Together they would be too busy: stay apart.
        assert_eq!(rebalance(1, &[600, 200], 5, SPILL), Rebalance::Stay);
        // The first thread never merges anywhere.
        assert_eq!(rebalance(0, &[100, 0], 5, SPILL), Rebalance::Stay);
        // Skips a full lower thread for a later one with room.
        assert_eq!(
            rebalance(2, &[800, 100, 50], 3, SPILL),
            Rebalance::Move { to: 1, count: 3 }
        );
    }

    #[test]
    fn spilling_then_merging_does_not_oscillate() {
        // After a spill of a saturated thread, the receiver holds the
        // moved share: it must not merge straight back.
        let after_spill = [750, 250];
        assert_eq!(rebalance(1, &after_spill, 8, SPILL), Rebalance::Stay);
        assert_eq!(rebalance(0, &after_spill, 24, SPILL), Rebalance::Stay);
    }

    #[test]
    fn the_meter_reports_per_mille_of_a_core() {
        let mut meter = LoadMeter::new();
        let start = std::time::Instant::now();
        // Spin ~30 ms of CPU on this thread.
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(30) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        meter.add_busy(start.elapsed());
        let load = meter.close_window(std::time::Instant::now());
        // A spinning thread uses (nearly) a whole core; allow for being
        // preempted on a busy machine.
        assert!(load > 200 && load <= 1100, "load {load}");
        std::thread::sleep(std::time::Duration::from_millis(30));
        let idle = meter.close_window(std::time::Instant::now());
        assert!(idle < 200, "idle load {idle}");
    }
}
