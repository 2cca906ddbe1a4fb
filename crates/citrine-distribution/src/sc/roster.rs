//! The strong-consistency roster of one namespace (paper 000 §4.1): the
//! nodes meant to be present at steady state, each with its rack, the
//! pending roster an operator staged with `roster-set:` (applied at the
//! next `recluster:`), and the nodes the cluster observes now — and the
//! text of the `roster:` answer and the `roster-set:` parameters
//! (protocol notes 08 §1).
//!
//! Owns: [`RosterNode`], [`NodeList`] (a list with its optional active
//! rack), [`Roster`] (roster, pending roster, observed nodes) and the
//! pure encode / parse functions. Nothing here does I/O or keeps the
//! roster across restarts (the caller stores [`NodeList::encode`]'s text).
//!
//! Formats (08 §1): a list prints its ids in hex, comma-separated, highest
//! id first, each followed by `@<rack>` when its rack is not 0; an active
//! rack prefixes the list with `M<rack>|`; an empty list prints `null`.
//! The answer for one namespace is
//! `roster=<list>:pending_roster=<list>:observed_nodes=<list>`; for all of
//! them, `ns=<NS>:roster=…:pending_roster=…:observed_nodes=…` joined with
//! `;`. `roster-set:namespace=NS;nodes=ID[@RACK],…` takes the same list
//! syntax (the `M<rack>|` prefix included, as operators paste the
//! observed nodes).
//!
//! Invariants: a [`NodeList`] is sorted by descending node id with no id
//! twice (a parsed list naming an id twice is refused); its encoding
//! parses back to an equal list.

use citrine_types::NodeId;
use std::fmt::Write as _;

/// One roster member: a node id and the rack it was rostered on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RosterNode {
    pub id: NodeId,
    pub rack_id: u32,
}

/// A list of nodes as the roster answers print it, with the active rack
/// (`M<rack>|`) when one is set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeList {
    /// Sorted by descending id, no id twice.
    nodes: Vec<RosterNode>,
    /// The rack that holds every master (`active-rack`), if any.
    pub active_rack: Option<u32>,
}

/// Why a node list did not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListError {
    /// An id that is not 1 to 16 hex digits, or zero.
    BadId(String),
    /// A rack that is not a decimal `u32`.
    BadRack(String),
    /// An `M<rack>|` prefix whose rack is not a decimal `u32`.
    BadActiveRack(String),
    /// The same node id twice.
    Duplicate(NodeId),
}

impl std::fmt::Display for ListError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListError::BadId(text) => write!(f, "bad node id '{text}'"),
            ListError::BadRack(text) => write!(f, "bad rack id '{text}'"),
            ListError::BadActiveRack(text) => write!(f, "bad active rack '{text}'"),
            ListError::Duplicate(id) => write!(f, "node {id} listed twice"),
        }
    }
}

impl NodeList {
    /// A list of `nodes` (any order); refused when an id appears twice.
    pub fn new(
        mut nodes: Vec<RosterNode>,
        active_rack: Option<u32>,
    ) -> Result<NodeList, ListError> {
        nodes.sort_by_key(|node| std::cmp::Reverse(node.id));
        if let Some(pair) = nodes.windows(2).find(|pair| pair[0].id == pair[1].id) {
            return Err(ListError::Duplicate(pair[0].id));
        }
        Ok(NodeList { nodes, active_rack })
    }

    /// The nodes, highest id first.
    pub fn nodes(&self) -> &[RosterNode] {
        &self.nodes
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when the list names no node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Whether `id` is listed.
    pub fn contains(&self, id: NodeId) -> bool {
        self.nodes.iter().any(|node| node.id == id)
    }

    /// The rack `id` is listed with, if listed.
    pub fn rack_of(&self, id: NodeId) -> Option<u32> {
        self.nodes
            .iter()
            .find(|node| node.id == id)
            .map(|node| node.rack_id)
    }

    /// The list as the answers print it (see the module documentation).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Some(rack) = self.active_rack {
            let _ = write!(out, "M{rack}|");
        }
        if self.nodes.is_empty() {
            out.push_str("null");
            return out;
        }
        for (index, node) in self.nodes.iter().enumerate() {
            if index > 0 {
                out.push(',');
            }
            let _ = write!(out, "{}", node.id);
            if node.rack_id != 0 {
                let _ = write!(out, "@{}", node.rack_id);
            }
        }
        out
    }

    /// Parses a list printed by [`NodeList::encode`] or given to
    /// `roster-set:` (`null` and the empty text are the empty list).
    pub fn parse(text: &str) -> Result<NodeList, ListError> {
        let (active_rack, body) = split_active_rack(text.trim())?;
        if body.is_empty() || body == "null" {
            return NodeList::new(Vec::new(), active_rack);
        }
        let nodes = body
            .split(',')
            .map(parse_node)
            .collect::<Result<Vec<_>, _>>()?;
        NodeList::new(nodes, active_rack)
    }
}

/// Splits an `M<rack>|` prefix off a list.
fn split_active_rack(text: &str) -> Result<(Option<u32>, &str), ListError> {
    let Some((prefix, body)) = text.split_once('|') else {
        return Ok((None, text));
    };
    let rack = prefix
        .strip_prefix('M')
        .and_then(|digits| digits.parse::<u32>().ok())
        .ok_or_else(|| ListError::BadActiveRack(prefix.to_owned()))?;
    Ok((Some(rack), body))
}

/// One `ID[@RACK]` item.
fn parse_node(item: &str) -> Result<RosterNode, ListError> {
    let item = item.trim();
    let (id_text, rack_text) = match item.split_once('@') {
        Some((id, rack)) => (id, Some(rack)),
        None => (item, None),
    };
    let valid_id = !id_text.is_empty() && id_text.len() <= 16;
    let id = valid_id
        .then(|| u64::from_str_radix(id_text, 16).ok())
        .flatten()
        .filter(|&id| id != 0)
        .ok_or_else(|| ListError::BadId(id_text.to_owned()))?;
    let rack_id = match rack_text {
        Some(text) => text
            .parse::<u32>()
            .map_err(|_| ListError::BadRack(text.to_owned()))?,
        None => 0,
    };
    Ok(RosterNode {
        id: NodeId(id),
        rack_id,
    })
}

/// The roster state of one namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Roster {
    /// The roster in force.
    pub roster: NodeList,
    /// What `roster-set:` staged, applied at the next `recluster:`.
    pub pending: NodeList,
    /// The nodes of the current cluster with their racks (and the
    /// namespace's active rack), as the view publishes them.
    pub observed: NodeList,
}

impl Roster {
    /// Stages `pending` (`roster-set:`).
    pub fn stage(&mut self, pending: NodeList) {
        self.pending = pending;
    }

    /// Applies the pending roster (at `recluster:`); true when the roster
    /// changed.
    pub fn apply_pending(&mut self) -> bool {
        if self.pending == self.roster {
            return false;
        }
        self.roster = self.pending.clone();
        true
    }

    /// The fields of the `roster:` answer for one namespace.
    pub fn encode(&self) -> String {
        format!(
            "roster={}:pending_roster={}:observed_nodes={}",
            self.roster.encode(),
            self.pending.encode(),
            self.observed.encode()
        )
    }

    /// Parses [`Roster::encode`]'s text.
    pub fn parse(text: &str) -> Result<Roster, RosterParseError> {
        let mut fields = text.split(':');
        let mut next = |name: &'static str| {
            fields
                .next()
                .and_then(|field| field.strip_prefix(name))
                .and_then(|rest| rest.strip_prefix('='))
                .ok_or(RosterParseError::MissingField(name))
        };
        let roster = NodeList::parse(next("roster")?)?;
        let pending = NodeList::parse(next("pending_roster")?)?;
        let observed = NodeList::parse(next("observed_nodes")?)?;
        Ok(Roster {
            roster,
            pending,
            observed,
        })
    }
}

/// Why a `roster:` answer did not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RosterParseError {
    MissingField(&'static str),
    List(ListError),
}

impl From<ListError> for RosterParseError {
    fn from(error: ListError) -> Self {
        RosterParseError::List(error)
    }
}

/// The `roster:` answer without `namespace=`: every namespace's fields,
/// each prefixed with `ns=<NS>:`, joined with `;`.
pub fn encode_all<'a>(namespaces: impl Iterator<Item = (&'a str, &'a Roster)>) -> String {
    namespaces
        .map(|(name, roster)| format!("ns={name}:{}", roster.encode()))
        .collect::<Vec<_>>()
        .join(";")
}

/// The parameters of `roster-set:namespace=NS;nodes=…`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RosterSet {
    pub namespace: String,
    pub nodes: NodeList,
}

/// Why `roster-set:` parameters were refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RosterSetError {
    MissingNamespace,
    MissingNodes,
    Nodes(ListError),
}

/// Parses the parameters of `roster-set:` (`namespace=NS;nodes=LIST`, in
/// either order).
pub fn parse_roster_set(params: &str) -> Result<RosterSet, RosterSetError> {
    let mut namespace = None;
    let mut nodes = None;
    for pair in params.split(';') {
        match pair.split_once('=') {
            Some(("namespace", value)) if !value.is_empty() => namespace = Some(value),
            Some(("nodes", value)) => nodes = Some(value),
            _ => {}
        }
    }
    let namespace = namespace.ok_or(RosterSetError::MissingNamespace)?;
    let nodes = nodes.ok_or(RosterSetError::MissingNodes)?;
    let nodes = NodeList::parse(nodes).map_err(RosterSetError::Nodes)?;
    Ok(RosterSet {
        namespace: namespace.to_owned(),
        nodes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u64, rack_id: u32) -> RosterNode {
        RosterNode {
            id: NodeId(id),
            rack_id,
        }
    }

    #[test]
    fn lists_print_highest_first_with_racks_and_null() {
        let list = NodeList::new(vec![node(0xA1, 0), node(0xBB9, 2), node(0x10, 1)], None);
        let list = list.expect("no duplicate");
        assert_eq!(list.encode(), "BB9@2,A1,10@1");
        assert_eq!(NodeList::default().encode(), "null");
        let active = NodeList::new(vec![node(0xA1, 1)], Some(1)).expect("list");
        assert_eq!(active.encode(), "M1|A1@1");
        assert_eq!(
            NodeList::new(Vec::new(), Some(3)).map(|l| l.encode()),
            Ok("M3|null".to_owned())
        );
    }

    #[test]
    fn lists_parse_back() {
        for text in ["null", "BB9@2,A1,10@1", "M2|BB9@2,A1@1", "BB9"] {
            let list = NodeList::parse(text).expect(text);
            assert_eq!(list.encode(), text);
        }
        // Lower-case ids and any order are accepted, printed canonically.
        let list = NodeList::parse("a1,bb9@2").expect("list");
        assert_eq!(list.encode(), "BB9@2,A1");
        assert_eq!(list.rack_of(NodeId(0xBB9)), Some(2));
        assert!(list.contains(NodeId(0xA1)) && !list.contains(NodeId(0xA2)));
    }

    #[test]
    fn bad_lists_are_refused() {
        assert_eq!(
            NodeList::parse("A1,A1@2"),
            Err(ListError::Duplicate(NodeId(0xA1)))
        );
        assert!(matches!(NodeList::parse("XYZ"), Err(ListError::BadId(_))));
        assert!(matches!(NodeList::parse("0"), Err(ListError::BadId(_))));
        assert!(matches!(
            NodeList::parse("11112222333344445"),
            Err(ListError::BadId(_))
        ));
        assert!(matches!(
            NodeList::parse("A1@x"),
            Err(ListError::BadRack(_))
        ));
        assert!(matches!(NodeList::parse("A1,"), Err(ListError::BadId(_))));
        assert!(matches!(
            NodeList::parse("Mx|A1"),
            Err(ListError::BadActiveRack(_))
        ));
    }

    #[test]
    fn roster_answer_round_trips_and_applies_pending() {
        let mut roster = Roster {
            observed: NodeList::parse("BB9@2,A1").expect("observed"),
            ..Roster::default()
        };
        assert_eq!(
            roster.encode(),
            "roster=null:pending_roster=null:observed_nodes=BB9@2,A1"
        );
        let set = parse_roster_set("namespace=test;nodes=BB9@2,A1").expect("params");
        assert_eq!(set.namespace, "test");
        roster.stage(set.nodes);
        assert_eq!(roster.roster.len(), 0, "staged, not applied");
        assert!(roster.apply_pending());
        assert!(!roster.apply_pending(), "nothing new to apply");
        let text = roster.encode();
        assert_eq!(
            text,
            "roster=BB9@2,A1:pending_roster=BB9@2,A1:observed_nodes=BB9@2,A1"
        );
        assert_eq!(Roster::parse(&text), Ok(roster.clone()));
        assert_eq!(
            encode_all([("test", &roster), ("bar", &Roster::default())].into_iter()),
            format!("ns=test:{text};ns=bar:roster=null:pending_roster=null:observed_nodes=null")
        );
    }

    #[test]
    fn roster_set_needs_both_parameters() {
        assert_eq!(
            parse_roster_set("nodes=A1"),
            Err(RosterSetError::MissingNamespace)
        );
        assert_eq!(
            parse_roster_set("namespace=test"),
            Err(RosterSetError::MissingNodes)
        );
        assert!(matches!(
            parse_roster_set("namespace=test;nodes=A1,A1"),
            Err(RosterSetError::Nodes(ListError::Duplicate(_)))
        ));
        let set = parse_roster_set("nodes=M1|A1@1;namespace=test").expect("either order");
        assert_eq!(set.nodes.active_rack, Some(1));
    }
}
