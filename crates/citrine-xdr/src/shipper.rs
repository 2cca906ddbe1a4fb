//! The shipping decisions of one DC and namespace on one node, as a
//! sans-I/O state machine (paper 001 on cross-datacenter replication;
//! paper 000 §5.2): no digest log, only each record's last-update time
//! (LUT) and, per partition, the last-ship time (LST) for this DC.
//!
//! The caller (the server) feeds it and carries out what it returns:
//! - [`Shipper::scans_due`]: the partitions to scan now and, for each, the
//!   window `(LST, horizon]` of LUTs to look for; the caller reads the
//!   partition's index and hands back every record in it through
//!   [`Shipper::offer`] (a record of a filtered-out set through
//!   [`Shipper::filtered`]).
//! - [`Shipper::poll`]: the ships to start ([`Ship`]), within the bound on
//!   records in flight and `max-throughput`.
//! - [`Shipper::ack`]: how a ship ended. Successes let the partition's LST
//!   advance; a retryable failure closes the window and schedules the
//!   partition's rescan (the same LUT scan recovers what the failure left).
//! - [`Shipper::take_lst_changes`]: the LSTs that moved, to persist.
//! - [`Shipper::mastered_lsts`] and [`Shipper::adopt_lst`]: a master's
//!   LSTs travel to the other members, which take them for the partitions
//!   they do not master, so that a new master resumes where the old one
//!   stood.
//! - [`Shipper::set_role`]: what this node is to each partition
//!   ([`Role`]). A master still filling its copy ships what it holds as it
//!   comes (the writes it accepts during the fill, within the bounded lag)
//!   but moves only a shadow of the LST, never the LST itself: a record it
//!   has not received yet may have any older LUT. Once whole it scans
//!   again from the LST, and the hot keys keep what it shipped during the
//!   fill from going twice. The acting master (the old master, holding the
//!   whole copy) ships nothing but keeps reporting its LST, which the
//!   filling master takes.
//!
//! Time enters only as the `now_ms` arguments.
//!
//! Invariants:
//! - a partition's LST grows only to just below the LUT of the first
//!   record of its window not yet acknowledged (or to the window's horizon
//!   once every record in it is): everything at or before an LST has been
//!   acknowledged by the destination; it moves back only by a rewind
//!   ([`Shipper::rewind_partition`]) or, on a partition this node does not
//!   master, by taking its master's ([`Shipper::adopt_lst`]), never while
//!   a window is open;
//! - a partition has at most one open window; a window holds at most
//!   `window_limit` records unless more share its last LUT;
//! - at most `max_in_flight` ships are outstanding;
//! - a record whose shipped LUT (the version actually read and sent) is
//!   at or past its LUT in a later window is not shipped again (hot-key
//!   de-duplication), and no record is shipped twice within `hot-key-ms`.

use crate::config::NamespaceSettings;
use citrine_types::{Digest, PARTITIONS};
use std::collections::{HashMap, VecDeque};

/// Fixed tuning of a shipper.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Ships outstanding at once.
    pub max_in_flight: usize,
    /// Records a window holds (ties with its last LUT excepted).
    pub window_limit: usize,
    /// Partitions with an open window at once.
    pub open_windows: usize,
    /// How soon a partition whose last scan found nothing is scanned again.
    pub idle_rescan_ms: u64,
    /// How soon a partition is rescanned after a failed ship.
    pub retry_ms: u64,
    /// How far behind now a window's horizon stays. A write takes its LUT
    /// under its partition's lock, so a write a scan did not see has a LUT
    /// at or past the `now_ms` read before the scan: any margin of 1 ms or
    /// more keeps it out of the window; the rest absorbs a wall clock
    /// stepped back a little.
    pub settle_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_in_flight: 64,
            window_limit: 256,
            open_windows: 32,
            idle_rescan_ms: 200,
            retry_ms: 1000,
            settle_ms: 20,
        }
    }
}

/// What this node is to a partition, for shipping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Neither ships nor reports: takes the master's LSTs.
    Standby,
    /// The master, whole: ships, moves and reports the LST.
    Master,
    /// The master while a migration fills its copy: ships what it holds,
    /// moves only the shadow LST, takes the acting master's LST.
    Filling,
    /// The acting master of a filling master: ships nothing, reports its
    /// LST (the old master's, the one the filling master resumes from).
    Acting,
}

/// One record a scan found in a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub digest: Digest,
    pub lut_ms: u64,
}

/// A partition to scan for records with `after < LUT <= up_to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scan {
    pub partition: u16,
    pub after: u64,
    pub up_to: u64,
}

/// A record to ship: read its current state and send it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ship {
    pub id: u64,
    pub partition: u16,
    pub digest: Digest,
}

/// How a ship ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The destination took it (or already had as new a copy); the LUT of
    /// the version that was read and sent.
    Shipped { lut_ms: u64 },
    /// The record was gone locally with no tombstone: nothing to ship.
    NotFound,
    /// The DC's filter expression rejected the record: not shipped.
    Filtered,
    /// The destination refused it for good; given up.
    Abandoned,
    /// The connection failed or timed out: retried by the next scan.
    RetryConnection,
    /// The destination answered with a temporary error.
    RetryDestination,
}

/// The counters of `get-stats:context=xdr;dc=…;namespace=…`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub success: u64,
    pub abandoned: u64,
    pub not_found: u64,
    pub filtered_out: u64,
    pub retry_conn_reset: u64,
    pub retry_dest: u64,
    pub recoveries: u64,
    pub hot_keys: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item {
    Pending,
    InFlight,
    Done,
    Failed,
}

#[derive(Debug)]
struct Window {
    horizon: u64,
    records: Vec<Candidate>,
    states: Vec<Item>,
    /// Records before this index are all `Done`.
    done_prefix: usize,
    in_flight: usize,
    failed: bool,
    /// Opened while the partition filled: it moves the shadow LST only.
    filling: bool,
}

#[derive(Debug, Clone, Copy)]
struct Partition {
    lst: u64,
    role: Role,
    /// While [`Role::Filling`]: how far the fill's windows shipped (0
    /// otherwise); see [`Shipper::set_role`].
    shadow: u64,
    /// When to scan next (`u64::MAX`: while its window is open).
    scan_at: u64,
    /// A failed window awaits its rescan.
    recovering: bool,
    /// Where the LST goes back to before the next scan (`u64::MAX`: no
    /// rewind asked): see [`Shipper::rewind_partition`].
    rewind_to: u64,
}

#[derive(Debug, Clone, Copy)]
struct Hot {
    shipped_lut: u64,
    shipped_at: u64,
}

/// The shipping state of one DC and namespace on this node.
#[derive(Debug)]
pub struct Shipper {
    limits: Limits,
    settings: NamespaceSettings,
    partitions: Vec<Partition>,
    windows: HashMap<u16, Window>,
    /// Partitions whose windows have records to send, round robin.
    ready: VecDeque<u16>,
    in_flight: HashMap<u64, (u16, usize, u64)>,
    hot: HashMap<Digest, Hot>,
    /// When cold hot-key entries were last dropped.
    purged_at: u64,
    next_id: u64,
    /// Where the next [`Shipper::scans_due`] starts looking.
    scan_cursor: usize,
    next_cursor: usize,
    tokens: f64,
    tokens_at: u64,
    lst_changes: Vec<(u16, u64)>,
    counters: Counters,
}

impl Shipper {
    /// A shipper of every record last updated at or after `ship_from_ms`
    /// (no partition mastered until [`Shipper::set_mastered`]). Its LSTs
    /// start just before it: a window takes LUTs past the LST, and a write
    /// in the very millisecond the namespace was added to the DC (or the
    /// rewind point) is one to ship.
    pub fn new(settings: NamespaceSettings, limits: Limits, ship_from_ms: u64) -> Shipper {
        let partition = Partition {
            lst: ship_from_ms.saturating_sub(1),
            role: Role::Standby,
            shadow: 0,
            scan_at: 0,
            recovering: false,
            rewind_to: u64::MAX,
        };
        Shipper {
            limits,
            settings,
            partitions: vec![partition; PARTITIONS],
            windows: HashMap::new(),
            ready: VecDeque::new(),
            in_flight: HashMap::new(),
            hot: HashMap::new(),
            purged_at: 0,
            next_id: 1,
            scan_cursor: 0,
            next_cursor: 0,
            tokens: 0.0,
            tokens_at: 0,
            lst_changes: Vec::new(),
            counters: Counters::default(),
        }
    }

    pub fn settings(&self) -> &NamespaceSettings {
        &self.settings
    }

    pub fn set_settings(&mut self, settings: NamespaceSettings) {
        self.settings = settings;
    }

    /// Restores a persisted LST (only ever moves it forward).
    pub fn restore_lst(&mut self, partition: u16, lst: u64) {
        if let Some(state) = self.partitions.get_mut(usize::from(partition)) {
            state.lst = state.lst.max(lst);
        }
    }

    pub fn lst(&self, partition: u16) -> u64 {
        self.partitions[usize::from(partition) % PARTITIONS].lst
    }

    /// Asks that `partition` be scanned again from `lut_ms` on (its LST
    /// moved back to just before it), once its open window, if any, is
    /// settled: a record that arrived by XDR keeps its source's LUT, which
    /// may be behind the LST already, and a DC with `forward` on must still
    /// see it. Records shipped since are de-duplicated by the hot keys.
    pub fn rewind_partition(&mut self, partition: u16, lut_ms: u64) {
        if let Some(state) = self.partitions.get_mut(usize::from(partition)) {
            state.rewind_to = state.rewind_to.min(lut_ms.saturating_sub(1));
            if state.scan_at != u64::MAX {
                state.scan_at = 0;
            }
        }
    }

    /// Takes the LST `partition`'s master reported for this DC and
    /// namespace (see [`Shipper::mastered_lsts`]), earlier or later than
    /// this node's: were this node to master the partition next, it
    /// resumes where the master stood — re-shipping little, and missing
    /// nothing the master had not shipped even when this node's own LST is
    /// later (its lane added after those writes). Ignored (false) while
    /// this node masters the partition or still has a window open in it.
    pub fn adopt_lst(&mut self, partition: u16, lst: u64) -> bool {
        let Some(state) = self.partitions.get_mut(usize::from(partition)) else {
            return false;
        };
        let whole_window = self
            .windows
            .get(&partition)
            .is_some_and(|window| !window.filling);
        if matches!(state.role, Role::Master | Role::Acting) || whole_window || state.lst == lst {
            return false;
        }
        state.lst = lst;
        self.lst_changes.push((partition, lst));
        true
    }

    /// The LSTs of the partitions this node masters whole or acts for,
    /// for the other members ([`Shipper::adopt_lst`]).
    pub fn mastered_lsts(&self) -> Vec<(u16, u64)> {
        self.partitions
            .iter()
            .enumerate()
            .filter(|(_, state)| matches!(state.role, Role::Master | Role::Acting))
            .map(|(index, state)| (index as u16, state.lst))
            .collect()
    }

    /// Whether this node masters `partition` whole ([`Role::Master`]) or
    /// not at all ([`Role::Standby`]).
    pub fn set_mastered(&mut self, partition: u16, mastered: bool) {
        let role = if mastered {
            Role::Master
        } else {
            Role::Standby
        };
        self.set_role(partition, role);
    }

    /// What this node is to `partition` now. Leaving [`Role::Filling`]
    /// drops the shadow LST: a master whole at last scans again from the
    /// LST (what it shipped while filling is de-duplicated by the hot keys).
    pub fn set_role(&mut self, partition: u16, role: Role) {
        if let Some(state) = self.partitions.get_mut(usize::from(partition)) {
            if role != Role::Filling {
                state.shadow = 0;
            }
            state.role = role;
        }
    }

    /// The partitions to scan now, at most as many as may open windows,
    /// taken round robin from where the last call stopped (so that every
    /// partition gets its turn however many are due).
    pub fn scans_due(&mut self, now_ms: u64) -> Vec<Scan> {
        let up_to = self.horizon(now_ms);
        let room = self.limits.open_windows.saturating_sub(self.windows.len());
        let mut scans = Vec::new();
        for step in 0..PARTITIONS {
            if scans.len() >= room {
                break;
            }
            let index = (self.scan_cursor + step) % PARTITIONS;
            let state = &mut self.partitions[index];
            if state.scan_at != u64::MAX && state.rewind_to != u64::MAX {
                if state.rewind_to < state.lst {
                    state.lst = state.rewind_to;
                    self.lst_changes.push((index as u16, state.lst));
                }
                state.rewind_to = u64::MAX;
            }
            let after = state.lst.max(state.shadow);
            let ships = matches!(state.role, Role::Master | Role::Filling);
            if !ships || state.scan_at > now_ms || up_to <= after {
                continue;
            }
            if state.recovering {
                state.recovering = false;
                self.counters.recoveries += 1;
            }
            state.scan_at = u64::MAX;
            scans.push(Scan {
                partition: index as u16,
                after,
                up_to,
            });
            self.next_cursor = (index + 1) % PARTITIONS;
        }
        self.scan_cursor = self.next_cursor;
        scans
    }

    fn horizon(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.settings.delay_ms.max(self.limits.settle_ms))
    }

    /// A record of the scanned window skipped by the set filters.
    pub fn filtered(&mut self, count: u64) {
        self.counters.filtered_out += count;
    }

    /// The records a scan of `scan` found (any order, each LUT in the
    /// window). Opens the partition's window, bounded by `window_limit`.
    pub fn offer(&mut self, scan: Scan, mut records: Vec<Candidate>, now_ms: u64) {
        let index = usize::from(scan.partition);
        if index >= PARTITIONS || self.windows.contains_key(&scan.partition) {
            return;
        }
        records.retain(|record| record.lut_ms > scan.after && record.lut_ms <= scan.up_to);
        records.sort_unstable_by_key(|record| record.lut_ms);
        let horizon = cut_window(&mut records, scan.up_to, self.limits.window_limit);
        let filling = self.partitions[index].role == Role::Filling;
        if records.is_empty() {
            self.advance(scan.partition, horizon, filling);
            self.partitions[index].scan_at = now_ms + self.limits.idle_rescan_ms;
            return;
        }
        let states = vec![Item::Pending; records.len()];
        self.windows.insert(
            scan.partition,
            Window {
                horizon,
                records,
                states,
                done_prefix: 0,
                in_flight: 0,
                failed: false,
                filling,
            },
        );
        self.ready.push_back(scan.partition);
    }

    /// The ships to start now.
    pub fn poll(&mut self, now_ms: u64) -> Vec<Ship> {
        self.refill(now_ms);
        let mut ships = Vec::new();
        let mut rounds = self.ready.len();
        while rounds > 0 && self.in_flight.len() < self.limits.max_in_flight && self.tokens >= 1.0 {
            rounds -= 1;
            let Some(partition) = self.ready.pop_front() else {
                break;
            };
            match self.next_of(partition, now_ms) {
                Some(ship) => {
                    self.tokens -= 1.0;
                    ships.push(ship);
                    self.ready.push_back(partition);
                    rounds = self.ready.len();
                }
                None if self.has_pending(partition) => self.ready.push_back(partition),
                None => self.settle(partition, now_ms),
            }
        }
        self.forget_cold_keys(now_ms);
        ships
    }

    fn has_pending(&self, partition: u16) -> bool {
        self.windows.get(&partition).is_some_and(|window| {
            !window.failed && window.states[window.done_prefix..].contains(&Item::Pending)
        })
    }

    fn refill(&mut self, now_ms: u64) {
        let rate = self.settings.max_throughput as f64;
        let elapsed = now_ms.saturating_sub(self.tokens_at) as f64 / 1000.0;
        // A burst of at most a tenth of a second's worth.
        self.tokens = (self.tokens + elapsed * rate).min((rate / 10.0).max(1.0));
        self.tokens_at = now_ms;
    }

    /// The partition's next record to ship, skipping (as done) the ones
    /// hot-key de-duplication covers; `None` when nothing can go now.
    fn next_of(&mut self, partition: u16, now_ms: u64) -> Option<Ship> {
        let hot_key_ms = self.settings.hot_key_ms;
        let window = self.windows.get_mut(&partition)?;
        if window.failed {
            return None;
        }
        for slot in window.done_prefix..window.records.len() {
            if window.states[slot] != Item::Pending {
                continue;
            }
            let record = window.records[slot];
            if let Some(hot) = self.hot.get(&record.digest) {
                if hot.shipped_lut >= record.lut_ms {
                    window.states[slot] = Item::Done;
                    self.counters.hot_keys += 1;
                    continue;
                }
                if hot.shipped_at + hot_key_ms > now_ms {
                    continue;
                }
            }
            let id = self.next_id;
            self.next_id += 1;
            window.states[slot] = Item::InFlight;
            window.in_flight += 1;
            self.in_flight.insert(id, (partition, slot, now_ms));
            return Some(Ship {
                id,
                partition,
                digest: record.digest,
            });
        }
        None
    }

    /// How ship `id` ended. Unknown ids (already settled) are ignored.
    pub fn ack(&mut self, id: u64, outcome: Outcome, now_ms: u64) {
        let Some((partition, slot, _)) = self.in_flight.remove(&id) else {
            return;
        };
        let Some(window) = self.windows.get_mut(&partition) else {
            return;
        };
        window.in_flight -= 1;
        let digest = window.records[slot].digest;
        let state = match outcome {
            Outcome::Shipped { lut_ms } => {
                self.counters.success += 1;
                self.hot.insert(
                    digest,
                    Hot {
                        shipped_lut: lut_ms,
                        shipped_at: now_ms,
                    },
                );
                Item::Done
            }
            Outcome::NotFound => {
                self.counters.not_found += 1;
                Item::Done
            }
            Outcome::Filtered => {
                self.counters.filtered_out += 1;
                Item::Done
            }
            Outcome::Abandoned => {
                self.counters.abandoned += 1;
                Item::Done
            }
            Outcome::RetryConnection => {
                self.counters.retry_conn_reset += 1;
                Item::Failed
            }
            Outcome::RetryDestination => {
                self.counters.retry_dest += 1;
                Item::Failed
            }
        };
        window.states[slot] = state;
        window.failed |= state == Item::Failed;
        self.settle(partition, now_ms);
    }

    /// Advances the partition's LST over its window's acknowledged prefix;
    /// closes the window when it is finished or failed and idle.
    fn settle(&mut self, partition: u16, now_ms: u64) {
        let Some(window) = self.windows.get_mut(&partition) else {
            return;
        };
        while window.done_prefix < window.records.len()
            && window.states[window.done_prefix] == Item::Done
        {
            window.done_prefix += 1;
        }
        let (lst, finished) = match window.records.get(window.done_prefix) {
            None => (window.horizon, true),
            Some(record) => (record.lut_ms - 1, window.failed && window.in_flight == 0),
        };
        let (failed, filling) = (window.failed, window.filling);
        self.advance(partition, lst, filling);
        if finished {
            self.windows.remove(&partition);
            self.ready.retain(|ready| *ready != partition);
            let state = &mut self.partitions[usize::from(partition)];
            // A finished window's partition may have more: scan it again
            // at once; a failed one after the retry delay.
            state.scan_at = if failed {
                now_ms + self.limits.retry_ms
            } else {
                now_ms
            };
            state.recovering = failed;
        }
    }

    /// Moves the LST forward to `lst` — only the shadow for a window of a
    /// filling partition (and not even that once the fill is over).
    fn advance(&mut self, partition: u16, lst: u64, filling: bool) {
        let state = &mut self.partitions[usize::from(partition)];
        if filling {
            if state.role == Role::Filling {
                state.shadow = state.shadow.max(lst);
            }
            return;
        }
        if lst > state.lst {
            state.lst = lst;
            self.lst_changes.push((partition, lst));
        }
    }

    /// Hot-key entries that can no longer de-duplicate anything: past
    /// `hot-key-ms` and at or behind their partition's LST.
    fn forget_cold_keys(&mut self, now_ms: u64) {
        if self.hot.len() < 4096 || now_ms < self.purged_at + 1000 {
            return;
        }
        self.purged_at = now_ms;
        let hot_key_ms = self.settings.hot_key_ms;
        let partitions = &self.partitions;
        self.hot.retain(|digest, hot| {
            hot.shipped_at + hot_key_ms > now_ms
                || hot.shipped_lut > partitions[digest.partition().index()].lst
        });
    }

    /// The LSTs that moved since the last call (to persist).
    pub fn take_lst_changes(&mut self) -> Vec<(u16, u64)> {
        std::mem::take(&mut self.lst_changes)
    }

    /// Every partition's LST (for a full save).
    pub fn lsts(&self) -> Vec<u64> {
        self.partitions.iter().map(|state| state.lst).collect()
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Records in open windows not yet sent.
    pub fn in_queue(&self) -> usize {
        self.windows
            .values()
            .map(|window| {
                window.states[window.done_prefix..]
                    .iter()
                    .filter(|state| **state == Item::Pending)
                    .count()
            })
            .sum()
    }

    pub fn in_progress(&self) -> usize {
        self.in_flight.len()
    }

    /// Partitions whose failed window awaits its rescan.
    pub fn recoveries_pending(&self) -> usize {
        self.partitions
            .iter()
            .filter(|state| state.recovering)
            .count()
    }

    /// How far behind now the oldest mastered partition's LST is, in ms
    /// (a filling one's shadow, when past its LST).
    pub fn lag_ms(&self, now_ms: u64) -> u64 {
        self.partitions
            .iter()
            .filter(|state| matches!(state.role, Role::Master | Role::Filling))
            .map(|state| now_ms.saturating_sub(state.lst.max(state.shadow)))
            .max()
            .unwrap_or(0)
    }
}

/// Keeps at most `limit` records of a LUT-sorted list (more only when they
/// share the last kept LUT) and returns the window's horizon: `up_to` when
/// nothing was cut, else the last kept LUT.
fn cut_window(records: &mut Vec<Candidate>, up_to: u64, limit: usize) -> u64 {
    if records.len() <= limit || limit == 0 {
        return up_to;
    }
    let last = records[limit - 1].lut_ms;
    let keep = records.partition_point(|record| record.lut_ms <= last);
    records.truncate(keep);
    last
}

#[cfg(test)]
mod tests;
