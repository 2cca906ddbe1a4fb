//! Agreement of the stable placement between the members of a view
//! (`prefer-minimal-migration`, issue 45; see `docs/partition-balance.md`).
//!
//! Owns: [`Agreement`], the sans-I/O state machine every node runs per
//! committed view, and its two frames, [`Frame::Offer`] and
//! [`Frame::Decision`], with their versioned encoding.
//!
//! The stable [`Placement`] depends on the previous placement, which the
//! members of a new view do not share (a node may have restarted or come
//! from another view). So exactly one node decides: the view's *source*,
//! its highest node id (the same node `replicas` calls the principal).
//! 1. A member with the switch on for some namespaces sends the source an
//!    [`Offer`] naming them (with their replication factors) once it has
//!    the view and every member's rack, and again every `resend_ms` until
//!    it has a decision. A member with the switch off sends nothing and
//!    computes the paper's map ([`PartitionMap::compute`]) at once.
//! 2. The source waits until every other member has offered, or
//!    `timeout_ms`. A namespace is decided *stable* only when the source
//!    and every other member offered it with the same replication factor;
//!    its placement is [`Placement::compute`] from the source's base (the
//!    last map it installed for the namespace) and the view's members.
//!    Every other namespace stays on the paper's map. When the most
//!    shared base offered is not the source's own (a restarted source),
//!    it first fetches it ([`Frame::BaseRequest`], [`Frame::Base`]); the
//!    caller computes the placements ([`Action::Compute`], off its
//!    heartbeat thread) and hands them back. The source installs
//!    the decision and sends it to every member that offered (and to each
//!    later offer of the same view: the decision never changes).
//! 3. A member installs only the source's decision for its current view,
//!    after checking that each placement is over exactly the view's
//!    members and racks.
//!
//! Invariants (tested below):
//! - a namespace is on the stable placement on some member of a view only
//!   if every member offered it, so every member takes the decision, and
//!   the decision is one source's: no view ever has a split map;
//! - a node with the switch off (or a Citrine before it) never receives a
//!   frame of this module from a member with a view it is in, except as
//!   the source; a switch-off source answers every offer with an
//!   all-paper decision; a source that never answers (a Citrine without
//!   this module) leaves the offering members waiting, reported by
//!   [`Action::Stalled`];
//! - pure: no clock, I/O or randomness; the caller passes the time.

use std::collections::BTreeMap;

use citrine_types::{NodeId, PARTITIONS};

use super::{NodeEntry, PartitionMap, PartitionMapConfig, Placement};
use crate::codec::{DecodeError, Reader, Writer};
use crate::view::MAX_CLUSTER_SIZE;

/// Version byte leading every encoded frame.
pub const FRAME_VERSION: u8 = 1;
/// Most namespaces one frame names.
pub const MAX_NAMESPACES: usize = 32;
/// Longest namespace name.
const MAX_NAME: usize = 31;
const TAG_OFFER: u8 = 1;
const TAG_DECISION: u8 = 2;
const TAG_BASE_REQUEST: u8 = 3;
const TAG_BASE: u8 = 4;

/// One namespace of an [`Offer`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OfferedNamespace {
    pub name: String,
    pub replication_factor: usize,
    /// [`Placement::fingerprint`] of the offerer's base for it (0: none).
    pub base: u64,
}

/// A member's offer: the namespaces it would take a stable placement for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offer {
    pub cluster_key: u64,
    /// Sorted by name.
    pub namespaces: Vec<OfferedNamespace>,
}

/// The source's decision for a view: the namespaces on the stable
/// placement and their placements; every other namespace uses the paper's
/// map. Also the form of a [`Frame::Base`] answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub cluster_key: u64,
    pub placements: Vec<(String, Placement)>,
}

/// What travels between members.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    Offer(Offer),
    Decision(Decision),
    /// The source asks a member for its bases of these namespaces.
    BaseRequest {
        cluster_key: u64,
        names: Vec<String>,
    },
    /// A member's bases, answering a [`Frame::BaseRequest`].
    Base(Decision),
}

/// What the caller must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send the encoded frame to each of `to`.
    Send { to: Vec<NodeId>, frame: Vec<u8> },
    /// Publish view `cluster_key` with these maps; a namespace not listed
    /// uses the paper's map.
    Install {
        cluster_key: u64,
        maps: Vec<(String, PartitionMap)>,
    },
    /// No decision from `source` after `waited_ms` (reported once per
    /// view): the view cannot be published.
    Stalled { source: NodeId, waited_ms: u64 },
    /// Run the jobs (off the caller's heartbeat thread: a small cluster's
    /// rebalance takes tens of milliseconds) and hand the placements to
    /// [`Agreement::computed`].
    Compute { cluster_key: u64, jobs: Vec<Job> },
}

/// One placement the source must compute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    pub name: String,
    pub base: Option<Placement>,
    pub members: Vec<NodeEntry>,
    pub replication_factor: usize,
}

impl Job {
    /// The placement: [`Placement::compute`] from the base.
    pub fn run(&self) -> (String, Placement) {
        let placement =
            Placement::compute(self.base.as_ref(), &self.members, self.replication_factor);
        (self.name.clone(), placement)
    }
}

/// The source fetching the base most members share.
struct Fetch {
    started_ms: u64,
    /// Namespace → fingerprint of the base wanted.
    wanted: BTreeMap<String, u64>,
    got: BTreeMap<String, Placement>,
}

/// The view being agreed on.
struct ViewState {
    cluster_key: u64,
    members: Vec<NodeEntry>,
    source: NodeId,
    started_ms: u64,
    last_offer_ms: u64,
    /// Offers received (source only), this node's own included.
    offers: BTreeMap<NodeId, Vec<OfferedNamespace>>,
    fetch: Option<Fetch>,
    /// The placements are being computed (source only).
    computing: bool,
    decision: Option<Decision>,
    stalled_reported: bool,
}

/// The per-node agreement state machine. See the module documentation.
pub struct Agreement {
    self_id: NodeId,
    /// Namespaces with the switch on here, with their replication factors.
    stable: Vec<(String, usize)>,
    /// Last placement installed per stable namespace.
    bases: BTreeMap<String, Placement>,
    view: Option<ViewState>,
    timeout_ms: u64,
    resend_ms: u64,
}

impl Agreement {
    /// `stable`: the namespaces with the switch on (name, replication
    /// factor); `timeout_ms`: how long a source waits for offers, and then
    /// for a base it asked for.
    pub fn new(self_id: NodeId, mut stable: Vec<(String, usize)>, timeout_ms: u64) -> Agreement {
        stable.sort();
        stable.dedup_by(|a, b| a.0 == b.0);
        Agreement {
            self_id,
            stable,
            bases: BTreeMap::new(),
            view: None,
            timeout_ms: timeout_ms.max(1),
            resend_ms: (timeout_ms / 4).max(1),
        }
    }

    /// Whether any namespace has the switch on here.
    pub fn is_on(&self) -> bool {
        !self.stable.is_empty()
    }

    /// The view `cluster_key` of `members` (with their racks) is committed
    /// and every member's rack is known.
    pub fn view_ready(&mut self, cluster_key: u64, members: &[NodeEntry], now: u64) -> Vec<Action> {
        let mut members = members.to_vec();
        members.sort_unstable();
        members.dedup_by_key(|member| member.id);
        if let Some(view) = &self.view {
            if view.cluster_key == cluster_key && view.members == members {
                // The same view again: the same outcome.
                return match &view.decision {
                    Some(decision) => vec![self.install_action(&decision.clone())],
                    None if !self.is_on() => vec![paper_install(cluster_key)],
                    None => Vec::new(),
                };
            }
        }
        let source = members.last().map_or(self.self_id, |member| member.id);
        self.view = Some(ViewState {
            cluster_key,
            members,
            source,
            started_ms: now,
            last_offer_ms: now,
            offers: BTreeMap::new(),
            fetch: None,
            computing: false,
            decision: None,
            stalled_reported: false,
        });
        if !self.is_on() {
            return vec![paper_install(cluster_key)];
        }
        if source == self.self_id {
            let own = self.offered();
            if let Some(view) = self.view.as_mut() {
                view.offers.insert(self.self_id, own);
            }
            self.try_decide(now, false)
        } else {
            vec![self.offer_action(source, cluster_key)]
        }
    }

    /// The node left its view: nothing is pending any more.
    pub fn orphaned(&mut self) {
        self.view = None;
    }

    /// A frame from `from`.
    pub fn on_frame(&mut self, from: NodeId, frame: Frame, now: u64) -> Vec<Action> {
        match frame {
            Frame::Offer(offer) => self.on_offer(from, offer, now),
            Frame::Decision(decision) => self.on_decision(from, decision),
            Frame::BaseRequest { cluster_key, names } => {
                self.on_base_request(from, cluster_key, names)
            }
            Frame::Base(bases) => self.on_base(from, bases, now),
        }
    }

    /// Time passes: a source stops waiting, a member offers again.
    pub fn tick(&mut self, now: u64) -> Vec<Action> {
        let (timeout, resend, self_id) = (self.timeout_ms, self.resend_ms, self.self_id);
        let Some(view) = self.view.as_mut() else {
            return Vec::new();
        };
        if view.decision.is_some() || self.stable.is_empty() {
            return Vec::new();
        }
        let waited = now.saturating_sub(view.started_ms);
        if view.source == self_id {
            return self.try_decide(now, waited >= timeout);
        }
        let mut actions = Vec::new();
        if waited >= 4 * timeout && !view.stalled_reported {
            view.stalled_reported = true;
            actions.push(Action::Stalled {
                source: view.source,
                waited_ms: waited,
            });
        }
        if now.saturating_sub(view.last_offer_ms) >= resend {
            view.last_offer_ms = now;
            let (source, key) = (view.source, view.cluster_key);
            actions.push(self.offer_action(source, key));
        }
        actions
    }

    fn on_offer(&mut self, from: NodeId, offer: Offer, now: u64) -> Vec<Action> {
        let Some(view) = &self.view else {
            return Vec::new();
        };
        let member = view.members.iter().any(|entry| entry.id == from);
        if view.source != self.self_id || view.cluster_key != offer.cluster_key || !member {
            return Vec::new();
        }
        if !self.is_on() {
            // Off here: the whole view is on the paper's map.
            let paper = Decision {
                cluster_key: offer.cluster_key,
                placements: Vec::new(),
            };
            return vec![send(vec![from], &Frame::Decision(paper))];
        }
        if let Some(decision) = &view.decision {
            return vec![send(vec![from], &Frame::Decision(decision.clone()))];
        }
        if let Some(view) = self.view.as_mut() {
            view.offers.insert(from, offer.namespaces);
        }
        self.try_decide(now, false)
    }

    /// A member answers the source's request with its bases.
    fn on_base_request(&self, from: NodeId, cluster_key: u64, names: Vec<String>) -> Vec<Action> {
        let Some(view) = &self.view else {
            return Vec::new();
        };
        if view.source != from || view.cluster_key != cluster_key {
            return Vec::new();
        }
        let placements = names
            .into_iter()
            .filter_map(|name| {
                let base = self.bases.get(&name)?.clone();
                Some((name, base))
            })
            .collect();
        let bases = Decision {
            cluster_key,
            placements,
        };
        vec![send(vec![from], &Frame::Base(bases))]
    }

    /// The source receives bases it asked for.
    fn on_base(&mut self, from: NodeId, bases: Decision, now: u64) -> Vec<Action> {
        let Some(view) = self.view.as_mut() else {
            return Vec::new();
        };
        let member = view.members.iter().any(|entry| entry.id == from);
        let Some(fetch) = view.fetch.as_mut() else {
            return Vec::new();
        };
        if view.cluster_key != bases.cluster_key || !member {
            return Vec::new();
        }
        for (name, placement) in bases.placements {
            if fetch.wanted.get(&name) == Some(&placement.fingerprint()) {
                fetch.got.insert(name, placement);
            }
        }
        self.try_decide(now, false)
    }

    /// The source decides once every member offered (and the bases it
    /// asked for came, or `timeout_ms` passed), or when `forced`.
    fn try_decide(&mut self, now: u64, forced: bool) -> Vec<Action> {
        let timeout = self.timeout_ms;
        let Some(view) = &self.view else {
            return Vec::new();
        };
        let all_in = view.offers.len() == view.members.len();
        if view.decision.is_some() || view.computing || (!all_in && !forced) {
            return Vec::new();
        }
        let agreed = agreed_namespaces(&self.stable, &view.offers, all_in);
        match &view.fetch {
            None => {
                let requests = self.base_requests(&agreed);
                if !requests.is_empty() {
                    return self.start_fetch(requests, now);
                }
            }
            Some(fetch) => {
                let complete = fetch.got.len() == fetch.wanted.len();
                if !complete && now.saturating_sub(fetch.started_ms) < timeout {
                    return Vec::new();
                }
            }
        }
        self.decide(agreed)
    }

    /// For each agreed namespace whose most shared base is not this
    /// node's: (holder, namespace, fingerprint).
    fn base_requests(&self, agreed: &[(String, usize)]) -> Vec<(NodeId, String, u64)> {
        let Some(view) = &self.view else {
            return Vec::new();
        };
        agreed
            .iter()
            .filter_map(|(name, _)| {
                let (fingerprint, holder) = most_shared_base(&view.offers, name)?;
                let own = self.bases.get(name).map(Placement::fingerprint);
                (own != Some(fingerprint)).then(|| (holder, name.clone(), fingerprint))
            })
            .collect()
    }

    fn start_fetch(&mut self, requests: Vec<(NodeId, String, u64)>, now: u64) -> Vec<Action> {
        let Some(view) = self.view.as_mut() else {
            return Vec::new();
        };
        let mut by_holder: BTreeMap<NodeId, Vec<String>> = BTreeMap::new();
        let mut wanted = BTreeMap::new();
        for (holder, name, fingerprint) in requests {
            by_holder.entry(holder).or_default().push(name.clone());
            wanted.insert(name, fingerprint);
        }
        view.fetch = Some(Fetch {
            started_ms: now,
            wanted,
            got: BTreeMap::new(),
        });
        let cluster_key = view.cluster_key;
        by_holder
            .into_iter()
            .map(|(holder, names)| send(vec![holder], &Frame::BaseRequest { cluster_key, names }))
            .collect()
    }

    /// The source's decision: the agreed namespaces' placements from the
    /// fetched bases (else its own), computed by the caller.
    fn decide(&mut self, agreed: Vec<(String, usize)>) -> Vec<Action> {
        let Some(view) = &self.view else {
            return Vec::new();
        };
        if agreed.is_empty() {
            return self.finish(Vec::new());
        }
        let jobs = agreed
            .into_iter()
            .map(|(name, rf)| {
                let fetched = view.fetch.as_ref().and_then(|fetch| fetch.got.get(&name));
                let base = fetched.or_else(|| self.bases.get(&name)).cloned();
                Job {
                    name,
                    base,
                    members: view.members.clone(),
                    replication_factor: rf,
                }
            })
            .collect();
        let cluster_key = view.cluster_key;
        if let Some(view) = self.view.as_mut() {
            view.computing = true;
        }
        vec![Action::Compute { cluster_key, jobs }]
    }

    /// The placements of an [`Action::Compute`] for view `cluster_key`:
    /// the source installs its decision and sends it.
    pub fn computed(
        &mut self,
        cluster_key: u64,
        placements: Vec<(String, Placement)>,
    ) -> Vec<Action> {
        let Some(view) = &self.view else {
            return Vec::new();
        };
        if view.cluster_key != cluster_key || !view.computing || view.decision.is_some() {
            return Vec::new();
        }
        self.finish(placements)
    }

    /// Installs the decision made of `placements` and sends it to every
    /// member that offered.
    fn finish(&mut self, placements: Vec<(String, Placement)>) -> Vec<Action> {
        let Some(view) = &self.view else {
            return Vec::new();
        };
        let decision = Decision {
            cluster_key: view.cluster_key,
            placements,
        };
        let to: Vec<NodeId> = view
            .offers
            .keys()
            .copied()
            .filter(|&node| node != self.self_id)
            .collect();
        let mut actions = Vec::with_capacity(2);
        if !to.is_empty() {
            actions.push(send(to, &Frame::Decision(decision.clone())));
        }
        actions.push(self.install_action(&decision));
        if let Some(view) = self.view.as_mut() {
            view.decision = Some(decision);
        }
        actions
    }

    fn on_decision(&mut self, from: NodeId, decision: Decision) -> Vec<Action> {
        let Some(view) = &self.view else {
            return Vec::new();
        };
        let current = view.cluster_key == decision.cluster_key && view.source == from;
        if !current || view.decision.is_some() || !self.is_on() {
            return Vec::new();
        }
        let n = view.members.len();
        let fits = decision.placements.iter().all(|(name, placement)| {
            placement.members() == view.members.as_slice()
                && self
                    .stable
                    .iter()
                    .any(|(ours, rf)| ours == name && (*rf).min(n) == placement.depth())
        });
        if !fits {
            // Not over this view's members and racks (a rack this node
            // has not heard of yet): wait for the next offer's answer.
            return Vec::new();
        }
        let action = self.install_action(&decision);
        if let Some(view) = self.view.as_mut() {
            view.decision = Some(decision);
        }
        vec![action]
    }

    /// Installs `decision`: the bases become the maps published now.
    fn install_action(&mut self, decision: &Decision) -> Action {
        let members = self
            .view
            .as_ref()
            .map(|view| view.members.clone())
            .unwrap_or_default();
        let mut maps = Vec::with_capacity(decision.placements.len());
        for (name, rf) in &self.stable {
            let placement = match decision.placements.iter().find(|(n, _)| n == name) {
                Some((_, placement)) => {
                    if let Some(map) = placement.partition_map(*rf) {
                        maps.push((name.clone(), map));
                    }
                    placement.clone()
                }
                None => paper_placement(&members, *rf),
            };
            self.bases.insert(name.clone(), placement);
        }
        Action::Install {
            cluster_key: decision.cluster_key,
            maps,
        }
    }

    /// This node's offer: its stable namespaces and their bases.
    fn offered(&self) -> Vec<OfferedNamespace> {
        self.stable
            .iter()
            .map(|(name, rf)| OfferedNamespace {
                name: name.clone(),
                replication_factor: *rf,
                base: self.bases.get(name).map_or(0, Placement::fingerprint),
            })
            .collect()
    }

    fn offer_action(&self, source: NodeId, cluster_key: u64) -> Action {
        let offer = Offer {
            cluster_key,
            namespaces: self.offered(),
        };
        send(vec![source], &Frame::Offer(offer))
    }
}

/// The source's namespaces that every member offered with the same
/// replication factor (none unless `all_in`).
fn agreed_namespaces(
    stable: &[(String, usize)],
    offers: &BTreeMap<NodeId, Vec<OfferedNamespace>>,
    all_in: bool,
) -> Vec<(String, usize)> {
    stable
        .iter()
        .filter(|(name, rf)| {
            all_in
                && offers.values().all(|offered| {
                    offered
                        .iter()
                        .any(|o| &o.name == name && o.replication_factor == *rf)
                })
        })
        .cloned()
        .collect()
}

/// The base fingerprint most members offered for `name` (ties: the one
/// whose highest holder is highest), with its highest holder.
fn most_shared_base(
    offers: &BTreeMap<NodeId, Vec<OfferedNamespace>>,
    name: &str,
) -> Option<(u64, NodeId)> {
    let mut tally: BTreeMap<u64, (usize, NodeId)> = BTreeMap::new();
    for (&node, offered) in offers {
        let base = offered
            .iter()
            .find(|o| o.name == name)
            .map_or(0, |o| o.base);
        if base != 0 {
            let entry = tally.entry(base).or_insert((0, node));
            entry.0 += 1;
            entry.1 = entry.1.max(node);
        }
    }
    tally
        .into_iter()
        .max_by_key(|&(_, (count, holder))| (count, holder))
        .map(|(fingerprint, (_, holder))| (fingerprint, holder))
}

fn paper_install(cluster_key: u64) -> Action {
    Action::Install {
        cluster_key,
        maps: Vec::new(),
    }
}

fn send(to: Vec<NodeId>, frame: &Frame) -> Action {
    Action::Send {
        to,
        frame: frame.encode(),
    }
}

/// The paper's map of `members` as a placement (the base after a view on
/// the paper's map).
pub fn paper_placement(members: &[NodeEntry], replication_factor: usize) -> Placement {
    let config = PartitionMapConfig {
        replication_factor,
        uniform_balance: true,
    };
    let map = PartitionMap::compute(members, &config);
    let mut entries = members.to_vec();
    entries.sort_unstable();
    entries.dedup_by_key(|entry| entry.id);
    let cells: Vec<u16> = map
        .table
        .iter()
        .map(|id| entries.partition_point(|entry| entry.id < *id) as u16)
        .collect();
    let depth = map.replication_factor();
    Placement::from_parts(entries, depth, cells).unwrap_or_else(|| {
        // `compute` lists distinct members per partition: unreachable.
        Placement::compute(None, members, replication_factor)
    })
}

impl Frame {
    /// `version:u8 tag:u8 body` (little-endian): an offer (tag 1) is
    /// `key:u64 count:u16 (name rf:u16 base:u64)*`; a decision (tag 2) and
    /// a base (tag 4) are `key:u64 count:u16 (name depth:u16 members:u16
    /// (id:u64 rack:u64)* cell:u16*)*` with `4096 × depth` cells per
    /// placement; a base request (tag 3) is `key:u64 count:u16 name*`.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(FRAME_VERSION);
        match self {
            Frame::Offer(offer) => {
                w.u8(TAG_OFFER);
                w.u64(offer.cluster_key);
                w.count(offer.namespaces.len());
                for offered in &offer.namespaces {
                    w.bytes(offered.name.as_bytes());
                    w.count(offered.replication_factor);
                    w.u64(offered.base);
                }
            }
            Frame::Decision(decision) => put_placements(&mut w, TAG_DECISION, decision),
            Frame::BaseRequest { cluster_key, names } => {
                w.u8(TAG_BASE_REQUEST);
                w.u64(*cluster_key);
                w.count(names.len());
                for name in names {
                    w.bytes(name.as_bytes());
                }
            }
            Frame::Base(bases) => put_placements(&mut w, TAG_BASE, bases),
        }
        w.finish()
    }

    /// Parses [`Frame::encode`]'s bytes. Never panics; every placement is
    /// re-validated by [`Placement::from_parts`].
    pub fn decode(input: &[u8]) -> Result<Frame, DecodeError> {
        let mut r = Reader::new(input);
        let version = r.u8()?;
        if version != FRAME_VERSION {
            return Err(DecodeError::UnsupportedVersion(version));
        }
        let frame = match r.u8()? {
            TAG_OFFER => {
                let cluster_key = r.u64()?;
                let count = r.count(MAX_NAMESPACES)?;
                let mut namespaces = Vec::with_capacity(count);
                for _ in 0..count {
                    namespaces.push(OfferedNamespace {
                        name: get_name(&mut r)?,
                        replication_factor: r.count(usize::from(u16::MAX))?,
                        base: r.u64()?,
                    });
                }
                Frame::Offer(Offer {
                    cluster_key,
                    namespaces,
                })
            }
            TAG_DECISION => Frame::Decision(get_placements(&mut r)?),
            TAG_BASE_REQUEST => {
                let cluster_key = r.u64()?;
                let count = r.count(MAX_NAMESPACES)?;
                let mut names = Vec::with_capacity(count);
                for _ in 0..count {
                    names.push(get_name(&mut r)?);
                }
                Frame::BaseRequest { cluster_key, names }
            }
            TAG_BASE => Frame::Base(get_placements(&mut r)?),
            other => return Err(DecodeError::UnknownTag(other)),
        };
        r.finish()?;
        Ok(frame)
    }
}

fn put_placements(w: &mut Writer, tag: u8, decision: &Decision) {
    w.u8(tag);
    w.u64(decision.cluster_key);
    w.count(decision.placements.len());
    for (name, placement) in &decision.placements {
        w.bytes(name.as_bytes());
        put_placement(w, placement);
    }
}

fn get_placements(r: &mut Reader<'_>) -> Result<Decision, DecodeError> {
    let cluster_key = r.u64()?;
    let count = r.count(MAX_NAMESPACES)?;
    let mut placements = Vec::with_capacity(count);
    for _ in 0..count {
        let name = get_name(r)?;
        placements.push((name, get_placement(r)?));
    }
    Ok(Decision {
        cluster_key,
        placements,
    })
}

fn get_name(r: &mut Reader<'_>) -> Result<String, DecodeError> {
    let raw = r.bytes(MAX_NAME)?;
    std::str::from_utf8(raw)
        .map(str::to_owned)
        .map_err(|_| DecodeError::Invalid("namespace name"))
}

fn put_placement(w: &mut Writer, placement: &Placement) {
    w.count(placement.depth());
    w.count(placement.members().len());
    for member in placement.members() {
        w.u64(member.id.0);
        w.u64(u64::from(member.rack_id));
    }
    for &cell in placement.cells() {
        w.u16(cell);
    }
}

fn get_placement(r: &mut Reader<'_>) -> Result<Placement, DecodeError> {
    let depth = r.count(MAX_CLUSTER_SIZE)?;
    let count = r.count(MAX_CLUSTER_SIZE)?;
    let mut members = Vec::with_capacity(count);
    for _ in 0..count {
        let id = NodeId(r.u64()?);
        let rack_id = u32::try_from(r.u64()?).map_err(|_| DecodeError::Invalid("rack"))?;
        members.push(NodeEntry { id, rack_id });
    }
    if depth > count {
        return Err(DecodeError::Invalid("placement depth"));
    }
    let mut cells = Vec::with_capacity(PARTITIONS * depth);
    for _ in 0..PARTITIONS * depth {
        cells.push(r.u16()?);
    }
    Placement::from_parts(members, depth, cells).ok_or(DecodeError::Invalid("placement"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
