//! Secondary indexes in the transaction service: keeping every index of a
//! namespace true as records are stored and removed, building a new index
//! from the records already stored, the `sindex-*` info commands, and the
//! definitions file. The indexes themselves are `citrine_sindex`'s; queries
//! on them run in [`crate::scan`].
//!
//! Maintenance, as every namespace's record hook (`Sindexes`, a
//! [`citrine_data::hook::RecordHook`] installed when the service opens):
//! [`transaction::install`] (every write, replica write, migrated record
//! and read-touch) computes a record's keys for every index from the new
//! body before storing it and moves the record's entries from the old
//! version's keys to the new ones; every path that removes a record from
//! the primary index (delete, expiry, eviction, truncation, a replica
//! delete) calls the hook's `unindex` first, and a dropped partition
//! clears its trees (`clear_partition`). All of it runs under the record
//! partition's write lock, and costs one relaxed load when the namespace
//! has no index.
//!
//! Builds: a new index is registered first (so writes maintain it from then
//! on), then `build` walks every partition under its read lock and adds
//! the records already there; until it is done `sindex/NS/NAME` reports
//! its `load_pct` and a query on it answers 203. The server runs builds on
//! its own thread ([`Service::run_sindex_builds`], `citrine-sindex`); a
//! service without that thread (tests, the simulator) builds inline in the
//! create command.
//!
//! Definitions: the `sindex-create` / `sindex-delete` commands, the
//! cluster's sharing of definitions (an index created through any node
//! exists on all) and the definitions file (`sindex.smd` in the work
//! directory, restored and rebuilt at start,
//! [`Service::keep_sindex_definitions`]) are `smd`'s.
//!
//! Handle: the commands, builds and definitions work through [`Indexes`]
//! (the two layers, every namespace's registry, the builds and the
//! definitions), never the whole `Service`; only the builder thread's entry
//! ([`Service::run_sindex_builds`]) sees the service, as it also pushes the
//! UDF modules.
//!
//! [`transaction::install`]: crate::transaction::install

use crate::filter::RecordView;
use crate::namespace::Namespace;
use crate::transaction::is_live;
use crate::work::WorkQueue;
use crate::{Layers, Service};
use citrine_data::hook::{InstallUpkeep, RecordHook};
use citrine_index::{IndexEntry, RecordMeta};
use citrine_record::BodyView;
use citrine_sindex::{Key, Sindex};
use citrine_types::{Digest, PartitionId};
use citrine_wire::info::InfoCommand;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The definitions file's name in its directory.
pub const DEFINITIONS_FILE: &str = "sindex.smd";

/// Builds waiting for the builder thread, and the shared definitions.
#[derive(Default)]
pub(crate) struct Builds {
    pub(crate) queue: WorkQueue<(Arc<Namespace>, Arc<Sindex>)>,
    /// The definitions this node shares with the cluster.
    pub(crate) smd: smd::Smd,
}

/// The keys one version of a record contributes to each of `indexes`, in
/// the same order (an index on another set gets none).
fn keys_of(
    namespace: &Namespace,
    indexes: &[Arc<Sindex>],
    digest: &Digest,
    meta: RecordMeta,
    body: &[u8],
) -> Vec<Vec<Key>> {
    let mut all = vec![Vec::new(); indexes.len()];
    let Ok(view) = BodyView::parse(body) else {
        tracing::warn!(?digest, "a record body that does not parse is not indexed");
        return all;
    };
    let record = RecordView::stored(namespace, &digest.0, &view, meta, body.len() as u64);
    for (index, keys) in indexes.iter().zip(all.iter_mut()) {
        if in_index_set(namespace, index, meta.set_id) {
            index.keys(&record, meta.last_update_ms, keys);
        }
    }
    all
}

/// Whether a record of set `set_id` belongs in `index` (by its set).
fn in_index_set(namespace: &Namespace, index: &Sindex, set_id: u16) -> bool {
    index.def.set.is_none()
        || index.set_id(|name| namespace.sets.existing_id(name.as_bytes())) == Some(set_id)
}

/// The keys a stored record contributes to each of `indexes` (read from
/// storage; none when it cannot be read, which leaves stale entries that
/// queries then skip: they check every record they return).
fn keys_of_entry(
    namespace: &Namespace,
    indexes: &[Arc<Sindex>],
    digest: &Digest,
    entry: &IndexEntry,
) -> Vec<Vec<Key>> {
    match namespace.storage.read(&entry.location) {
        Ok(body) => keys_of(namespace, indexes, digest, entry.meta(), &body),
        Err(error) => {
            tracing::warn!(
                ?digest,
                "cannot read a record to update its index entries: {error}"
            );
            vec![Vec::new(); indexes.len()]
        }
    }
}

/// What a write must do to the indexes: the new version's keys, computed
/// before its body goes to storage, for the indexes that cover the
/// record's set (a snapshot: the registry is not held across the store).
struct PendingKeys {
    indexes: Vec<Arc<Sindex>>,
    keys: Vec<Vec<Key>>,
}

/// One namespace's secondary indexes, and their upkeep: the namespace's
/// record hook ([`citrine_data::hook::RecordHook`]), which the data layer
/// calls under the record partition's write lock on every install and
/// removal. Costs one relaxed load per change when the namespace has no
/// index.
#[derive(Default)]
pub(crate) struct Sindexes {
    pub(crate) registry: citrine_sindex::Registry,
}

impl Sindexes {
    /// One per namespace of `data`, each installed as its namespace's hook
    /// (in the namespaces' order).
    pub(crate) fn install(data: &citrine_data::Data) -> Result<Vec<Arc<Sindexes>>, String> {
        data.namespaces()
            .map(|namespace| {
                let sindexes = Arc::new(Sindexes::default());
                namespace.set_hook(sindexes.clone())?;
                Ok(sindexes)
            })
            .collect()
    }

    /// The indexes that records of set `set_id` belong in.
    fn covering(&self, namespace: &Namespace, set_id: u16) -> Vec<Arc<Sindex>> {
        self.registry
            .read()
            .iter()
            .filter(|index| in_index_set(namespace, index, set_id))
            .cloned()
            .collect()
    }
}

impl RecordHook for Sindexes {
    /// Before a record's new body is stored: its keys for every index that
    /// covers its set. `None` when no index does.
    fn before_install(
        &self,
        namespace: &Namespace,
        digest: &Digest,
        meta: RecordMeta,
        body: &[u8],
    ) -> Option<InstallUpkeep> {
        if self.registry.is_empty() {
            return None;
        }
        let indexes = self.covering(namespace, meta.set_id);
        if indexes.is_empty() {
            return None;
        }
        let keys = keys_of(namespace, &indexes, digest, meta, body);
        Some(Box::new(PendingKeys { indexes, keys }))
    }

    /// After the index points at the new body: moves the record's entries
    /// from the replaced version's keys (`previous`, whose storage is not
    /// released yet) to the new ones.
    fn after_install(
        &self,
        namespace: &Namespace,
        upkeep: InstallUpkeep,
        digest: &Digest,
        previous: Option<&IndexEntry>,
    ) {
        let Ok(pending) = upkeep.downcast::<PendingKeys>() else {
            tracing::error!(
                ?digest,
                "secondary-index upkeep of another kind: entries not moved"
            );
            return;
        };
        let old = match previous {
            Some(entry) => keys_of_entry(namespace, &pending.indexes, digest, entry),
            None => vec![Vec::new(); pending.indexes.len()],
        };
        for ((index, old), new) in pending.indexes.iter().zip(&old).zip(&pending.keys) {
            index.update(digest, old, new);
        }
    }

    /// A record leaves the primary index: its entries leave every index.
    fn unindex(&self, namespace: &Namespace, digest: &Digest, entry: &IndexEntry) {
        if self.registry.is_empty() {
            return;
        }
        let indexes = self.covering(namespace, entry.meta().set_id);
        if indexes.is_empty() {
            return;
        }
        let old = keys_of_entry(namespace, &indexes, digest, entry);
        for (index, old) in indexes.iter().zip(&old) {
            index.update(digest, old, &[]);
        }
    }

    /// The node dropped a partition: every index forgets it.
    fn clear_partition(&self, _namespace: &Namespace, partition: PartitionId) {
        if self.registry.is_empty() {
            return;
        }
        for index in self.registry.read().iter() {
            index.clear_partition(partition);
        }
    }
}

/// Builds a new index from the records already stored: each partition under
/// its read lock (writers to it wait; they maintain the index themselves
/// afterwards), calling `between` after each. Stops early if the index is
/// deleted.
pub(crate) fn build(
    data: &citrine_data::Data,
    namespace: &Namespace,
    index: &Sindex,
    between: &mut dyn FnMut(),
) {
    let now = || data.now();
    let started = now().unix_ms;
    let mut keys = Vec::new();
    let mut added = 0u64;
    for partition_id in PartitionId::all() {
        if index.is_dropped() {
            return;
        }
        let when = now();
        let partition = namespace.index.partition(partition_id).read();
        for (digest, entry) in partition.iter() {
            let meta = entry.meta();
            if !is_live(namespace, &meta, when) || !in_index_set(namespace, index, meta.set_id) {
                continue;
            }
            let body = match namespace.storage.read(&entry.location) {
                Ok(body) => body,
                Err(error) => {
                    tracing::warn!(?digest, index = %index.def.name, "a record the build cannot read is not indexed: {error}");
                    continue;
                }
            };
            let Ok(view) = BodyView::parse(&body) else {
                continue;
            };
            let record = RecordView::stored(namespace, &digest.0, &view, meta, body.len() as u64);
            index.keys(&record, meta.last_update_ms, &mut keys);
            added += keys.len() as u64;
            index.update(&digest, &[], &keys);
        }
        drop(partition);
        index.partition_built();
        between();
    }
    let elapsed = now().unix_ms.saturating_sub(started);
    index.build_finished(elapsed);
    tracing::info!(namespace = %namespace.config.name, index = %index.def.name, entries = added, elapsed_ms = elapsed, "secondary index built");
}

/// What the index feature works with, and all it works with: the two
/// layers, each namespace's indexes (in the namespaces' order) and the
/// builds and definitions. Dispatch hands it out ([`Service::indexes`]).
#[derive(Clone, Copy)]
pub(crate) struct Indexes<'s> {
    pub(crate) layers: Layers<'s>,
    sindexes: &'s [Arc<Sindexes>],
    builds: &'s Builds,
}

impl<'s> Indexes<'s> {
    pub(crate) fn new(
        layers: Layers<'s>,
        sindexes: &'s [Arc<Sindexes>],
        builds: &'s Builds,
    ) -> Self {
        assert_eq!(
            sindexes.len(),
            layers.data.namespaces_shared().len(),
            "one index registry per namespace"
        );
        Indexes {
            layers,
            sindexes,
            builds,
        }
    }

    /// The secondary indexes of `namespace` (one of this node's).
    pub(crate) fn of(&self, namespace: &Namespace) -> &'s citrine_sindex::Registry {
        let index = self
            .layers
            .data
            .namespaces_shared()
            .iter()
            .position(|held| std::ptr::eq(held.as_ref(), namespace))
            .unwrap_or_else(|| panic!("namespace {} is not this node's", namespace.config.name));
        &self.sindexes[index].registry
    }

    /// Builds every queued index now, on this thread (for a service no
    /// builder thread serves, and for tests). Pushes nothing: a caller may
    /// hold the definitions' lock.
    pub(crate) fn run_pending_builds(&self) {
        while let Some((namespace, index)) = self.builds.queue.pop() {
            build(self.layers.data, &namespace, &index, &mut || {});
        }
    }

    /// Queues a new index's build for the builder thread, or builds it now
    /// when no thread serves the queue.
    pub(crate) fn queue_build(&self, namespace: Arc<Namespace>, index: Arc<Sindex>) {
        if !self.builds.queue.push((namespace, index)) {
            self.run_pending_builds();
        }
    }
}

impl Service {
    /// Runs the builds of new indexes, and the pushes of the definitions to
    /// the other members (`smd`), until `stopping` is set (the server's
    /// `citrine-sindex` thread). While it runs, create commands queue their
    /// builds here instead of building inline.
    pub fn run_sindex_builds(&self, stopping: &AtomicBool) {
        // The cluster's definitions (see `smd`) go out between builds and
        // between a long build's partitions.
        self.sindex_builds.queue.serve(
            stopping,
            |(namespace, index)| {
                build(&self.data, &namespace, &index, &mut || {
                    self.indexes().push_definitions();
                    self.udf_modules().push();
                    self.push_security();
                })
            },
            || {
                self.indexes().push_definitions();
                self.udf_modules().push();
                self.push_security();
            },
        );
    }

    /// Builds every queued index now, on this thread (see
    /// [`Indexes::run_pending_builds`]).
    pub fn run_pending_sindex_builds(&self) {
        self.indexes().run_pending_builds();
    }
}

/// The namespace an index command names, checked as the reference checks
/// it (missing, empty or too long → 20), and looked up: `Ok(None)` when
/// this node does not have it.
pub(crate) fn namespace_param<'s>(
    layers: &Layers<'s>,
    command: &InfoCommand<'_>,
) -> Result<Option<&'s Namespace>, String> {
    let name = crate::info::namespace_name(command)?;
    Ok(layers.namespace(name.as_bytes()))
}

/// As [`namespace_param`], where a namespace this node does not have is an
/// error too (`ERROR:20`, the reference's text).
fn known_namespace<'s>(
    layers: &Layers<'s>,
    command: &InfoCommand<'_>,
) -> Result<&'s Namespace, String> {
    namespace_param(layers, command)?.ok_or_else(|| NAMESPACE_NOT_FOUND.to_owned())
}

/// The reference's answer to an index command on a namespace the node does
/// not have.
const NAMESPACE_NOT_FOUND: &str = "ERROR:20:namespace not found on node";

/// The `indexname` an index command must give (missing or empty → 4).
pub(crate) fn index_name<'a>(command: &InfoCommand<'a>) -> Result<&'a str, String> {
    command
        .required("indexname")
        .map_err(|message| format!("ERROR:4:{message}"))
}

/// `sindex-exists:...`: `true` / `false`.
pub(crate) fn exists(indexes: &Indexes<'_>, command: &InfoCommand<'_>) -> String {
    let found = known_namespace(&indexes.layers, command).and_then(|namespace| {
        let name = index_name(command)?;
        Ok(indexes.of(namespace).get(name).is_some())
    });
    match found {
        Ok(found) => found.to_string(),
        Err(answer) => answer,
    }
}

/// `sindex`, `sindex/NS`, `sindex-list[:ns=NS]`: one entry per index; a
/// namespace the node does not have answers as the reference does
/// (`unknown`, the positional form's or the parameter form's answer).
/// Entries are separated by `;` (none after the last), contexts written
/// out unless `b64` (`sindex-list:...;b64=true`) asks for their bytes.
pub(crate) fn list(
    indexes: &Indexes<'_>,
    namespace: Option<&str>,
    unknown: &str,
    b64: bool,
) -> String {
    let layers = &indexes.layers;
    if namespace.is_some_and(|name| layers.namespace(name.as_bytes()).is_none()) {
        return unknown.to_owned();
    }
    let mut entries = Vec::new();
    for candidate in layers.data.namespaces() {
        if namespace.is_some_and(|name| name != candidate.config.name) {
            continue;
        }
        for index in indexes.of(candidate).read().iter() {
            let mut entry = index.def.listing(b64);
            // A set index lists no state (the reference's).
            if !index.def.is_set_index() {
                entry.push_str(if index.is_loaded() {
                    ":state=RW"
                } else {
                    ":state=WO"
                });
            }
            entries.push(entry);
        }
    }
    entries.join(";")
}

/// `sindex-stat:namespace=NS;indexname=NAME`: the parameters checked as
/// the reference checks them, then [`stat`].
pub(crate) fn stat_command(indexes: &Indexes<'_>, command: &InfoCommand<'_>) -> String {
    let namespace = match known_namespace(&indexes.layers, command) {
        Ok(namespace) => namespace,
        Err(answer) => return answer,
    };
    match index_name(command) {
        Ok(name) => stat(indexes, &namespace.config.name, name),
        Err(answer) => answer,
    }
}

/// `sindex/NS/NAME` and `sindex-stat:namespace=NS;indexname=NAME`: the
/// index's statistics (`load_pct` is what clients wait on).
pub(crate) fn stat(indexes: &Indexes<'_>, namespace: &str, name: &str) -> String {
    let Some(index) = indexes
        .layers
        .namespace(namespace.as_bytes())
        .and_then(|namespace| indexes.of(namespace).get(name))
    else {
        return "ERROR:201:no index".to_owned();
    };
    let queries = index.stats().queries.load(Ordering::Relaxed);
    let records = index.stats().query_records.load(Ordering::Relaxed);
    format!(
        "entries={};used_bytes={};load_pct={};load_time={};query_basic_complete={};query_basic_records={};query_basic_avg_rec_count={};",
        index.entries(),
        index.used_bytes(),
        index.load_pct(),
        index.load_time_ms(),
        queries,
        records,
        records.checked_div(queries).unwrap_or(0),
    )
}

/// How many indexes are defined on set `set` of `namespace`.
pub(crate) fn count_on_set(indexes: &Indexes<'_>, namespace: &Namespace, set: &[u8]) -> usize {
    indexes
        .of(namespace)
        .read()
        .iter()
        .filter(|index| index.def.set.as_deref().map(str::as_bytes) == Some(set))
        .count()
}

#[cfg(test)]
pub(crate) mod tests;

pub(crate) mod smd;
