//! Storage compression in the info protocol: the namespace's
//! `storage-engine.compression` and `storage-engine.compression-level` in
//! `get-config`, `data_compression_ratio` in its statistics, and
//! `set-config:context=namespace;id=NS;compression=...` to change them at
//! run time (the reference's names).
//!
//! Invariants: what `get-config` shows is the engine's live setting (not
//! the file's); a `set-config` checks every value before it applies any,
//! and changes only later writes (each stored record says how it is
//! stored, so nothing is rewritten).

use crate::namespace::Namespace;
use crate::Layers;
use citrine_storage::compress::{Algorithm, Compression};
use citrine_wire::info::InfoCommand;

/// `storage-engine.compression` and `storage-engine.compression-level`
/// (`none` and 0 for an engine that does not compress, as the reference
/// shows an uncompressed namespace).
pub(crate) fn config_pairs(namespace: &Namespace) -> Vec<(String, String)> {
    let setting = namespace
        .storage
        .compression()
        .map_or(Compression::default(), |setting| setting.get());
    vec![
        (
            "storage-engine.compression".to_owned(),
            setting.algorithm.name().to_owned(),
        ),
        (
            "storage-engine.compression-level".to_owned(),
            setting.level.to_string(),
        ),
    ]
}

/// `data_compression_ratio`: stored over uncompressed bytes of the record
/// bodies written since the start, three decimals (1.000 without
/// compression), as the reference prints it.
pub(crate) fn stat_pairs(namespace: &Namespace) -> Vec<(String, String)> {
    let ratio = namespace
        .storage
        .compression_stats()
        .map_or(1.0, |stats| stats.ratio());
    vec![("data_compression_ratio".to_owned(), format!("{ratio:.3}"))]
}

/// `set-config:context=namespace;id=NS;compression=lz4|zstd|none` and/or
/// `compression-level=0..9`.
pub(crate) fn set_config(layers: &Layers<'_>, command: &InfoCommand<'_>) -> String {
    let Some(name) = command.param("id") else {
        return "ERROR:4:missing id".to_owned();
    };
    let Some(namespace) = layers.namespace(name.as_bytes()) else {
        return "ERROR:4:namespace not found".to_owned();
    };
    let Some(setting) = namespace.storage.compression() else {
        return "ERROR:4:this namespace's storage engine does not compress".to_owned();
    };
    let mut next = setting.get();
    for (name, value) in &command.params {
        match *name {
            "context" | "id" => {}
            "compression" => match Algorithm::from_name(value) {
                Some(algorithm) => next.algorithm = algorithm,
                None => return "ERROR:4:compression must be none, lz4 or zstd".to_owned(),
            },
            "compression-level" => match value.parse().ok().and_then(Compression::valid_level) {
                Some(level) => next.level = level,
                None => return "ERROR:4:compression-level must be 0 to 9".to_owned(),
            },
            _ => return format!("ERROR:4:{name} cannot be set at run time"),
        }
    }
    setting.set(next);
    tracing::info!(namespace = %namespace.config.name, compression = next.algorithm.name(), level = next.level, "storage compression changed");
    "ok".to_owned()
}
