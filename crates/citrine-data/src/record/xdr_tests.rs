//! Writes and deletes shipped by XDR at their destination: they keep the
//! source's last-update time and lose (28) to a local copy or delete at
//! least as recent; a client's write ignores a LUT field.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::clock::ManualClock;
use crate::config::NamespaceConfig;
use citrine_wire::msg::{field_type, info1, info2, op_type, Message, MessageWriter};

const NOW_MS: u64 = 1_700_000_000_000;
const DIGEST: Digest = Digest([7; DIGEST_SIZE]);

fn namespace() -> Namespace {
    Namespace::open(
        NamespaceConfig::in_memory("test"),
        std::sync::Arc::new(ManualClock::new(NOW_MS)),
    )
    .unwrap()
}

/// Runs a write of bin `v` (or a delete), shipped with `lut_ms` when
/// `xdr`; the result code.
fn run(namespace: &Namespace, xdr: bool, delete: bool, lut_ms: u64, value: &str) -> u8 {
    let header = MsgHeader {
        info1: if xdr { info1::XDR } else { 0 },
        info2: info2::WRITE
            | if delete {
                info2::DELETE | info2::DURABLE_DELETE
            } else {
                0
            },
        ..MsgHeader::default()
    };
    let lut = u64::from_be_bytes(citrine_wire::msg::xdr_lut_field(5, lut_ms));
    let mut frame = Vec::new();
    let mut writer = MessageWriter::begin(&mut frame, &header);
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::DIGEST, &DIGEST.0)
        .field(field_type::LUT, &lut.to_be_bytes());
    if !delete {
        writer.op(
            op_type::WRITE,
            ParticleType::String as u8,
            b"v",
            value.as_bytes(),
        );
    }
    writer.finish();
    let message = Message::decode(&frame[8..]).unwrap();
    let request = prepare(&message, &DIGEST.0, None).unwrap();
    let mut out = Vec::new();
    perform(namespace, &request, Now::from_unix_ms(NOW_MS), &mut out);
    Message::decode(&out[8..]).unwrap().header.result_code
}

fn stored(namespace: &Namespace) -> (Option<u64>, Option<u64>) {
    let partition = namespace.index.partition(DIGEST.partition()).read();
    let live = partition
        .get(&DIGEST)
        .map(|entry| entry.meta().last_update_ms);
    let tombstone = partition.tombstone(&DIGEST).map(|t| t.last_update_ms);
    (live, tombstone)
}

#[test]
fn shipped_writes_keep_the_source_lut_and_lose_to_newer_local_copies() {
    let namespace = namespace();
    let l1 = NOW_MS - 5000;
    assert_eq!(run(&namespace, true, false, l1, "a"), 0);
    assert_eq!(stored(&namespace).0, Some(l1), "the source's LUT, not now");
    assert_eq!(
        run(&namespace, true, false, l1 - 1, "old"),
        28,
        "older loses"
    );
    assert_eq!(run(&namespace, true, false, l1, "same"), 28, "a tie loses");
    assert_eq!(run(&namespace, true, false, l1 + 1, "b"), 0, "newer wins");
    assert_eq!(stored(&namespace).0, Some(l1 + 1));

    let l2 = l1 + 10;
    assert_eq!(
        run(&namespace, true, true, l2 - 1, ""),
        0,
        "a newer delete wins"
    );
    assert_eq!(
        stored(&namespace),
        (None, Some(l2 - 1)),
        "its tombstone keeps its LUT"
    );
    assert_eq!(
        run(&namespace, true, false, l2 - 2, "c"),
        28,
        "older than the delete"
    );
    assert_eq!(run(&namespace, true, false, l2, "d"), 0);

    // A client's write: the field is ignored, the LUT is now.
    assert_eq!(run(&namespace, false, false, l1, "e"), 0);
    assert_eq!(stored(&namespace).0, Some(NOW_MS));
}

#[test]
fn a_change_that_waited_for_its_lock_takes_its_lut_under_it() {
    // Each request is taken up at NOW_MS (`run`'s `now`) and gets its
    // partition's lock seconds later: an XDR scan that read the clock and
    // the partition meanwhile did not see it, so its LUT must be past
    // that scan's window, the time it was decided under the lock.
    let clock = std::sync::Arc::new(ManualClock::new(NOW_MS + 5000));
    let shared: std::sync::Arc<dyn crate::Clock> = clock.clone();
    let namespace = Namespace::open(NamespaceConfig::in_memory("test"), shared).unwrap();
    assert_eq!(run(&namespace, false, false, 0, "a"), 0);
    assert_eq!(stored(&namespace).0, Some(NOW_MS + 5000), "a write");
    clock.advance_ms(1000);
    assert_eq!(run(&namespace, false, true, 0, ""), 0);
    assert_eq!(
        stored(&namespace).1,
        Some(NOW_MS + 6000),
        "a durable delete"
    );
}

/// Whether the live record, else the tombstone, came by XDR.
fn marked(namespace: &Namespace) -> Option<bool> {
    let partition = namespace.index.partition(DIGEST.partition()).read();
    let live = partition.get(&DIGEST).map(|entry| entry.meta().xdr_write);
    live.or_else(|| Some(partition.tombstone(&DIGEST)?.xdr_write))
}

/// A shipped write marks the record as arrived by XDR (so this site does
/// not ship it back); a client's write over it clears the mark; a shipped
/// delete leaves a marked tombstone, a client's delete an unmarked one.
#[test]
fn shipped_writes_and_deletes_are_marked_and_client_writes_clear_the_mark() {
    let namespace = namespace();
    assert_eq!(run(&namespace, true, false, NOW_MS - 5000, "a"), 0);
    assert_eq!(marked(&namespace), Some(true));
    assert_eq!(run(&namespace, false, false, 0, "b"), 0);
    assert_eq!(marked(&namespace), Some(false), "a client's write");
    assert_eq!(run(&namespace, true, false, NOW_MS + 1, "c"), 0);
    assert_eq!(marked(&namespace), Some(true));
    assert_eq!(run(&namespace, true, true, NOW_MS + 2, ""), 0);
    assert_eq!(
        marked(&namespace),
        Some(true),
        "a shipped delete's tombstone"
    );
    assert_eq!(run(&namespace, false, false, 0, "d"), 0);
    assert_eq!(run(&namespace, false, true, 0, ""), 0);
    assert_eq!(marked(&namespace), Some(false), "a client's delete");
}

/// The master's copy as a replica write or a migration sends it, stored
/// at another node: what that node then holds is marked as the master's
/// is (so that a replica or a migration's target that becomes master
/// does not ship back what came by XDR), for a record and a tombstone.
#[test]
fn the_mark_travels_with_replica_writes_and_migrations() {
    use crate::copy::{capture, store_copy, Admit, ReplicaWrite};
    let now = Now::from_unix_ms(NOW_MS);
    let copy_to = |master: &Namespace, other: &Namespace| {
        let sent = capture(master, &DIGEST, now).encode();
        let received = ReplicaWrite::decode(&sent).unwrap();
        store_copy(other, &received, now, 0, Admit::Always).unwrap();
    };
    // A client's write takes the clock's time (`lut_ms` is ignored).
    let (master, replica) = (namespace(), namespace());
    for (xdr, delete, lut_ms) in [
        (true, false, NOW_MS - 5000),
        (false, false, 0),
        (true, false, NOW_MS + 1000),
        (true, true, NOW_MS + 2000),
        (false, false, 0),
        (false, true, 0),
    ] {
        assert_eq!(run(&master, xdr, delete, lut_ms, "v"), 0);
        copy_to(&master, &replica);
        assert_eq!(
            marked(&replica),
            Some(xdr),
            "a copy of a {} by {}",
            if delete { "delete" } else { "write" },
            if xdr { "XDR" } else { "a client" }
        );
    }
}

/// A device namespace on `disk`, its index image at `image` (a fast
/// restart when a clean shutdown left one, else a cold start).
fn device_namespace(
    disk: &citrine_storage::device::io::SimDisk,
    image: &std::path::Path,
) -> Namespace {
    use citrine_storage::device::{DeviceConfig, Media};
    let engine = DeviceConfig {
        write_block_size: 64 << 10,
        media: Media::Simulated(vec![disk.clone()]),
        ..DeviceConfig::new("test", vec!["sim0".into()], 0)
    };
    let config = NamespaceConfig {
        storage_engine: crate::config::StorageEngineConfig::Device {
            engine,
            flush_max_ms: 1000,
            index_image: Some(image.to_path_buf()),
        },
        ..NamespaceConfig::in_memory("test")
    };
    Namespace::open(config, std::sync::Arc::new(ManualClock::new(NOW_MS))).unwrap()
}

/// A record that came by XDR is still marked after a fast restart and
/// after a cold start; a client's write over it is not; the void time
/// that carries the mark on the device comes back whole.
#[test]
fn the_mark_survives_device_restarts() {
    let directory = std::env::temp_dir().join(format!("citrine-xdr-mark-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let image = directory.join("test.index");
    let disk = citrine_storage::device::io::SimDisk::new((1 << 20) + 32 * (64 << 10), 5);
    let void_time = |namespace: &Namespace| {
        let partition = namespace.index.partition(DIGEST.partition()).read();
        partition.get(&DIGEST).map(|entry| entry.meta().void_time)
    };
    for xdr in [true, false] {
        let namespace = device_namespace(&disk, &image);
        assert_eq!(run(&namespace, xdr, false, NOW_MS + 1000, "v"), 0);
        assert_eq!(marked(&namespace), Some(xdr));
        let written = void_time(&namespace);
        crate::device::shutdown(&namespace, &ManualClock::new(NOW_MS)).unwrap();
        drop(namespace);
        for restart in ["fast", "cold"] {
            let namespace = device_namespace(&disk, &image);
            assert_eq!(
                marked(&namespace),
                Some(xdr),
                "{restart} restart, xdr {xdr}"
            );
            assert_eq!(void_time(&namespace), written, "{restart} restart");
            // Not shut down: the next start scans the device.
            crate::device::flush_tick(&namespace);
        }
    }
    let _ = std::fs::remove_dir_all(&directory);
}

/// A delete's tombstone is in the index again after a fast restart and
/// after a cold start, as it was before: its LUT (the source's for a
/// shipped delete), generation, life, durability and XDR mark — so a
/// delete that came by XDR is not shipped back after a restart, and one
/// not yet shipped still is. The same for a delete stored as a replica's
/// copy.
#[test]
fn tombstones_keep_their_lut_and_mark_across_device_restarts() {
    use crate::copy::{capture, store_copy, Admit, ReplicaWrite};
    let directory = std::env::temp_dir().join(format!("citrine-xdr-tomb-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let image = directory.join("test.index");
    let tombstone = |namespace: &Namespace| {
        let partition = namespace.index.partition(DIGEST.partition()).read();
        partition.tombstone(&DIGEST)
    };
    for (xdr, by_replica) in [(true, false), (false, false), (true, true)] {
        let disk = citrine_storage::device::io::SimDisk::new((1 << 20) + 32 * (64 << 10), 5);
        let namespace = device_namespace(&disk, &image);
        if by_replica {
            let master = super::xdr_tests::namespace();
            assert_eq!(run(&master, false, false, 0, "v"), 0);
            assert_eq!(run(&namespace, false, false, 0, "v"), 0);
            assert_eq!(run(&master, xdr, true, NOW_MS + 2000, ""), 0);
            let sent = capture(&master, &DIGEST, Now::from_unix_ms(NOW_MS)).encode();
            let received = ReplicaWrite::decode(&sent).unwrap();
            store_copy(
                &namespace,
                &received,
                Now::from_unix_ms(NOW_MS),
                0,
                Admit::Always,
            )
            .unwrap();
        } else {
            assert_eq!(run(&namespace, false, false, 0, "v"), 0);
            assert_eq!(run(&namespace, xdr, true, NOW_MS + 2000, ""), 0);
        }
        let before = tombstone(&namespace);
        assert_eq!(before.map(|t| t.xdr_write), Some(xdr));
        crate::device::shutdown(&namespace, &ManualClock::new(NOW_MS)).unwrap();
        drop(namespace);
        for restart in ["fast", "cold"] {
            let namespace = device_namespace(&disk, &image);
            assert_eq!(
                tombstone(&namespace),
                before,
                "{restart} restart, xdr {xdr}, by replica {by_replica}"
            );
            crate::device::flush_tick(&namespace);
        }
    }
    let _ = std::fs::remove_dir_all(&directory);
}
