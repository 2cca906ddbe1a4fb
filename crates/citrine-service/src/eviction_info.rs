//! Eviction and stop-writes thresholds in the info protocol:
//! `evict-hist-buckets`, `evict-tenths-pct`,
//! `storage-engine.evict-used-pct`, `storage-engine.stop-writes-avail-pct`
//! and `storage-engine.stop-writes-used-pct` in
//! `get-config:context=namespace` (the reference's names), and
//! `set-config:context=namespace;id=NS;NAME=VALUE` to change them at run
//! time, answered as the reference answers (checked side by side with
//! Aerospike CE 8.1.2).
//!
//! Invariants: what `get-config` shows is the live value the stop-writes
//! check and nsup read ([`citrine_data::config::Thresholds`]), not the
//! configuration file's. Like the reference, one `set-config` changes one
//! value: the first of [`NAMES`] (the reference's order) the command
//! gives; the command's other parameters are not looked at.

use crate::namespace::Namespace;
use crate::Layers;
use citrine_data::config::Thresholds;
use citrine_wire::info::InfoCommand;

/// The names this module sets, in the order the reference looks for them
/// (namespace-level names, then the storage engine's, each alphabetical).
const NAMES: [&str; 5] = [
    "evict-hist-buckets",
    "evict-tenths-pct",
    "evict-used-pct",
    "stop-writes-avail-pct",
    "stop-writes-used-pct",
];

/// The reference's answer to a value it refuses.
const INVALID: &str = "ERROR:4:invalid set-config parameter";

/// The thresholds of `namespace`, as `get-config` lists them.
pub(crate) fn config_pairs(namespace: &Namespace) -> Vec<(String, String)> {
    let thresholds = &namespace.thresholds;
    vec![
        (
            "evict-hist-buckets".to_owned(),
            thresholds.evict_hist_buckets().to_string(),
        ),
        (
            "evict-tenths-pct".to_owned(),
            thresholds.evict_tenths_pct().to_string(),
        ),
        (
            "storage-engine.evict-used-pct".to_owned(),
            thresholds.evict_used_pct().to_string(),
        ),
        (
            "storage-engine.stop-writes-avail-pct".to_owned(),
            thresholds.stop_writes_avail_pct().to_string(),
        ),
        (
            "storage-engine.stop-writes-used-pct".to_owned(),
            thresholds.stop_writes_used_pct().to_string(),
        ),
    ]
}

/// Whether a `set-config:context=namespace` command names a threshold.
pub(crate) fn sets(command: &InfoCommand<'_>) -> bool {
    NAMES.iter().any(|name| command.param(name).is_some())
}

/// `set-config:context=namespace;id=NS;NAME=VALUE` for the first of
/// [`NAMES`] given. The namespace is named by `id` (or `namespace`).
pub(crate) fn set_config(layers: &Layers<'_>, command: &InfoCommand<'_>) -> String {
    let name = match command.param("id").or_else(|| command.param("namespace")) {
        None => return "ERROR:20:missing 'namespace'".to_owned(),
        Some("") => return "ERROR:20:missing 'namespace' value".to_owned(),
        Some(name) => name,
    };
    let Some(namespace) = layers.namespace(name.as_bytes()) else {
        return "ERROR:20:namespace not found on node".to_owned();
    };
    let Some((param, value)) = NAMES
        .iter()
        .find_map(|param| command.param(param).map(|value| (*param, value)))
    else {
        return INVALID.to_owned();
    };
    let thresholds = &namespace.thresholds;
    let before = current(thresholds, param);
    if apply(thresholds, param, value).is_none() {
        return INVALID.to_owned();
    }
    tracing::info!(namespace = %namespace.config.name, param, before, after = current(thresholds, param), "changed by set-config");
    "ok".to_owned()
}

/// The value of `param` now.
fn current(thresholds: &Thresholds, param: &str) -> u64 {
    match param {
        "evict-hist-buckets" => u64::from(thresholds.evict_hist_buckets()),
        "evict-tenths-pct" => u64::from(thresholds.evict_tenths_pct()),
        "evict-used-pct" => u64::from(thresholds.evict_used_pct()),
        "stop-writes-avail-pct" => u64::from(thresholds.stop_writes_avail_pct()),
        _ => u64::from(thresholds.stop_writes_used_pct()),
    }
}

/// Parses `value` as the reference parses `param` and sets it; `None`
/// when refused (nothing changed).
fn apply(thresholds: &Thresholds, param: &str, value: &str) -> Option<()> {
    match param {
        "evict-hist-buckets" if value.is_empty() => None,
        "evict-hist-buckets" => thresholds.set_evict_hist_buckets(digits(value)?),
        // The reference takes any text here, as C's atoi would read it.
        "evict-tenths-pct" => {
            thresholds.set_evict_tenths_pct(c_atoi(value) as u32);
            Some(())
        }
        _ => {
            let pct = u8::try_from(digits(value)?).ok()?;
            match param {
                "evict-used-pct" => thresholds.set_evict_used_pct(pct),
                "stop-writes-avail-pct" => thresholds.set_stop_writes_avail_pct(pct),
                _ => thresholds.set_stop_writes_used_pct(pct),
            }
        }
    }
}

/// A value of decimal digits only (empty: 0, as the reference reads a
/// percentage), `None` for anything else or past `u32`.
fn digits(value: &str) -> Option<u32> {
    if !value.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    value.bytes().try_fold(0u32, |sum, byte| {
        sum.checked_mul(10)?.checked_add(u32::from(byte - b'0'))
    })
}

/// C's `strtol(value, NULL, 10)`: leading white space, an optional sign,
/// then as many digits as follow (none: 0), saturating at the 64-bit
/// limits.
fn c_atoi(value: &str) -> i64 {
    let text = value.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (negative, text) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let mut magnitude = 0i128;
    for byte in text.bytes().take_while(u8::is_ascii_digit) {
        magnitude = (magnitude * 10 + i128::from(byte - b'0')).min(i128::from(u64::MAX) + 1);
    }
    let signed = if negative { -magnitude } else { magnitude };
    signed.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the reference stored for each text (read back by get-config).
    #[test]
    fn evict_tenths_pct_reads_text_as_the_reference() {
        let cases: [(&str, u32); 11] = [
            ("7", 7),
            ("-1", 4_294_967_295),
            ("abc", 0),
            ("4294967296", 0),
            ("4294967297", 1),
            ("12abc", 12),
            (" 8", 8),
            ("", 0),
            ("0x10", 0),
            ("+9", 9),
            ("99999999999999999999", 4_294_967_295),
        ];
        for (text, stored) in cases {
            assert_eq!(c_atoi(text) as u32, stored, "{text:?}");
        }
        assert_eq!(c_atoi("-4294967297") as u32, 4_294_967_295);
    }

    #[test]
    fn percentages_take_digits_only() {
        assert_eq!(digits(""), Some(0));
        assert_eq!(digits("010"), Some(10));
        for refused in [" 7", "+5", "-1", "12abc", "0x10", "99999999999"] {
            assert_eq!(digits(refused), None, "{refused:?}");
        }
    }
}
