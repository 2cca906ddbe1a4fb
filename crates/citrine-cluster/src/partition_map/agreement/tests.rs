//! Members of views exchanging offers and decisions over a simulated
//! network: every member publishes the same map, whatever the mix of
//! switch settings, restarts and lost answers.

use super::*;
use crate::partition_map::placement::copies_moved;
use citrine_types::PartitionId;

const TIMEOUT: u64 = 100;

fn id(i: u64) -> NodeId {
    NodeId(0x0BB9_0000_11AC_4200 + (i << 32))
}

fn entries(ids: &[u64]) -> Vec<NodeEntry> {
    ids.iter()
        .map(|&i| NodeEntry {
            id: id(i),
            rack_id: 0,
        })
        .collect()
}

/// One simulated node: its state machine, what it published, and whether
/// it answers frames at all (a Citrine before this module does not).
struct Sim {
    agreement: Agreement,
    installed: Option<(u64, Vec<(String, PartitionMap)>)>,
    stalled: bool,
    understands: bool,
}

struct Net {
    nodes: BTreeMap<NodeId, Sim>,
    queue: Vec<(NodeId, NodeId, Vec<u8>)>,
    now: u64,
    /// Frames delivered, by receiver.
    received: BTreeMap<NodeId, usize>,
}

fn ns(rf: usize) -> Vec<(String, usize)> {
    vec![("test".to_owned(), rf)]
}

impl Net {
    fn new() -> Net {
        Net {
            nodes: BTreeMap::new(),
            queue: Vec::new(),
            now: 1,
            received: BTreeMap::new(),
        }
    }

    fn add(&mut self, i: u64, stable: Vec<(String, usize)>, understands: bool) {
        let sim = Sim {
            agreement: Agreement::new(id(i), stable, TIMEOUT),
            installed: None,
            stalled: false,
            understands,
        };
        self.nodes.insert(id(i), sim);
    }

    fn perform(&mut self, from: NodeId, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Send { to, frame } => {
                    for node in to {
                        self.queue.push((from, node, frame.clone()));
                    }
                }
                Action::Install { cluster_key, maps } => {
                    self.nodes.get_mut(&from).unwrap().installed = Some((cluster_key, maps));
                }
                Action::Stalled { .. } => self.nodes.get_mut(&from).unwrap().stalled = true,
                Action::Compute { cluster_key, jobs } => {
                    let placements = jobs.iter().map(Job::run).collect();
                    let node = self.nodes.get_mut(&from).unwrap();
                    let actions = node.agreement.computed(cluster_key, placements);
                    self.perform(from, actions);
                }
            }
        }
    }

    /// Commits view `key` of `members` on every node of it.
    fn view(&mut self, key: u64, members: &[u64]) {
        let view = entries(members);
        for &i in members {
            let node = self.nodes.get_mut(&id(i)).unwrap();
            node.installed = None;
            let actions = node.agreement.view_ready(key, &view, self.now);
            self.perform(id(i), actions);
        }
    }

    /// Delivers frames and ticks for `ms` milliseconds.
    fn run(&mut self, ms: u64) {
        let end = self.now + ms;
        while self.now < end {
            while let Some((from, to, bytes)) = self.queue.pop() {
                *self.received.entry(to).or_default() += 1;
                let Some(node) = self.nodes.get_mut(&to) else {
                    continue;
                };
                if !node.understands {
                    continue;
                }
                let frame = Frame::decode(&bytes).unwrap();
                let actions = node.agreement.on_frame(from, frame, self.now);
                self.perform(to, actions);
            }
            self.now += 10;
            let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
            for node in ids {
                let sim = self.nodes.get_mut(&node).unwrap();
                if sim.understands {
                    let actions = sim.agreement.tick(self.now);
                    self.perform(node, actions);
                }
            }
        }
    }

    /// The map `node` publishes for `test` (the paper's when not listed).
    fn map(&self, i: u64, members: &[u64], rf: usize) -> Option<PartitionMap> {
        let (_, maps) = self.nodes[&id(i)].installed.as_ref()?;
        Some(match maps.iter().find(|(name, _)| name == "test") {
            Some((_, map)) => map.clone(),
            None => paper(members, rf),
        })
    }

    /// Every member published view `key`, all with the same map; it.
    fn agreed(&self, key: u64, members: &[u64], rf: usize) -> PartitionMap {
        let first = self.map(members[0], members, rf).unwrap();
        for &i in members {
            let (installed_key, _) = self.nodes[&id(i)].installed.as_ref().unwrap();
            assert_eq!(*installed_key, key, "node {i}");
            assert_eq!(self.map(i, members, rf).unwrap(), first, "node {i}");
        }
        first
    }
}

fn paper(members: &[u64], rf: usize) -> PartitionMap {
    let config = PartitionMapConfig {
        replication_factor: rf,
        uniform_balance: true,
    };
    PartitionMap::compute(&entries(members), &config)
}

/// Copies of the new map on a node that held none of that partition.
fn moved(old: &PartitionMap, new: &PartitionMap) -> usize {
    PartitionId::all()
        .map(|p| {
            new.replicas(p)
                .iter()
                .filter(|node| !old.replicas(p).contains(node))
                .count()
        })
        .sum()
}

#[test]
fn all_on_agree_and_a_join_and_a_leave_move_little() {
    let mut net = Net::new();
    for i in 1..=5 {
        net.add(i, ns(2), true);
    }
    net.view(11, &[1, 2, 3, 4]);
    net.run(50);
    let first = net.agreed(11, &[1, 2, 3, 4], 2);
    // No base yet: the paper's map.
    assert_eq!(first, paper(&[1, 2, 3, 4], 2));
    net.view(12, &[1, 2, 3, 4, 5]);
    net.run(50);
    let joined = net.agreed(12, &[1, 2, 3, 4, 5], 2);
    assert!(!net.nodes[&id(5)].installed.as_ref().unwrap().1.is_empty());
    // Optimum: the joiner's share, 2 × 4096 / 5 = 1638.4 copies; at
    // most 1.25 × that.
    let join_moved = moved(&first, &joined);
    assert!(join_moved <= 2048, "join moved {join_moved}");
    net.view(13, &[1, 3, 4, 5]);
    net.run(50);
    let left = net.agreed(13, &[1, 3, 4, 5], 2);
    // Optimum: the leaver's copies, 2 × 4096 / 5.
    let leave_moved = moved(&joined, &left);
    assert!(leave_moved <= 2048, "leave moved {leave_moved}");
}

#[test]
fn at_30_nodes_a_join_moves_less_than_the_paper_map() {
    let mut net = Net::new();
    for i in 1..=31 {
        net.add(i, ns(2), true);
    }
    let thirty: Vec<u64> = (1..=30).collect();
    let all: Vec<u64> = (1..=31).collect();
    net.view(91, &thirty);
    net.run(50);
    let before = net.agreed(91, &thirty, 2);
    net.view(92, &all);
    net.run(50);
    let after = net.agreed(92, &all, 2);
    // Optimum 2 × 4096 / 31 = 264.3 copies.
    let stable = moved(&before, &after);
    let paper_moved = moved(&before, &paper(&all, 2));
    println!("join at 30 nodes: {stable} copies (paper map: {paper_moved})");
    assert!(stable <= 330, "{stable}");
    assert!(paper_moved > stable);
}

#[test]
fn the_decision_comes_after_one_round_trip_when_all_offer() {
    let mut net = Net::new();
    for i in 1..=3 {
        net.add(i, ns(2), true);
    }
    net.view(21, &[1, 2, 3]);
    net.run(10);
    net.agreed(21, &[1, 2, 3], 2);
}

#[test]
fn a_switch_off_member_keeps_everyone_on_the_paper_map() {
    let mut net = Net::new();
    for i in 1..=3 {
        net.add(i, ns(2), true);
    }
    net.add(4, Vec::new(), true);
    // A first stable view, so the placement differs from the paper's.
    net.view(31, &[1, 2, 3]);
    net.run(50);
    net.view(32, &[2, 3]);
    net.run(50);
    net.view(33, &[1, 2, 3, 4]);
    // The off member publishes at once; the others wait for the source.
    assert!(net.nodes[&id(4)].installed.is_some());
    net.run(3 * TIMEOUT);
    let map = net.agreed(33, &[1, 2, 3, 4], 2);
    assert_eq!(map, paper(&[1, 2, 3, 4], 2));
    // Node 4 is the source; nodes 1-3 offered it, it answered all-paper.
    // Now node 3 is the highest on: with node 4 gone it decides stable.
    net.view(34, &[1, 2, 3]);
    net.run(50);
    assert!(!net.nodes[&id(1)].installed.as_ref().unwrap().1.is_empty());
    net.agreed(34, &[1, 2, 3], 2);
}

#[test]
fn a_switch_off_member_that_is_not_the_source_hears_nothing() {
    let mut net = Net::new();
    net.add(1, Vec::new(), true);
    for i in 2..=3 {
        net.add(i, ns(2), true);
    }
    net.view(41, &[1, 2, 3]);
    net.run(3 * TIMEOUT);
    assert_eq!(net.received.get(&id(1)), None);
    assert_eq!(net.agreed(41, &[1, 2, 3], 2), paper(&[1, 2, 3], 2));
}

#[test]
fn an_older_source_leaves_the_offering_members_unpublished() {
    let mut net = Net::new();
    for i in 1..=2 {
        net.add(i, ns(2), true);
    }
    // Node 3 predates the agreement: it drops every frame.
    net.add(3, Vec::new(), false);
    net.view(51, &[1, 2, 3]);
    net.run(10 * TIMEOUT);
    for i in 1..=2 {
        assert!(net.nodes[&id(i)].installed.is_none(), "node {i} published");
        assert!(net.nodes[&id(i)].stalled, "node {i} did not report");
    }
}

#[test]
fn different_replication_factors_stay_on_the_paper_map() {
    let mut net = Net::new();
    net.add(1, ns(3), true);
    net.add(2, ns(2), true);
    net.view(61, &[1, 2]);
    net.run(3 * TIMEOUT);
    assert!(net.nodes[&id(2)].installed.as_ref().unwrap().1.is_empty());
    assert!(net.nodes[&id(1)].installed.as_ref().unwrap().1.is_empty());
}

#[test]
fn a_restarted_member_takes_the_sources_placement() {
    let mut net = Net::new();
    for i in 1..=4 {
        net.add(i, ns(2), true);
    }
    net.view(71, &[1, 2, 3, 4]);
    net.run(50);
    net.view(72, &[1, 2, 4]);
    net.run(50);
    let before = net.agreed(72, &[1, 2, 4], 2);
    // Node 3 restarts: no base, no memory of the views.
    net.add(3, ns(2), true);
    net.view(73, &[1, 2, 3, 4]);
    net.run(50);
    let after = net.agreed(73, &[1, 2, 3, 4], 2);
    assert_ne!(after, paper(&[1, 2, 3, 4], 2));
    assert!(moved(&before, &after) <= 2100, "{}", moved(&before, &after));
}

#[test]
fn decisions_from_elsewhere_or_for_other_members_are_ignored() {
    let members = entries(&[1, 2, 3]);
    let mut agreement = Agreement::new(id(1), ns(2), TIMEOUT);
    let actions = agreement.view_ready(81, &members, 0);
    assert!(matches!(&actions[..], [Action::Send { .. }]));
    let good = Decision {
        cluster_key: 81,
        placements: vec![("test".to_owned(), Placement::compute(None, &members, 2))],
    };
    // Not the source.
    let from_2 = agreement.on_frame(id(2), Frame::Decision(good.clone()), 1);
    assert!(from_2.is_empty());
    // Another view's key.
    let mut stale = good.clone();
    stale.cluster_key = 80;
    assert!(agreement
        .on_frame(id(3), Frame::Decision(stale), 1)
        .is_empty());
    // Other members.
    let mut other = good.clone();
    other.placements[0].1 = Placement::compute(None, &entries(&[1, 2, 3, 5]), 2);
    assert!(agreement
        .on_frame(id(3), Frame::Decision(other), 1)
        .is_empty());
    let actions = agreement.on_frame(id(3), Frame::Decision(good), 1);
    assert!(matches!(&actions[..], [Action::Install { cluster_key: 81, maps }] if maps.len() == 1));
}

#[test]
fn frames_round_trip_and_bad_bytes_are_refused() {
    let members = entries(&[1, 2, 3]);
    let offer = Frame::Offer(Offer {
        cluster_key: 7,
        namespaces: vec![
            OfferedNamespace {
                name: "bar".to_owned(),
                replication_factor: 3,
                base: 0,
            },
            OfferedNamespace {
                name: "test".to_owned(),
                replication_factor: 2,
                base: 99,
            },
        ],
    });
    let request = Frame::BaseRequest {
        cluster_key: 7,
        names: vec!["test".to_owned()],
    };
    let base = Frame::Base(Decision {
        cluster_key: 7,
        placements: vec![("test".to_owned(), Placement::compute(None, &members, 3))],
    });
    let decision = Frame::Decision(Decision {
        cluster_key: 7,
        placements: vec![("test".to_owned(), Placement::compute(None, &members, 2))],
    });
    for frame in [offer, decision, request, base] {
        let bytes = frame.encode();
        assert_eq!(Frame::decode(&bytes).unwrap(), frame);
        for cut in [0, 1, 2, bytes.len() / 2, bytes.len() - 1] {
            assert!(Frame::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Frame::decode(&longer).is_err());
        let mut version = bytes.clone();
        version[0] = 9;
        assert!(Frame::decode(&version).is_err());
    }
    // A cell naming a member that does not exist.
    let mut bytes = Frame::Decision(Decision {
        cluster_key: 7,
        placements: vec![("test".to_owned(), Placement::compute(None, &members, 2))],
    })
    .encode();
    let last = bytes.len() - 1;
    bytes[last] = 0x7f;
    assert!(Frame::decode(&bytes).is_err());
}

#[test]
fn paper_placement_is_the_paper_map() {
    let members = entries(&[1, 2, 3, 4, 5]);
    let placement = paper_placement(&members, 2);
    assert_eq!(
        placement.partition_map(2).unwrap(),
        paper(&[1, 2, 3, 4, 5], 2)
    );
    let moved_nothing = copies_moved(&placement, &Placement::compute(None, &members, 2), 2);
    assert_eq!(moved_nothing, 0);
}

#[test]
fn a_restarted_source_fetches_the_base_the_members_share() {
    let mut net = Net::new();
    for i in 1..=12 {
        net.add(i, ns(2), true);
    }
    // A history that takes the placement away from the paper's map; node
    // 12, the source throughout, keeps the base.
    let views: [&[u64]; 4] = [
        &[1, 2, 3, 4, 5, 6, 7, 8, 9, 12],
        &[1, 2, 3, 5, 6, 7, 8, 9, 12],
        &[1, 2, 3, 5, 6, 7, 8, 9, 11, 12],
        &[1, 2, 3, 5, 6, 8, 9, 10, 11, 12],
    ];
    for (key, members) in (101..).zip(views) {
        net.view(key, members);
        net.run(50);
    }
    let ten = views[3];
    let nine = &ten[..9];
    let before = net.agreed(104, ten, 2);
    // Node 12 restarts: it has no base and must fetch the one the others
    // share, or it would start again from the paper's map.
    net.add(12, ns(2), true);
    net.view(106, nine);
    net.run(50);
    let gone = net.agreed(106, nine, 2);
    net.view(107, ten);
    net.run(50);
    let back = net.agreed(107, ten, 2);
    // Optimum for each: 2 × 4096 / 10 = 819.2 copies.
    let (leave, join) = (moved(&before, &gone), moved(&gone, &back));
    let from_paper = moved(&gone, &paper(ten, 2));
    println!("source restart: leave {leave}, join {join} (paper map: {from_paper})");
    assert!(leave <= 1024 && join <= 1024, "leave {leave}, join {join}");
}

#[test]
fn a_base_that_never_comes_still_ends_in_one_decision() {
    let mut net = Net::new();
    for i in 1..=3 {
        net.add(i, ns(2), true);
    }
    net.view(111, &[1, 2, 3]);
    net.run(50);
    // Node 3 restarts; node 2 (the base's highest holder) stops answering
    // but still offers: the source decides from no base after a timeout.
    net.add(3, ns(2), true);
    let members = entries(&[1, 2, 3]);
    let offer = {
        let node = net.nodes.get_mut(&id(2)).unwrap();
        node.agreement.view_ready(112, &members, net.now);
        node.understands = false;
        node.agreement.offer_action(id(3), 112)
    };
    net.perform(id(2), vec![offer]);
    for i in [1, 3] {
        let node = net.nodes.get_mut(&id(i)).unwrap();
        let actions = node.agreement.view_ready(112, &members, net.now);
        net.perform(id(i), actions);
    }
    net.run(50);
    assert!(
        net.nodes[&id(3)].installed.is_none(),
        "decided before the timeout"
    );
    net.run(2 * TIMEOUT);
    let (key, maps) = net.nodes[&id(3)].installed.clone().unwrap();
    assert_eq!(key, 112);
    assert_eq!(maps.len(), 1);
    assert_eq!(net.nodes[&id(1)].installed, Some((key, maps)));
}
