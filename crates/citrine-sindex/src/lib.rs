//! Secondary indexes (001 §3.3's "secondary indexes on bins"): per
//! namespace, up to [`MAX_INDEXES`] indexes, each mapping the values of a
//! bin (or of an expression, or of the elements of a list or map bin,
//! under an optional CDT context) to the records that hold them.
//!
//! Layout: [`def`] (definitions and their text forms), [`key`] (the values
//! a record contributes, and their bval), [`filter`] (a query's
//! INDEX_RANGE); this file holds one index ([`Sindex`]: a tree per
//! partition) and a namespace's set of them ([`Registry`]).
//!
//! An index is partitioned like the primary index: one ordered tree of
//! `(bval, digest)` per partition, so a partition query walks one tree in
//! order and resumes after the `(bval, digest)` the client sends back, and
//! a migration that drops a partition clears one tree.
//!
//! This crate is pure: no I/O, no threads. The transaction service keeps
//! the trees true — it calls [`Sindex::update`] under the record's
//! partition write lock whenever a record is stored or removed — and
//! queries read them under the same partition's read lock.
//!
//! Invariants: a tree is only changed by a caller holding the write lock
//! of the record partition it belongs to, and read by one holding that
//! partition's lock; so a tree and its partition's records agree whenever
//! the partition lock is free, and a query that holds it sees each
//! matching record exactly at the keys it has. `entries` counts the
//! entries of every tree.

#![deny(unsafe_code)]

pub mod def;
pub mod filter;
pub use citrine_geo as geo;
pub mod key;

pub use def::{CollectionType, DefError, KeyType, SindexDef, Source};
pub use filter::{Filter, FilterError, Range};
pub use key::Key;

use citrine_exp::{Expression, Record};
use citrine_types::{Digest, PartitionId, DIGEST_SIZE, PARTITIONS};
use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Most indexes a namespace may have (the reference's limit).
pub const MAX_INDEXES: usize = 256;

/// Bytes one tree entry costs, about: the key (8 + 20) and its share of a
/// B-tree node.
const ENTRY_BYTES: u64 = 40;

/// A set id not yet resolved.
const SET_UNKNOWN: u32 = u32::MAX;

const DIGEST_MIN: Digest = Digest([0; DIGEST_SIZE]);
const DIGEST_MAX: Digest = Digest([0xff; DIGEST_SIZE]);

/// One partition's entries, in `(bval, digest)` order.
type Tree = BTreeSet<(i64, Digest)>;

/// Shards of an index's summary (by partition: writes to different
/// partitions rarely meet on one shard's lock).
const SUMMARY_SHARDS: usize = 16;

/// Which partitions hold entries of which bvals: `(bval, partition)` →
/// entries, so a selective query visits only the partitions that can
/// answer instead of all 4096 trees.
type Summary = BTreeMap<(i64, u16), u32>;

/// Query counters of one index.
#[derive(Debug, Default)]
pub struct SindexStats {
    /// Queries that used the index.
    pub queries: AtomicU64,
    /// Records those queries returned.
    pub query_records: AtomicU64,
}

/// One secondary index: its definition and its entries (shared with the
/// index it was renamed from, if it was).
pub struct Sindex {
    pub def: SindexDef,
    state: Arc<State>,
}

/// An index's entries and progress, which a rename keeps.
struct State {
    /// The parsed expression of an expression index.
    expression: Option<Expression>,
    trees: Box<[RwLock<Tree>]>,
    /// The trees' `(bval, partition)` pairs, sharded by partition; each
    /// shard changes only under the write lock of one of its partitions'
    /// trees (taken first).
    summary: Box<[Mutex<Summary>]>,
    entries: AtomicU64,
    /// Partitions the initial build has filled.
    built: AtomicU32,
    /// The initial build is over.
    loaded: AtomicBool,
    /// How long the initial build took, milliseconds.
    load_time_ms: AtomicU64,
    /// Deleted: a build in progress stops.
    dropped: AtomicBool,
    /// The id of the definition's set, once the namespace has it.
    set_id: AtomicU32,
    stats: SindexStats,
}

impl std::fmt::Debug for Sindex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sindex")
            .field("def", &self.def)
            .field("entries", &self.entries())
            .field("load_pct", &self.load_pct())
            .finish_non_exhaustive()
    }
}

impl Sindex {
    /// A new, empty index (not yet built).
    pub fn new(def: SindexDef) -> Result<Sindex, DefError> {
        let expression = match &def.source {
            Source::Bin(_) | Source::Set => None,
            Source::Expression(bytes) => {
                Some(Expression::parse_value(bytes).map_err(|error| DefError {
                    code: error.result_code().code() as u16,
                    message: "bad expression".to_owned(),
                })?)
            }
        };
        Ok(Sindex {
            def,
            state: Arc::new(State {
                expression,
                trees: (0..PARTITIONS).map(|_| RwLock::new(Tree::new())).collect(),
                summary: (0..SUMMARY_SHARDS)
                    .map(|_| Mutex::new(Summary::new()))
                    .collect(),
                entries: AtomicU64::new(0),
                built: AtomicU32::new(0),
                loaded: AtomicBool::new(false),
                load_time_ms: AtomicU64::new(0),
                dropped: AtomicBool::new(false),
                set_id: AtomicU32::new(SET_UNKNOWN),
                stats: SindexStats::default(),
            }),
        })
    }

    /// Query counters.
    pub fn stats(&self) -> &SindexStats {
        &self.state.stats
    }

    /// The keys `record` contributes (sorted, unique) into `out`.
    pub fn keys(&self, record: &dyn Record, now_ms: u64, out: &mut Vec<Key>) {
        key::extract(
            &self.def,
            self.state.expression.as_ref(),
            record,
            now_ms,
            out,
        );
    }

    /// Moves a record's entries from its `old` keys to its `new` ones (both
    /// sorted and unique, as [`Sindex::keys`] gives them). The caller holds
    /// the write lock of the record's partition.
    pub fn update(&self, digest: &Digest, old: &[Key], new: &[Key]) {
        // Unchanged keys (a write to other bins): no lock to take.
        if old == new {
            return;
        }
        let partition = digest.partition().index();
        let mut tree = self.state.trees[partition].write();
        let mut summary = self.state.summary[partition % SUMMARY_SHARDS].lock();
        let (mut added, mut removed) = (0u64, 0u64);
        for key in old {
            if new.binary_search(key).is_err() && tree.remove(&(key.bval(), *digest)) {
                removed += 1;
                let pair = (key.bval(), partition as u16);
                if let Some(count) = summary.get_mut(&pair) {
                    *count -= 1;
                    if *count == 0 {
                        summary.remove(&pair);
                    }
                }
            }
        }
        for key in new {
            if tree.insert((key.bval(), *digest)) {
                added += 1;
                *summary.entry((key.bval(), partition as u16)).or_insert(0) += 1;
            }
        }
        drop(summary);
        drop(tree);
        self.state.entries.fetch_add(added, Ordering::Relaxed);
        self.state.entries.fetch_sub(removed, Ordering::Relaxed);
    }

    /// Forgets every entry of one partition (the node dropped it).
    pub fn clear_partition(&self, partition: PartitionId) {
        let mut tree = self.state.trees[partition.index()].write();
        let count = tree.len() as u64;
        let mut summary = self.state.summary[partition.index() % SUMMARY_SHARDS].lock();
        let id = partition.index() as u16;
        // The tree's bvals, each once (they come in order): the partition's
        // pairs, without walking the rest of the shard.
        let mut previous = None;
        for &(bval, _) in tree.iter() {
            if previous != Some(bval) {
                summary.remove(&(bval, id));
                previous = Some(bval);
            }
        }
        drop(summary);
        tree.clear();
        drop(tree);
        self.state.entries.fetch_sub(count, Ordering::Relaxed);
    }

    /// The partitions holding entries within `ranges` (sorted, disjoint),
    /// as a map of the 4096; `None` when more than `max_pairs` `(bval,
    /// partition)` pairs are in range (a wide query: visiting every
    /// partition costs less than listing them).
    pub fn partitions_in(&self, ranges: &[(i64, i64)], max_pairs: usize) -> Option<Vec<bool>> {
        let mut holders = vec![false; PARTITIONS];
        let mut seen = 0usize;
        for shard in self.state.summary.iter() {
            let shard = shard.lock();
            for &(low, high) in ranges {
                if low > high {
                    continue;
                }
                for &(_, partition) in shard
                    .range((low, 0)..=(high, u16::MAX))
                    .map(|(pair, _)| pair)
                {
                    seen += 1;
                    if seen > max_pairs {
                        return None;
                    }
                    holders[usize::from(partition)] = true;
                }
            }
        }
        Some(holders)
    }

    /// Appends to `out` the entries of `partition` whose bval is within
    /// one of `ranges` (sorted, disjoint, ends included), in order,
    /// strictly after `after` when the query resumes there, at most `limit`
    /// of them. The caller holds the partition's lock.
    pub fn candidates(
        &self,
        partition: PartitionId,
        ranges: &[(i64, i64)],
        after: Option<(i64, Digest)>,
        limit: usize,
        out: &mut Vec<(i64, Digest)>,
    ) {
        debug_assert!(ranges.windows(2).all(|pair| pair[0].1 < pair[1].0));
        let tree = self.state.trees[partition.index()].read();
        for &(low, high) in ranges {
            if out.len() >= limit {
                return;
            }
            if low > high {
                continue;
            }
            let start = match after {
                Some(resume) if resume >= (low, DIGEST_MIN) => Bound::Excluded(resume),
                _ => Bound::Included((low, DIGEST_MIN)),
            };
            let end = (high, DIGEST_MAX);
            if let Bound::Excluded(resume) = start {
                if resume >= end {
                    continue;
                }
            }
            let room = limit - out.len();
            out.extend(
                tree.range((start, Bound::Included(end)))
                    .take(room)
                    .copied(),
            );
        }
    }

    /// For a geo query, whether the record holds a shape it selects (a
    /// point inside the queried region, a region holding the queried
    /// point), read from the index's source (bin or expression) under its
    /// context and collection type; true for every other query, whose
    /// keys say it all.
    pub fn geo_selects(
        &self,
        filter: &Filter,
        record: &dyn citrine_exp::Record,
        now_ms: u64,
    ) -> bool {
        let filter::Range::Geo { shape, .. } = &filter.range else {
            return true;
        };
        let Some((particle_type, bytes)) =
            key::source_value(&self.def, self.state.expression.as_ref(), record, now_ms)
        else {
            return false;
        };
        key::shapes(&self.def, particle_type, &bytes)
            .iter()
            .any(|stored| geo::selects(shape, stored))
    }

    /// Entries in all partitions.
    pub fn entries(&self) -> u64 {
        self.state.entries.load(Ordering::Relaxed)
    }

    /// Memory the entries take, about.
    pub fn used_bytes(&self) -> u64 {
        self.entries() * ENTRY_BYTES
    }

    /// Records a partition of the initial build as done.
    pub fn partition_built(&self) {
        self.state.built.fetch_add(1, Ordering::Relaxed);
    }

    /// Records the end of the initial build.
    pub fn build_finished(&self, elapsed_ms: u64) {
        self.state.load_time_ms.store(elapsed_ms, Ordering::Relaxed);
        self.state.loaded.store(true, Ordering::Release);
    }

    /// Whether the initial build is over.
    pub fn is_loaded(&self) -> bool {
        self.state.loaded.load(Ordering::Acquire)
    }

    /// How far the initial build is, 0 to 100 (100 only once it is over).
    pub fn load_pct(&self) -> u32 {
        if self.is_loaded() {
            return 100;
        }
        let built = self.state.built.load(Ordering::Relaxed) as usize;
        (built * 100 / PARTITIONS).min(99) as u32
    }

    /// How long the initial build took, milliseconds (0 until it is over).
    pub fn load_time_ms(&self) -> u64 {
        self.state.load_time_ms.load(Ordering::Relaxed)
    }

    /// Whether the index was deleted.
    pub fn is_dropped(&self) -> bool {
        self.state.dropped.load(Ordering::Relaxed)
    }

    /// The id of the definition's set when known (`resolve` looks it up
    /// otherwise; `None` while the namespace has no such set).
    pub fn set_id(&self, resolve: impl FnOnce(&str) -> Option<u16>) -> Option<u16> {
        let cached = self.state.set_id.load(Ordering::Relaxed);
        if cached != SET_UNKNOWN {
            return Some(cached as u16);
        }
        let id = resolve(self.def.set.as_deref()?)?;
        self.state.set_id.store(u32::from(id), Ordering::Relaxed);
        Some(id)
    }
}

/// How a query names the index it wants.
#[derive(Clone, Copy, Debug)]
pub struct Lookup<'a> {
    /// INDEX_NAME (field 21), when sent.
    pub name: Option<&'a str>,
    /// INDEX_EXPRESSION (field 24), when sent.
    pub expression: Option<&'a [u8]>,
    /// The filter's bin (empty with a name or an expression).
    pub bin: &'a [u8],
    pub key_type: KeyType,
    pub collection: CollectionType,
    /// INDEX_CONTEXT (field 23), when sent.
    pub context: Option<&'a [u8]>,
}

fn same_context(a: Option<&[u8]>, b: Option<&[u8]>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) if a == b => true,
        (Some(a), Some(b)) => {
            match (citrine_cdt::value::decode(a), citrine_cdt::value::decode(b)) {
                (Ok(a), Ok(b)) => citrine_cdt::value::compare(&a, &b) == std::cmp::Ordering::Equal,
                _ => false,
            }
        }
        _ => false,
    }
}

/// What [`Registry::create`] did.
#[derive(Debug)]
pub enum Created {
    /// A new index, to be built.
    New(Arc<Sindex>),
    /// An index of that name and definition already exists.
    Exists,
    /// The index with that definition (its old name here) now has the new
    /// name, its entries and progress kept, as the reference renames.
    Renamed(String),
}

/// What creating an index in a registry comes to (see [`decide`]).
enum Decision {
    Exists,
    /// The index at this position has the definition under another name.
    Rename(usize),
    New,
}

/// How `list` takes `def`: an index of that name and definition exists; an
/// index with that definition under another name is renamed; or a new one
/// (refused: a name taken by another definition, 200; a full list, 206).
fn decide(list: &[Arc<Sindex>], def: &SindexDef) -> Result<Decision, DefError> {
    if let Some(existing) = list.iter().find(|index| index.def.name == def.name) {
        if existing.def == *def {
            return Ok(Decision::Exists);
        }
        return Err(DefError {
            code: 200,
            message: "'indexname' already exists with different definition".to_owned(),
        });
    }
    if let Some(at) = list.iter().position(|index| index.def.same_target(def)) {
        return Ok(Decision::Rename(at));
    }
    if list.len() >= MAX_INDEXES {
        return Err(DefError {
            code: 206,
            message: format!("a namespace has at most {MAX_INDEXES} indexes"),
        });
    }
    Ok(Decision::New)
}

/// A namespace's indexes.
#[derive(Debug, Default)]
pub struct Registry {
    list: RwLock<Vec<Arc<Sindex>>>,
    /// `list.len()`, readable without the lock.
    count: AtomicUsize,
}

impl Registry {
    /// Whether the namespace has no index (one relaxed load: the write
    /// path's whole cost when there is none). Read under a partition lock,
    /// it is exact for that partition's records: see [`Registry::create`].
    pub fn is_empty(&self) -> bool {
        self.count.load(Ordering::Relaxed) == 0
    }

    /// How many indexes the namespace has.
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// The indexes, read-locked (writers of records hold this across their
    /// tree updates; creating and deleting an index wait for them).
    pub fn read(&self) -> RwLockReadGuard<'_, Vec<Arc<Sindex>>> {
        self.list.read()
    }

    /// Adds an index. The index is maintained by every record write from
    /// here on; the caller then builds it from the records already stored
    /// (partition by partition, each under its lock), so no record is
    /// missed: a write either precedes the build's visit of its partition
    /// (the build sees the record) or follows the registration (the write
    /// updates the index).
    pub fn create(&self, def: SindexDef) -> Result<Created, DefError> {
        let mut list = self.list.write();
        match decide(&list, &def)? {
            Decision::Exists => Ok(Created::Exists),
            Decision::Rename(at) => {
                let slot = &mut list[at];
                let old = slot.def.name.clone();
                *slot = Arc::new(Sindex {
                    def,
                    state: Arc::clone(&slot.state),
                });
                Ok(Created::Renamed(old))
            }
            Decision::New => {
                let index = Arc::new(Sindex::new(def)?);
                list.push(Arc::clone(&index));
                self.count.store(list.len(), Ordering::Relaxed);
                Ok(Created::New(index))
            }
        }
    }

    /// What [`Registry::create`] would do with `def` now, without doing
    /// it: `Exists`, `Renamed(old name)`, or `New` (with an index that is
    /// not registered), or the refusal it would answer.
    pub fn plan(&self, def: &SindexDef) -> Result<Created, DefError> {
        let list = self.list.read();
        Ok(match decide(&list, def)? {
            Decision::Exists => Created::Exists,
            Decision::Rename(at) => Created::Renamed(list[at].def.name.clone()),
            Decision::New => Created::New(Arc::new(Sindex::new(def.clone())?)),
        })
    }

    /// Removes an index by name; `None` when there is none.
    pub fn delete(&self, name: &str) -> Option<Arc<Sindex>> {
        let mut list = self.list.write();
        let position = list.iter().position(|index| index.def.name == name)?;
        let index = list.remove(position);
        self.count.store(list.len(), Ordering::Relaxed);
        index.state.dropped.store(true, Ordering::Relaxed);
        Some(index)
    }

    /// The index of that name.
    pub fn get(&self, name: &str) -> Option<Arc<Sindex>> {
        self.list
            .read()
            .iter()
            .find(|index| index.def.name == name)
            .cloned()
    }

    /// The set index of `set`, once it is built: what a scan of the set
    /// reads instead of every record of the namespace.
    pub fn set_index(&self, set: &str) -> Option<Arc<Sindex>> {
        self.list
            .read()
            .iter()
            .find(|index| {
                index.def.is_set_index()
                    && index.def.set.as_deref() == Some(set)
                    && index.is_loaded()
            })
            .cloned()
    }

    /// The index a query on `set` (`None`: the whole namespace) uses: the
    /// one it names, or the one defined on the filter's source, key type,
    /// collection type and context — on the query's set if there is one,
    /// else on the whole namespace (whose other sets' records the query
    /// then skips).
    pub fn for_query(&self, set: Option<&str>, lookup: &Lookup<'_>) -> Option<Arc<Sindex>> {
        let list = self.list.read();
        if let Some(name) = lookup.name {
            return list.iter().find(|index| index.def.name == name).cloned();
        }
        let fits = |index: &&Arc<Sindex>| {
            let def = &index.def;
            let source = match (&def.source, lookup.expression) {
                (Source::Expression(bytes), Some(expression)) => bytes.as_slice() == expression,
                (Source::Bin(bin), None) => bin.as_bytes() == lookup.bin,
                // A set index answers no filter, only scans of its set.
                _ => false,
            };
            source
                && def.key_type == lookup.key_type
                && def.collection == lookup.collection
                && same_context(def.context.as_deref(), lookup.context)
        };
        let on_set = set.and_then(|set| {
            list.iter()
                .filter(fits)
                .find(|index| index.def.set.as_deref() == Some(set))
        });
        on_set
            .or_else(|| {
                list.iter()
                    .filter(fits)
                    .find(|index| index.def.set.is_none())
            })
            .cloned()
    }
}

#[cfg(test)]
mod tests;
