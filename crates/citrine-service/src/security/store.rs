//! The users and roles as a shared metadata store: kept in the work
//! directory (`security.smd`), pushed to every other member on each change
//! and periodically, and merged from theirs.
//!
//! Each user and each role is an entry of its own with its own
//! [`Version`] (when and on which node it last changed: the later change
//! wins, the node id breaks a tie, then the entry's text), as the other
//! stores version their entries; a dropped one stays as a tombstone, so a
//! node that missed the drop cannot bring it back. A merge takes each
//! entry whose version is newer than the one known here, so two changes
//! made on two nodes at once to different users or roles both survive,
//! and two changes to one entry end as the same winner on every node.
//!
//! Text (file and push): one line per entry, the entry's line as
//! [`snapshot`] writes it followed by `;version=MS.NODE`, or
//! `KEY;dropped;version=MS.NODE` for a tombstone (KEY: `user:NAME`,
//! `role:NAME`, `external:NAME` for an LDAP user, the name in base64, or
//! `key:bGRhcA` for the key LDAP tokens are signed with: each node starts
//! with one of its own at version 0 and the greatest wins, so the cluster
//! ends with one; the first token signed with a key marks its line `used`,
//! which versions it then, so a key that signed tokens wins over every
//! unused one — a node's first LDAP login before it heard from the others,
//! or a blank node joining later, never invalidates issued tokens). The earlier format — a first line
//! `version=MS.NODE` for the whole store — is still read: every entry then
//! has that version, and an entry it lacks is taken as dropped then.
//!
//! Invariants: the entries and the node's state change together, under
//! the entries' lock (an admin command runs and is committed under it, a
//! merge applies under it), so the state is always the live entries; every
//! change made here gives each entry it changed a version later than the
//! one known for it, and is saved before the next request is served; a
//! line that does not parse is skipped (and logged), the others are taken.

use super::Guard;
use crate::replication::call_kind;
use crate::smd::Version;
use crate::Service;
use citrine_security::{snapshot, Security};
use citrine_types::NodeId;
use std::collections::BTreeMap;
use std::path::Path;

/// The file in the work directory.
pub const SECURITY_FILE: &str = "security.smd";

/// One user or role as the store keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Stamped {
    /// Its line ([`snapshot`]); `None`: dropped (a tombstone).
    line: Option<String>,
    version: Version,
}

/// Every entry, by key (`user:NAME` / `role:NAME`).
pub(crate) type Entries = BTreeMap<String, Stamped>;

/// The key of an entry's line: what precedes its first `;`.
fn key_of(line: &str) -> &str {
    line.split(';').next().unwrap_or(line)
}

/// The state's users and roles, one line each, by key.
fn lines_of(security: &Security) -> BTreeMap<String, String> {
    snapshot::to_text(security)
        .lines()
        .map(|line| (key_of(line).to_owned(), line.to_owned()))
        .collect()
}

/// The entries of a node that has changed nothing: its state's, version 0.
pub(crate) fn initial(security: &Security) -> Entries {
    lines_of(security)
        .into_iter()
        .map(|(key, line)| {
            let version = Version::default();
            let line = Some(line);
            (key, Stamped { line, version })
        })
        .collect()
}

/// Gives every entry whose line differs in `current` (the state after a
/// change made here at `now_ms` on `node`) the next version: a new or
/// changed line, or a tombstone for one no longer there. True when any did.
fn stamp_changes(
    entries: &mut Entries,
    current: BTreeMap<String, String>,
    now_ms: u64,
    node: NodeId,
) -> bool {
    let next = |known: Option<&Stamped>| {
        crate::smd::next_version(known.map(|known| known.version), now_ms, node)
    };
    let mut changed = false;
    let dropped: Vec<String> = entries
        .iter()
        .filter(|(key, stamped)| stamped.line.is_some() && !current.contains_key(*key))
        .map(|(key, _)| key.clone())
        .collect();
    for key in dropped {
        let version = next(entries.get(&key));
        entries.insert(
            key,
            Stamped {
                line: None,
                version,
            },
        );
        changed = true;
    }
    for (key, line) in current {
        let known = entries.get(&key);
        if known.is_some_and(|known| known.line.as_ref() == Some(&line)) {
            continue;
        }
        let version = next(known);
        entries.insert(
            key,
            Stamped {
                line: Some(line),
                version,
            },
        );
        changed = true;
    }
    changed
}

/// The store's text: one line per entry (tombstones too).
fn text(entries: &Entries) -> String {
    entries
        .iter()
        .map(|(key, stamped)| match &stamped.line {
            Some(line) => format!("{line};{}\n", stamped.version.param()),
            None => format!("{key};dropped;{}\n", stamped.version.param()),
        })
        .collect()
}

/// One line of [`text`]: its key and entry.
fn parse_line(line: &str) -> Result<(String, Stamped), String> {
    let (content, version) = line
        .rsplit_once(";version=")
        .ok_or_else(|| format!("no version in {line:?}"))?;
    let version = Version::parse(Some(version))?;
    let (key, line) = match content.strip_suffix(";dropped") {
        Some(key) => (key, None),
        None => {
            snapshot::from_text(content)?;
            (key_of(content), Some(content.to_owned()))
        }
    };
    let kinds = ["user:", "role:", "external:", "key:"];
    if !kinds.iter().any(|kind| key.starts_with(kind)) {
        return Err(format!("bad key {key:?}"));
    }
    Ok((key.to_owned(), Stamped { line, version }))
}

/// The entries of a store's text, each line that parses; the earlier
/// whole-store format gives every line the store's version.
fn parse(text: &str, from: &str) -> Vec<(String, Stamped)> {
    let mut lines = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .peekable();
    let whole = match lines
        .peek()
        .and_then(|first| first.strip_prefix("version="))
    {
        None => None,
        Some(version) => match Version::parse(Some(version)) {
            Ok(version) => {
                lines.next();
                Some(version)
            }
            Err(message) => {
                tracing::warn!("the users and roles from {from} are not understood: {message}");
                return Vec::new();
            }
        },
    };
    lines
        .filter_map(|line| {
            let parsed = match whole {
                None => parse_line(line),
                Some(version) => parse_line(&format!("{line};{}", version.param())),
            };
            parsed
                .map_err(|message| {
                    tracing::warn!(
                        "a users-and-roles line from {from} is not understood: {message}"
                    );
                })
                .ok()
        })
        .collect()
}

/// Takes into `entries` each of `incoming` that wins over the one known
/// here (newer, or of the same version and a greater line: two nodes'
/// default users, made apart with their own salts, end as one); true when
/// one was taken.
fn merge_into(entries: &mut Entries, incoming: Vec<(String, Stamped)>) -> bool {
    let mut taken = false;
    for (key, stamped) in incoming {
        let newer = entries
            .get(&key)
            .is_none_or(|known| (stamped.version, &stamped.line) > (known.version, &known.line));
        if newer {
            entries.insert(key, stamped);
            taken = true;
        }
    }
    taken
}

/// Adds, at version 0, the state's lines no entry has yet (what a node
/// has before it changed anything, such as its own token key).
pub(crate) fn add_initial(entries: &mut Entries, security: &Security) {
    for (key, stamped) in initial(security) {
        entries.entry(key).or_insert(stamped);
    }
}

/// The users and roles of the live entries.
fn live(entries: &Entries) -> Result<snapshot::Parsed, String> {
    let body: String = entries
        .values()
        .filter_map(|stamped| stamped.line.as_deref())
        .map(|line| format!("{line}\n"))
        .collect();
    snapshot::from_text(&body)
}

/// Makes the state the live entries (sessions of users still there stay).
fn apply(guard: &Guard, entries: &Entries) -> Result<(), String> {
    let parsed = live(entries)?;
    guard.with(|security| security.replace(parsed));
    Ok(())
}

/// The store's text, as a push carries it.
pub(crate) fn text_of(guard: &Guard) -> String {
    text(&guard.entries.lock())
}

impl Service {
    /// Keeps users and roles in `directory` from now on, and loads what
    /// the file there holds (none: the node keeps its default user).
    pub fn keep_security(&self, directory: &Path) -> Result<(), String> {
        let Some(guard) = self.security.get() else {
            return Ok(());
        };
        let path = directory.join(SECURITY_FILE);
        let text = crate::smd::read(&path)?;
        if guard.file.set(path.clone()).is_err() {
            return Err("the security store's directory is already set".to_owned());
        }
        let mut entries = guard.entries.lock();
        if !text.trim().is_empty() {
            let loaded: Entries = parse(&text, &path.display().to_string())
                .into_iter()
                .collect();
            // An entry the file does not name was dropped (the earlier
            // format kept no tombstones); a token key is never dropped.
            let latest = loaded.values().map(|stamped| stamped.version).max();
            for (key, stamped) in entries.iter_mut() {
                if !loaded.contains_key(key) && !key.starts_with("key:") {
                    stamped.line = None;
                    stamped.version = latest.unwrap_or(stamped.version);
                }
            }
            entries.extend(loaded);
            apply(guard, &entries)?;
        }
        save(guard, &entries)
    }

    /// Records what an admin command just changed here, under the entries'
    /// lock it ran under: each changed entry gets its next version, the
    /// store is saved and marked for the next push.
    pub(crate) fn commit_security(&self, guard: &Guard, entries: &mut Entries) {
        let current = guard.with(|security| lines_of(security));
        if !stamp_changes(entries, current, self.now().unix_ms, self.node_id) {
            return;
        }
        if let Err(message) = save(guard, entries) {
            tracing::error!("users and roles not saved: {message}");
        }
        guard.push.mark();
        self.sindex_builds.queue.wake();
    }

    /// Takes each of a peer's users and roles whose version is newer.
    pub(crate) fn merge_security(&self, text: &str) {
        let Some(guard) = self.security.get() else {
            return;
        };
        let incoming = parse(text, "a peer");
        let mut entries = guard.entries.lock();
        let mut merged = entries.clone();
        if !merge_into(&mut merged, incoming) {
            return;
        }
        if let Err(message) = apply(guard, &merged) {
            tracing::warn!("a peer's users and roles cannot be applied: {message}");
            return;
        }
        *entries = merged;
        tracing::info!("users and roles merged from a peer");
        if let Err(message) = save(guard, &entries) {
            tracing::error!("merged users and roles not saved: {message}");
        }
    }

    /// Sends the users and roles to every other member when a push is due
    /// (the `citrine-sindex` thread calls it beside the other stores').
    pub(crate) fn push_security(&self) {
        let Some(guard) = self.security.get() else {
            return;
        };
        crate::smd::push_to_peers(
            self.dist(),
            &guard.push,
            call_kind::SECURITY,
            "users and roles",
            || text_of(guard),
        );
    }
}

/// Writes the store's file, when the node keeps one.
fn save(guard: &Guard, entries: &Entries) -> Result<(), String> {
    match guard.file.get() {
        Some(path) => crate::smd::save_atomically(path, &text(entries)),
        None => Ok(()),
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
