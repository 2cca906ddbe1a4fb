//! Truncation of a namespace or of one set, for the whole cluster (the
//! reference's `truncate` system-metadata module): `truncate` and
//! `truncate-namespace` sent to any one node remove the records last
//! updated before the truncation's time on every node, as the official
//! clients expect (they send the command to a single node).
//!
//! Owns: the truncations this node knows ([`Truncations`]: the latest
//! last-update-time threshold, "lut", of each namespace and each
//! `(namespace, set)`), a checked truncation's taking effect here
//! ([`Distribution::truncate`]; the info commands that check one are the
//! service's), the merge of a peer's truncations, their pushes to the
//! peers, and the file `truncate.smd` in the work directory.
//!
//! Rules:
//! - a truncation's lut only grows: a command or a peer's entry with a lut
//!   at or below the one known changes nothing (the reference's conflict
//!   rule, the larger lut wins), so every order of pushes ends with the
//!   same thresholds on every node;
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
//!   and the file keeps every threshold (a memory namespace restarted empty
//!   still refuses older copies from a node that missed the command);
//! - pushed like the other shared metadata ([`crate::smd`]), but by the
//!   migration driver (an async task the simulator runs too): at once after
//!   a change (within the driver's idle poll), after every view change and
//!   every [`crate::smd::PUSH_EVERY_MS`]; and exchanged both ways with
//!   every peer during each view's partition-version exchange
//!   ([`Distribution::sync_truncations`], retried with the exchange until the
//!   peer answers), so a node that missed a truncation (down, or on the
//!   other side of a split) knows it before its exchange resolves and it
//!   serves or sends any copy;
//! - a truncation of a set this node has never stored gives the set its id
//!   here, so the threshold applies to records of it that arrive later;
//! - every copy of a record that travels between nodes (replica write,
//!   migration batch, duplicate-resolution answer) carries its sender's
//!   threshold for the record's set, and a receiver that knows an earlier
//!   one takes it as its own at once
//!   ([`Distribution::adopt_carried_truncation`]), before the push arrives.
//!
//! File format: one line per threshold, `namespace=NS;lut=MS` or
//! `namespace=NS;set=SET;lut=MS` (MS: Unix milliseconds), rewritten whole
//! (temporary file, fsync, rename) on every change. Pushes carry the same
//! lines. `truncate-undo` is not supported: a threshold cannot be lowered.

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

/// This node's truncation thresholds.
#[derive(Default)]
pub struct Truncations {
    /// Target → lut (Unix ms). Only grows.
    entries: Mutex<BTreeMap<Target, u64>>,
    /// The truncations file, once the server names its directory.
    file: OnceLock<PathBuf>,
    push: PushClock,
}

fn line((namespace, set): &Target, lut_ms: u64) -> String {
    match set {
        Some(set) => format!("namespace={namespace};set={set};lut={lut_ms}"),
        None => format!("namespace={namespace};lut={lut_ms}"),
    }
}

fn text(entries: &BTreeMap<Target, u64>) -> String {
    let mut text = String::new();
    for (target, lut_ms) in entries {
        text.push_str(&line(target, *lut_ms));
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

fn parse_line(text: &str) -> Result<(Target, u64), String> {
    let param = |key: &str| param(text, key);
    let namespace = param("namespace")
        .filter(|name| !name.is_empty())
        .ok_or("no namespace")?;
    let set = param("set").filter(|set| !set.is_empty());
    let lut_ms = param("lut")
        .and_then(|lut| lut.parse::<u64>().ok())
        .filter(|lut| *lut > 0)
        .ok_or("no valid lut")?;
    Ok(((namespace.to_owned(), set.map(str::to_owned)), lut_ms))
}

impl Truncations {
    fn save(&self, entries: &BTreeMap<Target, u64>) -> Result<(), String> {
        match self.file.get() {
            Some(path) => crate::smd::save_atomically(path, &text(entries)),
            None => Ok(()),
        }
    }
}

impl Distribution {
    /// Puts a checked truncation of `namespace` (or of its set `set`)
    /// at `lut_ms` into effect here: recorded (device, then file), marked
    /// for the push to the other members, and the records it covers
    /// removed. An equal or later truncation already in effect changes
    /// nothing.
    pub fn truncate(
        &self,
        namespace: Arc<Namespace>,
        set: Option<&str>,
        lut_ms: u64,
    ) -> Result<(), String> {
        let target: Target = (namespace.config.name.clone(), set.map(str::to_owned));
        let mut entries = self.truncations.entries.lock();
        if entries.get(&target).is_some_and(|known| *known >= lut_ms) {
            return Ok(());
        }
        let set_id = take_effect(&namespace, set, lut_ms)?;
        let mut next = entries.clone();
        next.insert(target, lut_ms);
        if let Err(message) = self.truncations.save(&next) {
            tracing::error!("truncation in effect here but not saved: {message}");
            return Err(format!("cannot save the truncation: {message}"));
        }
        *entries = next;
        self.truncations.push.mark();
        drop(entries);
        Removal {
            namespace,
            set_id,
            lut_ms,
        }
        .run();
        Ok(())
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
    /// sender ([`crate::replication::apply_copy`]) when it is later than the
    /// one known here: the truncation's push has not arrived yet, and this
    /// node must not serve the set's older records should the sender fail
    /// before it does. The sender's threshold for a set is the later of the
    /// namespace's and the set's, so it is taken as the set's own (the
    /// namespace's for a record in no set): never more than the sender
    /// truncated. The push, when it comes, brings the exact entry.
    pub fn adopt_carried_truncation(&self, namespace: &str, set: &[u8], lut_ms: u64) {
        let set = match std::str::from_utf8(set) {
            Ok("") => None,
            Ok(set) => Some(set.to_owned()),
            Err(_) => return, // no set name a truncation line can carry
        };
        let entry = line(&(namespace.to_owned(), set), lut_ms);
        self.merge_truncations_from(&entry, "a copy's sender");
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

    /// Takes every line of `text` whose lut is later than the one known
    /// (for a namespace this node has); returns whether any was taken, and
    /// the removals they call for.
    fn adopt_truncations(&self, text: &str, from: &str) -> (bool, Vec<Removal>) {
        let mut entries = self.truncations.entries.lock();
        let mut changed = false;
        let mut removals = Vec::new();
        for item in text.lines().map(str::trim).filter(|line| !line.is_empty()) {
            let (target, lut_ms) = match parse_line(item) {
                Ok(parsed) => parsed,
                Err(message) => {
                    tracing::warn!(
                        "a truncation from {from} is not understood ({message}): {item}"
                    );
                    continue;
                }
            };
            if entries.get(&target).is_some_and(|known| *known >= lut_ms) {
                continue;
            }
            let Some(namespace) = self.namespace_shared(target.0.as_bytes()) else {
                // A namespace this node does not have: kept, so it is
                // pushed on, but nothing here to truncate.
                entries.insert(target, lut_ms);
                changed = true;
                continue;
            };
            let now_ms = self.now().unix_ms;
            if lut_ms > now_ms.saturating_add(CLOCK_SKEW_WARN_MS) {
                tracing::warn!(namespace = %target.0, set = ?target.1, lut_ms, now_ms, "a truncation from {from} is in the future: clock skew?");
            }
            match take_effect(&namespace, target.1.as_deref(), lut_ms) {
                Ok(set_id) => {
                    tracing::info!(namespace = %target.0, set = ?target.1, lut_ms, "truncation taken from {from}");
                    entries.insert(target, lut_ms);
                    changed = true;
                    removals.push(Removal {
                        namespace,
                        set_id,
                        lut_ms,
                    });
                }
                // Not recorded: the next push brings it again.
                Err(message) => {
                    tracing::error!(namespace = %target.0, set = ?target.1, "truncation from {from} not taken: {message}")
                }
            }
        }
        (changed, removals)
    }

    /// Every threshold, one line each (what a push carries):
    /// `namespace=NS;[set=S;]lut=MS`.
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
