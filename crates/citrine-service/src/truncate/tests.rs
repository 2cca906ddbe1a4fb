#![allow(clippy::unwrap_used)]

use super::*;
use crate::batch::tests::{service, START_MS};
use crate::replication::{apply_replica_write, ReplicaWrite};
use crate::tests::info;
use citrine_types::ResultCode;
use citrine_wire::digest::{of_key, UserKey};
use std::time::{Duration, Instant};

/// Stores record `key` of `set` as a master's replica write would, last
/// updated at `last_update_ms`.
fn store(service: &Service, set: &str, key: i64, last_update_ms: u64) -> ResultCode {
    let body = citrine_record::encode_body(
        None,
        &[citrine_record::Bin {
            name: b"v".as_slice().into(),
            particle_type: 1,
            value: key.to_be_bytes().to_vec().into(),
        }],
    )
    .unwrap();
    apply_replica_write(
        service,
        &ReplicaWrite {
            namespace: "test".into(),
            digest: of_key(set, &UserKey::Integer(key)),
            generation: 1,
            void_time: 0,
            last_update_ms,
            set_name: set.as_bytes().to_vec(),
            body: Some(body),
        },
    )
}

/// Records of `set` the node holds (live or not).
fn held(service: &Service, set: &str) -> i64 {
    let namespace = service.namespace(b"test").unwrap();
    namespace.sets.existing_id(set.as_bytes()).map_or(0, |id| {
        namespace.sets.stats(id).objects.load(Ordering::Relaxed)
    })
}

fn command(service: &Service, text: &str) -> String {
    info(service, &[text]).remove(0).1
}

/// Waits for the background removal a merge started.
fn wait_held(service: &Service, set: &str, expected: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while held(service, set) != expected {
        assert!(
            Instant::now() < deadline,
            "{set}: {} held",
            held(service, set)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_truncation_made_on_one_node_reaches_the_others_and_only_grows() {
    let (a, clock) = service();
    let (b, clock_b) = service();
    for service in [&a, &b] {
        for key in 0..3 {
            assert_eq!(store(service, "s", key, START_MS - 1_000), ResultCode::Ok);
        }
        for key in 0..2 {
            assert_eq!(store(service, "t", key, START_MS - 1_000), ResultCode::Ok);
        }
    }
    clock.advance_ms(10);
    assert_eq!(command(&a, "truncate:namespace=test;set=s"), "ok");
    assert_eq!((held(&a, "s"), held(&a, "t")), (0, 2));
    let lut = START_MS + 10;
    assert_eq!(
        a.truncations_text(),
        format!("namespace=test;set=s;lut={lut}\n")
    );
    // B learns it from A's push: the records are hidden at once and
    // removed in the background; the other set keeps its records.
    b.merge_truncations(&a.truncations_text());
    let namespace = b.namespace(b"test").unwrap();
    let s = namespace.sets.existing_id(b"s").unwrap();
    assert!(namespace.is_truncated(s, START_MS - 1_000));
    wait_held(&b, "s", 0);
    assert_eq!(held(&b, "t"), 2);
    assert_eq!(b.truncations_text(), a.truncations_text());
    // A copy from before the threshold (a node that missed the command
    // migrating its records) is acknowledged and not stored; a later one is.
    assert_eq!(store(&b, "s", 7, lut - 1), ResultCode::Ok);
    assert_eq!(held(&b, "s"), 0);
    assert_eq!(store(&b, "s", 8, lut), ResultCode::Ok);
    assert_eq!(held(&b, "s"), 1);
    // An earlier threshold, from a peer or a command, changes nothing.
    b.merge_truncations(&format!("namespace=test;set=s;lut={}\n", lut - 500));
    let cut_ns = (lut - 500) * 1_000_000;
    assert_eq!(
        command(&b, &format!("truncate:namespace=test;set=s;lut={cut_ns}")),
        "ok"
    );
    assert_eq!(b.truncations_text(), a.truncations_text());
    assert_eq!(held(&b, "s"), 1);
    // A later one, the whole namespace, from B back to A.
    clock.advance_ms(10);
    clock_b.advance_ms(20);
    assert_eq!(store(&a, "t", 5, START_MS + 15), ResultCode::Ok);
    let cut_ns = (START_MS + 12) * 1_000_000;
    assert_eq!(
        command(
            &b,
            &format!("truncate-namespace:namespace=test;lut={cut_ns}")
        ),
        "ok"
    );
    assert_eq!(held(&b, "t"), 0);
    a.merge_truncations(&b.truncations_text());
    wait_held(&a, "t", 1);
    assert_eq!(
        a.truncations_text(),
        format!(
            "namespace=test;lut={}\nnamespace=test;set=s;lut={lut}\n",
            START_MS + 12
        )
    );
}

#[test]
fn a_set_this_node_never_stored_is_truncated_for_the_records_that_come_later() {
    let (a, clock) = service();
    let (b, _) = service();
    assert_eq!(store(&a, "only_a", 1, START_MS - 5), ResultCode::Ok);
    clock.advance_ms(1);
    assert_eq!(command(&a, "truncate:namespace=test;set=only_a"), "ok");
    b.merge_truncations(&a.truncations_text());
    // B had no record of the set; the old copy A's peer migrates later is
    // refused, a newer one is stored.
    assert_eq!(store(&b, "only_a", 1, START_MS - 5), ResultCode::Ok);
    assert_eq!(held(&b, "only_a"), 0);
    assert_eq!(store(&b, "only_a", 2, START_MS + 5), ResultCode::Ok);
    assert_eq!(held(&b, "only_a"), 1);
}

#[test]
fn truncations_are_kept_in_the_work_directory() {
    let directory = std::env::temp_dir().join(format!(
        "citrine-truncate-{}-{:x}",
        std::process::id(),
        START_MS
    ));
    let _ = std::fs::remove_dir_all(&directory);
    std::fs::create_dir_all(&directory).unwrap();
    let (a, clock) = service();
    a.keep_truncations(&directory).unwrap();
    clock.advance_ms(3);
    assert_eq!(command(&a, "truncate-namespace:namespace=test"), "ok");
    let file = directory.join(TRUNCATIONS_FILE);
    let saved = std::fs::read_to_string(&file).unwrap();
    assert_eq!(saved, format!("namespace=test;lut={}\n", START_MS + 3));
    // A restart (a memory namespace comes back empty) keeps the threshold:
    // an older copy offered later is not stored. A line that is not a
    // truncation is dropped from the file.
    std::fs::write(&file, format!("{saved}namespace=;lut=5\nnonsense\n")).unwrap();
    let (restarted, _) = service();
    restarted.keep_truncations(&directory).unwrap();
    assert_eq!(restarted.truncations_text(), saved);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), saved);
    assert_eq!(store(&restarted, "s", 1, START_MS), ResultCode::Ok);
    assert_eq!(held(&restarted, "s"), 0);
    let _ = std::fs::remove_dir_all(&directory);
}

#[test]
fn bad_truncation_commands_and_pushes_change_nothing() {
    let (a, _) = service();
    assert_eq!(store(&a, "s", 1, START_MS - 5), ResultCode::Ok);
    for (text, expected) in [
        (
            "truncate:namespace=nope;set=s",
            "ERROR:4:namespace not found",
        ),
        (
            "truncate:namespace=test;set=s;lut=12",
            "ERROR:4:lut would truncate to 0",
        ),
        ("truncate:namespace=test;set=s;lut=x", "ERROR:4:bad lut"),
        (
            "truncate:namespace=test;set=s;lut=99999999999999999999",
            "ERROR:4:bad lut",
        ),
        (
            "truncate-namespace:namespace=test;lut=1800000000000000000",
            "ERROR:4:lut is in the future",
        ),
    ] {
        assert_eq!(command(&a, text), expected, "{text}");
    }
    assert!(command(&a, "truncate-undo:namespace=test;set=s").starts_with("ERROR:4:"));
    a.merge_truncations("garbage\nnamespace=test;lut=zero\nnamespace=test;set=s\n\n");
    assert_eq!(a.truncations_text(), "");
    assert_eq!(held(&a, "s"), 1);
    // A namespace this node does not have is kept (and pushed on).
    a.merge_truncations("namespace=elsewhere;lut=5\n");
    assert_eq!(a.truncations_text(), "namespace=elsewhere;lut=5\n");
    assert_eq!(held(&a, "s"), 1);
}
