//! The `[xdr]` section of the configuration file, with the reference's
//! names:
//!
//! ```toml
//! [xdr.dc.dcb]
//! node-address-port = ["10.0.0.2:3000"]   # or one "HOST:PORT" / "HOST PORT"
//! [xdr.dc.dcb.namespace.test]
//! ship-only-specified-sets = true
//! ship-set = ["orders"]
//! delay-ms = 100
//! ```
//!
//! Every setting goes through `citrine_xdr`'s one parser, so the file and
//! `set-config:context=xdr` accept and refuse the same things.

use citrine_xdr::config::node_address;
use citrine_xdr::{DcConfig, NamespaceSettings};
use std::collections::BTreeMap;
use toml::{Table, Value};

/// The DCs of `[xdr]` (none without it).
pub fn resolve(section: Option<&Table>) -> Result<BTreeMap<String, DcConfig>, String> {
    let mut dcs = BTreeMap::new();
    let Some(section) = section else {
        return Ok(dcs);
    };
    for (key, value) in section {
        if key != "dc" {
            return Err(format!(
                "unknown xdr setting {key} (only dc sections are read)"
            ));
        }
        let table = value.as_table().ok_or("dc must be a table of DCs")?;
        for (name, dc) in table {
            let dc = dc.as_table().ok_or(format!("dc {name} must be a table"))?;
            dcs.insert(name.clone(), resolve_dc(name, dc)?);
        }
    }
    Ok(dcs)
}

fn resolve_dc(name: &str, table: &Table) -> Result<DcConfig, String> {
    let mut dc = DcConfig::default();
    for (key, value) in table {
        match key.as_str() {
            "node-address-port" => {
                for address in strings(value) {
                    dc.nodes
                        .push(node_address(&address?).map_err(|e| format!("dc {name}: {e}"))?);
                }
            }
            "namespace" => {
                let namespaces = value.as_table().ok_or("namespace must be a table")?;
                for (namespace, settings) in namespaces {
                    let settings = settings
                        .as_table()
                        .ok_or(format!("dc {name} namespace {namespace} must be a table"))?;
                    let parsed = resolve_namespace(settings)
                        .map_err(|e| format!("dc {name} namespace {namespace}: {e}"))?;
                    dc.namespaces.insert(namespace.clone(), parsed);
                }
            }
            other => return Err(format!("dc {name}: {other} is not supported yet")),
        }
    }
    Ok(dc)
}

fn resolve_namespace(table: &Table) -> Result<NamespaceSettings, String> {
    let mut settings = NamespaceSettings::default();
    for (key, value) in table {
        for text in strings(value) {
            settings.apply(key, &text?, true)?;
        }
    }
    Ok(settings)
}

/// A value as the strings `set-config` would carry: arrays give one each.
fn strings(value: &Value) -> Vec<Result<String, String>> {
    match value {
        Value::Array(items) => items.iter().flat_map(strings).collect(),
        Value::String(text) => vec![Ok(text.clone())],
        Value::Integer(number) => vec![Ok(number.to_string())],
        Value::Boolean(flag) => vec![Ok(flag.to_string())],
        other => vec![Err(format!("unexpected value {other}"))],
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn dcs_and_settings_from_toml() {
        let table: Table = toml::from_str(
            r#"
            [dc.dcb]
            node-address-port = ["127.0.0.1:4410", "127.0.0.1 4411"]
            [dc.dcb.namespace.test]
            ship-only-specified-sets = true
            ship-set = ["a", "b"]
            delay-ms = 100
            "#,
        )
        .unwrap();
        let dcs = resolve(Some(&table)).unwrap();
        let dc = &dcs["dcb"];
        assert_eq!(dc.nodes, ["127.0.0.1:4410", "127.0.0.1:4411"]);
        let test = &dc.namespaces["test"];
        assert!(test.ship_only_specified_sets && test.ships_set(b"b") && !test.ships_set(b"c"));
        assert_eq!(test.delay_ms, 100);

        let refused: Table =
            toml::from_str("[dc.x.namespace.test]\nbin-policy = \"only-changed\"").unwrap();
        assert!(resolve(Some(&refused)).unwrap_err().contains("bin-policy"));
    }
}
