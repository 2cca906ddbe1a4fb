//! The *stable placement*: a uniformly balanced partition map that a view
//! change moves by close to the minimum, because it is computed from the
//! previous placement instead of from the succession list alone.
//!
//! Owns: [`Placement`] (who holds column `c` of partition `p`, for `depth`
//! columns, over a sorted member list with racks) and the rebalancing step
//! [`Placement::compute`]. See `docs/partition-balance.md` for the
//! algorithm, its bounds and how the cluster agrees on the result.
//!
//! The step, given the previous placement (the *base*, or none) and the new
//! members:
//! 1. **Start.** Without a base, the start is the map of
//!    [`PartitionMap::compute`] with the paper's uniform-balance pass (so a
//!    cluster switching to the stable placement moves nothing). With one,
//!    every cell keeps its node if that node is still a member; cells of
//!    departed nodes, and of columns the base did not have, are *holes*.
//! 2. **Repair.** Partitions are visited in ascending order, columns left to
//!    right. A cell that breaks the rack rule (a member's rack changed, or
//!    rack awareness just began) becomes a hole. A hole is filled by the
//!    eligible node (not in the partition, rack rule kept) with the fewest
//!    copies of that column, then the fewest copies overall, then the
//!    lowest [`super::node_hash`]-style pair hash.
//! 3. **Balance**, column by column: while the least loaded node `v` of the
//!    column holds at least two fewer than the most loaded, a copy-free
//!    swap (two holders of one partition exchange columns, when that
//!    narrows both columns) or else a move (one cell changes hands, from a
//!    node holding at least two more than `v`, the most loaded first, then
//!    the partition `v` hashes first) is made. A node no move can help is
//!    set aside for the rest of the pass; passes repeat while one makes a
//!    step, and the columns are balanced in rounds until a round changes
//!    nothing (a swap for a later column touches an earlier one). Each step
//!    lowers the sum over columns of squared column counts, so this ends.
//!
//! Rack rule (as [`PartitionMap::compute`] applies it): column `c` of a
//! partition must be on a rack holding the fewest of columns `0..c` among
//! the racks that still have a node outside them. With at least `depth`
//! racks that is "all copies on distinct racks"; with fewer, copies are
//! spread round-robin. Without two distinct racks there is no rule.
//!
//! Invariants (tested below):
//! - a pure function of (base, set of members, depth): no I/O, clock or
//!   randomness, and the order of `members` does not matter;
//! - every partition has `min(depth, members)` distinct nodes, and every
//!   prefix of its columns keeps the rack rule;
//! - each column is spread as evenly as the rack rule allows: with racks
//!   of one size or none, every node holds `floor` or `ceil` of
//!   `4096 / members` partitions of every column (one more on either side
//!   when there are fewer racks than columns, where the round-robin rule
//!   ties the columns together); with racks of different sizes a column is
//!   within one partition of even inside each rack;
//! - cells are only changed in place (a joining node takes over a cell, a
//!   departed node's cell is taken over), so a namespace that reads only
//!   the first `r < depth` columns moves as little as one reading them all.

use citrine_types::{NodeId, PartitionId, PARTITIONS};

use super::{fnv1a_64, PartitionMapConfig};
use super::{node_id_hash, pair_hash, partition_id_hash, NodeEntry, PartitionMap};

/// An empty cell while a placement is being computed.
const HOLE: u16 = u16::MAX;

/// Most members a placement indexes (cells are `u16`, [`HOLE`] excluded).
pub const MAX_MEMBERS: usize = u16::MAX as usize;

/// For every partition, the members holding its `depth` columns (column 0
/// is the master), as indexes into the sorted member list.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Placement {
    /// Members sorted by id, distinct ids.
    members: Vec<NodeEntry>,
    /// Columns per partition: `min(wanted depth, members)`.
    depth: usize,
    /// Row-major: partition `p`'s cells are `table[p * depth..][..depth]`.
    table: Vec<u16>,
}

impl Placement {
    /// The placement for `members` (any order, duplicate ids keep the
    /// smallest rack) with `depth` columns, rebalanced from `base`.
    pub fn compute(base: Option<&Placement>, members: &[NodeEntry], depth: usize) -> Placement {
        let mut entries = members.to_vec();
        entries.sort_unstable();
        entries.dedup_by_key(|entry| entry.id);
        assert!(entries.len() <= MAX_MEMBERS, "too many members");
        let depth = depth.min(entries.len());
        let mut work = Work::new(&entries, depth);
        if depth == 0 {
            return work.finish(entries);
        }
        match base {
            Some(base) if !base.members.is_empty() => work.start_from(base),
            _ => work.start_fresh(&entries),
        }
        work.repair();
        work.balance_all();
        work.finish(entries)
    }

    /// Rebuilds a placement from its parts (a decoded message); `None`
    /// unless members are sorted and distinct, the table has
    /// `4096 × depth` cells, `depth <= members`, and every partition lists
    /// distinct members.
    pub fn from_parts(members: Vec<NodeEntry>, depth: usize, table: Vec<u16>) -> Option<Placement> {
        let sorted = members.windows(2).all(|pair| pair[0].id < pair[1].id);
        let n = members.len();
        let shaped = depth <= n && n <= MAX_MEMBERS && table.len() == PARTITIONS * depth;
        if !sorted || !shaped {
            return None;
        }
        let rows_ok = depth == 0
            || table.chunks(depth).all(|row| {
                row.iter()
                    .enumerate()
                    .all(|(c, &cell)| usize::from(cell) < n && !row[..c].contains(&cell))
            });
        rows_ok.then_some(Placement {
            members,
            depth,
            table,
        })
    }

    /// Members, sorted by id.
    pub fn members(&self) -> &[NodeEntry] {
        &self.members
    }

    /// Columns per partition.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// The raw cells (member indexes), row-major.
    pub fn cells(&self) -> &[u16] {
        &self.table
    }

    /// Member indexes holding `partition`, column 0 first.
    pub fn row(&self, partition: PartitionId) -> &[u16] {
        let start = partition.index() * self.depth;
        &self.table[start..start + self.depth]
    }

    /// Nodes holding `partition`, column 0 first.
    pub fn replicas(&self, partition: PartitionId) -> impl Iterator<Item = NodeId> + '_ {
        self.row(partition)
            .iter()
            .map(|&cell| self.members[usize::from(cell)].id)
    }

    /// The partition map of a namespace reading the first
    /// `min(replication_factor, members)` columns. `None` when that is
    /// more than the placement holds.
    pub fn partition_map(&self, replication_factor: usize) -> Option<PartitionMap> {
        let rf = replication_factor.min(self.members.len());
        if rf > self.depth {
            return None;
        }
        let mut table = Vec::with_capacity(PARTITIONS * rf);
        for row in self.table.chunks(self.depth.max(1)).take(PARTITIONS) {
            table.extend(row[..rf].iter().map(|&c| self.members[usize::from(c)].id));
        }
        let mut racks: Vec<u32> = self.members.iter().map(|m| m.rack_id).collect();
        racks.sort_unstable();
        racks.dedup();
        Some(PartitionMap {
            nodes: self.members.iter().map(|m| m.id).collect(),
            replication_factor: rf,
            rack_aware: racks.len() > 1,
            table: if rf == 0 { Vec::new() } else { table },
        })
    }

    /// A stable 64-bit hash (FNV-1a) of the members, their racks, the
    /// depth and every cell.
    pub fn fingerprint(&self) -> u64 {
        let mut bytes = Vec::with_capacity(16 + self.members.len() * 12 + self.table.len() * 2);
        bytes.extend_from_slice(&(self.depth as u64).to_le_bytes());
        for member in &self.members {
            bytes.extend_from_slice(&member.id.0.to_le_bytes());
            bytes.extend_from_slice(&member.rack_id.to_le_bytes());
        }
        for cell in &self.table {
            bytes.extend_from_slice(&cell.to_le_bytes());
        }
        fnv1a_64(&bytes)
    }
}

/// Copies in the first `columns` columns of `new` held by a node that did
/// not hold that partition (in its first `columns` columns) in `old`: the
/// copies a change from `old` to `new` must migrate.
pub fn copies_moved(old: &Placement, new: &Placement, columns: usize) -> usize {
    PartitionId::all()
        .map(|partition| {
            let before: Vec<NodeId> = old.replicas(partition).take(columns).collect();
            new.replicas(partition)
                .take(columns)
                .filter(|node| !before.contains(node))
                .count()
        })
        .sum()
}

/// The placement under construction.
struct Work {
    n: usize,
    depth: usize,
    ids: Vec<NodeId>,
    /// Rack index of each member.
    rack_of: Vec<usize>,
    /// Members per rack index.
    rack_size: Vec<usize>,
    rack_aware: bool,
    node_hashes: Vec<u64>,
    partition_hashes: Vec<u64>,
    table: Vec<u16>,
    /// `count[column * n + node]`: cells of `column` held by `node`.
    count: Vec<u32>,
    /// Cells held by each node, all columns.
    total: Vec<u32>,
}

impl Work {
    fn new(entries: &[NodeEntry], depth: usize) -> Work {
        let n = entries.len();
        let mut racks: Vec<u32> = entries.iter().map(|e| e.rack_id).collect();
        racks.sort_unstable();
        racks.dedup();
        let rack_of: Vec<usize> = entries
            .iter()
            .map(|e| racks.partition_point(|&r| r < e.rack_id))
            .collect();
        let mut rack_size = vec![0usize; racks.len()];
        for &rack in &rack_of {
            rack_size[rack] += 1;
        }
        Work {
            n,
            depth,
            ids: entries.iter().map(|e| e.id).collect(),
            rack_of,
            rack_size,
            rack_aware: racks.len() > 1,
            node_hashes: entries.iter().map(|e| node_id_hash(e.id)).collect(),
            partition_hashes: PartitionId::all().map(partition_id_hash).collect(),
            table: vec![HOLE; PARTITIONS * depth],
            count: vec![0; depth * n],
            total: vec![0; n],
        }
    }

    fn finish(self, members: Vec<NodeEntry>) -> Placement {
        debug_assert!(!self.table.contains(&HOLE));
        Placement {
            members,
            depth: self.depth,
            table: self.table,
        }
    }

    #[inline]
    fn count_of(&self, column: usize, node: u16) -> u32 {
        self.count[column * self.n + usize::from(node)]
    }

    fn set(&mut self, cell: usize, node: u16) {
        let column = cell % self.depth;
        let old = self.table[cell];
        if old != HOLE {
            self.count[column * self.n + usize::from(old)] -= 1;
            self.total[usize::from(old)] -= 1;
        }
        if node != HOLE {
            self.count[column * self.n + usize::from(node)] += 1;
            self.total[usize::from(node)] += 1;
        }
        self.table[cell] = node;
    }

    fn row(&self, partition: usize) -> &[u16] {
        &self.table[partition * self.depth..(partition + 1) * self.depth]
    }

    /// Tie-break: `node`'s pair hash with `partition` (lower first).
    #[inline]
    fn hash(&self, node: u16, partition: usize) -> u32 {
        pair_hash(
            self.node_hashes[usize::from(node)],
            self.partition_hashes[partition],
        )
    }

    /// The paper's map (Table 1 + uniform-balance pass + racks).
    fn start_fresh(&mut self, entries: &[NodeEntry]) {
        let config = PartitionMapConfig {
            replication_factor: self.depth,
            uniform_balance: true,
        };
        let map = PartitionMap::compute(entries, &config);
        for (cell, id) in map.table.iter().enumerate() {
            let index = self.ids.partition_point(|other| other < id);
            self.set(cell, index as u16);
        }
    }

    /// The base's cells, translated to the new member indexes; departed
    /// members and columns the base lacks are holes.
    fn start_from(&mut self, base: &Placement) {
        let new_index: Vec<u16> = base
            .members
            .iter()
            .map(|member| match self.ids.binary_search(&member.id) {
                Ok(index) => index as u16,
                Err(_) => HOLE,
            })
            .collect();
        let columns = self.depth.min(base.depth);
        for partition in 0..PARTITIONS {
            for column in 0..columns {
                let old = base.table[partition * base.depth + column];
                let node = new_index[usize::from(old)];
                if node != HOLE {
                    self.set(partition * self.depth + column, node);
                }
            }
        }
    }

    /// Whether the row keeps the rack rule in columns `from..` when column
    /// `at` holds `node` (columns before `from` are taken as they are;
    /// holes after `at` are skipped).
    fn rack_ok(&self, row: &[u16], at: usize, node: u16, from: usize) -> bool {
        if !self.rack_aware {
            return true;
        }
        let cell = |j: usize| if j == at { node } else { row[j] };
        if self.rack_size.len() >= self.depth {
            // Enough racks: every copy on its own rack.
            let rack = self.rack_of[usize::from(node)];
            return (0..row.len())
                .filter(|&j| j != at && row[j] != HOLE)
                .all(|j| self.rack_of[usize::from(row[j])] != rack);
        }
        let mut copies = vec![0usize; self.rack_size.len()];
        for j in 0..row.len() {
            let holder = cell(j);
            if holder == HOLE {
                continue;
            }
            let rack = self.rack_of[usize::from(holder)];
            if j >= from {
                let least = (0..copies.len())
                    .filter(|&r| self.rack_size[r] > copies[r])
                    .map(|r| copies[r])
                    .min();
                if least.is_some_and(|least| copies[rack] != least) {
                    return false;
                }
            }
            copies[rack] += 1;
        }
        true
    }

    /// Step 2: every hole filled and every cell breaking the rack rule
    /// replaced, partitions in order, columns left to right.
    fn repair(&mut self) {
        for partition in 0..PARTITIONS {
            for column in 0..self.depth {
                let cell = partition * self.depth + column;
                let holder = self.table[cell];
                if holder != HOLE && self.rack_ok(self.row(partition), column, holder, column) {
                    continue;
                }
                self.set(cell, HOLE);
                let filler = self.filler(partition, column);
                self.set(cell, filler);
            }
        }
    }

    /// The node to fill the hole at (`partition`, `column`): not in the
    /// row, rack rule kept for this column; fewest copies of the column,
    /// then overall, then lowest pair hash.
    fn filler(&self, partition: usize, column: usize) -> u16 {
        let row = self.row(partition);
        let candidates = (0..self.n as u16).filter(|node| !row.contains(node));
        let best = candidates
            .clone()
            .filter(|&node| self.rack_ok(row, column, node, column))
            .min_by_key(|&node| {
                (
                    self.count_of(column, node),
                    self.total[usize::from(node)],
                    self.hash(node, partition),
                )
            });
        // A rack-valid node always exists (a least-used rack with an
        // unused member); the fallback only guards the arithmetic.
        debug_assert!(best.is_some());
        best.or_else(|| candidates.min_by_key(|&node| self.count_of(column, node)))
            .unwrap_or(HOLE)
    }

    /// Step 3: every column balanced, in rounds until a round changes
    /// nothing (a swap made for a later column changes an earlier one).
    fn balance_all(&mut self) {
        let mut changed = true;
        while changed {
            changed = false;
            for column in 0..self.depth {
                changed |= self.balance(column);
            }
        }
    }

    /// One column, in passes until a pass makes no step (a node set aside
    /// in one pass may be helped once other nodes' counts changed).
    /// Returns whether any step was made.
    fn balance(&mut self, column: usize) -> bool {
        let mut any = false;
        while self.balance_pass(column) {
            any = true;
        }
        any
    }

    /// Steps into the least loaded node of `column` not yet set aside,
    /// until the column spans at most one or every node is set aside.
    /// Returns whether any step was made.
    fn balance_pass(&mut self, column: usize) -> bool {
        let mut stuck = vec![false; self.n];
        let mut any = false;
        loop {
            let least = (0..self.n as u16)
                .filter(|&node| !stuck[usize::from(node)])
                .min_by_key(|&node| (self.count_of(column, node), self.total[usize::from(node)]));
            let Some(least) = least else { break };
            let most = (0..self.n as u16)
                .map(|node| self.count_of(column, node))
                .max()
                .unwrap_or(0);
            if most < self.count_of(column, least) + 2 {
                break;
            }
            let helped = self.swap_into(column, least)
                || self.move_into(column, least)
                || self.chain_into(column, least);
            any |= helped;
            if !helped {
                stuck[usize::from(least)] = true;
            }
        }
        any
    }

    /// A copy-free step: in some partition `node` holds another column
    /// `other`, and exchanging it with column `column`'s holder narrows
    /// both columns. Returns whether one was made.
    fn swap_into(&mut self, column: usize, node: u16) -> bool {
        let mine = self.count_of(column, node);
        let mut best: Option<(u32, u32, usize, usize)> = None;
        for partition in 0..PARTITIONS {
            let row = self.row(partition);
            let Some(other) = row.iter().position(|&cell| cell == node) else {
                continue;
            };
            let holder = row[column];
            if other == column
                || self.count_of(column, holder) < mine + 2
                || self.count_of(other, node) < self.count_of(other, holder) + 1
            {
                continue;
            }
            let first = u32::MAX - self.count_of(column, holder);
            // A candidate that cannot beat the best on the first key is
            // skipped before the costlier rack check and hash.
            if best.is_some_and(|b| first > b.0) {
                continue;
            }
            let mut swapped = row.to_vec();
            swapped.swap(column, other);
            if !self.rack_ok(&swapped, column, node, column.min(other)) {
                continue;
            }
            let key = (first, self.hash(node, partition), partition, other);
            if best.is_none_or(|b| key < b) {
                best = Some(key);
            }
        }
        let Some((_, _, partition, other)) = best else {
            return false;
        };
        let holder = self.row(partition)[column];
        self.set(partition * self.depth + column, node);
        self.set(partition * self.depth + other, holder);
        true
    }

    /// Two moves when no single one is allowed: some `via` (holding one
    /// more than `node`) hands `node` a cell it may take, and a holder with
    /// at least two more than `node` hands `via` another. Returns whether
    /// they were made.
    fn chain_into(&mut self, column: usize, node: u16) -> bool {
        let mine = self.count_of(column, node);
        // For each possible `via`, the cell it would hand over.
        let mut second: Vec<Option<(u32, usize)>> = vec![None; self.n];
        for partition in 0..PARTITIONS {
            let row = self.row(partition);
            let via = row[column];
            if self.count_of(column, via) < mine + 1
                || row.contains(&node)
                || !self.rack_ok(row, column, node, column)
            {
                continue;
            }
            let key = (self.hash(node, partition), partition);
            let slot = &mut second[usize::from(via)];
            if slot.is_none_or(|b| key < b) {
                *slot = Some(key);
            }
        }
        let mut best: Option<(u32, u32, usize, usize)> = None;
        for (via, hand) in second.iter().enumerate() {
            let Some((_, to_node)) = *hand else { continue };
            let via = via as u16;
            for partition in 0..PARTITIONS {
                let row = self.row(partition);
                let holder = row[column];
                let theirs = self.count_of(column, holder);
                if theirs < mine + 2
                    || row.contains(&via)
                    || !self.rack_ok(row, column, via, column)
                {
                    continue;
                }
                let key = (
                    u32::MAX - theirs,
                    self.hash(via, partition),
                    partition,
                    to_node,
                );
                if best.is_none_or(|b| key < b) {
                    best = Some(key);
                }
            }
        }
        let Some((_, _, to_via, to_node)) = best else {
            return false;
        };
        let via = self.row(to_node)[column];
        self.set(to_via * self.depth + column, via);
        self.set(to_node * self.depth + column, node);
        true
    }

    /// One cell of `column` handed to `node` by a holder with at least two
    /// more of the column: the most loaded holder first, then the
    /// partition `node` hashes first. Returns whether one was made.
    fn move_into(&mut self, column: usize, node: u16) -> bool {
        let mine = self.count_of(column, node);
        let mut best: Option<(u32, u32, u32, usize)> = None;
        for partition in 0..PARTITIONS {
            let row = self.row(partition);
            let holder = row[column];
            let theirs = self.count_of(column, holder);
            if theirs < mine + 2 || row.contains(&node) {
                continue;
            }
            let first = (
                u32::MAX - theirs,
                u32::MAX - self.total[usize::from(holder)],
            );
            // As in `swap_into`: no rack check or hash for a candidate that
            // cannot win.
            if best.is_some_and(|b| first > (b.0, b.1)) {
                continue;
            }
            if !self.rack_ok(row, column, node, column) {
                continue;
            }
            let key = (first.0, first.1, self.hash(node, partition), partition);
            if best.is_none_or(|b| key < b) {
                best = Some(key);
            }
        }
        let Some((.., partition)) = best else {
            return false;
        };
        self.set(partition * self.depth + column, node);
        true
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    /// Aerospike-style node ids, as the simulator generates them.
    fn id(i: usize) -> NodeId {
        let mac = (i + 2) as u64;
        NodeId(0x0BB9_0000_0000_0000 | ((mac & 0xff) << 40) | ((mac >> 8) << 32) | 0x11AC_4202)
    }

    fn entry(i: usize, racks: u32) -> NodeEntry {
        NodeEntry {
            id: id(i),
            rack_id: if racks > 1 { i as u32 % racks + 1 } else { 0 },
        }
    }

    fn entries(range: std::ops::Range<usize>, racks: u32) -> Vec<NodeEntry> {
        range.map(|i| entry(i, racks)).collect()
    }

    /// Per-node counts of `column`.
    fn column_counts(placement: &Placement, column: usize) -> Vec<usize> {
        let mut counts = vec![0usize; placement.members().len()];
        for row in placement.cells().chunks(placement.depth()) {
            counts[usize::from(row[column])] += 1;
        }
        counts
    }

    /// Every column within floor..=ceil of 4096 / members when the racks
    /// are of one size (or there are none); otherwise the rack rule can
    /// force whole racks above the mean, and each column is only checked
    /// to be within one partition of even inside every rack. With fewer
    /// racks than columns the round-robin rule ties columns together and
    /// a column may span one more on each side (see the module bounds).
    fn assert_even(placement: &Placement, what: &str) {
        let racks: HashSet<u32> = placement.members().iter().map(|m| m.rack_id).collect();
        let slack = usize::from(racks.len() > 1 && racks.len() < placement.depth());
        let members = placement.members();
        let n = members.len();
        let mut rack_sizes: HashMap<u32, usize> = HashMap::new();
        for member in members {
            *rack_sizes.entry(member.rack_id).or_insert(0) += 1;
        }
        let uniform = rack_sizes.values().collect::<HashSet<_>>().len() == 1;
        for column in 0..placement.depth() {
            let counts = column_counts(placement, column);
            if uniform {
                let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
                assert!(
                    *max <= PARTITIONS.div_ceil(n) + slack && *min + slack >= PARTITIONS / n,
                    "{what}: column {column} spans {min}..{max} over {n} nodes"
                );
                continue;
            }
            for &rack in rack_sizes.keys() {
                let on_rack = (0..n).filter(|&i| members[i].rack_id == rack);
                let (min, max) = on_rack.fold((usize::MAX, 0), |(lo, hi), i| {
                    (lo.min(counts[i]), hi.max(counts[i]))
                });
                assert!(
                    max <= min + 1 + 2 * slack,
                    "{what}: column {column} spans {min}..{max} on rack {rack}"
                );
            }
        }
    }

    /// Distinct nodes per partition and, with at least `depth` racks,
    /// distinct racks.
    fn assert_rows(placement: &Placement, what: &str) {
        let racks: HashSet<u32> = placement.members().iter().map(|m| m.rack_id).collect();
        for partition in PartitionId::all() {
            let nodes: HashSet<NodeId> = placement.replicas(partition).collect();
            assert_eq!(nodes.len(), placement.depth(), "{what}: {partition:?}");
            if racks.len() >= placement.depth() && racks.len() > 1 {
                let rack_of: HashMap<NodeId, u32> = placement
                    .members()
                    .iter()
                    .map(|m| (m.id, m.rack_id))
                    .collect();
                let used: HashSet<u32> = nodes.iter().map(|n| rack_of[n]).collect();
                assert_eq!(
                    used.len(),
                    placement.depth(),
                    "{what}: racks of {partition:?}"
                );
            }
        }
    }

    /// (copies moved, optimum) of one join and of one leave from `n`
    /// nodes, rebalanced from the placement of `n` nodes.
    fn join_and_leave(n: usize, racks: u32, rf: usize) -> [(usize, f64); 2] {
        let base = Placement::compute(None, &entries(0..n, racks), rf);
        let joined = Placement::compute(Some(&base), &entries(0..n + 1, racks), rf);
        let mut fewer = entries(0..n, racks);
        fewer.remove(n / 2);
        let left = Placement::compute(Some(&base), &fewer, rf);
        for (what, p) in [("base", &base), ("joined", &joined), ("left", &left)] {
            assert_even(p, &format!("{what} n={n} racks={racks}"));
            assert_rows(p, &format!("{what} n={n} racks={racks}"));
        }
        let share = |nodes: usize| (rf * PARTITIONS) as f64 / nodes as f64;
        [
            (copies_moved(&base, &joined, rf), share(n + 1)),
            (copies_moved(&base, &left, rf), share(n)),
        ]
    }

    /// The same movement for the paper's map, recomputed from the members.
    fn paper_join(n: usize, racks: u32, rf: usize) -> usize {
        let config = PartitionMapConfig {
            replication_factor: rf,
            uniform_balance: true,
        };
        let a = PartitionMap::compute(&entries(0..n, racks), &config);
        let b = PartitionMap::compute(&entries(0..n + 1, racks), &config);
        PartitionId::all()
            .map(|p| {
                let before = a.replicas(p);
                b.replicas(p).iter().filter(|x| !before.contains(x)).count()
            })
            .sum()
    }

    #[test]
    fn hundred_nodes_move_at_most_a_quarter_above_the_optimum() {
        for racks in [1, 3] {
            for (moved, optimum) in join_and_leave(100, racks, 2) {
                assert!(
                    moved as f64 <= 1.25 * optimum,
                    "racks {racks}: {moved} moved, optimum {optimum}"
                );
            }
            // The paper's map, recomputed, moves many times that.
            let (_, optimum) = join_and_leave(100, racks, 2)[0];
            assert!(paper_join(100, racks, 2) as f64 > 5.0 * optimum);
        }
    }

    /// On demand (about a minute unoptimised):
    /// `cargo test -p citrine-cluster --release -- --ignored thousand`.
    /// `citrine-sim balance --table` measures the same figures.
    #[test]
    #[ignore = "slow in debug builds; run on demand"]
    fn thousand_nodes_move_at_most_twice_the_optimum() {
        for racks in [1, 3] {
            for (moved, optimum) in join_and_leave(1000, racks, 2) {
                assert!(
                    moved as f64 <= 2.0 * optimum,
                    "racks {racks}: {moved} moved, optimum {optimum}"
                );
            }
        }
    }

    #[test]
    fn small_clusters_and_three_copies_stay_even() {
        for &(n, racks, rf) in &[
            (2, 1, 2),
            (3, 1, 3),
            (5, 3, 2),
            (7, 3, 3),
            (9, 2, 3),
            (12, 4, 3),
        ] {
            let [(joined, j_opt), (left, l_opt)] = join_and_leave(n, racks, rf);
            // Small clusters with racks can be forced above the optimum by
            // the rack rule; never grossly.
            assert!(
                joined as f64 <= 1.5 * j_opt,
                "n={n} racks={racks}: {joined} / {j_opt}"
            );
            assert!(
                left as f64 <= 1.5 * l_opt,
                "n={n} racks={racks}: {left} / {l_opt}"
            );
        }
    }

    #[test]
    fn deterministic_and_order_independent() {
        let nodes = entries(0..37, 3);
        let base = Placement::compute(None, &nodes, 2);
        let mut reversed = entries(0..38, 3);
        reversed.reverse();
        let a = Placement::compute(Some(&base), &entries(0..38, 3), 2);
        let b = Placement::compute(Some(&base), &reversed, 2);
        assert_eq!(a, b);
        assert_eq!(a.fingerprint(), b.fingerprint());
        let mut duplicated = entries(0..38, 3);
        duplicated.extend(entries(0..5, 3));
        assert_eq!(a, Placement::compute(Some(&base), &duplicated, 2));
    }

    #[test]
    fn fresh_placement_is_the_papers_map() {
        for racks in [1, 3] {
            let nodes = entries(0..100, racks);
            let config = PartitionMapConfig {
                replication_factor: 2,
                uniform_balance: true,
            };
            let paper = PartitionMap::compute(&nodes, &config);
            let fresh = Placement::compute(None, &nodes, 2);
            assert_eq!(fresh.partition_map(2), Some(paper));
        }
    }

    #[test]
    fn a_shallower_namespace_reads_a_prefix_and_moves_little() {
        let base = Placement::compute(None, &entries(0..100, 1), 3);
        let joined = Placement::compute(Some(&base), &entries(0..101, 1), 3);
        let moved = copies_moved(&base, &joined, 2);
        assert!(moved as f64 <= 1.25 * 2.0 * 4096.0 / 101.0, "{moved}");
        let map = joined.partition_map(2).unwrap();
        assert_eq!(map.replication_factor(), 2);
        for partition in PartitionId::all() {
            let first: Vec<NodeId> = joined.replicas(partition).take(2).collect();
            assert_eq!(map.replicas(partition), &first[..]);
        }
        assert!(joined.partition_map(4).is_none());
    }

    #[test]
    fn growing_from_one_node_balances_masters_by_swaps() {
        let one = Placement::compute(None, &entries(0..1, 1), 2);
        assert_eq!(one.depth(), 1);
        let two = Placement::compute(Some(&one), &entries(0..2, 1), 2);
        assert_eq!(two.depth(), 2);
        assert_even(&two, "two");
        // The second node gets every replica, and half the masters are
        // handed over without moving a copy.
        assert_eq!(copies_moved(&one, &two, 2), PARTITIONS);
    }

    #[test]
    fn rack_changes_are_repaired() {
        // Everyone on rack 0, then the same nodes on three racks.
        let flat = Placement::compute(None, &entries(0..30, 1), 2);
        let racked = Placement::compute(Some(&flat), &entries(0..30, 3), 2);
        assert_rows(&racked, "racked");
        assert_even(&racked, "racked");
        // About a third of the partitions had both copies on one rack.
        let moved = copies_moved(&flat, &racked, 2);
        assert!(moved < PARTITIONS / 2, "{moved}");
    }

    #[test]
    fn fewer_racks_than_copies_spread_round_robin() {
        let base = Placement::compute(None, &entries(0..8, 2), 3);
        let next = Placement::compute(Some(&base), &entries(0..9, 2), 3);
        for placement in [&base, &next] {
            let rack_of: HashMap<NodeId, u32> = placement
                .members()
                .iter()
                .map(|m| (m.id, m.rack_id))
                .collect();
            for partition in PartitionId::all() {
                let racks: Vec<u32> = placement.replicas(partition).map(|n| rack_of[&n]).collect();
                assert_ne!(racks[0], racks[1], "{partition:?}");
            }
        }
    }

    #[test]
    fn from_parts_validates() {
        let p = Placement::compute(None, &entries(0..4, 1), 2);
        let rebuilt =
            Placement::from_parts(p.members().to_vec(), p.depth(), p.cells().to_vec()).unwrap();
        assert_eq!(rebuilt, p);
        let mut bad = p.cells().to_vec();
        bad[1] = bad[0];
        assert!(Placement::from_parts(p.members().to_vec(), 2, bad).is_none());
        let mut out_of_range = p.cells().to_vec();
        out_of_range[0] = 4;
        assert!(Placement::from_parts(p.members().to_vec(), 2, out_of_range).is_none());
        assert!(Placement::from_parts(p.members().to_vec(), 5, p.cells().to_vec()).is_none());
        let mut unsorted = p.members().to_vec();
        unsorted.swap(0, 1);
        assert!(Placement::from_parts(unsorted, 2, p.cells().to_vec()).is_none());
    }

    #[test]
    fn empty_and_single() {
        let none = Placement::compute(None, &[], 2);
        assert_eq!(none.depth(), 0);
        assert!(none.cells().is_empty());
        let one = Placement::compute(Some(&none), &entries(0..1, 1), 2);
        assert_eq!(one.depth(), 1);
        assert!(one.cells().iter().all(|&c| c == 0));
    }
}
