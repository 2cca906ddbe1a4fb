//! The data layer of one node (paper 001 §2): namespaces and their sets,
//! the single-record operations on them, expiry and eviction, truncation
//! thresholds, and the storage engines behind their trait. It knows
//! nothing of other nodes: where a request runs, replication and
//! migrations are the distribution layer's (`citrine-distribution`), and
//! batches, scans, queries, UDFs and secondary indexes are the features'
//! above both.
//!
//! Modules: [`clock`] (the injected [`Clock`] and [`Now`]), [`config`]
//! (a namespace's settings), [`namespace`] (a namespace: index, storage,
//! sets, statistics, conflict resolution's order of versions), [`hook`]
//! (the upkeep every record change runs: secondary indexes, installed from
//! above), [`record`] (reads, writes, deletes, read-touch, installs and
//! removals), [`filter`] (filter expressions against a record), [`copy`]
//! (a record's state as another node sends it, and whether it is stored
//! over the local copy), [`truncation`] (removing the records a threshold
//! covers), [`nsup`] (expiry and eviction passes), [`device`] (the device
//! engine's index rebuild, defragmentation moves, clean shutdown), [`txn`]
//! (multi-record transactions: provisional versions, verify, rolls,
//! monitors, recovery by deadline), and [`Data`], the handle the layers
//! above hold.
//!
//! Invariants: a transaction takes one partition lock and runs to
//! completion; time comes only through the [`Clock`] the caller passes; the
//! crate spawns no thread and never sleeps (clippy's `disallowed-methods`,
//! see `clippy.toml`).

#![forbid(unsafe_code)]
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod clock;
pub mod config;
pub mod copy;
pub mod device;
pub mod filter;
pub mod hook;
pub mod namespace;
pub mod nsup;
pub mod record;
pub mod tally;
pub mod truncation;
pub mod txn;
pub mod xdr_arrivals;

pub use clock::{Clock, ManualClock, Now};
pub use namespace::Namespace;

use std::sync::Arc;

/// The data layer of one node: its namespaces, in configuration order, and
/// the clock every transaction reads.
pub struct Data {
    namespaces: Vec<Arc<Namespace>>,
    clock: Arc<dyn Clock>,
    started_unix_ms: u64,
}

impl Data {
    /// Opens every namespace (device namespaces rebuild their index: fast
    /// restart or cold start).
    pub fn open(
        namespaces: &[config::NamespaceConfig],
        clock: Arc<dyn Clock>,
    ) -> Result<Data, String> {
        let namespaces = namespaces
            .iter()
            .cloned()
            .map(|namespace| Namespace::open(namespace, Arc::clone(&clock)).map(Arc::new))
            .collect::<Result<Vec<_>, String>>()?;
        let started_unix_ms = clock.now_unix_ms();
        Ok(Data {
            namespaces,
            clock,
            started_unix_ms,
        })
    }

    /// The namespace called `name`.
    #[inline]
    pub fn namespace(&self, name: &[u8]) -> Option<&Namespace> {
        self.namespace_index(name)
            .map(|index| self.namespaces[index].as_ref())
    }

    /// The namespace called `name`, shared (for work that outlives the
    /// request: a scan cursor, a background removal).
    pub fn namespace_shared(&self, name: &[u8]) -> Option<Arc<Namespace>> {
        self.namespace_index(name)
            .map(|index| Arc::clone(&self.namespaces[index]))
    }

    /// The position of the namespace called `name` in configuration order.
    #[inline]
    pub fn namespace_index(&self, name: &[u8]) -> Option<usize> {
        self.namespaces
            .iter()
            .position(|namespace| namespace.config.name.as_bytes() == name)
    }

    /// All namespaces, in configuration order.
    pub fn namespaces(&self) -> impl Iterator<Item = &Namespace> {
        self.namespaces.iter().map(Arc::as_ref)
    }

    /// All namespaces, shared.
    pub fn namespaces_shared(&self) -> &[Arc<Namespace>] {
        &self.namespaces
    }

    /// The current time.
    #[inline]
    pub fn now(&self) -> Now {
        Now::of(self.clock.as_ref())
    }

    /// The clock.
    pub fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }

    /// The clock, shared (for work that reads it later).
    pub fn clock_shared(&self) -> Arc<dyn Clock> {
        Arc::clone(&self.clock)
    }

    /// Unix ms when the data layer opened.
    pub fn started_unix_ms(&self) -> u64 {
        self.started_unix_ms
    }

    /// True when no namespace holds a record (or tombstone).
    pub fn holds_nothing(&self) -> bool {
        self.namespaces()
            .all(|namespace| namespace.index.record_count() == 0)
    }
}
