//! The XDR filter expressions (`xdr-set-filter`) as the cluster shares
//! them — the reference keeps them in system metadata — one entry per DC
//! and namespace: the expression's base64 text (as the clients send it)
//! or a removal, with the version of its last change
//! (`citrine_service::smd::Version`). Kept in `xdr-filters.smd` in the work
//! directory, pushed to the other members like the other shared stores
//! (the info answer waits for their acknowledgements; the XDR thread
//! pushes again after a view change and every few seconds), merged by
//! version.
//!
//! Invariants: an entry changes only to a newer version; a removal stays
//! as a tombstone (`exp=null`) so a member that missed it cannot bring the
//! filter back; every entry held parsed as a filter expression when it
//! was set (a pushed entry that does not parse is skipped).

use citrine_service::smd::Version;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// One DC and namespace's filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub version: Version,
    /// Base64 of the expression; `None` once removed.
    pub exp: Option<String>,
}

/// Every DC and namespace's filter this node knows.
#[derive(Debug, Default)]
pub struct Filters {
    pub entries: BTreeMap<(String, String), Entry>,
    /// The store's file (none without a work directory).
    pub path: Option<PathBuf>,
}

impl Filters {
    /// The store kept in `path`, if any (an unreadable file is logged and
    /// the store starts empty: the next push from a member refills it).
    pub fn load(path: Option<PathBuf>) -> Filters {
        let mut filters = Filters {
            entries: BTreeMap::new(),
            path,
        };
        if let Some(path) = &filters.path {
            match citrine_service::smd::read(path) {
                Ok(text) => {
                    filters.merge(&text);
                }
                Err(error) => tracing::warn!("xdr: {error}"),
            }
        }
        filters
    }

    /// The store's text: one `dc=…;namespace=…;exp=…;version=…` line an
    /// entry (`exp=null` for a removal).
    pub fn text(&self) -> String {
        let mut text = String::new();
        for ((dc, namespace), entry) in &self.entries {
            let exp = entry.exp.as_deref().unwrap_or("null");
            text.push_str(&format!(
                "dc={dc};namespace={namespace};exp={exp};{}\n",
                entry.version.param()
            ));
        }
        text
    }

    /// The filter of a DC and namespace, if one is set.
    pub fn get(&self, dc: &str, namespace: &str) -> Option<&str> {
        self.entries
            .get(&(dc.to_owned(), namespace.to_owned()))?
            .exp
            .as_deref()
    }

    /// Sets (or with `None` removes) a filter at `version`; false when the
    /// entry held is as new.
    pub fn set(&mut self, dc: &str, namespace: &str, entry: Entry) -> bool {
        let key = (dc.to_owned(), namespace.to_owned());
        if self
            .entries
            .get(&key)
            .is_some_and(|held| held.version >= entry.version)
        {
            return false;
        }
        self.entries.insert(key, entry);
        true
    }

    /// Takes the newer entries of another member's text; the DCs and
    /// namespaces that changed.
    pub fn merge(&mut self, text: &str) -> Vec<(String, String)> {
        let mut changed = Vec::new();
        for line in text.lines().filter(|line| !line.trim().is_empty()) {
            let Some((dc, namespace, entry)) = parse_line(line) else {
                tracing::warn!("xdr: a filter line that does not parse: {line:?}");
                continue;
            };
            if self.set(&dc, &namespace, entry) {
                changed.push((dc, namespace));
            }
        }
        changed
    }

    /// Writes the store's file (when it has one).
    pub fn save(&self) {
        if let Some(path) = &self.path {
            if let Err(error) = citrine_service::smd::save_atomically(path, &self.text()) {
                tracing::warn!("xdr: {error}");
            }
        }
    }
}

/// One line of the store's text; `None` when a field is missing or the
/// expression does not parse.
fn parse_line(line: &str) -> Option<(String, String, Entry)> {
    let get = |key: &str| {
        line.split(';')
            .find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
    };
    let (dc, namespace, exp) = (get("dc")?, get("namespace")?, get("exp")?);
    let version = Version::parse(get("version")).ok()?;
    let exp = match exp {
        "null" => None,
        text => {
            super::parse_filter(text).ok()?;
            Some(text.to_owned())
        }
    };
    Some((dc.to_owned(), namespace.to_owned(), Entry { version, exp }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn version(ms: u64, node: u64) -> Version {
        Version { ms, node }
    }

    #[test]
    fn newer_entries_win_and_removals_stay() {
        // `true` (msgpack 0xc3) and `false` (0xc2), as filters.
        let (all, none) = ("ww==", "wg==");
        let mut here = Filters::default();
        let entry = |ms, exp: Option<&str>| Entry {
            version: version(ms, 1),
            exp: exp.map(str::to_owned),
        };
        assert!(here.set("dc1", "test", entry(10, Some(all))));
        let mut there = Filters::default();
        assert_eq!(
            there.merge(&here.text()),
            vec![("dc1".into(), "test".into())]
        );
        assert_eq!(there.get("dc1", "test"), Some(all));
        assert!(there.set("dc1", "test", entry(20, None)));
        assert!(!here.set("dc1", "test", entry(5, Some(none))), "older");
        assert_eq!(here.merge(&there.text()).len(), 1);
        assert_eq!(here.get("dc1", "test"), None, "the removal is taken");
        assert!(
            here.text().contains("exp=null"),
            "and kept: {}",
            here.text()
        );
        assert!(there.merge(&here.text()).is_empty(), "nothing newer");
        assert!(
            here.merge("dc=dc1;namespace=test;exp=%%%;version=99.1\n")
                .is_empty(),
            "not base64"
        );
        // The Go client's invalid filter: an integer bin equal to a string.
        let mismatch = "kwGTUQKjYmlurANzb21lIHN0cmluZw==";
        let line = format!("dc=dc1;namespace=test;exp={mismatch};version=99.1\n");
        assert!(here.merge(&line).is_empty(), "not a filter");
        assert!(
            super::super::parse_filter("kwGTUQKjYmluVQ==").is_ok(),
            "bin == 85"
        );
    }
}
