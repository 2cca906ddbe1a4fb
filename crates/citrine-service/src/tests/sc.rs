//! Strong-consistency namespaces as served today: the roster info
//! commands' formats, the shared store they change, the refusal (11) of
//! data requests on partitions the view does not make available, and a
//! node alone serving the partitions it is the only replica of.

use super::*;
use crate::cluster_state::{ClusterMember, ClusterState};

/// `test` strong-consistency (active rack `active_rack`, 0 for none),
/// `bar` AP.
fn sc_service(active_rack: u32) -> Service {
    let mut sc = NamespaceConfig::in_memory("test");
    sc.sc.strong_consistency = true;
    sc.sc.active_rack = active_rack;
    sc.sc.serve_data = true;
    let (service, _) = service_with_all(vec![sc, NamespaceConfig::in_memory("bar")]);
    service
}

fn ask(service: &Service, command: &str) -> String {
    info(service, &[command]).remove(0).1
}

/// A view of this node (rack 2) and `other` (rack 1).
fn publish_two(service: &Service, other: u64) {
    let me = service.node_id;
    let member = |id: u64, rack_id: u32| ClusterMember {
        node_id: citrine_types::NodeId(id),
        rack_id,
        service_address: String::new(),
        tls: None,
    };
    service.publish_cluster(ClusterState::new(
        me,
        other ^ 0x5100,
        vec![member(me.0, 2), member(other, 1)],
        &[("test".into(), 2), ("bar".into(), 2)],
        2,
        2,
    ));
}

#[test]
fn roster_answers_follow_the_references_formats() {
    let service = sc_service(0);
    let me = service.node_id;
    publish_two(&service, 0xA1);
    let observed = format!("{me}@2,A1@1");
    assert_eq!(
        ask(&service, "roster:namespace=test"),
        format!("roster=null:pending_roster=null:observed_nodes={observed}")
    );
    let staged = format!("roster-set:namespace=test;nodes={observed}");
    assert_eq!(ask(&service, &staged), "ok");
    assert_eq!(
        ask(&service, "roster:namespace=test"),
        format!("roster=null:pending_roster={observed}:observed_nodes={observed}")
    );
    assert_eq!(ask(&service, "recluster:"), "ok");
    // Only SC namespaces are listed without `namespace=`.
    assert_eq!(
        ask(&service, "roster:"),
        format!("ns=test:roster={observed}:pending_roster={observed}:observed_nodes={observed}")
    );
    assert_eq!(ask(&service, "revive:namespace=test"), "ok");
}

#[test]
fn the_namespace_answer_shows_the_strong_consistency_options() {
    let service = sc_service(3);
    let pairs = |name: &str| ask(&service, &format!("namespace/{name}"));
    let sc = pairs("test");
    for pair in [
        "strong-consistency=true",
        "strong-consistency-allow-expunge=false",
        "auto-revive=false",
        "active-rack=3",
    ] {
        assert!(sc.split(';').any(|item| item == pair), "{pair} in {sc}");
    }
    let ap = pairs("bar");
    assert!(
        ap.split(';').any(|item| item == "strong-consistency=false"),
        "{ap}"
    );
}

#[test]
fn an_active_rack_prefixes_the_observed_nodes() {
    let service = sc_service(2);
    publish_two(&service, 0xA1);
    let me = service.node_id;
    assert_eq!(
        ask(&service, "roster:namespace=test"),
        format!("roster=null:pending_roster=null:observed_nodes=M2|{me}@2,A1@1")
    );
    // Pasted back as operators do, the prefix is kept.
    let staged = format!("roster-set:namespace=test;nodes=M2|{me}@2,A1@1");
    assert_eq!(ask(&service, &staged), "ok");
    assert!(ask(&service, "roster:namespace=test").contains("pending_roster=M2|"));
}

#[test]
fn recluster_on_a_non_principal_is_ignored() {
    let service = sc_service(0);
    let me = service.node_id;
    // The other member's id is higher: it is the principal.
    publish_two(&service, me.0 + 1);
    let staged = format!("roster-set:namespace=test;nodes={me}");
    assert_eq!(ask(&service, &staged), "ok");
    assert_eq!(ask(&service, "recluster:"), "ignored-by-non-principal");
    assert!(
        ask(&service, "roster:namespace=test").starts_with("roster=null:"),
        "not applied"
    );
    assert!(!service.dist().take_recluster_request());
    // In a view whose other member has a lower id, it is the principal.
    publish_two(&service, 0xA1);
    assert_eq!(ask(&service, "recluster:"), "ok");
    assert!(ask(&service, "roster:namespace=test").starts_with(&format!("roster={me}:")));
}

#[test]
fn roster_commands_refuse_ap_unknown_namespaces_and_bad_lists() {
    let service = sc_service(0);
    let not_sc = "ERROR:4:namespace is not strong-consistency";
    assert_eq!(ask(&service, "roster:namespace=bar"), not_sc);
    assert_eq!(ask(&service, "roster-set:namespace=bar;nodes=A1"), not_sc);
    assert_eq!(ask(&service, "revive:namespace=bar"), not_sc);
    let unknown = "ERROR:4:namespace not found";
    assert_eq!(ask(&service, "roster:namespace=nope"), unknown);
    assert_eq!(ask(&service, "roster-set:namespace=nope;nodes=A1"), unknown);
    assert_eq!(
        ask(&service, "roster-set:namespace=test"),
        "ERROR:4:missing nodes"
    );
    assert_eq!(
        ask(&service, "roster-set:nodes=A1"),
        "ERROR:4:missing namespace"
    );
    assert_eq!(
        ask(&service, "roster-set:namespace=test;nodes=A1,A1"),
        "ERROR:4:node A1 listed twice"
    );
    assert_eq!(
        ask(&service, "roster-set:namespace=test;nodes=xyz"),
        "ERROR:4:bad node id 'xyz'"
    );
    assert_eq!(ask(&service, "revive:"), "ERROR:4:missing namespace");
    // Nothing was staged by the refused commands.
    assert!(ask(&service, "roster:namespace=test").starts_with("roster=null:pending_roster=null:"));
}

#[test]
fn rosters_are_kept_in_the_work_directory_and_merged_newest_first() {
    let directory =
        std::env::temp_dir().join(format!("citrine-roster-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&directory);
    std::fs::create_dir_all(&directory).unwrap();
    let service = sc_service(0);
    service.dist().keep_rosters(&directory).unwrap();
    assert_eq!(
        ask(&service, "roster-set:namespace=test;nodes=B2@1,A1"),
        "ok"
    );
    assert_eq!(ask(&service, "recluster:"), "ok");
    let text = service.dist().rosters_text();
    assert!(text.starts_with("namespace=test;roster=B2@1,A1;pending=B2@1,A1;version="));
    // A restarted node brings them back from its file.
    let restarted = sc_service(0);
    restarted.dist().keep_rosters(&directory).unwrap();
    assert_eq!(restarted.dist().rosters_text(), text);
    // A peer's newer change is taken, an older one is not.
    let other = sc_service(0);
    assert_eq!(ask(&other, "roster-set:namespace=test;nodes=C3"), "ok");
    let older = other.dist().rosters_text();
    assert_eq!(ask(&restarted, "roster-set:namespace=test;nodes=D4"), "ok");
    restarted.dist().merge_rosters(&older);
    assert!(ask(&restarted, "roster:namespace=test").contains("pending_roster=D4"));
    other.dist().merge_rosters(&restarted.dist().rosters_text());
    assert!(ask(&other, "roster:namespace=test").starts_with("roster=B2@1,A1:pending_roster=D4:"));
    let _ = std::fs::remove_dir_all(&directory);
}

#[test]
fn an_sc_namespace_answers_unavailable_and_an_ap_one_serves() {
    let service = sc_service(0);
    let write = put("k", Ops::new().int(op_type::WRITE, "a", 1));
    assert_eq!(send(&service, &write).header.result_code, 11);
    assert_eq!(send(&service, &get("k")).header.result_code, 11);
    // The same requests on the AP namespace `bar` are served.
    let on_bar = |frame: Vec<u8>| rename_namespace(&frame, "bar");
    assert_eq!(send(&service, &on_bar(write.clone())).header.result_code, 0);
    assert_eq!(send(&service, &on_bar(get("k"))).header.result_code, 0);
}

/// `frame` (a request on `test`) sent to namespace `to` instead.
fn rename_namespace(frame: &[u8], to: &str) -> Vec<u8> {
    let message = Message::decode(&frame[8..]).unwrap();
    let mut out = Vec::new();
    let mut writer = MessageWriter::begin(&mut out, &message.header);
    for field in message.fields() {
        let data = match field.field_type {
            field_type::NAMESPACE => to.as_bytes(),
            _ => field.data,
        };
        writer.field(field.field_type, data);
    }
    for op in message.ops() {
        writer.op(op.op_type, op.particle_type, op.name, op.value);
    }
    writer.finish();
    out
}

#[test]
fn a_pending_roster_is_applied_at_the_next_view_on_its_principal() {
    let service = sc_service(0);
    let me = service.node_id;
    assert_eq!(ask(&service, "roster-set:namespace=test;nodes=A1"), "ok");
    // A view whose principal is another node: nothing applied here.
    publish_two(&service, me.0 + 1);
    assert!(service.dist().apply_pending_rosters_at_view().is_empty());
    assert!(ask(&service, "roster:namespace=test").starts_with("roster=null:"));
    // A view this node leads: applied as it is published, once.
    publish_two(&service, 0xA1);
    assert!(ask(&service, "roster:namespace=test").starts_with("roster=A1:pending_roster=A1:"));
    assert!(service.dist().apply_pending_rosters_at_view().is_empty());
    // Staged after the view formed: pending until the next view.
    assert_eq!(ask(&service, "roster-set:namespace=test;nodes=A2"), "ok");
    assert!(service.dist().apply_pending_rosters_at_view().is_empty());
    assert!(ask(&service, "roster:namespace=test").starts_with("roster=A1:pending_roster=A2:"));
}

/// A view of this node alone under cluster key `key` (its exchange
/// resolves at once).
fn publish_alone(service: &Service, key: u64) {
    let me = service.node_id;
    let member = ClusterMember {
        node_id: me,
        rack_id: 0,
        service_address: String::new(),
        tls: None,
    };
    service.publish_cluster(ClusterState::new(
        me,
        key,
        vec![member],
        &[("test".into(), 2), ("bar".into(), 2)],
        2,
        2,
    ));
}

/// `name=` in the `namespace/test` answer.
fn stat(service: &Service, name: &str) -> String {
    let answer = ask(service, "namespace/test");
    answer
        .split(';')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {name} in {answer}"))
        .to_owned()
}

#[test]
fn a_rostered_view_makes_partitions_available_with_a_regime() {
    let service = sc_service(0);
    let me = service.node_id;
    publish_alone(&service, 0x51);
    // No roster: nothing is available, the cluster is not stable.
    assert_eq!(stat(&service, "unavailable_partitions"), "4096");
    assert_eq!(stat(&service, "dead_partitions"), "0");
    assert_eq!(ask(&service, "cluster-stable:"), "ERROR::unstable-cluster");
    let empty = citrine_distribution::cluster_state::bitmap_base64(std::iter::empty());
    assert!(ask(&service, "replicas").contains(&format!("test:0,1,{empty}")));
    assert!(!service.dist().take_recluster_request());
    // The roster of this node, then `recluster:`: a new view is asked for.
    assert_eq!(
        ask(&service, &format!("roster-set:namespace=test;nodes={me}")),
        "ok"
    );
    assert_eq!(ask(&service, "recluster:"), "ok");
    assert!(service.dist().take_recluster_request());
    publish_alone(&service, 0x52);
    assert_eq!(stat(&service, "unavailable_partitions"), "0");
    assert_eq!(ask(&service, "cluster-stable:"), "52");
    let all = citrine_distribution::cluster_state::bitmap_base64(citrine_types::PartitionId::all());
    let replicas = ask(&service, "replicas");
    assert!(replicas.contains(&format!("test:2,1,{all}")), "{replicas}");
    assert!(replicas.contains("bar:0,1,"), "{replicas}");
    assert!(ask(&service, "replicas-master").contains(&format!("test:{all}")));
    // Every later view serves in a higher regime; this node, the only
    // replica, serves the data.
    publish_alone(&service, 0x53);
    assert!(ask(&service, "replicas").contains(&format!("test:4,1,{all}")));
    let write = put("k", Ops::new().int(op_type::WRITE, "a", 1));
    assert_eq!(send(&service, &write).header.result_code, 0);
    assert_eq!(send(&service, &get("k")).header.result_code, 0);
    assert!(!service.dist().take_recluster_request(), "decided with it");
}

#[test]
fn without_serve_data_an_available_partition_still_answers_11() {
    let mut sc = NamespaceConfig::in_memory("test");
    sc.sc.strong_consistency = true;
    sc.sc.serve_data = false;
    let (service, _) = service_with_all(vec![sc]);
    let me = service.node_id;
    publish_alone(&service, 0x51);
    assert_eq!(
        ask(&service, &format!("roster-set:namespace=test;nodes={me}")),
        "ok"
    );
    assert_eq!(ask(&service, "recluster:"), "ok");
    publish_alone(&service, 0x52);
    assert_eq!(stat(&service, "unavailable_partitions"), "0");
    let write = put("k", Ops::new().int(op_type::WRITE, "a", 1));
    assert_eq!(send(&service, &write).header.result_code, 11);
    assert_eq!(send(&service, &get("k")).header.result_code, 11);
}

#[test]
fn sc_versions_survive_a_restart_in_the_work_directory() {
    let directory =
        std::env::temp_dir().join(format!("citrine-sc-versions-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&directory);
    std::fs::create_dir_all(&directory).unwrap();
    let service = sc_service(0);
    let me = service.node_id;
    service.dist().keep_rosters(&directory).unwrap();
    service.dist().keep_sc_versions(&directory).unwrap();
    ask(&service, &format!("roster-set:namespace=test;nodes={me}"));
    ask(&service, "recluster:");
    publish_alone(&service, 0x61);
    publish_alone(&service, 0x62);
    assert_eq!(service.dist().sc_regime("test"), 4);
    // In memory, a restart lost the copies: the regime is kept, the
    // partitions are dead (the whole roster is here, its copies gone)
    // until `revive:`.
    let restarted = sc_service(0);
    restarted.dist().keep_rosters(&directory).unwrap();
    restarted.dist().keep_sc_versions(&directory).unwrap();
    assert_eq!(restarted.dist().sc_regime("test"), 4);
    publish_alone(&restarted, 0x63);
    assert_eq!(stat(&restarted, "dead_partitions"), "4096");
    assert_eq!(stat(&restarted, "unavailable_partitions"), "4096");
    assert_eq!(ask(&restarted, "revive:namespace=test"), "ok");
    assert!(restarted.dist().take_recluster_request());
    publish_alone(&restarted, 0x64);
    assert_eq!(stat(&restarted, "dead_partitions"), "0");
    assert_eq!(stat(&restarted, "unavailable_partitions"), "0");
    assert!(ask(&restarted, "replicas").contains("test:8,1,"));
    let _ = std::fs::remove_dir_all(&directory);
}

/// An SC namespace on a device with `commit-to-device`, one node, its
/// versions in a work directory (a restart on its own drive keeps them:
/// they stand). A restart on a blank
/// drive (replaced) under the same work directory must not claim the
/// copies the kept versions describe: every partition is dead until
/// `revive:`. Before, the kept "full" versions stood, every partition was
/// available, and the acknowledged record read back absent.
#[test]
fn a_blank_drive_under_a_kept_work_directory_claims_no_copy() {
    use citrine_storage::device::io::SimDisk;
    use citrine_storage::device::{DeviceConfig, Media};
    let directory =
        std::env::temp_dir().join(format!("citrine-sc-blank-drive-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&directory);
    std::fs::create_dir_all(&directory).unwrap();
    let bytes = (1 << 20) + 16 * (64 << 10);
    let on = |disk: &SimDisk| {
        let mut engine = DeviceConfig {
            write_block_size: 64 << 10,
            media: Media::Simulated(vec![disk.clone()]),
            ..DeviceConfig::new("test", vec!["sim0".into()], 0)
        };
        engine.commit_to_device = true;
        let mut sc = NamespaceConfig {
            storage_engine: StorageEngineConfig::Device {
                engine,
                flush_max_ms: 1000,
                index_image: None,
            },
            ..NamespaceConfig::in_memory("test")
        };
        sc.sc.strong_consistency = true;
        sc.sc.serve_data = true;
        let (service, _) = service_with_all(vec![sc]);
        service.dist().keep_rosters(&directory).unwrap();
        service.dist().keep_sc_versions(&directory).unwrap();
        service
    };
    let service = on(&SimDisk::new(bytes, 7));
    let me = service.node_id;
    ask(&service, &format!("roster-set:namespace=test;nodes={me}"));
    ask(&service, "recluster:");
    publish_alone(&service, 0x61);
    publish_alone(&service, 0x62);
    let write = put("k", Ops::new().int(op_type::WRITE, "a", 1));
    assert_eq!(send(&service, &write).header.result_code, 0);
    drop(service);
    let replaced = on(&SimDisk::new(bytes, 8));
    publish_alone(&replaced, 0x64);
    assert_eq!(stat(&replaced, "dead_partitions"), "4096");
    assert_eq!(send(&replaced, &get("k")).header.result_code, 11);
    let _ = std::fs::remove_dir_all(&directory);
}

/// A foreground scan of `test` tracking partitions `pids` (info1 READ,
/// PARTITION_DONE asked), or a background one (info2 WRITE with one write
/// op: a background operations job).
pub(crate) fn scan_frame(pids: &[u16], background: bool) -> Vec<u8> {
    let header = MsgHeader {
        info1: if background { 0 } else { info1::READ },
        info2: if background { info2::WRITE } else { 0 },
        info3: citrine_wire::msg::info3::PARTITION_DONE,
        transaction_ttl: 1000,
        ..MsgHeader::default()
    };
    let mut out = Vec::new();
    let mut writer = MessageWriter::begin(&mut out, &header);
    writer.field(field_type::NAMESPACE, b"test");
    writer.field(field_type::TASK_ID, &0x5C5Cu64.to_be_bytes());
    let bytes: Vec<u8> = pids.iter().flat_map(|pid| pid.to_le_bytes()).collect();
    writer.field(field_type::PID_ARRAY, &bytes);
    if background {
        writer.op(op_type::WRITE, 1, b"b", &7i64.to_be_bytes());
    }
    writer.finish();
    out
}

/// The records a scan of `pids` streams, and the partitions it reports
/// unavailable (partition-done with 11).
pub(crate) fn scan_sc(service: &Service, pids: &[u16]) -> (usize, Vec<u16>) {
    let messages = crate::batch::tests::run(service, &scan_frame(pids, false));
    let last = messages.last().expect("a LAST message");
    assert_eq!(last.header.info3, citrine_wire::msg::info3::LAST);
    assert_eq!(last.header.result_code, 0);
    let done = citrine_wire::msg::info3::PARTITION_DONE;
    let records = messages.iter().filter(|m| m.header.info3 == 0).count();
    let unavailable = messages
        .iter()
        .filter(|m| m.header.info3 == done && m.header.result_code == 11)
        .map(|m| m.header.generation as u16)
        .collect();
    (records, unavailable)
}

#[test]
fn scans_read_the_partitions_this_node_masters_in_the_sc_map_only() {
    let service = sc_service(0);
    let me = service.node_id;
    let keys = ["k1", "k2", "k3", "k4"];
    let pids: Vec<u16> = keys
        .iter()
        .map(|key| key_digest(key).partition().get())
        .collect();
    // Undecided (no view), then a view without a roster: every partition
    // asked for is unavailable, nothing is read.
    assert_eq!(scan_sc(&service, &pids), (0, sorted(&pids)));
    publish_alone(&service, 0x51);
    assert_eq!(scan_sc(&service, &pids), (0, sorted(&pids)));
    // The roster of this node: it masters every partition and serves them.
    let staged = format!("roster-set:namespace=test;nodes={me}");
    assert_eq!(ask(&service, &staged), "ok");
    assert_eq!(ask(&service, "recluster:"), "ok");
    publish_alone(&service, 0x52);
    for key in keys {
        let write = put(key, Ops::new().int(op_type::WRITE, "a", 1));
        assert_eq!(send(&service, &write).header.result_code, 0);
    }
    assert_eq!(scan_sc(&service, &pids), (keys.len(), Vec::new()));
    // A background job's writes do not take the SC path: refused, 16.
    let background = crate::batch::tests::run(&service, &scan_frame(&pids, true));
    assert_eq!(background[0].header.result_code, 16);
}

#[test]
fn scans_of_a_closed_sc_namespace_answer_11() {
    let mut sc = NamespaceConfig::in_memory("test");
    sc.sc.strong_consistency = true;
    sc.sc.serve_data = false;
    let (service, _) = service_with_all(vec![sc]);
    let messages = crate::batch::tests::run(&service, &scan_frame(&[1, 2], false));
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].header.result_code, 11);
}

fn key_digest(key: &str) -> citrine_types::Digest {
    crate::batch::tests::digest("demo", key)
}

fn sorted(pids: &[u16]) -> Vec<u16> {
    let mut pids = pids.to_vec();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// `test` strong-consistency on a simulated device without
/// `commit-to-device`, with `auto-revive` as given; `bar` AP.
fn sc_device_service(disk: &citrine_storage::device::io::SimDisk, auto_revive: bool) -> Service {
    use citrine_storage::device::{DeviceConfig, Media};
    let engine = DeviceConfig {
        write_block_size: 64 << 10,
        media: Media::Simulated(vec![disk.clone()]),
        ..DeviceConfig::new("test", vec!["sim0".into()], 0)
    };
    let mut sc = NamespaceConfig {
        storage_engine: StorageEngineConfig::Device {
            engine,
            flush_max_ms: 1000,
            index_image: None,
        },
        ..NamespaceConfig::in_memory("test")
    };
    sc.sc.strong_consistency = true;
    sc.sc.serve_data = true;
    sc.sc.auto_revive = auto_revive;
    service_with_all(vec![sc, NamespaceConfig::in_memory("bar")]).0
}

/// A node (re)started on `disk` and `directory`, alone in view `key`.
fn start_on(
    disk: &citrine_storage::device::io::SimDisk,
    directory: &std::path::Path,
    auto_revive: bool,
    key: u64,
) -> Service {
    let service = sc_device_service(disk, auto_revive);
    service.dist().keep_rosters(directory).unwrap();
    service.dist().keep_sc_versions(directory).unwrap();
    publish_alone(&service, key);
    service
}

/// Clean shutdown as the server does it: storage closed, flushed and
/// synced, then the mark.
fn shut_down_cleanly(service: &Service) {
    let namespace = service.namespace(b"test").unwrap();
    crate::device::shutdown(namespace, service.clock()).unwrap();
    service.dist().mark_clean_shutdown().unwrap();
}

fn value_of(service: &Service, key: &str) -> (u8, Vec<u8>) {
    let reply = send(service, &get(key));
    let value = reply
        .bins
        .first()
        .map(|bin| bin.2.clone())
        .unwrap_or_default();
    (reply.header.result_code, value)
}

/// After a clean shutdown (storage closed to writes, flushed, synced,
/// then the work directory marked) a whole-roster restart keeps every
/// copy: no partition is dead and the write reads back, `auto-revive` or
/// not. A crash after that (the mark was taken at start) leaves every
/// partition dead until `revive:`, unless `auto-revive` keeps the copies
/// (counted in `auto_revived_partitions`).
#[test]
fn a_clean_shutdown_keeps_the_copies_and_auto_revive_keeps_a_crashs() {
    use citrine_storage::device::io::{PowerCut, SimDisk};
    let directory =
        std::env::temp_dir().join(format!("citrine-sc-auto-revive-{}", std::process::id()));
    for (seed, auto_revive) in [(11, false), (12, true)] {
        let _ = std::fs::remove_dir_all(&directory);
        std::fs::create_dir_all(&directory).unwrap();
        let disk = SimDisk::new((1 << 20) + 16 * (64 << 10), seed);
        let service = start_on(&disk, &directory, auto_revive, 0x71);
        let me = service.node_id;
        ask(&service, &format!("roster-set:namespace=test;nodes={me}"));
        ask(&service, "recluster:");
        publish_alone(&service, 0x72);
        let write = |service: &Service, key: &str, value: i64| {
            let ops = Ops::new().int(op_type::WRITE, "a", value);
            send(service, &put(key, ops)).header.result_code
        };
        assert_eq!(write(&service, "k", 7), 0);
        shut_down_cleanly(&service);
        assert_ne!(write(&service, "late", 8), 0, "closed storage refuses");
        drop(service);

        let restarted = start_on(&disk, &directory, auto_revive, 0x73);
        assert_eq!(stat(&restarted, "dead_partitions"), "0");
        assert_eq!(stat(&restarted, "unavailable_partitions"), "0");
        assert_eq!(stat(&restarted, "auto_revived_partitions"), "0");
        assert_eq!(value_of(&restarted, "k"), (0, 7i64.to_be_bytes().to_vec()));
        assert_eq!(value_of(&restarted, "late").0, 2, "never acknowledged");
        drop(restarted);

        let crashed = start_on(
            &disk.power_cut(PowerCut::LoseUnsynced),
            &directory,
            auto_revive,
            0x74,
        );
        let (dead, revived) = if auto_revive {
            ("0", "4096")
        } else {
            ("4096", "0")
        };
        assert_eq!(
            stat(&crashed, "dead_partitions"),
            dead,
            "auto-revive {auto_revive}"
        );
        assert_eq!(stat(&crashed, "auto_revived_partitions"), revived);
    }
    let _ = std::fs::remove_dir_all(&directory);
}
