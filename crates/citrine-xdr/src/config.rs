//! XDR configuration: destinations (DCs), their seed nodes and, per DC
//! and namespace, the shipping settings, with the reference's names.
//!
//! One parser serves the `[xdr]` TOML section and the run-time
//! `set-config:context=xdr;…` commands ([`Command::parse`]), so both
//! accept and refuse exactly the same names and values. Settings this
//! slice does not implement are refused with an error naming them, never
//! silently ignored ([`REFUSED`]).
//!
//! Invariants: a [`NamespaceSettings`] always holds values within the
//! reference's bounds (`delay-ms` and `hot-key-ms` at most 5000,
//! `max-throughput` a multiple of 100); a set is never in both the ship
//! and the ignore list's effect: `ignore-set` wins.

use std::collections::{BTreeMap, BTreeSet};

/// The reference's bound on `delay-ms` and `hot-key-ms`.
pub const MAX_DELAY_MS: u64 = 5000;

/// Settings of the reference parsed and refused here (not implemented in
/// this slice): a value other than the default is an error naming it.
pub const REFUSED: &[(&str, &str)] = &[
    ("bin-policy", "all"),
    ("ship-bin-luts", "false"),
    ("transaction-queue-limit", ""),
    ("remote-namespace", ""),
    ("write-policy", "auto"),
    ("ship-nsup-deletes", "false"),
    ("ignore-expunges", "false"),
    ("ship-versions-policy", "latest"),
    ("ship-versions-interval", ""),
    ("sc-replication-wait-ms", ""),
    ("ignore-bin", ""),
    ("ship-bin", ""),
    ("ship-only-specified-bins", "false"),
];

/// One DC's namespace: what is shipped and how fast.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceSettings {
    /// `ship-only-specified-sets`: ship only the sets in `ship_sets`.
    pub ship_only_specified_sets: bool,
    /// `ship-set` (repeatable).
    pub ship_sets: BTreeSet<Vec<u8>>,
    /// `ignore-set` (repeatable).
    pub ignore_sets: BTreeSet<Vec<u8>>,
    /// `delay-ms`: a record is shipped no earlier than this after its
    /// last update.
    pub delay_ms: u64,
    /// `hot-key-ms`: a record is shipped at most once in this period.
    pub hot_key_ms: u64,
    /// `max-throughput`: records shipped a second, at most.
    pub max_throughput: u64,
    /// `forward`: also ship the records that arrived here by XDR (for
    /// chains); off, only the writes made at this site are shipped.
    pub forward: bool,
    /// `enable-compression`: records of at least `compression-threshold`
    /// bytes travel as compressed (type 4) messages.
    pub enable_compression: bool,
    /// `compression-level`: zlib's, 1 to 9.
    pub compression_level: u32,
    /// `compression-threshold`: the smallest record compressed, bytes.
    pub compression_threshold: u64,
}

impl Default for NamespaceSettings {
    fn default() -> Self {
        NamespaceSettings {
            ship_only_specified_sets: false,
            ship_sets: BTreeSet::new(),
            ignore_sets: BTreeSet::new(),
            delay_ms: 0,
            hot_key_ms: 100,
            max_throughput: 100_000,
            forward: false,
            enable_compression: false,
            compression_level: 1,
            compression_threshold: 128,
        }
    }
}

impl NamespaceSettings {
    /// Whether a record of `set` (empty: no set) is shipped.
    pub fn ships_set(&self, set: &[u8]) -> bool {
        if self.ignore_sets.contains(set) {
            return false;
        }
        !self.ship_only_specified_sets || self.ship_sets.contains(set)
    }

    /// Applies one `NAME=VALUE` setting; `add` is false for a set
    /// removed from `ship-set` or `ignore-set` (`action=remove`).
    pub fn apply(&mut self, name: &str, value: &str, add: bool) -> Result<(), String> {
        match name {
            "ship-only-specified-sets" => self.ship_only_specified_sets = boolean(name, value)?,
            "ship-set" => edit_set(&mut self.ship_sets, value, add),
            "ignore-set" => edit_set(&mut self.ignore_sets, value, add),
            "delay-ms" => self.delay_ms = bounded(name, value, MAX_DELAY_MS)?,
            "hot-key-ms" => self.hot_key_ms = bounded(name, value, MAX_DELAY_MS)?,
            "max-throughput" => self.max_throughput = throughput(value)?,
            "forward" => self.forward = boolean(name, value)?,
            "enable-compression" => self.enable_compression = boolean(name, value)?,
            "compression-level" => self.compression_level = level(value)?,
            "compression-threshold" => self.compression_threshold = threshold(value)?,
            _ => return refuse(name, value),
        }
        Ok(())
    }
}

/// One destination: its seed nodes and the namespaces shipped to it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DcConfig {
    /// `node-address-port` entries, `HOST:PORT`.
    pub nodes: Vec<String>,
    pub namespaces: BTreeMap<String, NamespaceSettings>,
}

/// Where a namespace added to a DC starts shipping from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rewind {
    /// Only writes from now on (the reference's default).
    None,
    /// Everything (`rewind=all`).
    All,
    /// Writes of the last this many seconds.
    Seconds(u64),
}

/// A run-time `set-config:context=xdr;…` command, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    CreateDc(String),
    DeleteDc(String),
    AddNode(String, String),
    RemoveNode(String, String),
    AddNamespace(String, String, Rewind),
    RemoveNamespace(String, String),
    /// DC, namespace, setting, value, add (false: `action=remove`).
    Set(String, String, String, String, bool),
}

impl Command {
    /// Parses the parameters of `set-config:context=xdr;…` (the
    /// `context` pair may be present; it is skipped).
    pub fn parse(params: &[(&str, &str)]) -> Result<Command, String> {
        let get = |key: &str| params.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        let dc = get("dc").ok_or("missing dc")?.to_owned();
        valid_name("dc", &dc)?;
        let action = get("action");
        if let Some(address) = get("node-address-port") {
            let address = node_address(address)?;
            return match action {
                Some("add") => Ok(Command::AddNode(dc, address)),
                Some("remove") => Ok(Command::RemoveNode(dc, address)),
                _ => Err("node-address-port needs action=add or action=remove".into()),
            };
        }
        let Some(namespace) = get("namespace") else {
            return match action {
                Some("create") => Ok(Command::CreateDc(dc)),
                Some("delete") => Ok(Command::DeleteDc(dc)),
                _ => Err("a dc needs action=create or action=delete".into()),
            };
        };
        let namespace = namespace.to_owned();
        let setting = params
            .iter()
            .find(|(k, _)| !matches!(*k, "context" | "dc" | "namespace" | "action" | "rewind"));
        match (setting, action) {
            (None, Some("add")) => Ok(Command::AddNamespace(dc, namespace, rewind(get("rewind"))?)),
            (None, Some("remove")) => Ok(Command::RemoveNamespace(dc, namespace)),
            (None, _) => Err("a namespace needs action=add or action=remove".into()),
            (Some((name, value)), action) => {
                let add = action != Some("remove");
                let mut probe = NamespaceSettings::default();
                probe.apply(name, value, add)?;
                Ok(Command::Set(
                    dc,
                    namespace,
                    (*name).into(),
                    (*value).into(),
                    add,
                ))
            }
        }
    }
}

fn rewind(value: Option<&str>) -> Result<Rewind, String> {
    match value {
        None => Ok(Rewind::None),
        Some("all") => Ok(Rewind::All),
        Some(seconds) => seconds
            .parse::<u64>()
            .map(Rewind::Seconds)
            .map_err(|_| format!("rewind must be all or a number of seconds, not {seconds:?}")),
    }
}

/// `HOST:PORT` (the reference also accepts `HOST PORT` in its file).
pub fn node_address(value: &str) -> Result<String, String> {
    let value = value.trim();
    let (host, port) = value
        .rsplit_once(':')
        .or_else(|| value.rsplit_once(' '))
        .ok_or_else(|| format!("node-address-port must be HOST:PORT, not {value:?}"))?;
    let port: u16 = port
        .trim()
        .parse()
        .map_err(|_| format!("node-address-port has a bad port: {value:?}"))?;
    if host.trim().is_empty() || port == 0 {
        return Err(format!(
            "node-address-port must be HOST:PORT, not {value:?}"
        ));
    }
    Ok(format!("{}:{port}", host.trim()))
}

fn valid_name(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 31 || name.contains([':', ';', '=', ',']) {
        return Err(format!("bad {what} name {name:?}"));
    }
    Ok(())
}

fn edit_set(sets: &mut BTreeSet<Vec<u8>>, value: &str, add: bool) {
    if add {
        sets.insert(value.as_bytes().to_vec());
    } else {
        sets.remove(value.as_bytes());
    }
}

fn boolean(name: &str, value: &str) -> Result<bool, String> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("{name} must be true or false")),
    }
}

fn bounded(name: &str, value: &str, max: u64) -> Result<u64, String> {
    match value.parse::<u64>() {
        Ok(number) if number <= max => Ok(number),
        _ => Err(format!("{name} must be 0 to {max}")),
    }
}

fn throughput(value: &str) -> Result<u64, String> {
    match value.parse::<u64>() {
        Ok(number) if number > 0 && number % 100 == 0 => Ok(number),
        _ => Err("max-throughput must be a positive multiple of 100".into()),
    }
}

fn level(value: &str) -> Result<u32, String> {
    match value.parse::<u32>() {
        Ok(level @ 1..=9) => Ok(level),
        _ => Err("compression-level must be 1 to 9".into()),
    }
}

/// A positive number of bytes (the reference's own bounds are not known
/// here).
fn threshold(value: &str) -> Result<u64, String> {
    match value.parse::<u64>() {
        Ok(bytes) if bytes > 0 => Ok(bytes),
        _ => Err("compression-threshold must be a positive number of bytes".into()),
    }
}

fn refuse(name: &str, value: &str) -> Result<(), String> {
    match REFUSED.iter().find(|(refused, _)| *refused == name) {
        Some((_, default)) if !default.is_empty() && *default == value => Ok(()),
        Some(_) => Err(format!("{name} is not supported by this server's XDR yet")),
        None => Err(format!("unknown xdr setting {name}")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn commands_parse_as_the_reference_spells_them() {
        let parse = |pairs: &[(&str, &str)]| Command::parse(pairs);
        assert_eq!(
            parse(&[("context", "xdr"), ("dc", "dcb"), ("action", "create")]),
            Ok(Command::CreateDc("dcb".into()))
        );
        assert_eq!(
            parse(&[
                ("dc", "dcb"),
                ("node-address-port", "127.0.0.1:4401"),
                ("action", "add")
            ]),
            Ok(Command::AddNode("dcb".into(), "127.0.0.1:4401".into()))
        );
        assert_eq!(
            parse(&[
                ("dc", "dcb"),
                ("namespace", "test"),
                ("action", "add"),
                ("rewind", "all")
            ]),
            Ok(Command::AddNamespace(
                "dcb".into(),
                "test".into(),
                Rewind::All
            ))
        );
        assert_eq!(
            parse(&[("dc", "dcb"), ("namespace", "test"), ("delay-ms", "300")]),
            Ok(Command::Set(
                "dcb".into(),
                "test".into(),
                "delay-ms".into(),
                "300".into(),
                true
            ))
        );
        assert!(parse(&[("dc", "dcb"), ("namespace", "test"), ("delay-ms", "9000")]).is_err());
        assert!(parse(&[
            ("dc", "dcb"),
            ("namespace", "test"),
            ("max-throughput", "150")
        ])
        .is_err());
        let refused = parse(&[
            ("dc", "dcb"),
            ("namespace", "test"),
            ("bin-policy", "only-changed"),
        ]);
        assert!(refused.is_err_and(|e| e.contains("bin-policy")));
        assert!(parse(&[("dc", "dcb"), ("namespace", "test"), ("forward", "true")]).is_ok());
        assert!(parse(&[("dc", "dcb"), ("namespace", "test"), ("forward", "yes")]).is_err());
        let compression = [("enable-compression", "true"), ("compression-level", "9")];
        for (name, value) in compression {
            assert!(parse(&[("dc", "dcb"), ("namespace", "test"), (name, value)]).is_ok());
        }
        assert!(parse(&[
            ("dc", "dcb"),
            ("namespace", "test"),
            ("compression-level", "0")
        ])
        .is_err());
        assert!(parse(&[("dc", "dcb"), ("namespace", "test"), ("nonsense", "1")]).is_err());
    }

    #[test]
    fn set_filters() {
        let mut settings = NamespaceSettings::default();
        assert!(settings.ships_set(b"a") && settings.ships_set(b""));
        settings
            .apply("ship-only-specified-sets", "true", true)
            .unwrap();
        settings.apply("ship-set", "a", true).unwrap();
        settings.apply("ship-set", "b", true).unwrap();
        settings.apply("ignore-set", "b", true).unwrap();
        assert!(settings.ships_set(b"a"));
        assert!(!settings.ships_set(b"b"), "ignore-set wins");
        assert!(!settings.ships_set(b"c") && !settings.ships_set(b""));
        settings.apply("ship-set", "a", false).unwrap();
        assert!(!settings.ships_set(b"a"));
    }
}
