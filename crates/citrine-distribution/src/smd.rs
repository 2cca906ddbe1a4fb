//! What the cluster's shared metadata stores have in common (the
//! reference's "system metadata"): truncations ([`crate::truncations`]),
//! and, above this layer, secondary-index definitions and UDF modules.
//!
//! Owns: [`Version`] (when and where an entry last changed: the later
//! change wins, the node id breaks a tie) and how a change made here picks
//! its version ([`next_version`]); writing a store's file atomically
//! ([`save_atomically`]); when a store is due to be pushed to the other
//! members ([`PushClock`]) and the push itself ([`push_to_peers_unanswered`]).
//!
//! Rules shared by the stores: every entry carries a version; a merge takes
//! an entry only when its version is newer than the one known here;
//! removals are kept as tombstones so a node that missed one cannot bring
//! the entry back; every change is pushed to every other member at once,
//! again after each view change, and every [`PUSH_EVERY_MS`].
//!
//! An info command that changes a store (the service's `Store::changed_by`)
//! answers only once every other member acknowledged the store with the
//! change (the service's `Service::sync_stores`, at most [`SYNC_TIMEOUT`]),
//! as the reference's index and UDF commands answer once the change is
//! committed cluster-wide: a client that deletes an index through one node and creates one under
//! that name through another finds the delete there. A member that does
//! not answer in time gets the change from the pushes that follow; the
//! answer still goes out, since the change is made and saved here.

use crate::Distribution;
use citrine_types::NodeId;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// The longest a change waits for a push to the peers that missed it.
pub const PUSH_EVERY_MS: u64 = 5_000;

/// How long one push to one peer may take.
pub const PUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// The longest a change's info answer waits for the other members.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(2);

/// When and where an entry last changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub ms: u64,
    pub node: u64,
}

impl Version {
    /// `version=MS.NODE` (node in hex), as the files and pushes carry it.
    pub fn param(&self) -> String {
        format!("version={}.{:x}", self.ms, self.node)
    }

    /// Parses the value of a `version=` parameter; an absent one (a line
    /// written before versions) is version 0.
    pub fn parse(text: Option<&str>) -> Result<Version, String> {
        let Some(text) = text else {
            return Ok(Version::default());
        };
        let bad = || format!("bad version {text:?}");
        let (ms, node) = text.split_once('.').ok_or_else(bad)?;
        Ok(Version {
            ms: ms.parse().map_err(|_| bad())?,
            node: u64::from_str_radix(node, 16).map_err(|_| bad())?,
        })
    }
}

/// The version of a change made on `node` at `now_ms` to an entry last
/// changed at `known`: now, but always later than `known` (a clock behind a
/// peer's, or two changes in one millisecond, must not make a change lose
/// to the one it follows).
pub fn next_version(known: Option<Version>, now_ms: u64, node: NodeId) -> Version {
    let after = known.map_or(0, |known| known.ms.saturating_add(1));
    Version {
        ms: now_ms.max(after),
        node: node.0,
    }
}

/// Replaces the file at `path` with `text`: a temporary file, fsync,
/// rename, directory fsync.
pub fn save_atomically(path: &Path, text: &str) -> Result<(), String> {
    let temporary = path.with_extension("tmp");
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

/// Reads a store's file; a missing file is an empty store.
pub fn read(path: &Path) -> Result<String, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(error) => Err(format!("cannot read {}: {error}", path.display())),
    }
}

/// When a store was last pushed, and whether a change is waiting.
#[derive(Default)]
pub struct PushClock {
    unpushed: AtomicBool,
    pushed_key: AtomicU64,
    pushed_ms: AtomicU64,
}

impl PushClock {
    /// A change the peers have not been sent yet.
    pub fn mark(&self) {
        self.unpushed.store(true, Ordering::Release);
    }

    /// Whether a push is due (a change waits, the view changed, or
    /// [`PUSH_EVERY_MS`] passed); when it is, records it as done.
    pub fn take_due(&self, cluster_key: u64, now_ms: u64) -> bool {
        let due = self.unpushed.load(Ordering::Acquire)
            || self.pushed_key.load(Ordering::Relaxed) != cluster_key
            || now_ms.saturating_sub(self.pushed_ms.load(Ordering::Relaxed)) >= PUSH_EVERY_MS;
        if due {
            self.unpushed.store(false, Ordering::Release);
            self.pushed_key.store(cluster_key, Ordering::Relaxed);
            self.pushed_ms.store(now_ms, Ordering::Relaxed);
        }
        due
    }
}

impl Distribution {
    /// The other members of the current view, and its cluster key.
    pub fn peers(&self) -> (Vec<NodeId>, u64) {
        let cluster = self.cluster();
        let peers = cluster
            .members
            .iter()
            .map(|member| member.node_id)
            .filter(|node| *node != self.node_id)
            .collect();
        (peers, cluster.cluster_key)
    }
}

/// Sends a store's `text()` to every other member when `clock` says a
/// push is due, for the migration driver: sends to every peer and waits
/// for no answer (a peer that misses the push gets the next one).
/// The driver must not wait on a dead peer: a push sent just before a
/// view change would hold the new view's partition-version exchange —
/// during which every request runs a duplicate resolution — for up to
/// [`PUSH_TIMEOUT`]. True when a push went out.
pub fn push_to_peers_unanswered(
    dist: &Distribution,
    clock: &PushClock,
    kind: u8,
    text: impl FnOnce() -> String,
) -> bool {
    let Some((fabric, peers, text)) = due_push(dist, clock, text) else {
        return false;
    };
    for peer in peers {
        // Sent by `call` itself (see `Fabric::call`); the answer is not
        // wanted.
        drop(fabric.call(peer, kind, text.as_bytes().to_vec(), PUSH_TIMEOUT));
    }
    true
}

/// The fabric, the peers and the text of a push when one is due (and there
/// is anyone to send a non-empty text to).
pub fn due_push(
    dist: &Distribution,
    clock: &PushClock,
    text: impl FnOnce() -> String,
) -> Option<(
    std::sync::Arc<dyn crate::replication::Fabric>,
    Vec<NodeId>,
    String,
)> {
    let fabric = dist.fabric()?;
    let (peers, cluster_key) = dist.peers();
    if peers.is_empty() || !clock.take_due(cluster_key, dist.now().unix_ms) {
        return None;
    }
    let text = text();
    (!text.is_empty()).then_some((fabric, peers, text))
}
