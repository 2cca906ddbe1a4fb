//! The strong-consistency rules wired into the node: each node's
//! [`ScVersion`] of every partition of every SC namespace, what it tells
//! the other members at each view's partition-version exchange, the
//! decision every member takes from the same inputs, and the SC partition
//! map ([`ScMap`]) the view publishes.
//!
//! Owns: [`ScPartitions`] (this node's versions and namespace regimes, the
//! file [`VERSIONS_FILE`] in the work directory, pending `revive:`s and
//! recluster requests), the exchange section ([`encode_section`],
//! [`decode_section`]), [`decide_view`] and [`ScMap`].
//!
//! At every view (see [`crate::migration`]): the snapshot a member answers
//! the exchange with ends, when the node has SC namespaces, with an SC
//! section (marker byte 0 — never a namespace name's length — and the
//! section's format byte [`SECTION_FORMAT`]): per SC namespace, the roster
//! in force as `roster:` prints it, the namespace regime, whether a
//! `revive:` waits, and every partition's version that is not the default.
//! A cluster without SC namespaces sends exactly the bytes it sent before.
//! With every member's section in, each runs [`decide_view`]: the rosters
//! must agree (else every partition is unavailable in this view and the
//! view is redone once the rosters converged), dead partitions are revived
//! when a member asked for it, the view's regime is two past every
//! regime a member knows ([`availability::view_regime`]), and
//! [`availability::decide`] / [`availability::next_versions`] give each
//! partition's verdict and this node's next version. The versions are saved
//! before the map is published.
//!
//! Restarts: the file brings the versions back. A namespace in memory, or
//! on a drive that came up blank (replaced under a kept work directory),
//! lost its copies ([`ScVersion::wiped`], its regime kept); one on devices
//! without `commit-to-device` may have lost its last writes
//! ([`ScVersion::evaded`]); with `commit-to-device` the versions stand.
//! So do they when the last shutdown was clean (as the reference, which
//! loses writes only to unclean shutdowns): every device namespace closed
//! to writes, flushed and synced, the versions saved, then
//! [`CLEAN_SHUTDOWN_FILE`] written; a start removes the mark before
//! anything else, so a crash later is never taken for clean. After an
//! unclean shutdown `auto-revive` keeps them too, accepting the loss of
//! the last unflushed writes, as an operator's `revive:` would (counted
//! in `auto_revived_partitions`).
//!
//! Invariants: the decision is a pure function of the roster, the
//! replication factor, the cluster key and the members' sections (their
//! order does not matter), so every member publishes the same [`ScMap`];
//! a node's namespace regime never decreases, across restarts too.

use super::availability::{self, Availability, Holding, Member, RosterPlacement, ScVersion};
use super::roster::NodeList;
use crate::Distribution;
use citrine_data::config::StorageEngineConfig;
use citrine_types::{NodeId, PartitionId, PARTITIONS};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// The versions file in the work directory.
pub const VERSIONS_FILE: &str = "sc-versions";
/// The mark of a clean shutdown in the work directory: written last at a
/// clean shutdown (every device namespace closed to writes, flushed and
/// synced; the versions saved), removed first at the next start.
pub const CLEAN_SHUTDOWN_FILE: &str = "sc-clean-shutdown";
/// The format byte after the SC section's marker.
pub const SECTION_FORMAT: u8 = 1;

/// What one member says about one SC namespace at the exchange.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScEntry {
    /// The roster in force, as `roster:` prints it.
    pub roster: String,
    /// The highest regime this node published for the namespace.
    pub regime: u32,
    /// A `revive:` waits for this view.
    pub revive: bool,
    /// Every partition's version, indexed by partition id.
    pub versions: Vec<ScVersion>,
}

/// Per SC namespace, one member's entry.
pub type ScSection = BTreeMap<String, ScEntry>;

/// One partition of an SC namespace in a view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScPartition {
    /// Served by these replicas, master first.
    Available(Vec<NodeId>),
    Unavailable,
    Dead,
}

/// The SC partition map of one namespace in one view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScMap {
    /// The view's regime (0: not decided).
    pub regime: u32,
    /// Indexed by partition id.
    pub partitions: Vec<ScPartition>,
    /// Partitions not available (dead ones included).
    pub unavailable: usize,
    pub dead: usize,
    /// Per partition, the nodes whose copies its fill may merge
    /// ([`availability::trusted_copies`]; empty when not available).
    pub trusted: Vec<Vec<NodeId>>,
}

impl ScMap {
    /// Every partition unavailable, in `regime`.
    pub fn unavailable(regime: u32) -> ScMap {
        ScMap {
            regime,
            partitions: vec![ScPartition::Unavailable; PARTITIONS],
            unavailable: PARTITIONS,
            dead: 0,
            trusted: vec![Vec::new(); PARTITIONS],
        }
    }

    /// From the verdicts and trusted copies, indexed by partition id.
    fn from_partitions(
        regime: u32,
        partitions: Vec<ScPartition>,
        trusted: Vec<Vec<NodeId>>,
    ) -> ScMap {
        let dead = partitions
            .iter()
            .filter(|p| matches!(p, ScPartition::Dead))
            .count();
        let available = partitions
            .iter()
            .filter(|p| matches!(p, ScPartition::Available(_)))
            .count();
        ScMap {
            regime,
            unavailable: partitions.len() - available,
            dead,
            partitions,
            trusted,
        }
    }

    /// The working replicas of `partition`, master first (empty when not
    /// available).
    pub fn replicas(&self, partition: PartitionId) -> &[NodeId] {
        match self.partitions.get(partition.index()) {
            Some(ScPartition::Available(replicas)) => replicas,
            _ => &[],
        }
    }

    /// The nodes whose copies `partition`'s fill may merge.
    pub fn trusted(&self, partition: PartitionId) -> &[NodeId] {
        self.trusted
            .get(partition.index())
            .map_or(&[], Vec::as_slice)
    }

    /// Whether `partition` is served in this view.
    pub fn is_available(&self, partition: PartitionId) -> bool {
        !self.replicas(partition).is_empty()
    }

    /// The partitions `node` holds in column `column` (0: master).
    pub fn column_of(&self, node: NodeId, column: usize) -> impl Iterator<Item = PartitionId> + '_ {
        PartitionId::all()
            .filter(move |&partition| self.replicas(partition).get(column) == Some(&node))
    }
}

/// This node's SC state of one namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
struct NamespaceSc {
    regime: u32,
    versions: Vec<ScVersion>,
    revive: bool,
    /// Copies kept at this start by `auto-revive` (not in the file).
    auto_revived: u32,
}

impl Default for NamespaceSc {
    fn default() -> NamespaceSc {
        NamespaceSc {
            regime: 0,
            versions: vec![ScVersion::default(); PARTITIONS],
            revive: false,
            auto_revived: 0,
        }
    }
}

/// This node's SC partition state (see the module documentation).
#[derive(Default)]
pub struct ScPartitions {
    namespaces: Mutex<BTreeMap<String, NamespaceSc>>,
    file: OnceLock<PathBuf>,
    /// `recluster:` or `revive:` asked for a new view.
    recluster: AtomicBool,
    /// Versions changed by fills and drops since the last save.
    dirty: AtomicBool,
    /// Per namespace, the roster the last decision used ("" after rosters
    /// that disagreed: the view is redone).
    decided_rosters: Mutex<BTreeMap<String, String>>,
}

/// The outcome of [`decide_view`] for one namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub map: ScMap,
    /// This node's next version of every partition.
    pub own: Vec<ScVersion>,
    /// This node's namespace regime from now on.
    pub regime: u32,
    /// The members' rosters agreed.
    pub agreed: bool,
}

/// Decides one SC namespace for a view: `entries` are every member's
/// (this node's, `self_id`, included), `replication_factor` the
/// namespace's, `cluster_key` the view's.
pub fn decide_view(
    self_id: NodeId,
    replication_factor: usize,
    cluster_key: u64,
    entries: &[(NodeId, &ScEntry)],
) -> Decision {
    let mut entries: Vec<(NodeId, &ScEntry)> = entries.to_vec();
    entries.sort_by_key(|(id, _)| *id);
    entries.dedup_by_key(|(id, _)| *id);
    let own_entry = entries
        .iter()
        .find(|(id, _)| *id == self_id)
        .map(|(_, e)| *e);
    let known = entries
        .iter()
        .flat_map(|(_, e)| {
            std::iter::once(e.regime).chain(e.versions.iter().map(|v| v.known_regime))
        })
        .max()
        .unwrap_or(0);
    let roster = own_entry.map(|e| e.roster.clone()).unwrap_or_default();
    let agreed = entries.iter().all(|(_, e)| e.roster == roster);
    let nodes = NodeList::parse(&roster).unwrap_or_default();
    let own_versions = own_entry.map_or_else(
        || vec![ScVersion::default(); PARTITIONS],
        |e| e.versions.clone(),
    );
    if !agreed || nodes.is_empty() {
        return Decision {
            map: ScMap::unavailable(0),
            own: own_versions,
            regime: known,
            agreed,
        };
    }
    let placement =
        RosterPlacement::with_active_rack(nodes.nodes(), replication_factor, nodes.active_rack);
    let regime = availability::view_regime(std::iter::once(known));
    let revive = entries.iter().any(|(_, e)| e.revive);
    let mut partitions = Vec::with_capacity(PARTITIONS);
    let mut trusted = Vec::with_capacity(PARTITIONS);
    let mut own = Vec::with_capacity(PARTITIONS);
    for partition in PartitionId::all() {
        let (verdict, copies, next) = decide_partition(
            &placement,
            partition,
            &entries,
            revive,
            regime,
            cluster_key,
            self_id,
        );
        partitions.push(verdict);
        trusted.push(copies);
        own.push(next.unwrap_or(own_versions[partition.index()]));
    }
    Decision {
        map: ScMap::from_partitions(regime, partitions, trusted),
        own,
        regime,
        agreed,
    }
}

/// One partition's verdict, the copies its fill may merge, and this
/// node's next version of it (`None` when this node gave no entry).
fn decide_partition(
    placement: &RosterPlacement,
    partition: PartitionId,
    entries: &[(NodeId, &ScEntry)],
    revive: bool,
    regime: u32,
    cluster_key: u64,
    self_id: NodeId,
) -> (ScPartition, Vec<NodeId>, Option<ScVersion>) {
    let mut members: Vec<Member> = entries
        .iter()
        .map(|(id, entry)| Member {
            id: *id,
            version: entry
                .versions
                .get(partition.index())
                .copied()
                .unwrap_or_default(),
        })
        .collect();
    let mut availability = availability::decide(placement, partition, &members);
    if availability == Availability::Dead {
        // The per-partition trace of a dead verdict (RUST_LOG=
        // citrine_distribution::sc=debug): what each member reported.
        tracing::debug!(partition = partition.index(), regime, ?members, "dead");
    }
    if revive && availability == Availability::Dead {
        let revived = availability::revive(&members);
        for (member, version) in members.iter_mut().zip(revived) {
            member.version = version;
        }
        availability = availability::decide(placement, partition, &members);
    }
    let next = availability::next_versions(&members, &availability, regime, cluster_key);
    let own = members
        .iter()
        .position(|m| m.id == self_id)
        .and_then(|at| next.get(at).copied());
    let trusted = availability
        .assignment()
        .map(|assignment| availability::trusted_copies(placement, &members, assignment))
        .unwrap_or_default();
    let verdict = match availability {
        Availability::Available(assignment) => ScPartition::Available(assignment.replicas),
        Availability::Unavailable => ScPartition::Unavailable,
        Availability::Dead => ScPartition::Dead,
    };
    (verdict, trusted, own)
}

/// Appends the SC section (see the module documentation): `0 | format |`
/// then per namespace `u8 len | name | u16 len | roster | u32 regime | u8
/// flags (1: revive) | u16 count | count × (u16 partition | u8 holding |
/// u32 copy regime | u32 known regime | u64 ckey | u8 flags (1 evade, 2
/// revived, 4 master))`, big-endian. Nothing for an empty section.
pub fn encode_section(out: &mut Vec<u8>, section: &ScSection) {
    if section.is_empty() {
        return;
    }
    out.push(0);
    out.push(SECTION_FORMAT);
    for (name, entry) in section {
        let name = &name.as_bytes()[..name.len().min(255)];
        out.push(name.len() as u8);
        out.extend_from_slice(name);
        let roster = &entry.roster.as_bytes()[..entry.roster.len().min(u16::MAX as usize)];
        out.extend_from_slice(&(roster.len() as u16).to_be_bytes());
        out.extend_from_slice(roster);
        out.extend_from_slice(&entry.regime.to_be_bytes());
        out.push(u8::from(entry.revive));
        let held: Vec<(usize, &ScVersion)> = entry
            .versions
            .iter()
            .enumerate()
            .filter(|(_, v)| **v != ScVersion::default())
            .collect();
        out.extend_from_slice(&(held.len() as u16).to_be_bytes());
        for (partition, version) in held {
            out.extend_from_slice(&(partition as u16).to_be_bytes());
            encode_version(out, version);
        }
    }
}

fn encode_version(out: &mut Vec<u8>, version: &ScVersion) {
    out.push(match version.holding {
        Holding::Absent => 0,
        Holding::Subset => 1,
        Holding::Full => 2,
    });
    out.extend_from_slice(&version.copy_regime.to_be_bytes());
    out.extend_from_slice(&version.known_regime.to_be_bytes());
    out.extend_from_slice(&version.ckey.to_be_bytes());
    out.push(
        u8::from(version.evade) | u8::from(version.revived) << 1 | u8::from(version.master) << 2,
    );
}

/// A byte cursor for [`decode_section`].
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, length: usize) -> Option<&'a [u8]> {
        let slice = self.bytes.get(self.at..self.at.checked_add(length)?)?;
        self.at += length;
        Some(slice)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
    fn done(&self) -> bool {
        self.at == self.bytes.len()
    }
}

/// The most SC namespaces a peer's section may carry (the reference's
/// limit on namespaces per node). Each decoded namespace costs a table of
/// every partition's version, so a section's size in memory must not grow
/// with a few bytes of input per namespace without bound.
pub const SECTION_MAX_NAMESPACES: usize = 32;

/// Decodes what follows the marker byte of an SC section (the format byte
/// first); `None` when malformed, of an unknown format, or naming more
/// than [`SECTION_MAX_NAMESPACES`] namespaces.
pub fn decode_section(bytes: &[u8]) -> Option<ScSection> {
    let mut cursor = Cursor { bytes, at: 0 };
    if cursor.u8()? != SECTION_FORMAT {
        return None;
    }
    let mut section = ScSection::new();
    while !cursor.done() {
        if section.len() == SECTION_MAX_NAMESPACES {
            return None;
        }
        let length = usize::from(cursor.u8()?);
        let name = std::str::from_utf8(cursor.take(length)?).ok()?.to_owned();
        let length = usize::from(cursor.u16()?);
        let roster = std::str::from_utf8(cursor.take(length)?).ok()?.to_owned();
        let regime = cursor.u32()?;
        let flags = cursor.u8()?;
        let mut versions = vec![ScVersion::default(); PARTITIONS];
        for _ in 0..cursor.u16()? {
            let partition = usize::from(cursor.u16()?);
            let version = decode_version(&mut cursor)?;
            *versions.get_mut(partition)? = version;
        }
        if name.is_empty() || flags > 1 || section.contains_key(&name) {
            return None;
        }
        let entry = ScEntry {
            roster,
            regime,
            revive: flags == 1,
            versions,
        };
        section.insert(name, entry);
    }
    Some(section)
}

fn decode_version(cursor: &mut Cursor<'_>) -> Option<ScVersion> {
    let holding = match cursor.u8()? {
        0 => Holding::Absent,
        1 => Holding::Subset,
        2 => Holding::Full,
        _ => return None,
    };
    let copy_regime = cursor.u32()?;
    let known_regime = cursor.u32()?;
    let ckey = cursor.u64()?;
    let flags = cursor.u8()?;
    if flags > 7 {
        return None;
    }
    Some(ScVersion {
        holding,
        copy_regime,
        known_regime,
        ckey,
        evade: flags & 1 != 0,
        revived: flags & 2 != 0,
        master: flags & 4 != 0,
    })
}

/// The versions file's text: one line per namespace,
/// `namespace=NS;regime=R;versions=P:H.C.K.CKEY.F,...` (hex; only the
/// partitions whose version is not the default).
fn file_text(namespaces: &BTreeMap<String, NamespaceSc>) -> String {
    let mut text = String::new();
    for (name, state) in namespaces {
        let versions: Vec<String> = state
            .versions
            .iter()
            .enumerate()
            .filter(|(_, v)| **v != ScVersion::default())
            .map(|(partition, v)| {
                let mut bytes = Vec::new();
                encode_version(&mut bytes, v);
                let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                format!("{partition:x}:{hex}")
            })
            .collect();
        text.push_str(&format!(
            "namespace={name};regime={:x};versions={}\n",
            state.regime,
            versions.join(",")
        ));
    }
    text
}

/// Parses one line of the versions file.
fn parse_line(line: &str) -> Option<(String, NamespaceSc)> {
    let field = |key: &str| {
        line.split(';')
            .find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
    };
    let name = field("namespace")?.to_owned();
    let regime = u32::from_str_radix(field("regime")?, 16).ok()?;
    let mut state = NamespaceSc {
        regime,
        ..NamespaceSc::default()
    };
    for item in field("versions")?
        .split(',')
        .filter(|item| !item.is_empty())
    {
        let (partition, hex) = item.split_once(':')?;
        let partition = usize::from_str_radix(partition, 16).ok()?;
        let bytes: Option<Vec<u8>> = (0..hex.len())
            .step_by(2)
            .map(|at| u8::from_str_radix(hex.get(at..at + 2)?, 16).ok())
            .collect();
        let bytes = bytes?;
        let mut cursor = Cursor {
            bytes: &bytes,
            at: 0,
        };
        *state.versions.get_mut(partition)? = decode_version(&mut cursor)?;
    }
    Some((name, state))
}

/// A version as a restart finds it: `memory` when the namespace keeps its
/// records in memory or its drive came up blank (its copy is gone; what
/// the node knew is in the file), else `committed` when every write reached the device before it
/// was acknowledged (the copy stands); otherwise the copy may have lost
/// its last writes and is not trusted.
fn after_restart(version: ScVersion, memory: bool, committed: bool) -> ScVersion {
    let version = ScVersion {
        master: false,
        ..version
    };
    if version.holding == Holding::Absent || (committed && !memory) {
        return version;
    }
    if memory {
        return ScVersion {
            holding: Holding::Absent,
            copy_regime: 0,
            evade: true,
            ..version
        };
    }
    version.evaded()
}

/// Every version as a restart finds it ([`after_restart`]); returns how
/// many copies (full or subset) were kept.
fn restart_versions(versions: &mut [ScVersion], memory: bool, whole: bool) -> u32 {
    let mut kept = 0;
    for version in versions {
        *version = after_restart(*version, memory, whole);
        kept += u32::from(version.holding != Holding::Absent && !version.evade);
    }
    kept
}

/// Whether the last shutdown marked `directory` clean; the mark is removed
/// (and the removal synced) first, so a crash of this run is never taken
/// for a clean shutdown.
fn take_clean_mark(directory: &Path) -> Result<bool, String> {
    let path = directory.join(CLEAN_SHUTDOWN_FILE);
    match std::fs::remove_file(&path) {
        Ok(()) => std::fs::File::open(directory)
            .and_then(|dir| dir.sync_all())
            .map(|()| true)
            .map_err(|error| format!("cannot sync {}: {error}", directory.display())),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(error) => Err(format!("cannot remove {}: {error}", path.display())),
    }
}

impl Distribution {
    /// Keeps the SC versions in `directory` from now on, and brings back
    /// the ones the file there holds, as a restart leaves them (see the
    /// module documentation). Call it once, before the first view.
    pub fn keep_sc_versions(&self, directory: &Path) -> Result<(), String> {
        let path = directory.join(VERSIONS_FILE);
        let text = crate::smd::read(&path)?;
        let sc = &self.sc_partitions;
        if sc.file.set(path).is_err() {
            return Err("the SC versions file is already set".to_owned());
        }
        let clean = take_clean_mark(directory)?;
        let mut namespaces = sc.namespaces.lock();
        for (name, mut state) in text.lines().filter_map(parse_line) {
            let Some(namespace) = self.namespace(name.as_bytes()) else {
                continue;
            };
            let (memory, committed) = match &namespace.config.storage_engine {
                StorageEngineConfig::Memory { .. } => (true, false),
                StorageEngineConfig::Device { engine, .. } => (false, engine.commit_to_device),
            };
            // A drive replaced (blank, formatted by this start) under a
            // kept work directory lost its copies as memory does. A clean
            // shutdown flushed and synced every acknowledged write: its
            // copies stand as with commit-to-device. After a crash
            // `auto-revive` keeps them too, accepting that the last
            // unflushed writes may be gone (what `revive:` accepts).
            let blank = namespace
                .storage
                .device()
                .is_some_and(|device| device.formatted_at_open());
            let lost = memory || blank;
            let revive = !lost && !committed && !clean && namespace.config.sc.auto_revive;
            let whole = committed || (!lost && clean) || revive;
            state.auto_revived = restart_versions(&mut state.versions, lost, whole);
            if revive {
                tracing::warn!(namespace = %name, "{} partitions auto-revived after an unclean shutdown: writes not yet flushed may be lost", state.auto_revived);
            } else {
                state.auto_revived = 0;
            }
            namespaces.insert(name, state);
        }
        self.save_sc_versions(&namespaces)
    }

    /// Clean shutdown, after every device namespace was closed to writes,
    /// flushed and synced: saves the versions and marks the work directory
    /// so that the next start keeps the device namespaces' copies. The lock is held to the end: no version changes between
    /// the save and the mark.
    pub fn mark_clean_shutdown(&self) -> Result<(), String> {
        let Some(path) = self.sc_partitions.file.get() else {
            return Ok(());
        };
        let namespaces = self.sc_partitions.namespaces.lock();
        self.save_sc_versions(&namespaces)?;
        self.sc_partitions.dirty.store(false, Ordering::Release);
        crate::smd::save_atomically(&path.with_file_name(CLEAN_SHUTDOWN_FILE), "clean\n")
    }

    /// The `auto_revived_partitions` statistic: copies of `namespace` this
    /// start kept by `auto-revive` after an unclean shutdown.
    pub fn sc_auto_revived(&self, namespace: &str) -> u32 {
        self.sc_partitions
            .namespaces
            .lock()
            .get(namespace)
            .map_or(0, |state| state.auto_revived)
    }

    fn save_sc_versions(&self, namespaces: &BTreeMap<String, NamespaceSc>) -> Result<(), String> {
        match self.sc_partitions.file.get() {
            Some(path) => crate::smd::save_atomically(path, &file_text(namespaces)),
            None => Ok(()),
        }
    }

    /// The SC namespaces' names, in configuration order.
    fn sc_namespace_names(&self) -> Vec<String> {
        self.namespaces()
            .filter(|namespace| namespace.config.sc.strong_consistency)
            .map(|namespace| namespace.config.name.clone())
            .collect()
    }

    /// This node's SC section for the exchange of a view being published.
    pub fn sc_section(&self) -> ScSection {
        let names = self.sc_namespace_names();
        let mut namespaces = self.sc_partitions.namespaces.lock();
        names
            .into_iter()
            .map(|name| {
                let state = namespaces.entry(name.clone()).or_default();
                let entry = ScEntry {
                    roster: self.roster_entry(&name).roster.encode(),
                    regime: state.regime,
                    revive: state.revive,
                    versions: state.versions.clone(),
                };
                (name, entry)
            })
            .collect()
    }

    /// Decides every SC namespace of the view `cluster_key` from the
    /// members' sections (this node's included), saves this node's next
    /// versions and returns each namespace's map.
    pub fn decide_sc(
        &self,
        cluster_key: u64,
        sections: &[(NodeId, &ScSection)],
    ) -> Vec<(String, ScMap)> {
        let mut maps = Vec::new();
        let mut namespaces = self.sc_partitions.namespaces.lock();
        let mut decided = self.sc_partitions.decided_rosters.lock();
        for name in self.sc_namespace_names() {
            let Some(namespace) = self.namespace(name.as_bytes()) else {
                continue;
            };
            let entries: Vec<(NodeId, &ScEntry)> = sections
                .iter()
                .filter_map(|(id, section)| section.get(&name).map(|entry| (*id, entry)))
                .collect();
            let rf = usize::from(namespace.config.replication_factor).max(1);
            let decision = decide_view(self.node_id, rf, cluster_key, &entries);
            let state = namespaces.entry(name.clone()).or_default();
            state.versions = decision.own;
            state.regime = state.regime.max(decision.regime);
            state.revive = false;
            let roster = entries
                .iter()
                .find(|(id, _)| *id == self.node_id)
                .map(|(_, e)| e.roster.clone())
                .unwrap_or_default();
            decided.insert(
                name.clone(),
                if decision.agreed {
                    roster
                } else {
                    String::new()
                },
            );
            if !decision.agreed {
                tracing::warn!(namespace = %name, "members disagree on the roster: every partition unavailable until the next view");
            }
            maps.push((name, decision.map));
        }
        self.sc_partitions.dirty.store(false, Ordering::Release);
        if let Err(error) = self.save_sc_versions(&namespaces) {
            tracing::error!("{error}: SC versions not saved; every SC partition unavailable");
            return maps
                .into_iter()
                .map(|(name, map)| (name, ScMap::unavailable(map.regime)))
                .collect();
        }
        maps
    }

    /// `revive:`: dead partitions of `namespace` are revived at the next
    /// view (which this asks for).
    pub fn request_revive(&self, namespace: &str) {
        self.sc_partitions
            .namespaces
            .lock()
            .entry(namespace.to_owned())
            .or_default()
            .revive = true;
        self.request_recluster();
    }

    /// Asks the cluster runtime for a new view (`recluster:`).
    pub fn request_recluster(&self) {
        self.sc_partitions.recluster.store(true, Ordering::Release);
    }

    /// Whether a new view is wanted: asked for, or an SC namespace's roster
    /// in force is not the one the last view decided with. The cluster
    /// runtime asks at each tick; only the principal acts on it.
    pub fn take_recluster_request(&self) -> bool {
        let asked = self.sc_partitions.recluster.swap(false, Ordering::AcqRel);
        let decided = self.sc_partitions.decided_rosters.lock().clone();
        let changed = self.sc_namespace_names().iter().any(|name| {
            decided
                .get(name)
                .is_some_and(|roster| *roster != self.roster_entry(name).roster.encode())
        });
        asked || changed
    }

    /// The fill of `partition` of SC namespace `namespace` ended on this
    /// node, a replica of it in the view with `cluster_key`: its copy holds
    /// the merge of every copy present, so it is full and inducted
    /// ([`availability::fill_complete`]). Ignored when a later view
    /// decided the partition since. Saved lazily ([`Distribution::save_sc_versions_if_dirty`]):
    /// lost, the node restarts with the subset it had, which only counts
    /// for less.
    pub fn sc_fill_complete(&self, namespace: &str, partition: PartitionId, cluster_key: u64) {
        self.sc_transition(namespace, partition, cluster_key, true);
    }

    /// This node's copy of `partition` of SC namespace `namespace`, outside
    /// the replica list of the view with `cluster_key`, was dropped:
    /// `inducted` once the replicas were filled
    /// ([`availability::drop_copies`]); otherwise an untrusted copy went at
    /// once, and the node holds nothing but stays as trusted as it was.
    pub fn sc_copy_dropped(
        &self,
        namespace: &str,
        partition: PartitionId,
        cluster_key: u64,
        inducted: bool,
    ) {
        if inducted {
            self.sc_transition(namespace, partition, cluster_key, false);
            return;
        }
        let mut namespaces = self.sc_partitions.namespaces.lock();
        let version = namespaces
            .get_mut(namespace)
            .and_then(|state| state.versions.get_mut(partition.index()));
        if let Some(version) = version.filter(|version| version.ckey == cluster_key) {
            version.holding = Holding::Absent;
            version.copy_regime = 0;
            self.sc_partitions.dirty.store(true, Ordering::Release);
        }
    }

    /// Applies [`availability::fill_complete`] (`replica`) or
    /// [`availability::drop_copies`] to this node's version.
    fn sc_transition(
        &self,
        namespace: &str,
        partition: PartitionId,
        cluster_key: u64,
        replica: bool,
    ) {
        let mut namespaces = self.sc_partitions.namespaces.lock();
        let Some(state) = namespaces.get_mut(namespace) else {
            return;
        };
        let Some(version) = state.versions.get_mut(partition.index()) else {
            return;
        };
        if version.ckey != cluster_key {
            return;
        }
        let member = [Member {
            id: self.node_id,
            version: *version,
        }];
        let assignment = availability::Assignment {
            rule: availability::Rule::Majority,
            replicas: if replica {
                vec![self.node_id]
            } else {
                Vec::new()
            },
            sources: Vec::new(),
            latest: version.copy_regime,
        };
        let next = match replica {
            true => availability::fill_complete(&member, &assignment),
            false => availability::drop_copies(&member, &assignment),
        };
        if let Some(next) = next.first() {
            if next != version {
                *version = *next;
                self.sc_partitions.dirty.store(true, Ordering::Release);
            }
        }
    }

    /// Saves the versions changed since the last save (fills and drops);
    /// the migration driver calls it when idle.
    pub fn save_sc_versions_if_dirty(&self) {
        if !self.sc_partitions.dirty.swap(false, Ordering::AcqRel) {
            return;
        }
        let namespaces = self.sc_partitions.namespaces.lock();
        if let Err(error) = self.save_sc_versions(&namespaces) {
            self.sc_partitions.dirty.store(true, Ordering::Release);
            tracing::error!("{error}: SC fills and drops not saved yet");
        }
    }

    /// This node's version of `partition` of SC namespace `namespace`.
    pub fn sc_version(&self, namespace: &str, partition: PartitionId) -> Option<ScVersion> {
        let namespaces = self.sc_partitions.namespaces.lock();
        namespaces
            .get(namespace)?
            .versions
            .get(partition.index())
            .copied()
    }

    /// This node's namespace regime of `namespace`.
    pub fn sc_regime(&self, namespace: &str) -> u32 {
        self.sc_partitions
            .namespaces
            .lock()
            .get(namespace)
            .map_or(0, |state| state.regime)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::sc::roster::RosterNode;

    /// The roster of nodes `ids` (rack 0), as `roster:` prints it.
    fn roster(ids: &[u64]) -> String {
        let nodes = ids
            .iter()
            .map(|&id| RosterNode {
                id: NodeId(id),
                rack_id: 0,
            })
            .collect();
        NodeList::new(nodes, None).unwrap().encode()
    }

    fn entry(roster: &str, regime: u32, versions: Vec<ScVersion>) -> ScEntry {
        ScEntry {
            roster: roster.to_owned(),
            regime,
            revive: false,
            versions,
        }
    }

    /// Every member decides the view of `entries` (node, entry): the maps
    /// they publish, which must be equal, and each member's next entry.
    fn view(key: u64, entries: &[(u64, ScEntry)]) -> (ScMap, Vec<(u64, ScEntry)>) {
        let refs: Vec<(NodeId, &ScEntry)> =
            entries.iter().map(|(id, e)| (NodeId(*id), e)).collect();
        let mut maps = Vec::new();
        let mut next = Vec::new();
        for (id, old) in entries {
            let decision = decide_view(NodeId(*id), 2, key, &refs);
            maps.push(decision.map);
            let regime = old.regime.max(decision.regime);
            next.push((*id, entry(&old.roster, regime, decision.own)));
        }
        assert!(
            maps.windows(2).all(|pair| pair[0] == pair[1]),
            "members agree"
        );
        (maps.remove(0), next)
    }

    #[test]
    fn a_new_roster_serves_everything_and_two_of_three_missing_serve_nothing() {
        let ids = [0xA1, 0xB2, 0xC3];
        let text = roster(&ids);
        let fresh: Vec<(u64, ScEntry)> = ids
            .iter()
            .map(|&id| (id, entry(&text, 0, vec![ScVersion::default(); PARTITIONS])))
            .collect();
        let (map, steady) = view(7, &fresh);
        assert_eq!((map.unavailable, map.dead, map.regime), (0, 0, 2));
        let placement = RosterPlacement::new(NodeList::parse(&text).unwrap().nodes(), 2);
        for partition in PartitionId::all() {
            assert_eq!(
                map.replicas(partition),
                placement.roster_replicas(partition)
            );
        }
        // Steady again: a later view, a higher regime, still everything.
        let (map, steady) = view(8, &steady);
        assert_eq!((map.unavailable, map.regime), (0, 4));
        // One node alone: nothing is available (no majority, never both
        // roster replicas), nothing dead (the roster is not whole).
        let (alone, after) = view(9, &steady[..1]);
        assert_eq!((alone.unavailable, alone.dead), (PARTITIONS, 0));
        // The others back: everything again, in a regime past every one.
        let mut back = after;
        back.extend(steady[1..].iter().cloned());
        let (map, _) = view(10, &back);
        assert_eq!(map.unavailable, 0);
        assert!(
            map.regime > alone.regime && alone.regime > 4,
            "{} {}",
            map.regime,
            alone.regime
        );
        // Two of three (a majority) serve every partition.
        let (pair, _) = view(11, &steady[1..]);
        assert_eq!(pair.unavailable, 0);
        assert!(PartitionId::all().all(|p| !pair.replicas(p).contains(&NodeId(0xA1))));
    }

    #[test]
    fn members_that_disagree_on_the_roster_serve_nothing() {
        let fresh =
            |id: u64, roster: &str| (id, entry(roster, 0, vec![ScVersion::default(); PARTITIONS]));
        let (map, _) = view(
            3,
            &[
                fresh(0xA1, &roster(&[0xA1, 0xB2])),
                fresh(0xB2, &roster(&[0xA1])),
            ],
        );
        assert_eq!(map.unavailable, PARTITIONS);
        let decision = decide_view(NodeId(0xA1), 2, 3, &[]);
        assert!(decision.agreed);
        assert_eq!(decision.map.unavailable, PARTITIONS, "no roster: nothing");
    }

    /// A roster with an active rack (`M2|`): the view masters every
    /// partition on that rack's node; without it both nodes master some.
    #[test]
    fn the_rosters_active_rack_masters_every_partition() {
        let masters_of = |roster: &str| {
            let entries: Vec<(u64, ScEntry)> = [0xA1, 0xB2]
                .iter()
                .map(|&id| (id, entry(roster, 0, vec![ScVersion::default(); PARTITIONS])))
                .collect();
            let (map, _) = view(7, &entries);
            assert_eq!(map.unavailable, 0);
            let on_b2 = map
                .partitions
                .iter()
                .filter(|p| matches!(p, ScPartition::Available(r) if r[0] == NodeId(0xB2)))
                .count();
            on_b2
        };
        assert_eq!(masters_of("M2|B2@2,A1@1"), PARTITIONS);
        let spread = masters_of("B2@2,A1@1");
        assert!(spread > 1000 && spread < PARTITIONS - 1000, "{spread}");
    }

    #[test]
    fn dead_partitions_come_back_only_when_a_member_asks_for_revive() {
        let ids = [0xA1, 0xB2];
        let text = roster(&ids);
        let evaded = ScVersion {
            holding: Holding::Full,
            copy_regime: 2,
            known_regime: 2,
            ..ScVersion::default()
        }
        .evaded();
        let entries: Vec<(u64, ScEntry)> = ids
            .iter()
            .map(|&id| (id, entry(&text, 2, vec![evaded; PARTITIONS])))
            .collect();
        let (map, next) = view(5, &entries);
        assert_eq!((map.unavailable, map.dead), (PARTITIONS, PARTITIONS));
        let mut asked = next;
        asked[1].1.revive = true;
        let (map, _) = view(6, &asked);
        assert_eq!((map.unavailable, map.dead), (0, 0));
    }

    #[test]
    fn sections_round_trip_and_refuse_garbage() {
        let mut versions = vec![ScVersion::default(); PARTITIONS];
        versions[4095] = ScVersion {
            holding: Holding::Subset,
            copy_regime: 9,
            known_regime: 11,
            ckey: 0xABCD,
            evade: true,
            revived: false,
            master: true,
        };
        let mut section = ScSection::new();
        section.insert(
            "sc".into(),
            ScEntry {
                revive: true,
                ..entry("A1@2", 11, versions)
            },
        );
        let mut bytes = Vec::new();
        encode_section(&mut bytes, &ScSection::new());
        assert!(bytes.is_empty(), "no SC namespace: no section");
        encode_section(&mut bytes, &section);
        assert_eq!(bytes[0], 0, "the marker");
        assert_eq!(decode_section(&bytes[1..]), Some(section.clone()));
        // (The format byte alone is an empty section.)
        for cut in 3..bytes.len() {
            assert_eq!(decode_section(&bytes[1..cut]), None, "cut {cut}");
        }
        let mut unknown = bytes.clone();
        unknown[1] = SECTION_FORMAT + 1;
        assert_eq!(decode_section(&unknown[1..]), None);
        // A peer naming more namespaces than a node can have is refused
        // before each costs a table of 4096 versions.
        let many: ScSection = (0..=SECTION_MAX_NAMESPACES)
            .map(|index| (format!("ns{index}"), entry("A1@2", 1, Vec::new())))
            .collect();
        let mut bytes = Vec::new();
        encode_section(&mut bytes, &many);
        assert_eq!(decode_section(&bytes[1..]), None);
        let mut bytes = Vec::new();
        let fewer: ScSection = many.into_iter().skip(1).collect();
        encode_section(&mut bytes, &fewer);
        assert_eq!(decode_section(&bytes[1..]).map(|s| s.len()), Some(32));
    }

    #[test]
    fn the_file_keeps_versions_and_a_restart_distrusts_what_it_may_have_lost() {
        let full = ScVersion {
            holding: Holding::Full,
            copy_regime: 6,
            known_regime: 6,
            ckey: 3,
            master: true,
            ..ScVersion::default()
        };
        let mut state = NamespaceSc {
            regime: 6,
            ..NamespaceSc::default()
        };
        state.versions[17] = full;
        let namespaces = BTreeMap::from([("sc".to_owned(), state.clone())]);
        let text = file_text(&namespaces);
        let (name, read) = parse_line(text.trim()).unwrap();
        assert_eq!((name.as_str(), &read), ("sc", &state));
        let kept = after_restart(full, false, true);
        assert!(!kept.evade && kept.holding == Holding::Full && !kept.master);
        assert!(after_restart(full, false, false).evade);
        let memory = after_restart(full, true, false);
        assert!(memory.evade && memory.holding == Holding::Absent && memory.known_regime == 6);
        let knows = ScVersion {
            known_regime: 6,
            ..ScVersion::default()
        };
        assert_eq!(after_restart(knows, true, false), knows);
    }
}
