//! `enable-benchmarks-storage` (the reference's namespace storage detail
//! histograms, set with `set-config:context=namespace;id=NS;
//! enable-benchmarks-storage=true`, shown by `get-config` as
//! `storage-engine.enable-benchmarks-storage`): per namespace
//! `{NS}-device-read-size` and `{NS}-device-write-size` (bytes: every
//! record read from a device, every record stored — a memory namespace's
//! too, as the reference's), and per device of a device namespace
//! `{NS}-PATH-read`, `{NS}-PATH-large-block-read` and `{NS}-PATH-write`
//! (in the histograms' unit: a record read from the device, a block read
//! by defragmentation, a write block written out), named, ordered and
//! dumped by the ticker as the reference's (8.1.2, asked with a memory and
//! a file namespace). As in the reference, `latencies:` does not list them
//! (`latencies:hist=` answers `ERROR:4:bad hist name`).
//!
//! The engine reports through its [`citrine_storage::bench::BenchSlot`];
//! the histograms are built the first time the flag is turned on and kept
//! (turned off and on again, a dump shows the total since then).

use crate::latency::Histogram;
use citrine_storage::bench::{IoKind, StorageBenchmarks};
use std::sync::Arc;
use std::time::Duration;

/// One namespace's storage histograms (see the module doc).
pub struct StorageHistograms {
    read_size: Histogram,
    write_size: Histogram,
    /// Per device, in configuration order: read, large-block-read, write.
    devices: Vec<[Histogram; 3]>,
    /// The node's histogram unit, fixed before it serves.
    unit_nanos: u64,
}

impl StorageHistograms {
    /// The histograms of namespace `name` with these device paths.
    pub fn new(name: &str, device_paths: &[String], unit_nanos: u64) -> StorageHistograms {
        let histogram = |suffix: &str| {
            let full = format!("{{{name}}}-{suffix}");
            Histogram::new(full, Some(name.to_owned()), "storage_benchmark")
        };
        StorageHistograms {
            read_size: histogram("device-read-size"),
            write_size: histogram("device-write-size"),
            devices: device_paths
                .iter()
                .map(|path| {
                    ["read", "large-block-read", "write"]
                        .map(|io| histogram(&format!("{path}-{io}")))
                })
                .collect(),
            unit_nanos,
        }
    }

    /// Every histogram, in the reference's dump order, with whether it
    /// counts bytes (not time).
    pub fn histograms(&self) -> impl Iterator<Item = (&Histogram, bool)> {
        let sizes = [(&self.read_size, true), (&self.write_size, true)];
        let devices = self
            .devices
            .iter()
            .flatten()
            .map(|histogram| (histogram, false));
        sizes.into_iter().chain(devices)
    }
}

impl StorageBenchmarks for StorageHistograms {
    fn record_size(&self, write: bool, bytes: u64) {
        let histogram = if write {
            &self.write_size
        } else {
            &self.read_size
        };
        histogram.record_bytes(bytes);
    }

    fn device_io(&self, device: usize, kind: IoKind, elapsed: Duration) {
        let position = match kind {
            IoKind::Read => 0,
            IoKind::LargeBlockRead => 1,
            IoKind::Write => 2,
        };
        if let Some(histograms) = self.devices.get(device) {
            histograms[position].record_in(elapsed, self.unit_nanos);
        }
    }
}

/// Turns namespace `namespace`'s storage benchmarks on or off: the
/// engine's slot and the ticker's dump share one set of histograms.
pub(crate) fn set(layers: &crate::Layers<'_>, index: usize, on: bool) {
    let Some(namespace) = layers.data.namespaces_shared().get(index).cloned() else {
        return;
    };
    let latencies = layers.latencies;
    let histograms = latencies.benchmarks().storage(index, || {
        let paths: Vec<String> = namespace.storage.device().map_or_else(Vec::new, |device| {
            let paths = &device.config().paths;
            paths
                .iter()
                .map(|path| path.display().to_string())
                .collect()
        });
        let unit = latencies.unit().nanos();
        Arc::new(StorageHistograms::new(&namespace.config.name, &paths, unit))
    });
    let Some(histograms) = histograms else {
        return;
    };
    namespace
        .storage
        .benchmarks()
        .set(|| histograms.clone(), on);
    latencies.benchmarks().set_storage(index, on);
}
