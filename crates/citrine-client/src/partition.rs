//! The client's partition map: parsing the `replicas` info answer
//! (03-info §2.5) and the per-namespace table of which node holds each
//! partition in each replica column (column 0 = master).
//!
//! Invariants:
//! - every bitmap accepted is exactly 684 base64 characters decoding to 512
//!   bytes (4096 bits, MSB-first: partition p is bit `0x80 >> (p & 7)` of
//!   byte `p >> 3`);
//! - an entry names the node whose claim has the highest regime among
//!   every known node's latest answer, the most recent answer among
//!   equals. A node whose claim shrinks leaves the partition to the other
//!   nodes' claims instead of leaving it unmapped, so the order in which
//!   nodes are refreshed during a view change never loses a partition (a
//!   node that restarted and claimed everything alone for a moment, then
//!   joined, would otherwise blank out partitions the others claimed
//!   before it);
//! - a partition no answer claims keeps the node it named, while that node
//!   is known (as the official clients keep it): claims move between
//!   answers fetched at different moments — an acting master hands a
//!   partition back to its master just before the master's copy is whole,
//!   and the client may see the one answer before the other — and a
//!   request sent to the last claimant is still served or redirected; a
//!   removed node's entries are forgotten.

use base64::Engine as _;
use citrine_types::{NodeId, PARTITIONS};
use std::collections::HashMap;

/// Length of one base64 bitmap.
pub const BITMAP_BASE64_LEN: usize = 684;
/// Length of one decoded bitmap.
pub const BITMAP_BYTES: usize = PARTITIONS / 8;

/// One namespace of a `replicas` answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceReplicas {
    pub namespace: String,
    pub regime: u32,
    /// Columns in order: master, first replica, ...
    pub columns: Vec<Vec<u8>>,
}

impl NamespaceReplicas {
    /// Whether the node that sent this owns partition `p` in `column`.
    pub fn owns(&self, column: usize, partition: usize) -> bool {
        self.columns
            .get(column)
            .and_then(|bitmap| bitmap.get(partition >> 3))
            .is_some_and(|byte| byte & (0x80 >> (partition & 7)) != 0)
    }

    /// Number of partitions owned in `column`.
    pub fn count(&self, column: usize) -> usize {
        self.columns.get(column).map_or(0, |bitmap| {
            bitmap.iter().map(|byte| byte.count_ones() as usize).sum()
        })
    }
}

/// Parses a `replicas` value: `<ns>:<regime>,<n>,<b64>,...;<ns>:...`. The
/// legacy `replicas-all` form `<ns>:<n>,<b64>,...` (no regime) is accepted too.
pub fn parse_replicas(text: &str) -> Result<Vec<NamespaceReplicas>, String> {
    let mut out = Vec::new();
    for item in text.trim().split(';').filter(|item| !item.is_empty()) {
        let (namespace, rest) = item
            .split_once(':')
            .ok_or_else(|| format!("missing ':' in replicas item {item:?}"))?;
        if namespace.is_empty() || namespace.len() > citrine_types::NAMESPACE_NAME_MAX {
            return Err(format!(
                "invalid namespace name length in replicas: {namespace:?}"
            ));
        }
        let parts: Vec<&str> = rest.split(',').collect();
        let number = |text: &str, what: &str| {
            text.parse::<u32>()
                .map_err(|e| format!("{what} {text:?} for {namespace}: {e}"))
        };
        let (regime, n_replicas, bitmaps) = match parts.as_slice() {
            [first, second, bitmaps @ ..] if second.len() != BITMAP_BASE64_LEN => (
                number(first, "regime")?,
                number(second, "replica count")? as usize,
                bitmaps,
            ),
            [first, bitmaps @ ..] => (0, number(first, "replica count")? as usize, bitmaps),
            [] => return Err(format!("empty replicas item for {namespace}")),
        };
        if n_replicas != bitmaps.len() {
            return Err(format!(
                "{namespace}: replica count {n_replicas} but {} bitmaps",
                bitmaps.len()
            ));
        }
        let mut columns = Vec::with_capacity(bitmaps.len());
        for bitmap in bitmaps {
            columns.push(decode_bitmap(bitmap).map_err(|e| format!("{namespace}: {e}"))?);
        }
        out.push(NamespaceReplicas {
            namespace: namespace.to_owned(),
            regime,
            columns,
        });
    }
    Ok(out)
}

/// Decodes one 684-character bitmap.
pub fn decode_bitmap(text: &str) -> Result<Vec<u8>, String> {
    if text.len() != BITMAP_BASE64_LEN {
        return Err(format!(
            "bitmap has {} characters, expected {BITMAP_BASE64_LEN}",
            text.len()
        ));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| format!("bitmap base64: {e}"))?;
    if bytes.len() != BITMAP_BYTES {
        return Err(format!(
            "bitmap decodes to {} bytes, expected {BITMAP_BYTES}",
            bytes.len()
        ));
    }
    Ok(bytes)
}

/// Encodes a 512-byte bitmap (used by test servers and the no-op responder).
pub fn encode_bitmap(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Which node holds each partition of one namespace, per replica column.
#[derive(Clone, Debug)]
pub struct NamespaceTable {
    /// `columns[c][p]` = node holding partition p in column c.
    pub columns: Vec<Vec<Option<NodeId>>>,
    /// Last regime applied per partition (strong consistency).
    pub regimes: Vec<u32>,
}

impl Default for NamespaceTable {
    fn default() -> NamespaceTable {
        NamespaceTable {
            columns: Vec::new(),
            regimes: vec![0; PARTITIONS],
        }
    }
}

impl NamespaceTable {
    /// Node of partition `p` in `column`, if known.
    pub fn node(&self, column: usize, partition: usize) -> Option<NodeId> {
        self.columns
            .get(column)
            .and_then(|col| col.get(partition))
            .copied()
            .flatten()
    }

    /// Number of replica columns known.
    pub fn replicas(&self) -> usize {
        self.columns.len()
    }
}

/// Partition tables of every namespace the cluster answered for.
#[derive(Clone, Debug, Default)]
pub struct PartitionMap {
    pub namespaces: HashMap<String, NamespaceTable>,
    /// Each node's latest answer and when it was applied (a sequence).
    answers: HashMap<NodeId, (u64, Vec<NamespaceReplicas>)>,
    applied: u64,
}

impl PartitionMap {
    /// Applies one node's `replicas` answer.
    pub fn apply(&mut self, node: NodeId, answer: &[NamespaceReplicas]) {
        self.applied += 1;
        self.answers.insert(node, (self.applied, answer.to_vec()));
        self.rebuild();
    }

    /// Forgets every entry naming `node` (it left the cluster).
    pub fn remove_node(&mut self, node: NodeId) {
        if self.answers.remove(&node).is_some() {
            self.rebuild();
        }
    }

    fn rebuild(&mut self) {
        let previous = std::mem::take(&mut self.namespaces);
        let mut namespaces: HashMap<String, NamespaceTable> = HashMap::new();
        // Oldest first, so a later answer replaces an earlier one of the
        // same regime.
        let mut answers: Vec<(&NodeId, &(u64, Vec<NamespaceReplicas>))> =
            self.answers.iter().collect();
        answers.sort_by_key(|(_, (applied, _))| *applied);
        for (node, (_, answer)) in answers {
            for namespace in answer {
                let table = namespaces.entry(namespace.namespace.clone()).or_default();
                while table.columns.len() < namespace.columns.len() {
                    table.columns.push(vec![None; PARTITIONS]);
                }
                for (column_index, column) in table.columns.iter_mut().enumerate() {
                    for (partition, entry) in column.iter_mut().enumerate() {
                        if namespace.owns(column_index, partition)
                            && namespace.regime >= table.regimes[partition]
                        {
                            *entry = Some(*node);
                            table.regimes[partition] = namespace.regime;
                        }
                    }
                }
            }
        }
        // Unclaimed now: the last claimant, while it is known.
        for (name, table) in &mut namespaces {
            let Some(before) = previous.get(name) else {
                continue;
            };
            for (column, entries) in table.columns.iter_mut().enumerate() {
                for (partition, entry) in entries.iter_mut().enumerate() {
                    if entry.is_some() {
                        continue;
                    }
                    if let Some(node) = before.node(column, partition) {
                        if self.answers.contains_key(&node) {
                            *entry = Some(node);
                            table.regimes[partition] =
                                table.regimes[partition].max(before.regimes[partition]);
                        }
                    }
                }
            }
        }
        self.namespaces = namespaces;
    }

    /// Node of `partition` of `namespace` in `column`.
    pub fn node(&self, namespace: &str, column: usize, partition: usize) -> Option<NodeId> {
        self.namespaces
            .get(namespace)
            .and_then(|table| table.node(column, partition))
    }

    /// Number of replica columns known for `namespace` (0 if unknown).
    pub fn replicas(&self, namespace: &str) -> usize {
        self.namespaces
            .get(namespace)
            .map_or(0, NamespaceTable::replicas)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_ones() -> String {
        encode_bitmap(&[0xFF; BITMAP_BYTES])
    }

    fn bitmap_of(partitions: &[usize]) -> String {
        let mut bytes = vec![0u8; BITMAP_BYTES];
        for p in partitions {
            bytes[p >> 3] |= 0x80 >> (p & 7);
        }
        encode_bitmap(&bytes)
    }

    #[test]
    fn all_ones_bitmap_is_the_reference_text() {
        let text = all_ones();
        assert_eq!(text.len(), 684);
        assert_eq!(&text[..682], "/".repeat(682));
        assert_eq!(&text[682..], "8=");
    }

    #[test]
    fn single_node_answer() {
        let text = format!("test:0,1,{};bar:0,1,{}", all_ones(), all_ones());
        let parsed = parse_replicas(&text).expect("parses");
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[0].namespace, "test");
        assert_eq!(parsed[0].count(0), 4096);
        let mut map = PartitionMap::default();
        map.apply(NodeId(7), &parsed);
        assert_eq!(map.node("test", 0, 0), Some(NodeId(7)));
        assert_eq!(map.node("bar", 0, 4095), Some(NodeId(7)));
        assert_eq!(map.node("bar", 1, 4095), None);
        assert_eq!(map.node("nope", 0, 1), None);
    }

    #[test]
    fn bit_order_is_msb_first() {
        let parsed =
            parse_replicas(&format!("ns:0,1,{}", bitmap_of(&[0, 9, 4095]))).expect("parses");
        let ns = &parsed[0];
        assert!(ns.owns(0, 0) && ns.owns(0, 9) && ns.owns(0, 4095));
        assert!(!ns.owns(0, 1) && !ns.owns(0, 8) && !ns.owns(0, 4094));
        assert_eq!(ns.count(0), 3);
        let decoded = decode_bitmap(&bitmap_of(&[0, 9])).expect("decodes");
        assert_eq!(decoded[0], 0x80);
        assert_eq!(decoded[1], 0x40);
    }

    #[test]
    fn two_nodes_two_columns_and_handover() {
        let evens: Vec<usize> = (0..PARTITIONS).step_by(2).collect();
        let odds: Vec<usize> = (1..PARTITIONS).step_by(2).collect();
        let a = parse_replicas(&format!(
            "test:0,2,{},{}",
            bitmap_of(&evens),
            bitmap_of(&odds)
        ))
        .expect("a");
        let b = parse_replicas(&format!(
            "test:0,2,{},{}",
            bitmap_of(&odds),
            bitmap_of(&evens)
        ))
        .expect("b");
        let mut map = PartitionMap::default();
        map.apply(NodeId(1), &a);
        map.apply(NodeId(2), &b);
        assert_eq!(map.replicas("test"), 2);
        assert_eq!(map.node("test", 0, 0), Some(NodeId(1)));
        assert_eq!(map.node("test", 1, 0), Some(NodeId(2)));
        assert_eq!(map.node("test", 0, 1), Some(NodeId(2)));
        // Node 1 gives up partition 0 (master) and nobody claims it yet:
        // its entry stays until another node claims it.
        let a2 = parse_replicas(&format!(
            "test:0,2,{},{}",
            bitmap_of(&evens[1..]),
            bitmap_of(&odds)
        ))
        .expect("a2");
        map.apply(NodeId(1), &a2);
        assert_eq!(map.node("test", 0, 0), Some(NodeId(1)));
        assert_eq!(map.node("test", 0, 2), Some(NodeId(1)));
        // Node 2 claims it: its entry now.
        let with_zero: Vec<usize> = std::iter::once(0).chain(odds.iter().copied()).collect();
        let b2 = parse_replicas(&format!(
            "test:0,2,{},{}",
            bitmap_of(&with_zero),
            bitmap_of(&evens)
        ))
        .expect("b2");
        map.apply(NodeId(2), &b2);
        assert_eq!(map.node("test", 0, 0), Some(NodeId(2)));
        map.apply(NodeId(1), &a2);
        assert_eq!(map.node("test", 0, 0), Some(NodeId(2)));
        map.remove_node(NodeId(2));
        assert_eq!(map.node("test", 0, 0), None, "a removed node's entries go");
        assert_eq!(map.node("test", 0, 1), None);
        assert_eq!(map.node("test", 1, 0), None);
    }

    /// A node restarted alone claims everything for a moment, then joins
    /// again with its half: the other node's half stays mapped to it,
    /// whatever order the answers come in.
    #[test]
    fn a_shrinking_claim_falls_back_to_the_other_nodes() {
        let evens: Vec<usize> = (0..PARTITIONS).step_by(2).collect();
        let odds: Vec<usize> = (1..PARTITIONS).step_by(2).collect();
        let half =
            |own: &[usize]| parse_replicas(&format!("test:0,1,{}", bitmap_of(own))).expect("half");
        let all = parse_replicas(&format!("test:0,1,{}", all_ones())).expect("all");
        let mut map = PartitionMap::default();
        map.apply(NodeId(1), &half(&evens));
        map.apply(NodeId(2), &half(&odds));
        map.apply(NodeId(1), &all);
        assert_eq!(map.node("test", 0, 1), Some(NodeId(1)), "latest claim wins");
        map.apply(NodeId(1), &half(&evens));
        assert_eq!(map.node("test", 0, 1), Some(NodeId(2)));
        assert_eq!(map.node("test", 0, 0), Some(NodeId(1)));
        map.remove_node(NodeId(1));
        assert_eq!(map.node("test", 0, 0), None);
        assert_eq!(map.node("test", 0, 3), Some(NodeId(2)));
    }

    #[test]
    fn regime_guards_strong_consistency_entries() {
        let mut map = PartitionMap::default();
        map.apply(
            NodeId(1),
            &parse_replicas(&format!("sc:5,1,{}", bitmap_of(&[3]))).expect("parses"),
        );
        map.apply(
            NodeId(2),
            &parse_replicas(&format!("sc:4,1,{}", bitmap_of(&[3]))).expect("parses"),
        );
        assert_eq!(map.node("sc", 0, 3), Some(NodeId(1)));
        map.apply(
            NodeId(2),
            &parse_replicas(&format!("sc:6,1,{}", bitmap_of(&[3]))).expect("parses"),
        );
        assert_eq!(map.node("sc", 0, 3), Some(NodeId(2)));
    }

    #[test]
    fn legacy_form_and_errors() {
        let parsed = parse_replicas(&format!("test:1,{}", all_ones())).expect("legacy");
        assert_eq!(parsed[0].regime, 0);
        assert_eq!(parsed[0].columns.len(), 1);
        let short = &all_ones()[..683];
        for bad in [
            format!("test:0,1,{short}"),
            format!("test:0,2,{}", all_ones()),
            format!(":0,1,{}", all_ones()),
            format!("{}:0,1,{}", "n".repeat(32), all_ones()),
            "test".to_owned(),
            format!("test:x,1,{}", all_ones()),
            format!("test:0,1,{}", "*".repeat(684)),
        ] {
            assert!(parse_replicas(&bad).is_err(), "{bad:.40} should fail");
        }
        assert_eq!(parse_replicas("").expect("empty"), vec![]);
    }
}
