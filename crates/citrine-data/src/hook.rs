//! Upkeep that runs with every change of a namespace's records, under the
//! record partition's write lock: how the secondary indexes (above this
//! layer) stay true without this layer importing them.
//!
//! The data layer calls a namespace's [`RecordHook`] from the only places
//! that change its primary index: [`crate::record::store::install`] (every
//! write, replica write, migrated record and read-touch: `before_install`
//! while the new body is at hand, `after_install` once the index points at
//! it), every removal (delete, expiry, eviction, truncation, replica
//! delete: `unindex`, before the entry's storage is released), and the
//! drop of a partition's copy (`clear_partition`). A namespace without a
//! hook skips all of it.

use crate::namespace::Namespace;
use citrine_index::{IndexEntry, RecordMeta};
use citrine_types::{Digest, PartitionId};
use std::any::Any;

/// What `before_install` computed from the new body, handed back to
/// `after_install` (the hook's own type, boxed).
pub type InstallUpkeep = Box<dyn Any + Send>;

/// Upkeep of one namespace's records (see the module doc). Every method
/// runs under the record partition's write lock and must not take it.
pub trait RecordHook: Send + Sync + 'static {
    /// Before a new version's body is stored: what the hook needs from it
    /// (`None`: nothing to do for this record).
    fn before_install(
        &self,
        namespace: &Namespace,
        digest: &Digest,
        meta: RecordMeta,
        body: &[u8],
    ) -> Option<InstallUpkeep>;

    /// Once the index points at the new version; `previous` is the
    /// replaced entry, whose storage is not released yet.
    fn after_install(
        &self,
        namespace: &Namespace,
        upkeep: InstallUpkeep,
        digest: &Digest,
        previous: Option<&IndexEntry>,
    );

    /// A record leaves the primary index; `entry`'s storage is not
    /// released yet.
    fn unindex(&self, namespace: &Namespace, digest: &Digest, entry: &IndexEntry);

    /// This node dropped its copy of a partition.
    fn clear_partition(&self, namespace: &Namespace, partition: PartitionId);
}
