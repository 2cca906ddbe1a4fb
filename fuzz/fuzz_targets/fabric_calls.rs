//! The fabric (`citrine_service::Service::serve_fabric`): every call kind a
//! peer can send — proxied requests, replica writes, migration batches,
//! duplicate resolution, the partition-version exchange, drops, manifests
//! the pushes of index definitions, UDF modules and truncations, and parts
//! of aggregations — with arbitrary payloads, into one node that keeps its
//! state across inputs (a view of
//! its own with cluster key 1, an in-memory namespace `test`, no fabric of
//! its own, so nothing leaves it).
//!
//! Input: byte 0 is the call kind (its low 4 bits), the rest the payload.
//!
//! Oracle: no panic, no hang, memory bounded by libFuzzer; afterwards the
//! node still answers an `EXCHANGE` for its own key.
#![no_main]

use citrine_service::Service;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

const NODE: u64 = 0xA1;
const CLUSTER_KEY: u64 = 1;

fn node() -> &'static (tokio::runtime::Runtime, Service) {
    static NODE_STATE: OnceLock<(tokio::runtime::Runtime, Service)> = OnceLock::new();
    NODE_STATE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let (_clock, service) = citrine_wire_fuzz::node::single_node(NODE, CLUSTER_KEY, 2);
        (runtime, service)
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, payload)) = data.split_first() else {
        return;
    };
    let (runtime, service) = node();
    let _answer = runtime.block_on(service.serve_fabric(kind & 0x0F, payload));
    // Still serving: its own exchange answer, and an info call.
    let exchange = runtime.block_on(service.serve_fabric(
        citrine_service::replication::call_kind::EXCHANGE,
        &CLUSTER_KEY.to_be_bytes(),
    ));
    assert!(!exchange.is_empty(), "no exchange answer");
});
