//! The index definitions a cluster shares (the reference's "system
//! metadata" for secondary indexes): every node holds every definition,
//! whichever node a client sent `sindex-create` or `sindex-delete` to.
//!
//! Owns: the versioned definitions ([`Entry`]: a definition, or the
//! tombstone of a deleted one, with the [`Version`] of its last change),
//! the info commands that change them, the merge of a peer's definitions,
//! their pushes to the peers, and the definitions file.
//!
//! Rules: a change made here gets version (now, this node's id); a merge
//! takes each entry whose version is newer than this node's and applies it
//! to the namespace's registry (create and build, rename, or delete), so
//! every node ends with the same definitions whatever order the pushes
//! arrive in. The `citrine-sindex` thread pushes every definition to every
//! other member at once after a change, after each view change, and every
//! [`crate::smd::PUSH_EVERY_MS`] (a node that missed a push, or was down,
//! catches up). Versions, the file write and the push are
//! [`crate::smd`]'s, shared with the UDF modules.
//! Tombstones are kept, so a delete is not undone by a node that missed it.
//!
//! File: `sindex.smd` in the work directory, one entry a line
//! (`version=MS.NODE;` and the `sindex-create` parameters, or
//! `version=MS.NODE;deleted=true;namespace=NS;indexname=NAME`), rewritten
//! whole (temporary file, fsync, rename, directory fsync) on every change
//! and read at start. A line without a version (written before versions)
//! is version 0.
//!
//! Invariant: the entries lock is held across a change's registry update
//! and its file write, so the file never lags a change the node answered
//! `ok` to.

use super::Indexes;
use super::DEFINITIONS_FILE;
use crate::namespace::Namespace;
use crate::replication::call_kind;
use crate::smd::{PushClock, Version};
use crate::{Layers, Service};
use citrine_sindex::def::params;
use citrine_sindex::{Created, SindexDef};
use citrine_wire::info::InfoCommand;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// One index name's definition, or its tombstone.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub version: Version,
    pub namespace: String,
    pub name: String,
    /// `None`: deleted.
    pub def: Option<SindexDef>,
}

impl Entry {
    fn line(&self) -> String {
        let version = self.version.param();
        match &self.def {
            Some(def) => format!("{version};{}", def.to_command()),
            None => format!(
                "{version};deleted=true;namespace={};indexname={}",
                self.namespace, self.name
            ),
        }
    }

    fn parse(line: &str) -> Result<Entry, String> {
        let param = params(line);
        let version = Version::parse(param("version"))?;
        if param("deleted") == Some("true") {
            let namespace = param("namespace").ok_or("a tombstone without a namespace")?;
            let name = param("indexname").ok_or("a tombstone without an indexname")?;
            return Ok(Entry {
                version,
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                def: None,
            });
        }
        let def = SindexDef::parse(param).map_err(|error| error.message)?;
        Ok(Entry {
            version,
            namespace: def.namespace.clone(),
            name: def.name.clone(),
            def: Some(def),
        })
    }
}

/// Entries by (namespace, index name).
type Entries = BTreeMap<(String, String), Entry>;

/// This node's copy of the shared definitions.
#[derive(Default)]
pub(crate) struct Smd {
    entries: Mutex<Entries>,
    /// The definitions file, once the server names its directory.
    file: OnceLock<PathBuf>,
    /// When the definitions were last pushed.
    push: PushClock,
}

impl Smd {
    /// Every entry, one line each.
    fn text(entries: &Entries) -> String {
        let mut text = String::new();
        for entry in entries.values() {
            text.push_str(&entry.line());
            text.push('\n');
        }
        text
    }

    /// Rewrites the file (when there is one). The caller holds `entries`.
    fn save(&self, entries: &Entries) -> Result<(), String> {
        let Some(path) = self.file.get() else {
            return Ok(());
        };
        crate::smd::save_atomically(path, &Smd::text(entries))
    }
}

impl<'s> Indexes<'s> {
    fn smd(&self) -> &'s Smd {
        &self.builds.smd
    }

    /// Applies a definition to its namespace's registry: creates the index
    /// and queues its build, renames the index that has its definition, or
    /// replaces an index of that name with another definition (nothing
    /// when that name already has that definition).
    fn apply_def(&self, def: SindexDef, replace: bool) -> Result<(), String> {
        let Some(namespace) = self.layers.data.namespace_shared(def.namespace.as_bytes()) else {
            // Kept, not applied: the definitions are the cluster's (a peer
            // or a later configuration may have the namespace), as the
            // reference's shared metadata keeps them.
            return Ok(());
        };
        if replace {
            if let Some(existing) = self.of(&namespace).get(&def.name) {
                if existing.def != def {
                    self.of(&namespace).delete(&def.name);
                }
            }
        }
        match self.of(&namespace).create(def) {
            Ok(Created::Exists | Created::Renamed(_)) => Ok(()),
            Ok(Created::New(index)) => {
                self.queue_build(namespace, index);
                Ok(())
            }
            Err(error) => Err(format!("ERROR:{}:{}", error.code, error.message)),
        }
    }

    /// The version of a change made here to `key`: now, but always later
    /// than the version this node knows for it (a clock behind a peer's,
    /// or two changes in one millisecond, must not make a change lose to
    /// the one it follows).
    fn next_version(&self, entries: &Entries, key: &(String, String)) -> Version {
        let known = entries.get(key).map(|entry| entry.version);
        crate::smd::next_version(known, self.layers.now().unix_ms, self.layers.node_id())
    }

    /// Records a command's change: `next` (the entries with the change) is
    /// saved first, then `apply` makes the change here, then the entries
    /// become `next` and are pushed. A save that fails answers `ERROR:1`
    /// and changes nothing: a change the file could not keep would be gone
    /// after a restart of this node.
    fn commit(
        &self,
        mut entries: parking_lot::MutexGuard<'_, Entries>,
        next: Entries,
        command: &str,
        apply: impl FnOnce() -> Result<(), String>,
    ) -> String {
        if let Err(message) = self.smd().save(&next) {
            tracing::error!("{command} not saved, so not made: {message}");
            return format!("ERROR:1:{message}");
        }
        if let Err(answer) = apply() {
            // Not expected: the change was planned under this same lock.
            // The file goes back to what holds.
            if let Err(message) = self.smd().save(&entries) {
                tracing::error!("{command}: the definitions file could not be restored: {message}");
            }
            return answer;
        }
        *entries = next;
        drop(entries);
        self.changed();
        "ok".to_owned()
    }

    /// Marks a change for the peers and wakes the thread that pushes.
    fn changed(&self) {
        self.smd().push.mark();
        self.builds.queue.wake();
    }

    /// Keeps index definitions in `directory` from now on, and creates (and
    /// queues the builds of) the indexes the file there names. A line that
    /// no longer makes a valid index (its namespace is gone from the
    /// configuration, say) is logged and dropped from the file.
    pub(crate) fn keep_definitions(&self, directory: &Path) -> Result<(), String> {
        let path = directory.join(DEFINITIONS_FILE);
        let text = crate::smd::read(&path)?;
        let smd = self.smd();
        if smd.file.set(path.clone()).is_err() {
            return Err("the definitions directory is already set".to_owned());
        }
        let mut entries = smd.entries.lock();
        for line in text.lines().map(str::trim).filter(|line| !line.is_empty()) {
            let entry = match Entry::parse(line) {
                Ok(entry) => entry,
                Err(message) => {
                    tracing::error!(file = %path.display(), %line, "index definition not restored: {message}");
                    continue;
                }
            };
            if let Some(def) = entry.def.clone() {
                if let Err(message) = self.apply_def(def, true) {
                    tracing::error!(file = %path.display(), %line, "index definition not restored: {message}");
                    continue;
                }
            }
            entries.insert((entry.namespace.clone(), entry.name.clone()), entry);
        }
        smd.save(&entries)
    }

    /// Merges a peer's definitions (the text its push carries): each entry
    /// newer than this node's is applied and kept. Definitions go first, so
    /// a rename (the new name's definition and the old name's tombstone)
    /// keeps the index's entries. When a definition's index is here under
    /// another live name (two names created for one target at once), the
    /// newer of the two names wins on every node: the other gets a
    /// tombstone of the winner's version.
    pub(crate) fn merge_definitions(&self, text: &str) {
        let smd = self.smd();
        let mut entries = smd.entries.lock();
        let mut incoming: Vec<Entry> = text
            .lines()
            .filter(|line| !line.trim().is_empty())
            .filter_map(|line| match Entry::parse(line) {
                Ok(entry) => Some(entry),
                Err(message) => {
                    tracing::warn!(%line, "a peer's index definition is not understood: {message}");
                    None
                }
            })
            .filter(|entry| newer(&entries, entry))
            .collect();
        if incoming.is_empty() {
            return;
        }
        incoming.sort_by_key(|entry| entry.def.is_none());
        for entry in incoming {
            // An earlier entry of this merge may have settled this one.
            if !newer(&entries, &entry) {
                continue;
            }
            match &entry.def {
                None => {
                    if let Some(namespace) = self.layers.namespace(entry.namespace.as_bytes()) {
                        self.of(namespace).delete(&entry.name);
                    }
                }
                Some(def) => {
                    if let Some(rival) = rival_of(&entries, def) {
                        if rival.version > entry.version {
                            // This node's name for the target is newer: the
                            // incoming name loses.
                            let loser = Entry {
                                version: rival.version,
                                def: None,
                                ..entry.clone()
                            };
                            tracing::info!(index = %entry.name, kept = %rival.name, "a peer's index name lost to a newer one for the same definition");
                            entries.insert((loser.namespace.clone(), loser.name.clone()), loser);
                            continue;
                        }
                        let loser = Entry {
                            version: entry.version,
                            def: None,
                            ..rival
                        };
                        entries.insert((loser.namespace.clone(), loser.name.clone()), loser);
                    }
                    if let Err(message) = self.apply_def(def.clone(), true) {
                        tracing::error!(index = %entry.name, "a peer's index definition cannot be applied here: {message}");
                        continue;
                    }
                }
            }
            tracing::info!(namespace = %entry.namespace, index = %entry.name, deleted = entry.def.is_none(), "index definition merged from a peer");
            entries.insert((entry.namespace.clone(), entry.name.clone()), entry);
        }
        self.changed();
        if let Err(message) = smd.save(&entries) {
            tracing::error!("merged index definitions not saved: {message}");
        }
    }

    /// Every definition and tombstone, as a push carries them.
    pub(crate) fn definitions_text(&self) -> String {
        Smd::text(&self.smd().entries.lock())
    }

    /// Sends every definition to every other member when a change is
    /// unpushed, the view changed, or [`crate::smd::PUSH_EVERY_MS`] passed (called by
    /// the `citrine-sindex` thread).
    pub(crate) fn push_definitions(&self) {
        let smd = self.smd();
        crate::smd::push_to_peers(
            self.layers.dist,
            &smd.push,
            call_kind::SINDEX_DEFINITIONS,
            "index definitions",
            || self.definitions_text(),
        );
    }
}

impl Service {
    /// Keeps index definitions in `directory` from now on (see
    /// [`Indexes::keep_definitions`]).
    pub fn keep_sindex_definitions(&self, directory: &Path) -> Result<(), String> {
        self.indexes().keep_definitions(directory)
    }
}

/// Whether `entry` is newer than what `entries` knows of its name.
fn newer(entries: &Entries, entry: &Entry) -> bool {
    entries
        .get(&(entry.namespace.clone(), entry.name.clone()))
        .is_none_or(|known| entry.version > known.version)
}

/// The live entry of another name with `def`'s target, if any.
fn rival_of(entries: &Entries, def: &SindexDef) -> Option<Entry> {
    entries
        .values()
        .find(|entry| {
            entry.name != def.name
                && entry
                    .def
                    .as_ref()
                    .is_some_and(|known| known.same_target(def))
        })
        .cloned()
}

/// `sindex-create:...`: creates (or renames) the index here, records the
/// change and has it pushed to the other members; the change is saved
/// before it is made (see `Indexes::commit`).
pub(crate) fn create(indexes: &Indexes<'_>, command: &InfoCommand<'_>) -> String {
    let namespace = match check_create(&indexes.layers, command) {
        Ok(namespace) => namespace,
        Err(answer) => return answer,
    };
    let def = match SindexDef::parse(|name| command.param(name)) {
        Ok(def) => def,
        Err(error) => return format!("ERROR:{}:{}", error.code, error.message),
    };
    let smd = indexes.smd();
    let entries = smd.entries.lock();
    let Some(namespace) = namespace else {
        // The reference answers ok for a namespace the node does not have
        // and keeps the definition (its name is taken there: another
        // definition under it is refused with 200); nothing is built, and
        // the client's `sindex-stat` then gets 20.
        return record_elsewhere(indexes, entries, def);
    };
    // Registries change only under this lock: the plan holds until applied.
    let renamed_from = match indexes.of(namespace).plan(&def) {
        Ok(Created::Renamed(old)) => Some(old),
        Ok(Created::Exists | Created::New(_)) => None,
        Err(error) => return format!("ERROR:{}:{}", error.code, error.message),
    };
    let key = (def.namespace.clone(), def.name.clone());
    // Recorded even when nothing changes here: this command is the latest
    // word on the name, over a delete a peer has not pushed yet.
    let version = indexes.next_version(&entries, &key);
    let mut next = entries.clone();
    if let Some(old) = renamed_from {
        let old_key = (def.namespace.clone(), old.clone());
        let version = version.max(indexes.next_version(&entries, &old_key));
        next.insert(
            old_key,
            Entry {
                version,
                namespace: def.namespace.clone(),
                name: old,
                def: None,
            },
        );
    }
    next.insert(
        key,
        Entry {
            version,
            namespace: def.namespace.clone(),
            name: def.name.clone(),
            def: Some(def.clone()),
        },
    );
    indexes.commit(entries, next, "sindex-create", || {
        indexes.apply_def(def, false)
    })
}

/// [`create`] for a namespace this node does not have: the definition is
/// recorded (and pushed) without an index, unless its name holds another
/// definition there.
fn record_elsewhere(
    indexes: &Indexes<'_>,
    entries: parking_lot::MutexGuard<'_, Entries>,
    def: SindexDef,
) -> String {
    let key = (def.namespace.clone(), def.name.clone());
    match entries.get(&key).and_then(|entry| entry.def.as_ref()) {
        Some(known) if *known == def => return "ok".to_owned(),
        Some(_) => {
            return "ERROR:200:'indexname' already exists with different definition".to_owned()
        }
        None => {}
    }
    let version = indexes.next_version(&entries, &key);
    let mut next = entries.clone();
    let entry = Entry {
        version,
        namespace: def.namespace.clone(),
        name: def.name.clone(),
        def: Some(def),
    };
    next.insert(key, entry);
    indexes.commit(entries, next, "sindex-create", || Ok(()))
}

/// The parameters of `sindex-create` the reference checks before anything
/// else, in its order: the namespace (missing, empty or too long → 20),
/// the index name and, when given, the set (missing or empty → 4: an
/// empty set is not "the whole namespace"). `Ok(None)`: a namespace this
/// node does not have.
fn check_create<'s>(
    layers: &Layers<'s>,
    command: &InfoCommand<'_>,
) -> Result<Option<&'s Namespace>, String> {
    let namespace = super::namespace_param(layers, command)?;
    super::index_name(command)?;
    if command.param("set").is_some() {
        crate::info::set_name(command)?;
    }
    Ok(namespace)
}

/// `sindex-delete:...`: `ok`, also for an index or a namespace that does
/// not exist (as the 8.x reference answers); a known index's tombstone is
/// pushed to the other members. The tombstone is saved before the index
/// goes. A missing or empty namespace or index name is refused.
pub(crate) fn delete(indexes: &Indexes<'_>, command: &InfoCommand<'_>) -> String {
    let namespace = match super::namespace_param(&indexes.layers, command) {
        Ok(namespace) => namespace,
        Err(answer) => return answer,
    };
    let name = match super::index_name(command) {
        Ok(name) => name,
        Err(answer) => return answer,
    };
    let namespace_name = match namespace {
        Some(namespace) => namespace.config.name.clone(),
        None => command
            .param("namespace")
            .or_else(|| command.param("ns"))
            .unwrap_or_default()
            .to_owned(),
    };
    let smd = indexes.smd();
    let entries = smd.entries.lock();
    let key = (namespace_name.clone(), name.to_owned());
    if namespace.is_none() && !entries.contains_key(&key) {
        // Nothing recorded under the name in a namespace this node lacks.
        return "ok".to_owned();
    }
    // A tombstone even for a name not known here: a peer may hold a create
    // of it it has not pushed yet, which this later delete must win over.
    let version = indexes.next_version(&entries, &key);
    let mut next = entries.clone();
    next.insert(
        key,
        Entry {
            version,
            namespace: namespace_name,
            name: name.to_owned(),
            def: None,
        },
    );
    indexes.commit(entries, next, "sindex-delete", || {
        if let Some(namespace) = namespace {
            indexes.of(namespace).delete(name);
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{NamespaceConfig, ServiceConfig};
    use crate::sindex::tests::info;
    use crate::ManualClock;
    use std::sync::Arc;

    const START_MS: u64 = 1_700_000_000_000;

    fn node(id: u64, clock_ms: u64) -> Service {
        let config = ServiceConfig::local(id, vec![NamespaceConfig::in_memory("test")]);
        Service::new(config, Arc::new(ManualClock::new(clock_ms)))
    }

    /// What `from`'s push would carry, merged into `to`.
    fn push(from: &Service, to: &Service) {
        let text = from.indexes().definitions_text();
        to.indexes().merge_definitions(&text);
    }

    fn sync(a: &Service, b: &Service) {
        push(a, b);
        push(b, a);
        push(a, b);
    }

    fn names(service: &Service) -> Vec<String> {
        let namespace = service.namespace(b"test").expect("namespace");
        let list = service.indexes().of(namespace).read();
        list.iter().map(|index| index.def.name.clone()).collect()
    }

    const CREATE_I: &str = "sindex-create:ns=test;indexname=i;bin=b;type=NUMERIC";
    const DELETE_I: &str = "sindex-delete:ns=test;indexname=i";

    #[test]
    fn a_definition_for_a_namespace_the_node_lacks_is_kept_as_the_reference_keeps_it() {
        // Answers of the reference (CE 8.1.2): the name is taken in the
        // missing namespace; another definition under it is refused with
        // 200 until it is deleted. (The official Python client's suite
        // creates a map-keys index, then a map-values one of the same
        // name, in a namespace `test1` no node has, and expects 200.)
        let keys = "sindex-create:namespace=test1;set=demo;indexname=m;bin=b;type=numeric;indextype=mapkeys";
        let values = "sindex-create:namespace=test1;set=demo;indexname=m;bin=b;type=numeric;indextype=mapvalues";
        let (a, b) = (node(0xA, START_MS), node(0xB, START_MS + 5));
        assert_eq!(info(&a, keys), "ok");
        assert_eq!(info(&a, keys), "ok");
        let taken = "ERROR:200:'indexname' already exists with different definition";
        assert_eq!(info(&a, values), taken);
        // A peer that lacks the namespace too learns the definition.
        push(&a, &b);
        assert_eq!(info(&b, values), taken);
        assert_eq!(
            info(&a, "sindex-exists:namespace=test1;indexname=m"),
            "ERROR:20:namespace not found on node"
        );
        assert_eq!(info(&a, "sindex-delete:namespace=test1;indexname=m"), "ok");
        assert_eq!(info(&a, values), "ok");
        // In a namespace the node has, the same words.
        assert_eq!(info(&a, CREATE_I), "ok");
        assert_eq!(
            info(
                &a,
                "sindex-create:ns=test;indexname=i;bin=other;type=NUMERIC"
            ),
            taken
        );
    }

    #[test]
    fn the_last_command_wins_even_when_it_changes_nothing_where_it_lands() {
        // Delete on A, then create on B (which still has the index).
        let (a, b) = (node(0xA, START_MS), node(0xB, START_MS + 5));
        assert_eq!(info(&a, CREATE_I), "ok");
        push(&a, &b);
        assert_eq!(info(&a, DELETE_I), "ok");
        assert_eq!(info(&b, CREATE_I), "ok");
        sync(&a, &b);
        assert_eq!(
            (names(&a), names(&b)),
            (vec!["i".to_owned()], vec!["i".to_owned()])
        );
        // Create on A, then delete on B (which never had it).
        let (a, b) = (node(0xA, START_MS), node(0xB, START_MS + 5));
        assert_eq!(info(&a, CREATE_I), "ok");
        assert_eq!(info(&b, DELETE_I), "ok");
        sync(&a, &b);
        assert!(names(&a).is_empty() && names(&b).is_empty());
    }

    #[test]
    fn a_clock_behind_does_not_make_a_later_change_lose() {
        let (a, b) = (node(0xA, START_MS), node(0xB, START_MS - 100));
        assert_eq!(info(&a, CREATE_I), "ok");
        push(&a, &b);
        assert_eq!(info(&a, DELETE_I), "ok");
        push(&a, &b);
        assert!(names(&b).is_empty());
        // B's clock says 100 ms before A's delete; its create comes after.
        assert_eq!(info(&b, CREATE_I), "ok");
        sync(&a, &b);
        assert_eq!(
            (names(&a), names(&b)),
            (vec!["i".to_owned()], vec!["i".to_owned()])
        );
        // Two changes in one millisecond on one node: the second wins.
        assert_eq!(info(&a, DELETE_I), "ok");
        assert_eq!(info(&a, CREATE_I), "ok");
        sync(&a, &b);
        assert_eq!(
            (names(&a), names(&b)),
            (vec!["i".to_owned()], vec!["i".to_owned()])
        );
    }

    #[test]
    fn two_names_for_one_definition_settle_on_the_newer_everywhere() {
        let (a, b) = (node(0xA, START_MS), node(0xB, START_MS + 1));
        assert_eq!(
            info(&a, "sindex-create:ns=test;indexname=i1;bin=b;type=NUMERIC"),
            "ok"
        );
        assert_eq!(
            info(&b, "sindex-create:ns=test;indexname=i2;bin=b;type=NUMERIC"),
            "ok"
        );
        sync(&a, &b);
        assert_eq!(names(&a), vec!["i2".to_owned()]);
        assert_eq!(names(&b), vec!["i2".to_owned()]);
        assert_eq!(
            a.indexes().definitions_text(),
            b.indexes().definitions_text()
        );
    }

    #[test]
    fn a_rename_reaches_peers_with_its_entries() {
        let (a, b) = (node(0xA, START_MS), node(0xB, START_MS));
        for service in [&a, &b] {
            crate::batch::tests::put(service, "demo", "k", &[("b", 7)], false);
        }
        assert_eq!(info(&a, CREATE_I), "ok");
        push(&a, &b);
        assert!(info(&b, "sindex/test/i").contains("entries=1;"));
        assert_eq!(
            info(&a, "sindex-create:ns=test;indexname=j;bin=b;type=NUMERIC"),
            "ok"
        );
        push(&a, &b);
        assert_eq!(names(&b), vec!["j".to_owned()]);
        let stat = info(&b, "sindex/test/j");
        assert!(
            stat.contains("entries=1;") && stat.contains("load_pct=100;"),
            "{stat}"
        );
        assert_eq!(
            a.indexes().definitions_text(),
            b.indexes().definitions_text()
        );
    }

    #[test]
    fn entries_round_trip_through_their_lines() {
        let def = SindexDef::parse(params("ns=test;set=s;indexname=i;bin=b;type=STRING"))
            .expect("definition");
        let live = Entry {
            version: Version {
                ms: 1_700_000_000_123,
                node: 0xBB9,
            },
            namespace: "test".into(),
            name: "i".into(),
            def: Some(def.clone()),
        };
        let parsed = Entry::parse(&live.line()).expect("live");
        assert_eq!(parsed.version, live.version);
        assert_eq!(parsed.def, Some(def));
        let tombstone = Entry {
            def: None,
            ..live.clone()
        };
        let parsed = Entry::parse(&tombstone.line()).expect("tombstone");
        assert_eq!((parsed.version, parsed.def), (tombstone.version, None));
        assert_eq!(parsed.name, "i");
        // A line from before versions: version 0.
        let old = Entry::parse("namespace=test;indexname=i;bin=b;type=NUMERIC").expect("old");
        assert_eq!(old.version, Version::default());
        assert!(Entry::parse("version=12;namespace=test;indexname=i;bin=b;type=NUMERIC").is_err());
        assert!(Entry::parse("version=1.1;deleted=true;indexname=i").is_err());
    }
}
