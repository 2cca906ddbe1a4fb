//! The strong-consistency rosters the cluster shares (the reference keeps
//! them in its system metadata): for each namespace, the roster in force
//! and the pending roster `roster-set:` staged, so that `roster-set:` sent
//! to one node reaches every node, `recluster:` on any node applies the
//! pending rosters everywhere, and both survive restarts.
//!
//! Owns: [`Rosters`] (the entries, the file `roster.smd` in the work
//! directory, the push clock), the text of an entry (one line), the merge
//! of a peer's entries, and [`Distribution`]'s roster operations
//! ([`Distribution::stage_roster`], [`Distribution::apply_pending_rosters`],
//! [`Distribution::roster_of`], [`Distribution::observed_nodes`]).
//!
//! A pending roster becomes the roster at `recluster:` on any node, and
//! at each new view on its principal (the member with the highest id, as
//! the reference applies them at each rebalance), once per view.
//!
//! Rules (those of every shared store, [`crate::smd`]): each change here
//! gives the namespace's entry the next [`Version`]; a merge takes an entry
//! only when its version is newer; a change is saved before it takes
//! effect (a change the file could not keep is refused); every change is
//! pushed to the other members at once, after each view change and every
//! [`crate::smd::PUSH_EVERY_MS`] (by the migration driver, beside the
//! truncations).
//!
//! File and push format: one line per namespace,
//! `namespace=NS;roster=LIST;pending=LIST;version=MS.NODE`, LIST as the
//! `roster:` answer prints it ([`NodeList::encode`]).

use super::roster::{NodeList, Roster, RosterNode};
use crate::replication::call_kind;
use crate::smd::{PushClock, Version};
use crate::Distribution;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The rosters file in the work directory.
pub const ROSTERS_FILE: &str = "roster.smd";

/// One namespace's rosters, as the members share them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    pub roster: NodeList,
    pub pending: NodeList,
    pub version: Version,
}

/// Every namespace's rosters known here.
#[derive(Default)]
pub struct Rosters {
    entries: Mutex<BTreeMap<String, Entry>>,
    file: OnceLock<PathBuf>,
    pub push: PushClock,
    /// The cluster key of the last view whose pending rosters were looked
    /// at ([`Distribution::apply_pending_rosters_at_view`]).
    view_key: AtomicU64,
}

impl Rosters {
    /// Saves `entries` to the file (nowhere before [`Distribution::keep_rosters`]).
    fn save(&self, entries: &BTreeMap<String, Entry>) -> Result<(), String> {
        match self.file.get() {
            Some(path) => crate::smd::save_atomically(path, &text(entries)),
            None => Ok(()),
        }
    }

    /// Makes `changes` (namespace, new entry) and saves them first; on a
    /// failed save nothing changes.
    fn commit(&self, changes: Vec<(String, Entry)>) -> Result<(), String> {
        let mut entries = self.entries.lock();
        let mut next = entries.clone();
        next.extend(changes);
        self.save(&next)?;
        *entries = next;
        self.push.mark();
        Ok(())
    }
}

/// One entry's line.
fn line(namespace: &str, entry: &Entry) -> String {
    format!(
        "namespace={namespace};roster={};pending={};{}",
        entry.roster.encode(),
        entry.pending.encode(),
        entry.version.param()
    )
}

/// Every entry, one line each.
pub fn text(entries: &BTreeMap<String, Entry>) -> String {
    entries
        .iter()
        .map(|(namespace, entry)| line(namespace, entry) + "\n")
        .collect()
}

/// Parses one line of [`text`].
pub fn parse_line(text: &str) -> Result<(String, Entry), String> {
    let param = |key: &str| {
        text.split(';')
            .find_map(|pair| pair.split_once('=').filter(|(name, _)| *name == key))
            .map(|(_, value)| value)
    };
    let namespace = param("namespace")
        .filter(|name| !name.is_empty())
        .ok_or_else(|| format!("no namespace in {text:?}"))?;
    let list = |key: &str| {
        NodeList::parse(param(key).unwrap_or("null")).map_err(|error| format!("{key}: {error}"))
    };
    let entry = Entry {
        roster: list("roster")?,
        pending: list("pending")?,
        version: Version::parse(param("version"))?,
    };
    Ok((namespace.to_owned(), entry))
}

/// Takes into `entries` every entry of `incoming` newer than the one known;
/// true when one was taken. A line not understood is logged and skipped.
pub fn merge_into(entries: &mut BTreeMap<String, Entry>, incoming: &str, from: &str) -> bool {
    let mut changed = false;
    for text in incoming.lines().filter(|line| !line.trim().is_empty()) {
        let (namespace, entry) = match parse_line(text) {
            Ok(parsed) => parsed,
            Err(message) => {
                tracing::warn!("a roster line from {from} is not understood: {message}");
                continue;
            }
        };
        let newer = entries
            .get(&namespace)
            .is_none_or(|known| entry.version > known.version);
        if newer {
            entries.insert(namespace, entry);
            changed = true;
        }
    }
    changed
}

impl Distribution {
    /// Keeps the rosters in `directory` from now on, and brings back the
    /// ones the file there holds.
    pub fn keep_rosters(&self, directory: &Path) -> Result<(), String> {
        let path = directory.join(ROSTERS_FILE);
        let text = crate::smd::read(&path)?;
        if self.rosters.file.set(path.clone()).is_err() {
            return Err("the rosters directory is already set".to_owned());
        }
        let mut entries = self.rosters.entries.lock();
        merge_into(&mut entries, &text, &path.display().to_string());
        self.rosters.save(&entries)
    }

    /// The next version of `namespace`'s entry for a change made here.
    fn next_roster_version(&self, known: &Entry) -> Version {
        crate::smd::next_version(Some(known.version), self.now().unix_ms, self.node_id)
    }

    /// Stages `pending` as `namespace`'s pending roster (`roster-set:`).
    pub fn stage_roster(&self, namespace: &str, pending: NodeList) -> Result<(), String> {
        let mut entry = self.roster_entry(namespace);
        entry.version = self.next_roster_version(&entry);
        entry.pending = pending;
        self.rosters.commit(vec![(namespace.to_owned(), entry)])
    }

    /// Makes the pending roster of each of `namespaces` its roster
    /// (`recluster:`); returns the namespaces whose roster changed.
    pub fn apply_pending_rosters(&self, namespaces: &[&str]) -> Result<Vec<String>, String> {
        let changes: Vec<(String, Entry)> = namespaces
            .iter()
            .filter_map(|namespace| {
                let mut entry = self.roster_entry(namespace);
                (entry.pending != entry.roster).then(|| {
                    entry.version = self.next_roster_version(&entry);
                    entry.roster = entry.pending.clone();
                    (namespace.to_string(), entry)
                })
            })
            .collect();
        let changed = changes.iter().map(|(name, _)| name.clone()).collect();
        self.rosters.commit(changes)?;
        Ok(changed)
    }

    /// At the first call in a new view, on its principal (highest node
    /// id): applies the pending roster of every strong-consistency
    /// namespace; returns the namespaces whose roster changed.
    pub fn apply_pending_rosters_at_view(&self) -> Vec<String> {
        let cluster = self.cluster();
        let key = cluster.cluster_key;
        if self.rosters.view_key.swap(key, Ordering::Relaxed) == key {
            return Vec::new();
        }
        if cluster.principal() != self.node_id {
            return Vec::new();
        }
        let names: Vec<&str> = self
            .data
            .namespaces_shared()
            .iter()
            .filter(|namespace| namespace.config.sc.strong_consistency)
            .map(|namespace| namespace.config.name.as_str())
            .collect();
        match self.apply_pending_rosters(&names) {
            Ok(changed) => changed,
            Err(message) => {
                tracing::error!("pending rosters not applied at the view: {message}");
                Vec::new()
            }
        }
    }

    /// `namespace`'s entry (empty rosters when none was ever set).
    pub fn roster_entry(&self, namespace: &str) -> Entry {
        self.rosters
            .entries
            .lock()
            .get(namespace)
            .cloned()
            .unwrap_or_default()
    }

    /// The nodes of the current view with their racks, and `active_rack`
    /// (0: none), as the `roster:` answer's `observed_nodes` prints them.
    pub fn observed_nodes(&self, active_rack: u32) -> NodeList {
        let members = self
            .cluster()
            .members
            .iter()
            .map(|member| RosterNode {
                id: member.node_id,
                rack_id: member.rack_id,
            })
            .collect();
        let active = (active_rack != 0).then_some(active_rack);
        // Ids of one view are distinct; an empty list if they were not.
        NodeList::new(members, active).unwrap_or_default()
    }

    /// `namespace`'s roster, pending roster and observed nodes.
    pub fn roster_of(&self, namespace: &str, active_rack: u32) -> Roster {
        let entry = self.roster_entry(namespace);
        Roster {
            roster: entry.roster,
            pending: entry.pending,
            observed: self.observed_nodes(active_rack),
        }
    }

    /// Merges a peer's rosters (the text its push carries).
    pub fn merge_rosters(&self, incoming: &str) {
        let mut entries = self.rosters.entries.lock();
        let mut next = entries.clone();
        if !merge_into(&mut next, incoming, "a peer") {
            return;
        }
        if let Err(message) = self.rosters.save(&next) {
            tracing::error!("a peer's rosters not saved, so not taken: {message}");
            return;
        }
        tracing::info!("rosters merged from a peer");
        *entries = next;
    }

    /// Every entry, one line each (what a push carries).
    pub fn rosters_text(&self) -> String {
        text(&self.rosters.entries.lock())
    }

    /// Sends the rosters to every other member when a push is due (the
    /// migration driver calls it beside the truncations' push).
    pub fn push_rosters(&self) -> bool {
        crate::smd::push_to_peers_unanswered(self, &self.rosters.push, call_kind::ROSTERS, || {
            self.rosters_text()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(roster: &str, pending: &str, ms: u64) -> Entry {
        Entry {
            roster: NodeList::parse(roster).expect("roster"),
            pending: NodeList::parse(pending).expect("pending"),
            version: Version { ms, node: 0xA1 },
        }
    }

    #[test]
    fn lines_round_trip() {
        let mut entries = BTreeMap::new();
        entries.insert("test".to_owned(), entry("BB9@2,A1", "M2|BB9@2", 17));
        entries.insert("bar".to_owned(), entry("null", "null", 3));
        let written = text(&entries);
        assert_eq!(
            written,
            "namespace=bar;roster=null;pending=null;version=3.a1\n\
             namespace=test;roster=BB9@2,A1;pending=M2|BB9@2;version=17.a1\n"
        );
        let mut read = BTreeMap::new();
        assert!(merge_into(&mut read, &written, "test"));
        assert_eq!(read, entries);
        assert!(parse_line("roster=A1;version=1.1").is_err(), "no namespace");
        assert!(parse_line("namespace=t;roster=A1,A1;version=1.1").is_err());
    }

    #[test]
    fn merge_takes_only_newer_entries() {
        let mut known = BTreeMap::new();
        known.insert("test".to_owned(), entry("A1", "A1", 10));
        let older = text(&BTreeMap::from([("test".to_owned(), entry("B2", "B2", 9))]));
        assert!(!merge_into(&mut known, &older, "peer"));
        assert_eq!(known["test"].roster.encode(), "A1");
        let newer = text(&BTreeMap::from([(
            "test".to_owned(),
            entry("B2", "C3", 11),
        )]));
        assert!(merge_into(&mut known, &newer, "peer"));
        assert_eq!(known["test"].roster.encode(), "B2");
        assert_eq!(known["test"].pending.encode(), "C3");
        assert!(!merge_into(&mut known, "garbage line\n", "peer"));
    }
}
