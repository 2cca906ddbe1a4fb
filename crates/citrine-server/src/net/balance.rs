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
//! - a thread over the spill threshold for [`SPILL_AFTER_WINDOWS`] windows
//!   in a row (more after spills that were undone, see [`SpillGate`])
//!   moves some of its active connections to the least loaded thread, if that one is clearly less loaded (by [`MIN_GAP_PERMILLE`]);
//!   it moves a quarter of the gap's share at a time, so loads converge
//!   without oscillating;
//! - but not while it is contended: a thread that spends
//!   [`Thresholds::contended_permille`] or more of a window runnable and waiting
//!   for a CPU shows that the machine's CPUs are taken (by other service
//!   threads, by clients on the same machine, by anything), so a second
//!   thread would get no CPU of its own and would only cut the same CPU
//!   time into more wake-ups (measured on 2 cores shared with the client:
//!   spilling there cost 1.6-2.8 µs a request and tripled p99, for no
//!   throughput, bench/RESULTS.md);
//! - a thread hands all its active connections to a lower-numbered thread
//!   when both together use less than [`MERGE_PCT`] of the threshold, so a
//!   node returns to few threads after a burst. Merged, they use less than
//!   the sum (fewer wake-ups), so a merge never pushes a thread over the
//!   threshold and spilling and merging do not chase each other. A
//!   contended thread merges whenever both fit in one core: spread over
//!   CPUs they do not have, they only time-slice. (The merged thread can
//!   be over the spill threshold; if it then has a CPU of its own, it
//!   spills again. Where the contention came only from the spill itself,
//!   a node would alternate between one and two threads every few hundred
//!   milliseconds; [`SpillGate`] doubles the hot windows a spill needs each
//!   time connections came back to the thread since its last spill, up to
//!   [`MAX_SPILL_AFTER_WINDOWS`], so such a node settles to one
//!   alternation in about 20 s at most.)
//!
//! Invariants: loads and waits are per-mille of one core or of the window
//! (0..=1000 and a bit over when the measurement window stretches); a
//! decision never moves connections to the deciding thread itself, and
//! never more than it has; a contended thread never spills.

/// Least difference (per-mille of a core) between a hot thread and the
/// thread it spills to: moving work between two nearly equal threads only
/// churns.
pub const MIN_GAP_PERMILLE: u32 = 150;

/// Two threads whose loads add up to less than this share (percent) of
/// the spill threshold are merged into one.
pub const MERGE_PCT: u32 = 90;

/// The balancing thresholds a node runs with (`service-thread-spill-pct`
/// and `service-thread-contended-pct`, in per-mille).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// CPU load above which a thread spills.
    pub spill_permille: u32,
    /// Share of a window runnable but waiting for a CPU from which a
    /// thread counts as contended (1000: never).
    pub contended_permille: u32,
}

/// Windows in a row a thread must be over the spill threshold before it
/// spills: one busy window is noise.
pub const SPILL_AFTER_WINDOWS: u32 = 3;

/// The most hot windows in a row a spill can be made to wait for (about
/// 19 s of 100-ms windows) after spills that were undone.
pub const MAX_SPILL_AFTER_WINDOWS: u32 = SPILL_AFTER_WINDOWS << 6;

/// Windows without a spill after which a thread's spills need only
/// [`SPILL_AFTER_WINDOWS`] again (about a minute).
pub const SPILL_QUIET_WINDOWS: u32 = 600;

/// When a thread may spill: after enough hot windows in a row, and after
/// more of them when its spills keep being undone.
///
/// A spill is undone when connections move back to the thread before it
/// spills again: another thread merged into it, or (counted alike, since
/// connections going back and forth is what the back-off damps) another
/// thread spilled onto it. Each spill that follows
/// an undone one, within [`SPILL_QUIET_WINDOWS`] of the last, doubles the
/// hot windows the next spill needs, up to [`MAX_SPILL_AFTER_WINDOWS`]; a
/// spill that was not undone, or a quiet minute, resets it. A surge that
/// needs several spills in a row to spread (each moves a quarter of the
/// gap) is not slowed: nothing comes back between them.
///
/// Invariant: `SPILL_AFTER_WINDOWS <= spill_after <= MAX_SPILL_AFTER_WINDOWS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpillGate {
    /// Windows in a row over the spill threshold without waiting for a CPU.
    hot_windows: u32,
    /// Hot windows the next spill needs.
    spill_after: u32,
    /// Windows since the last spill (`u32::MAX`: none yet).
    since_spill: u32,
    /// Connections moved back to this thread since its last spill.
    undone: bool,
}

impl Default for SpillGate {
    fn default() -> SpillGate {
        SpillGate {
            hot_windows: 0,
            spill_after: SPILL_AFTER_WINDOWS,
            since_spill: u32::MAX,
            undone: false,
        }
    }
}

impl SpillGate {
    /// Records one window's load.
    pub fn observe(&mut self, load: Load, thresholds: Thresholds) {
        self.hot_windows = if load.hot(thresholds) {
            self.hot_windows.saturating_add(1)
        } else {
            0
        };
        self.since_spill = self.since_spill.saturating_add(1);
        if self.since_spill >= SPILL_QUIET_WINDOWS {
            self.spill_after = SPILL_AFTER_WINDOWS;
        }
    }

    /// Whether the thread has been hot long enough to spill.
    pub fn ready(&self) -> bool {
        self.hot_windows >= self.spill_after
    }

    /// Records connections moved to this thread from another (by a merge
    /// or a spill: the arrival does not say which).
    pub fn took_back(&mut self) {
        if self.since_spill != u32::MAX {
            self.undone = true;
        }
    }

    /// Records that the thread spilled.
    pub fn spilled(&mut self) {
        self.spill_after = if self.undone && self.since_spill < SPILL_QUIET_WINDOWS {
            (self.spill_after * 2).min(MAX_SPILL_AFTER_WINDOWS)
        } else {
            SPILL_AFTER_WINDOWS
        };
        debug_assert!((SPILL_AFTER_WINDOWS..=MAX_SPILL_AFTER_WINDOWS).contains(&self.spill_after));
        self.since_spill = 0;
        self.undone = false;
        self.hot_windows = 0;
    }

    /// Hot windows the next spill needs.
    pub fn spill_after(&self) -> u32 {
        self.spill_after
    }
}

/// One core, per-mille.
const ONE_CORE_PERMILLE: u32 = 1000;

/// A service thread's use of the machine over one window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Load {
    /// CPU time, per-mille of one core.
    pub cpu: u32,
    /// Time runnable but waiting for a CPU, per-mille of the window (0
    /// where the kernel does not tell).
    pub wait: u32,
}

impl Load {
    /// Whether the thread waited for a CPU long enough that a second
    /// thread would not find one free.
    pub fn contended(&self, thresholds: Thresholds) -> bool {
        self.wait >= thresholds.contended_permille && thresholds.contended_permille < 1000
    }

    /// Whether this window counts toward a spill: over the threshold with
    /// a CPU of its own.
    pub fn hot(&self, thresholds: Thresholds) -> bool {
        self.cpu > thresholds.spill_permille && !self.contended(thresholds)
    }
}

/// What a service thread does after measuring the loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rebalance {
    Stay,
    /// This thread is saturated: move `count` of its active connections
    /// to the less loaded thread `to`.
    Spill {
        to: usize,
        count: usize,
    },
    /// This thread and the lower thread `to` fit in one: move all `count`
    /// of its active connections there.
    Merge {
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
/// that carried requests in the last measurement window, measured `own`
/// over it, and may spill if `spill_ready` (its [`SpillGate`]: hot long
/// enough). `loads` are the threads' CPU loads (`loads[me] == own.cpu`).
pub fn rebalance(
    me: usize,
    loads: &[u32],
    own: Load,
    spill_ready: bool,
    active: usize,
    thresholds: Thresholds,
) -> Rebalance {
    debug_assert!(me < loads.len());
    debug_assert_eq!(loads[me], own.cpu);
    if active == 0 || loads.len() < 2 {
        return Rebalance::Stay;
    }
    let spill_permille = thresholds.spill_permille;
    let contended = own.contended(thresholds);
    let mine = loads[me];
    if mine > spill_permille {
        if contended || !spill_ready {
            return Rebalance::Stay;
        }
        if let Some(to) = least_loaded(loads, Some(me)) {
            let theirs = loads[to];
            if theirs + MIN_GAP_PERMILLE < mine {
                // Half the gap evens the two out; move a quarter of the
                // connections that share represents, at least one.
                let share = (mine - theirs) as usize * active / (4 * mine as usize);
                let count = share.clamp(1, active);
                return Rebalance::Spill { to, count };
            }
        }
        return Rebalance::Stay;
    }
    if me > 0 {
        let merged_limit = if contended {
            ONE_CORE_PERMILLE
        } else {
            spill_permille * MERGE_PCT / 100
        };
        if let Some(to) = (0..me).find(|&to| loads[to] + mine < merged_limit) {
            return Rebalance::Merge { to, count: active };
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

/// Measures one service thread's CPU use, and its waits for a CPU, over
/// windows of wall time.
///
/// Both come from `/proc/thread-self/schedstat` (nanoseconds on a CPU and
/// nanoseconds runnable on a run queue, read once a window); where that
/// file is missing the meter falls back to the wall time the thread spent
/// outside its poll, which also counts time the thread was runnable but
/// preempted, and reports no waits.
pub struct LoadMeter {
    window_start: std::time::Instant,
    start: Option<SchedStat>,
    busy_wall: std::time::Duration,
}

impl LoadMeter {
    pub fn new() -> LoadMeter {
        LoadMeter {
            window_start: std::time::Instant::now(),
            start: SchedStat::of_this_thread(),
            busy_wall: std::time::Duration::ZERO,
        }
    }

    /// Whether the meter reads the thread's CPU time (else it needs
    /// [`LoadMeter::add_busy`]).
    pub fn counts_cpu(&self) -> bool {
        self.start.is_some()
    }

    /// Adds wall time spent serving (the fallback measure).
    pub fn add_busy(&mut self, busy: std::time::Duration) {
        self.busy_wall += busy;
    }

    /// When the current window ends.
    pub fn window_end(&self, window: std::time::Duration) -> std::time::Instant {
        self.window_start + window
    }

    /// Closes the window at `now`: the thread's CPU time and waits over it.
    pub fn close_window(&mut self, now: std::time::Instant) -> Load {
        let wall = now.saturating_duration_since(self.window_start);
        let end = SchedStat::of_this_thread();
        let (used_ns, waited_ns) = match (self.start, end) {
            (Some(start), Some(end)) => (
                u128::from(end.on_cpu_ns.saturating_sub(start.on_cpu_ns)),
                u128::from(end.waiting_ns.saturating_sub(start.waiting_ns)),
            ),
            _ => (self.busy_wall.as_nanos(), 0),
        };
        self.window_start = now;
        self.start = end;
        self.busy_wall = std::time::Duration::ZERO;
        if wall.is_zero() {
            return Load::default();
        }
        let per_mille = |ns: u128| (ns * 1000 / wall.as_nanos()).min(u128::from(u32::MAX)) as u32;
        Load {
            cpu: per_mille(used_ns),
            wait: per_mille(waited_ns),
        }
    }
}

/// The scheduler's account of this thread, if the kernel tells.
#[derive(Debug, Clone, Copy)]
struct SchedStat {
    /// Time on a CPU.
    on_cpu_ns: u64,
    /// Time runnable, waiting on a run queue for a CPU.
    waiting_ns: u64,
}

impl SchedStat {
    fn of_this_thread() -> Option<SchedStat> {
        let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
        let mut fields = text.split_whitespace();
        Some(SchedStat {
            on_cpu_ns: fields.next()?.parse().ok()?,
            waiting_ns: fields.next()?.parse().ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPILL: u32 = 850;
    const LIMITS: Thresholds = Thresholds {
        spill_permille: SPILL,
        contended_permille: 100,
    };
    const NEVER_CONTENDED: Thresholds = Thresholds {
        spill_permille: SPILL,
        contended_permille: 1000,
    };

    /// The decision of an uncontended thread that has been hot long enough.
    fn rebalance_settled(me: usize, loads: &[u32], active: usize, spill: u32) -> Rebalance {
        let own = Load {
            cpu: loads[me],
            wait: 0,
        };
        let thresholds = Thresholds {
            spill_permille: spill,
            ..LIMITS
        };
        rebalance(me, loads, own, true, active, thresholds)
    }

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
            rebalance_settled(0, &[1000, 0], 32, SPILL),
            Rebalance::Spill { to: 1, count: 8 }
        );
        assert_eq!(
            rebalance_settled(0, &[1000, 400, 100], 40, SPILL),
            Rebalance::Spill { to: 2, count: 9 }
        );
        // At least one connection moves.
        assert_eq!(
            rebalance_settled(1, &[0, 1000], 1, SPILL),
            Rebalance::Spill { to: 0, count: 1 }
        );
    }

    #[test]
    fn no_move_below_the_threshold_or_between_equals() {
        assert_eq!(rebalance_settled(0, &[800, 0], 32, SPILL), Rebalance::Stay);
        assert_eq!(
            rebalance_settled(0, &[950, 900], 32, SPILL),
            Rebalance::Stay
        );
        assert_eq!(rebalance_settled(0, &[1000, 0], 0, SPILL), Rebalance::Stay);
        assert_eq!(rebalance_settled(0, &[1000], 10, SPILL), Rebalance::Stay);
    }

    #[test]
    fn threads_that_fit_in_one_merge_into_the_lower() {
        assert_eq!(
            rebalance_settled(1, &[300, 100], 5, SPILL),
            Rebalance::Merge { to: 0, count: 5 }
        );
        // Both half busy (seen after a burst spilled connections): one
        // thread carries them for less.
        assert_eq!(
            rebalance_settled(1, &[490, 230], 16, SPILL),
            Rebalance::Merge { to: 0, count: 16 }
        );
        // Together they would be too busy: stay apart.
        assert_eq!(rebalance_settled(1, &[600, 200], 5, SPILL), Rebalance::Stay);
        // The first thread never merges anywhere.
        assert_eq!(rebalance_settled(0, &[100, 0], 5, SPILL), Rebalance::Stay);
        // Skips a full lower thread for a later one with room.
        assert_eq!(
            rebalance_settled(2, &[800, 100, 50], 3, SPILL),
            Rebalance::Merge { to: 1, count: 3 }
        );
    }

    #[test]
    fn spilling_then_merging_does_not_oscillate() {
        // After a spill of a saturated thread, the receiver holds the
        // moved share: it must not merge straight back.
        let after_spill = [750, 250];
        assert_eq!(
            rebalance_settled(1, &after_spill, 8, SPILL),
            Rebalance::Stay
        );
        assert_eq!(
            rebalance_settled(0, &after_spill, 24, SPILL),
            Rebalance::Stay
        );
    }

    #[test]
    fn one_hot_window_is_not_enough_to_spill() {
        let loads = [1000, 0];
        let own = Load { cpu: 1000, wait: 0 };
        let mut gate = SpillGate::default();
        for _ in 0..SPILL_AFTER_WINDOWS - 1 {
            gate.observe(own, LIMITS);
            assert!(!gate.ready());
            let decision = rebalance(0, &loads, own, gate.ready(), 32, LIMITS);
            assert_eq!(decision, Rebalance::Stay);
        }
        gate.observe(own, LIMITS);
        assert!(gate.ready());
        assert_eq!(
            rebalance(0, &loads, own, gate.ready(), 32, LIMITS),
            Rebalance::Spill { to: 1, count: 8 }
        );
        // A cooler window starts the count again.
        gate.observe(Load { cpu: 500, wait: 0 }, LIMITS);
        assert!(!gate.ready());
    }

    /// Windows a gate needs, hot and uncontended, before it is ready.
    fn windows_to_ready(gate: &mut SpillGate) -> u32 {
        let hot = Load { cpu: 1000, wait: 0 };
        (1..=MAX_SPILL_AFTER_WINDOWS + 1)
            .find(|_| {
                gate.observe(hot, LIMITS);
                gate.ready()
            })
            .expect("a hot thread is ready within the longest back-off")
    }

    #[test]
    fn spills_that_are_undone_back_off_until_a_quiet_minute() {
        let mut gate = SpillGate::default();
        // Connections arriving before any spill are not an undone spill.
        gate.took_back();
        let mut waits = Vec::new();
        for _ in 0..9 {
            waits.push(windows_to_ready(&mut gate));
            gate.spilled();
            // The spread threads wait for CPUs; the other one merges back.
            gate.took_back();
        }
        assert_eq!(waits, [3, 3, 6, 12, 24, 48, 96, 192, 192]);
        // The next spill (after an undone one) stays done: the one after it
        // needs only the base again.
        windows_to_ready(&mut gate);
        gate.spilled();
        assert_eq!(gate.spill_after(), MAX_SPILL_AFTER_WINDOWS);
        windows_to_ready(&mut gate);
        gate.spilled();
        assert_eq!(gate.spill_after(), SPILL_AFTER_WINDOWS);
        // So does a quiet minute after an undone one.
        gate.took_back();
        windows_to_ready(&mut gate);
        gate.spilled();
        assert_eq!(gate.spill_after(), 2 * SPILL_AFTER_WINDOWS);
        let cool = Load { cpu: 100, wait: 0 };
        for _ in 0..SPILL_QUIET_WINDOWS {
            gate.observe(cool, LIMITS);
        }
        assert_eq!(gate.spill_after(), SPILL_AFTER_WINDOWS);
        assert_eq!(windows_to_ready(&mut gate), SPILL_AFTER_WINDOWS);
    }

    #[test]
    fn a_surge_spreads_in_spills_that_are_not_slowed() {
        // Nothing comes back between the spills that spread a surge.
        let mut gate = SpillGate::default();
        for _ in 0..5 {
            assert_eq!(windows_to_ready(&mut gate), SPILL_AFTER_WINDOWS);
            gate.spilled();
        }
    }

    #[test]
    fn a_thread_waiting_for_a_cpu_does_not_spill() {
        // Saturated and long hot, but a tenth of the window runnable
        // without a CPU: a second thread would find none free.
        let contended = Load {
            cpu: 1000,
            wait: LIMITS.contended_permille,
        };
        assert!(contended.contended(LIMITS));
        assert!(!contended.hot(LIMITS));
        assert_eq!(
            rebalance(0, &[1000, 0], contended, true, 32, LIMITS),
            Rebalance::Stay
        );
        let almost = Load {
            cpu: 1000,
            wait: LIMITS.contended_permille - 1,
        };
        assert!(!almost.contended(LIMITS));
        assert!(almost.hot(LIMITS));
        assert_eq!(
            rebalance(0, &[1000, 0], almost, true, 32, LIMITS),
            Rebalance::Spill { to: 1, count: 8 }
        );
        // With waits ignored (`service-thread-contended-pct = 100`), even a
        // thread that waited the whole window spills.
        let starved = Load {
            cpu: 1000,
            wait: 1000,
        };
        assert!(!starved.contended(NEVER_CONTENDED));
        assert_eq!(
            rebalance(0, &[1000, 0], starved, true, 32, NEVER_CONTENDED),
            Rebalance::Spill { to: 1, count: 8 }
        );
    }

    #[test]
    fn contended_threads_that_fit_in_one_core_merge() {
        // (deciding thread, loads, its wait, decision). The first: measured
        // on 2 cores shared with the client after a spill, 500 and 384
        // per-mille, each waiting for a CPU over a third of the time.
        let cases: [(usize, [u32; 2], u32, Rebalance); 4] = [
            (1, [500, 384], 356, Rebalance::Merge { to: 0, count: 16 }),
            // Uncontended, the same loads stay apart (over MERGE_PCT of
            // the threshold together).
            (1, [500, 384], 0, Rebalance::Stay),
            // More than one core together: apart even when contended.
            (1, [500, 520], 356, Rebalance::Stay),
            // After the merge the thread is under the threshold: no spill
            // back.
            (0, [650, 0], 290, Rebalance::Stay),
        ];
        for (me, loads, wait, expected) in cases {
            let own = Load {
                cpu: loads[me],
                wait,
            };
            assert_eq!(
                rebalance(me, &loads, own, false, 16, LIMITS),
                expected,
                "thread {me} of {loads:?} waiting {wait}"
            );
        }
    }

    /// The meter tests measure this thread's CPU: they must not run beside
    /// each other (the waits test spins two threads per CPU on purpose).
    static METER_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn the_meter_reports_per_mille_of_a_core() {
        let _alone = METER_TESTS
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
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
        // A spinning thread is on a CPU or waiting for one the whole time
        // (other tests of this binary may take CPUs from it).
        assert!(load.cpu > 50 && load.cpu <= 1100, "load {load:?}");
        assert!(load.cpu + load.wait >= 700, "load {load:?}");
        assert!(load.wait <= 1000, "load {load:?}");
        std::thread::sleep(std::time::Duration::from_millis(30));
        let idle = meter.close_window(std::time::Instant::now());
        assert!(idle.cpu < 200, "idle load {idle:?}");
    }

    #[test]
    fn the_meter_sees_waits_for_a_cpu() {
        let _alone = METER_TESTS
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let mut meter = LoadMeter::new();
        if !meter.counts_cpu() {
            // No schedstat on this kernel: waits are not measured.
            return;
        }
        // Twice as many spinning threads as CPUs, and this one spinning too:
        // each gets well under half a CPU and waits for the rest.
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spinners: Vec<_> = (0..2 * cpus)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        let start = std::time::Instant::now();
        let _ = meter.close_window(start);
        while start.elapsed() < std::time::Duration::from_millis(300) {
            std::hint::spin_loop();
        }
        let load = meter.close_window(std::time::Instant::now());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for spinner in spinners {
            let _ = spinner.join();
        }
        assert!(load.contended(LIMITS), "{} CPUs, load {load:?}", cpus);
        assert!(load.cpu < 900, "{} CPUs, load {load:?}", cpus);
    }
}
