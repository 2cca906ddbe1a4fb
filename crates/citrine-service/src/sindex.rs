//! Secondary indexes in the transaction service: keeping every index of a
//! namespace true as records are stored and removed, building a new index
//! from the records already stored, the `sindex-*` info commands, and the
//! definitions file. The indexes themselves are `citrine_sindex`'s; queries
//! on them run in [`crate::scan`].
//!
//! Maintenance: [`transaction::install`] (every write, replica write,
//! migrated record and read-touch) computes a record's keys for every index
//! from the new body before storing it and moves the record's entries from
//! the old version's keys to the new ones; every path that removes a record
//! from the primary index (delete, expiry, eviction, truncation, a replica
//! delete) calls [`unindex`] first, and a dropped partition clears its
//! trees ([`clear_partition`]). All of it runs under the record
//! partition's write lock, and costs one relaxed load when the namespace
//! has no index.
//!
//! Builds: a new index is registered first (so writes maintain it from then
//! on), then [`build`] walks every partition under its read lock and adds
//! the records already there. The server runs builds on its own thread
//! ([`Service::run_sindex_builds`]); a service without that thread (tests,
//! the simulator) builds inline in the create command.
//!
//! Definitions file: with a directory set ([`Service::keep_sindex_definitions`])
//! every namespace's definitions are kept in `sindex.smd` there, one
//! `sindex-create` parameter line each, rewritten whole (to a temporary
//! file, then renamed) on every change; at start the indexes it names are
//! created again and built.
//!
//! Not yet: a cluster does not share definitions — a `sindex-create` sent
//! to one node creates the index on that node only.
//!
//! [`transaction::install`]: crate::transaction::install

use crate::filter::RecordView;
use crate::namespace::Namespace;
use crate::transaction::{is_live, Now};
use crate::Service;
use citrine_index::{IndexEntry, RecordMeta};
use citrine_record::BodyView;
use citrine_sindex::{Created, Key, Sindex, SindexDef};
use citrine_types::{Digest, PartitionId};
use citrine_wire::info::InfoCommand;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// The definitions file's name in its directory.
pub const DEFINITIONS_FILE: &str = "sindex.smd";

/// Builds waiting for the builder thread, and where definitions are kept.
#[derive(Default)]
pub(crate) struct Builds {
    queue: Mutex<VecDeque<(Arc<Namespace>, Arc<Sindex>)>>,
    wake: Condvar,
    /// A builder thread runs (else builds run inline).
    attached: AtomicBool,
    /// The definitions file, once the server names its directory.
    file: OnceLock<PathBuf>,
    /// Serializes rewrites of the file.
    file_lock: Mutex<()>,
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
/// before its body goes to storage. `None` when the namespace has no index.
pub(crate) struct PendingKeys<'n> {
    indexes: parking_lot::RwLockReadGuard<'n, Vec<Arc<Sindex>>>,
    keys: Vec<Vec<Key>>,
}

/// Before a record's new body is stored: its keys for every index. The
/// caller holds the record partition's write lock.
pub(crate) fn before_install<'n>(
    namespace: &'n Namespace,
    digest: &Digest,
    meta: RecordMeta,
    body: &[u8],
) -> Option<PendingKeys<'n>> {
    if namespace.sindexes.is_empty() {
        return None;
    }
    let indexes = namespace.sindexes.read();
    let keys = keys_of(namespace, &indexes, digest, meta, body);
    Some(PendingKeys { indexes, keys })
}

/// After the index points at the new body: moves the record's entries from
/// the replaced version's keys (`previous`, whose storage is not released
/// yet) to the new ones. Same lock as [`before_install`].
pub(crate) fn after_install(
    namespace: &Namespace,
    pending: PendingKeys<'_>,
    digest: &Digest,
    previous: Option<&IndexEntry>,
) {
    let old = match previous {
        Some(entry) => keys_of_entry(namespace, &pending.indexes, digest, entry),
        None => vec![Vec::new(); pending.indexes.len()],
    };
    for ((index, old), new) in pending.indexes.iter().zip(&old).zip(&pending.keys) {
        index.update(digest, old, new);
    }
}

/// A record leaves the primary index: its entries leave every index. The
/// caller holds the partition's write lock, and `entry`'s storage is not
/// released yet.
pub(crate) fn unindex(namespace: &Namespace, digest: &Digest, entry: &IndexEntry) {
    if namespace.sindexes.is_empty() {
        return;
    }
    let indexes = namespace.sindexes.read();
    let old = keys_of_entry(namespace, &indexes, digest, entry);
    for (index, old) in indexes.iter().zip(&old) {
        index.update(digest, old, &[]);
    }
}

/// The node dropped a partition: every index forgets it. The caller holds
/// the partition's write lock.
pub(crate) fn clear_partition(namespace: &Namespace, partition: PartitionId) {
    if namespace.sindexes.is_empty() {
        return;
    }
    for index in namespace.sindexes.read().iter() {
        index.clear_partition(partition);
    }
}

/// Builds a new index from the records already stored: each partition under
/// its read lock (writers to it wait; they maintain the index themselves
/// afterwards). Stops early if the index is deleted.
pub(crate) fn build(namespace: &Namespace, index: &Sindex, now: impl Fn() -> Now) {
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
            index.update(digest, &[], &keys);
        }
        drop(partition);
        index.partition_built();
    }
    let elapsed = now().unix_ms.saturating_sub(started);
    index.build_finished(elapsed);
    tracing::info!(namespace = %namespace.config.name, index = %index.def.name, entries = added, elapsed_ms = elapsed, "secondary index built");
}

impl Service {
    /// Runs the builds of new indexes until `stopping` is set (the server's
    /// `citrine-sindex` thread). While it runs, create commands queue their
    /// builds here instead of building inline.
    pub fn run_sindex_builds(&self, stopping: &AtomicBool) {
        let builds = &self.sindex_builds;
        builds.attached.store(true, Ordering::Release);
        while !stopping.load(Ordering::Relaxed) {
            let job = {
                let mut queue = builds.queue.lock();
                if queue.is_empty() {
                    builds
                        .wake
                        .wait_for(&mut queue, std::time::Duration::from_millis(200));
                }
                queue.pop_front()
            };
            if let Some((namespace, index)) = job {
                build(&namespace, &index, || self.now());
            }
        }
        builds.attached.store(false, Ordering::Release);
    }

    /// Builds every queued index now, on this thread (for a service no
    /// builder thread serves, and for tests).
    pub fn run_pending_sindex_builds(&self) {
        loop {
            let Some((namespace, index)) = self.sindex_builds.queue.lock().pop_front() else {
                return;
            };
            build(&namespace, &index, || self.now());
        }
    }

    fn queue_build(&self, namespace: Arc<Namespace>, index: Arc<Sindex>) {
        let builds = &self.sindex_builds;
        builds.queue.lock().push_back((namespace, index));
        if builds.attached.load(Ordering::Acquire) {
            builds.wake.notify_one();
        } else {
            self.run_pending_sindex_builds();
        }
    }

    /// Keeps index definitions in `directory` from now on, and creates (and
    /// queues the builds of) the indexes the file there names. A line that
    /// no longer makes a valid index (its namespace is gone from the
    /// configuration, say) is logged and dropped from the file.
    pub fn keep_sindex_definitions(&self, directory: &Path) -> Result<(), String> {
        let path = directory.join(DEFINITIONS_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(error) => return Err(format!("cannot read {}: {error}", path.display())),
        };
        if self.sindex_builds.file.set(path.clone()).is_err() {
            return Err("the definitions directory is already set".to_owned());
        }
        for line in text.lines().map(str::trim).filter(|line| !line.is_empty()) {
            match SindexDef::parse(citrine_sindex::def::params(line)) {
                Ok(def) => {
                    if let Err(message) = self.create_local(def) {
                        tracing::error!(file = %path.display(), %line, "index definition not restored: {message}");
                    }
                }
                Err(error) => {
                    tracing::error!(file = %path.display(), %line, "index definition not restored: {}", error.message);
                }
            }
        }
        self.save_sindex_definitions()
    }

    /// Rewrites the definitions file (when there is one).
    fn save_sindex_definitions(&self) -> Result<(), String> {
        let Some(path) = self.sindex_builds.file.get() else {
            return Ok(());
        };
        let _guard = self.sindex_builds.file_lock.lock();
        let mut text = String::new();
        for namespace in self.namespaces() {
            for index in namespace.sindexes.read().iter() {
                text.push_str(&index.def.to_command());
                text.push('\n');
            }
        }
        let temporary = path.with_extension("smd.tmp");
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::File::create(&temporary)?;
            std::io::Write::write_all(&mut file, text.as_bytes())?;
            file.sync_all()?;
            std::fs::rename(&temporary, path)?;
            if let Some(directory) = path.parent() {
                std::fs::File::open(directory)?.sync_all()?;
            }
            Ok(())
        };
        write().map_err(|error| format!("cannot write {}: {error}", path.display()))
    }

    /// Creates (or renames) an index on this node and queues the build of
    /// a new one. `Ok(false)` when it already existed with that name and
    /// definition.
    fn create_local(&self, def: SindexDef) -> Result<bool, String> {
        let Some(namespace) = self
            .namespaces
            .iter()
            .find(|namespace| namespace.config.name == def.namespace)
            .cloned()
        else {
            return Err(format!("ERROR:4:namespace {} not found", def.namespace));
        };
        match namespace.sindexes.create(def) {
            Ok(Created::Exists) => Ok(false),
            // Nothing to build; the definitions file names it anew.
            Ok(Created::Renamed) => Ok(true),
            Ok(Created::New(index)) => {
                self.queue_build(namespace, index);
                Ok(true)
            }
            Err(error) => Err(format!("ERROR:{}:{}", error.code, error.message)),
        }
    }
}

/// `sindex-create:...`
pub(crate) fn create(service: &Service, command: &InfoCommand<'_>) -> String {
    let def = match SindexDef::parse(|name| command.param(name)) {
        Ok(def) => def,
        Err(error) => return format!("ERROR:{}:{}", error.code, error.message),
    };
    let (namespace, name) = (def.namespace.clone(), def.name.clone());
    match service.create_local(def) {
        Ok(false) => "ok".to_owned(),
        Ok(true) => match service.save_sindex_definitions() {
            Ok(()) => "ok".to_owned(),
            Err(message) => {
                // Not durable: not created.
                if let Some(namespace) = service.namespace(namespace.as_bytes()) {
                    namespace.sindexes.delete(&name);
                }
                tracing::error!("sindex-create refused: {message}");
                format!("ERROR:1:{message}")
            }
        },
        Err(answer) => answer,
    }
}

fn namespace_param<'s>(service: &'s Service, command: &InfoCommand<'_>) -> Option<&'s Namespace> {
    command
        .param("namespace")
        .or_else(|| command.param("ns"))
        .and_then(|name| service.namespace(name.as_bytes()))
}

/// `sindex-delete:...`: `ok`, also for an index that does not exist (as
/// the 8.x reference answers).
pub(crate) fn delete(service: &Service, command: &InfoCommand<'_>) -> String {
    let Some(namespace) = namespace_param(service, command) else {
        return "ERROR:4:namespace not found".to_owned();
    };
    let Some(name) = command.param("indexname") else {
        return "ERROR:4:missing indexname".to_owned();
    };
    if namespace.sindexes.delete(name).is_some() {
        if let Err(message) = service.save_sindex_definitions() {
            // The index is gone from memory; the file still names it, so a
            // restart would bring it back.
            tracing::error!("sindex-delete: {message}");
            return format!("ERROR:1:{message}");
        }
    }
    "ok".to_owned()
}

/// `sindex-exists:...`: `true` / `false`.
pub(crate) fn exists(service: &Service, command: &InfoCommand<'_>) -> String {
    let Some(namespace) = namespace_param(service, command) else {
        return "ERROR:4:namespace not found".to_owned();
    };
    let name = command.param("indexname").unwrap_or_default();
    namespace.sindexes.get(name).is_some().to_string()
}

/// `sindex`, `sindex/NS`, `sindex-list[:ns=NS]`: one entry per index.
pub(crate) fn list(service: &Service, namespace: Option<&str>) -> String {
    let mut out = String::new();
    for candidate in service.namespaces() {
        if namespace.is_some_and(|name| name != candidate.config.name) {
            continue;
        }
        for index in candidate.sindexes.read().iter() {
            out.push_str(&index.def.listing());
            out.push_str(if index.is_loaded() {
                ":state=RW;"
            } else {
                ":state=WO;"
            });
        }
    }
    out
}

/// `sindex/NS/NAME` and `sindex-stat:namespace=NS;indexname=NAME`: the
/// index's statistics (`load_pct` is what clients wait on).
pub(crate) fn stat(service: &Service, namespace: &str, name: &str) -> String {
    let Some(index) = service
        .namespace(namespace.as_bytes())
        .and_then(|namespace| namespace.sindexes.get(name))
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
pub(crate) fn count_on_set(namespace: &Namespace, set: &[u8]) -> usize {
    namespace
        .sindexes
        .read()
        .iter()
        .filter(|index| index.def.set.as_deref().map(str::as_bytes) == Some(set))
        .count()
}

#[cfg(test)]
pub(crate) mod tests;
