//! Truncation of a namespace or of one set, for the whole cluster (the
//! reference's `truncate` system-metadata module): `truncate` and
//! `truncate-namespace` sent to any one node remove the records last
//! updated before the truncation's time on every node, as the official
//! clients expect (they send the command to a single node);
//! `truncate-undo` and `truncate-namespace-undo` remove the threshold
//! again, everywhere.
//!
//! Owns: the truncations this node knows ([`Truncations`]: for each
//! namespace and each `(namespace, set)`, the last-update-time threshold,
//! "lut", with the count of changes made to it), a checked truncation's or
//! undo's taking effect here ([`Distribution::truncate`],
//! [`Distribution::undo_truncation`]; the info commands that check them
//! are the service's), the merge of a peer's truncations, their pushes to
//! the peers, and the file `truncate.smd` in the work directory.
//!
//! Rules:
//! - every change of a target (a truncation, an undo) gives its entry the
//!   next generation; a merge takes a peer's entry when its generation is
//!   later, or at one generation its lut is (a truncation made
//!   concurrently with an undo wins over it), so every order of pushes
//!   ends with the same entry on every node ([`Entry::supersedes`]);
//! - a truncation only raises a threshold: a command whose lut is at or
//!   below the one in effect changes nothing (as the reference's); an
//!   undo lowers it to none (a later truncation may then set an earlier
//!   lut). What a truncation removed stays removed; an undo brings back
//!   only what was not removed yet and, on a device namespace's cold
//!   start, what the device still holds (as the reference's undo allows
//!   "recovery upon a subsequent cold restart");
//! - a threshold takes effect at once: a record last updated before it is
//!   no longer live ([`citrine_data::namespace::Namespace::is_truncated`]), and a
//!   replica write or migrated record that it covers is not stored
//!   ([`crate::replication`]), so a node that was down during the command
//!   cannot bring the records back; the records already held are then
//!   removed (inline for a command; for a peer's entry, which arrives on
//!   the fabric's serving path, where the node runs background work —
//!   the server's `citrine-truncate` thread);
//! - durable before it is answered: a device namespace records the
//!   threshold on its device (a restart does not load the records again),
//!   and the file keeps every entry, undone ones included (a memory
//!   namespace restarted empty still refuses older copies from a node that
//!   missed the command, and a node that missed an undo learns it);
//! - pushed like the other shared metadata ([`crate::smd`]), but by the
//!   migration driver (an async task the simulator runs too): at once after
//!   a change (within the driver's idle poll), after every view change and
//!   every [`crate::smd::PUSH_EVERY_MS`]; and exchanged both ways with
//!   every peer during each view's partition-version exchange
//!   ([`Distribution::sync_truncations`], retried with the exchange until the
//!   peer answers), so a node that missed a truncation (down, or on the
//!   other side of a split) knows it before its exchange resolves and it
//!   serves or sends any copy;
//! - a truncation of a set this node has never stored waits by name for
//!   the set's first record (`SetRegistry::set_truncation`): it applies to
//!   the records of it that arrive later, and the set does not exist until
//!   then (as in the reference, `sets` does not list it);
//! - every copy of a record that travels between nodes (replica write,
//!   migration batch, duplicate-resolution answer) carries its sender's
//!   threshold for the record's set, and a receiver that knows no such
//!   threshold takes it as the set's own at once
//!   ([`Distribution::adopt_carried_truncation`]), before the push arrives.
//!   A threshold at or below the highest the target ever had here is from
//!   before an undo this node knows, and is not taken again. A carried
//!   threshold may stand for the sender's namespace truncation: undoing a
//!   namespace's truncation undoes with it the carried set thresholds it
//!   covered.
//!
//! File format: one line per target,
//! `namespace=NS;[set=SET;]lut=MS;generation=G[;highest=MS][;carried=1]`
//! (MS: Unix milliseconds; `lut=0` once undone; `highest` when it differs
//! from `lut`; `carried` for a threshold taken from a copy), rewritten
//! whole (temporary file, fsync, rename) on every change. Pushes carry the
//! same lines. A line without `generation` (written before undos existed)
//! is generation 0.

use crate::replication::{call_kind, Fabric};
use crate::smd::PushClock;
use crate::Distribution;
use citrine_data::namespace::Namespace;
use citrine_data::truncation::{take_effect, Removal};
use citrine_types::{NodeId, ResultCode};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// The truncations file in the work directory.
pub const TRUNCATIONS_FILE: &str = "truncate.smd";

/// A peer's threshold this far past the local clock is taken with a
/// warning (the clocks disagree).
const CLOCK_SKEW_WARN_MS: u64 = 15_000;

/// How long the exchange's truncation sync waits for a peer.
const SYNC_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// What a threshold truncates: a namespace, or one set of it.
type Target = (String, Option<String>);

/// One target's truncation, as the members share it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// Changes made to the target (each truncation and undo adds one).
    pub generation: u64,
    /// The threshold, Unix ms; 0 once undone.
    pub lut_ms: u64,
    /// The latest threshold the target ever had.
    pub highest_ms: u64,
    /// Taken from a copy's carried threshold, not from a command or a push
    /// of one (see the module doc).
    pub carried: bool,
}

impl Entry {
    /// Whether a merge takes `self` over `known`: a later generation; at
    /// one generation a later lut; at one lut the command's entry over a
    /// carried one. A total order, so every node ends with the same.
    pub fn supersedes(&self, known: &Entry) -> bool {
        (self.generation, self.lut_ms, !self.carried)
            > (known.generation, known.lut_ms, !known.carried)
    }

    /// The entry after a command sets the threshold to `lut_ms` (0: undo).
    fn changed_to(&self, lut_ms: u64) -> Entry {
        Entry {
            generation: self.generation + 1,
            lut_ms,
            highest_ms: self.highest_ms.max(lut_ms),
            carried: false,
        }
    }
}

/// This node's truncation thresholds.
#[derive(Default)]
pub struct Truncations {
    /// Target → its entry (undone ones kept).
    entries: Mutex<BTreeMap<Target, Entry>>,
    /// The truncations file, once the server names its directory.
    file: OnceLock<PathBuf>,
    push: PushClock,
}

fn line((namespace, set): &Target, entry: &Entry) -> String {
    let mut text = format!("namespace={namespace};");
    if let Some(set) = set {
        text.push_str(&format!("set={set};"));
    }
    text.push_str(&format!(
        "lut={};generation={}",
        entry.lut_ms, entry.generation
    ));
    if entry.highest_ms != entry.lut_ms {
        text.push_str(&format!(";highest={}", entry.highest_ms));
    }
    if entry.carried {
        text.push_str(";carried=1");
    }
    text
}

fn text(entries: &BTreeMap<Target, Entry>) -> String {
    let mut text = String::new();
    for (target, entry) in entries {
        text.push_str(&line(target, entry));
        text.push('\n');
    }
    text
}

/// The value of parameter `key` in a `key=value;key=value` line.
fn param<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.split(';')
        .filter_map(|item| item.split_once('='))
        .find(|(name, _)| name.trim() == key)
        .map(|(_, value)| value.trim())
}

fn parse_line(text: &str) -> Result<(Target, Entry), String> {
    let param = |key: &str| param(text, key);
    let number = |key: &str| match param(key) {
        None => Ok(None),
        Some(value) => value
            .parse::<u64>()
            .map(Some)
            .map_err(|_| format!("bad {key}")),
    };
    let namespace = param("namespace")
        .filter(|name| !name.is_empty())
        .ok_or("no namespace")?;
    let set = param("set").filter(|set| !set.is_empty());
    let lut_ms = number("lut")?.ok_or("no lut")?;
    let generation = number("generation")?.unwrap_or(0);
    if lut_ms == 0 && generation == 0 {
        // Only an undo leaves no threshold, and an undo is a change.
        return Err("no valid lut".to_owned());
    }
    let entry = Entry {
        generation,
        lut_ms,
        highest_ms: number("highest")?.unwrap_or(0).max(lut_ms),
        carried: param("carried") == Some("1"),
    };
    Ok(((namespace.to_owned(), set.map(str::to_owned)), entry))
}

impl Truncations {
    fn save(&self, entries: &BTreeMap<Target, Entry>) -> Result<(), String> {
        match self.file.get() {
            Some(path) => crate::smd::save_atomically(path, &text(entries)),
            None => Ok(()),
        }
    }
}

/// A change of entries made here: each target's new entry takes effect
/// (in order), then the whole map is saved. Returns the removals the
/// raised thresholds call for; stops at the first failure, leaving the
/// entries as they were (the thresholds that already took effect stay:
/// a retried command or the next push makes the entries agree).
fn commit(
    truncations: &Truncations,
    entries: &mut BTreeMap<Target, Entry>,
    namespace: &Arc<Namespace>,
    changes: Vec<(Target, Entry)>,
) -> Result<Vec<Removal>, String> {
    let mut next = entries.clone();
    let mut removals = Vec::new();
    for (target, entry) in changes {
        removals.extend(take_effect(namespace, target.1.as_deref(), entry.lut_ms)?);
        next.insert(target, entry);
    }
    if let Err(message) = truncations.save(&next) {
        tracing::error!("truncation in effect here but not saved: {message}");
        return Err(format!("cannot save the truncation: {message}"));
    }
    *entries = next;
    truncations.push.mark();
    Ok(removals)
}

/// When namespace `name`'s own threshold falls from `undone_ms`: its set
/// thresholds taken from copies that it may explain (at or below it),
/// undone with it, as (target, new entry).
fn carried_undone_with(
    entries: &BTreeMap<Target, Entry>,
    name: &str,
    undone_ms: u64,
) -> Vec<(Target, Entry)> {
    entries
        .iter()
        .filter(|((namespace, set), entry)| {
            namespace == name
                && set.is_some()
                && entry.carried
                && entry.lut_ms > 0
                && entry.lut_ms <= undone_ms
        })
        .map(|(target, entry)| (target.clone(), entry.changed_to(0)))
        .collect()
}

impl Distribution {
    /// Puts a checked truncation of `namespace` (or of its set `set`)
    /// at `lut_ms` into effect here: recorded (device, then file), marked
    /// for the push to the other members, and the records it covers
    /// removed. A truncation at or after it already in effect changes
    /// nothing.
    pub fn truncate(
        &self,
        namespace: Arc<Namespace>,
        set: Option<&str>,
        lut_ms: u64,
    ) -> Result<(), String> {
        let target: Target = (namespace.config.name.clone(), set.map(str::to_owned));
        let mut entries = self.truncations.entries.lock();
        let known = entries.get(&target).copied().unwrap_or_default();
        if known.lut_ms >= lut_ms {
            return Ok(());
        }
        let changes = vec![(target, known.changed_to(lut_ms))];
        let removals = commit(&self.truncations, &mut entries, &namespace, changes)?;
        drop(entries);
        for removal in removals {
            removal.run();
        }
        Ok(())
    }

    /// Undoes the truncation of `namespace` (or of its set `set`) in
    /// effect here: its threshold is removed (device, then file; a
    /// namespace's undo takes the set thresholds carried copies gave with
    /// it) and the change marked for the push. Nothing removed comes back
    /// (see the module doc). Without a truncation in effect, nothing
    /// changes.
    pub fn undo_truncation(
        &self,
        namespace: Arc<Namespace>,
        set: Option<&str>,
    ) -> Result<(), String> {
        let target: Target = (namespace.config.name.clone(), set.map(str::to_owned));
        let mut entries = self.truncations.entries.lock();
        let Some(known) = entries
            .get(&target)
            .copied()
            .filter(|known| known.lut_ms > 0)
        else {
            return Ok(());
        };
        let mut changes = vec![(target, known.changed_to(0))];
        if set.is_none() {
            changes.extend(carried_undone_with(
                &entries,
                &namespace.config.name,
                known.lut_ms,
            ));
        }
        commit(&self.truncations, &mut entries, &namespace, changes).map(|_| ())
    }

    /// Keeps truncations in `directory` from now on, and brings back the
    /// ones the file there holds (removing what they cover of the records
    /// just loaded). A line that is not understood is logged and dropped.
    pub fn keep_truncations(&self, directory: &Path) -> Result<(), String> {
        let path = directory.join(TRUNCATIONS_FILE);
        let text = crate::smd::read(&path)?;
        if self.truncations.file.set(path.clone()).is_err() {
            return Err("the truncations directory is already set".to_owned());
        }
        let (_, removals) = self.adopt_truncations(&text, &path.display().to_string());
        for removal in removals {
            removal.run();
        }
        let entries = self.truncations.entries.lock();
        self.truncations.save(&entries)
    }

    /// Merges a peer's truncations (the text its push carries); the records
    /// they cover are removed where the node runs background work
    /// ([`Distribution::set_background_runner`]).
    pub fn merge_truncations(&self, incoming: &str) {
        self.merge_truncations_from(incoming, "a peer");
    }

    /// Takes the threshold a copy of a record of `set` carried from its
    /// sender ([`crate::replication::apply_copy`]) when it is later than
    /// any this node ever knew for the set: the truncation's push has not
    /// arrived yet, and this node must not serve the set's older records
    /// should the sender fail before it does. The sender's threshold for a
    /// set is the later of the namespace's and the set's, so it is taken
    /// as the set's own (the namespace's for a record in no set), marked
    /// carried: never more than the sender truncated. The push, when it
    /// comes, brings the exact entry. A threshold at or below the highest
    /// known is from a sender that has not learned an undo yet.
    pub fn adopt_carried_truncation(&self, namespace: &str, set: &[u8], lut_ms: u64) {
        let set = match std::str::from_utf8(set) {
            Ok("") => None,
            Ok(set) => Some(set.to_owned()),
            Err(_) => return, // no set name a truncation line can carry
        };
        let target = (namespace.to_owned(), set);
        let known = self
            .truncations
            .entries
            .lock()
            .get(&target)
            .copied()
            .unwrap_or_default();
        if lut_ms <= known.highest_ms {
            return;
        }
        let carried = Entry {
            generation: known.generation,
            lut_ms,
            highest_ms: lut_ms,
            carried: true,
        };
        self.merge_truncations_from(&line(&target, &carried), "a copy's sender");
    }

    fn merge_truncations_from(&self, incoming: &str, from: &str) {
        let (changed, removals) = self.adopt_truncations(incoming, from);
        if changed {
            self.truncations.push.mark();
            let entries = self.truncations.entries.lock();
            if let Err(message) = self.truncations.save(&entries) {
                tracing::error!("merged truncations not saved: {message}");
            }
        }
        if !removals.is_empty() {
            // A merge arrives on the fabric's serving path or in an
            // exchange, neither of which may wait for a walk of every
            // partition: the server runs it on a thread of its own.
            self.run_in_background(Box::new(move || {
                for removal in removals {
                    removal.run();
                }
            }));
        }
    }

    /// Takes every line of `text` whose entry supersedes the one known
    /// (for a namespace this node has, in effect here too); returns
    /// whether any was taken, and the removals they call for.
    fn adopt_truncations(&self, text: &str, from: &str) -> (bool, Vec<Removal>) {
        let mut entries = self.truncations.entries.lock();
        let mut changed = false;
        let mut removals = Vec::new();
        for item in text.lines().map(str::trim).filter(|line| !line.is_empty()) {
            let (target, incoming) = match parse_line(item) {
                Ok(parsed) => parsed,
                Err(message) => {
                    tracing::warn!(
                        "a truncation from {from} is not understood ({message}): {item}"
                    );
                    continue;
                }
            };
            let known = entries.get(&target).copied().unwrap_or_default();
            let highest_ms = known.highest_ms.max(incoming.highest_ms);
            if !incoming.supersedes(&known) {
                if highest_ms > known.highest_ms && entries.contains_key(&target) {
                    entries.insert(
                        target,
                        Entry {
                            highest_ms,
                            ..known
                        },
                    );
                    changed = true;
                }
                continue;
            }
            let entry = Entry {
                highest_ms,
                ..incoming
            };
            let mut changes = vec![(target.clone(), entry)];
            if target.1.is_none() && entry.lut_ms < known.lut_ms {
                changes.extend(carried_undone_with(&entries, &target.0, known.lut_ms));
            }
            for (target, entry) in changes {
                if let Some(removal) = self.adopt_entry(&target, entry, from) {
                    removals.extend(removal);
                    entries.insert(target, entry);
                    changed = true;
                }
            }
        }
        (changed, removals)
    }

    /// Puts one merged entry into effect here; `None` when it could not
    /// be (not recorded: the next push brings it again), else the removal
    /// it calls for. A namespace this node does not have is only kept, and
    /// pushed on.
    fn adopt_entry(&self, target: &Target, entry: Entry, from: &str) -> Option<Option<Removal>> {
        let Some(namespace) = self.namespace_shared(target.0.as_bytes()) else {
            return Some(None);
        };
        let now_ms = self.now().unix_ms;
        if entry.lut_ms > now_ms.saturating_add(CLOCK_SKEW_WARN_MS) {
            tracing::warn!(namespace = %target.0, set = ?target.1, lut_ms = entry.lut_ms, now_ms, "a truncation from {from} is in the future: clock skew?");
        }
        match take_effect(&namespace, target.1.as_deref(), entry.lut_ms) {
            Ok(removal) => {
                tracing::info!(namespace = %target.0, set = ?target.1, lut_ms = entry.lut_ms, generation = entry.generation, "truncation taken from {from}");
                Some(removal)
            }
            Err(message) => {
                tracing::error!(namespace = %target.0, set = ?target.1, "truncation from {from} not taken: {message}");
                None
            }
        }
    }

    /// Every entry, one line each, undone ones included (what a push
    /// carries; the format is the file's, see the module doc).
    pub fn truncations_text(&self) -> String {
        text(&self.truncations.entries.lock())
    }

    /// Sends every threshold to `peer` and takes the ones its answer
    /// carries (the migration driver calls it once per peer in each view's
    /// exchange, before the exchange resolves). One attempt: a peer that
    /// does not answer gets the periodic pushes.
    /// False when the peer could not be reached (the caller tries again):
    /// any answer, even a refusal, counts as synced.
    pub async fn sync_truncations(&self, fabric: &dyn Fabric, peer: NodeId) -> bool {
        let text = self.truncations_text().into_bytes();
        match fabric
            .call(peer, call_kind::TRUNCATIONS, text, SYNC_TIMEOUT)
            .await
        {
            Ok(answer) => {
                match answer.split_first() {
                    Some((&code, rest)) if code == ResultCode::Ok.code() => {
                        match std::str::from_utf8(rest) {
                            Ok(text) => self.merge_truncations(text),
                            Err(_) => tracing::warn!(?peer, "a peer's truncations are not text"),
                        }
                    }
                    _ => tracing::warn!(?peer, "truncations not synced: answer {answer:?}"),
                }
                true
            }
            Err(error) => {
                tracing::debug!(?peer, "truncations not synced: {error:?}");
                false
            }
        }
    }

    /// Sends every threshold to every other member when a push is due (the
    /// migration driver calls it at each step, so the simulator runs the
    /// pushes too), without waiting for answers; true when one went out.
    pub fn push_truncations(&self) -> bool {
        crate::smd::push_to_peers_unanswered(
            self,
            &self.truncations.push,
            call_kind::TRUNCATIONS,
            || self.truncations_text(),
        )
    }
}
