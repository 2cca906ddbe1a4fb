//! Strong-consistency namespaces as served today: the roster info
//! commands' formats, the shared store they change, and the refusal (11)
//! of every data request on an SC namespace.

use super::*;
use crate::cluster_state::{ClusterMember, ClusterState};

/// `test` strong-consistency (active rack `active_rack`, 0 for none),
/// `bar` AP.
fn sc_service(active_rack: u32) -> Service {
    let mut sc = NamespaceConfig::in_memory("test");
    sc.sc.strong_consistency = true;
    sc.sc.active_rack = active_rack;
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
    // A view this node leads: applied once.
    publish_two(&service, 0xA1);
    assert_eq!(
        service.dist().apply_pending_rosters_at_view(),
        vec!["test".to_owned()]
    );
    assert!(ask(&service, "roster:namespace=test").starts_with("roster=A1:pending_roster=A1:"));
    assert!(service.dist().apply_pending_rosters_at_view().is_empty());
}
