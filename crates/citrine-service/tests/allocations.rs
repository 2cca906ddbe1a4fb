//! Counts heap allocations per request on the hot path, so a change that
//! adds allocations to reads or writes fails here instead of hiding in a
//! benchmark. The counts are exact and deterministic: only the measuring
//! thread's allocations count (the test harness's own threads allocate
//! when they please, more so on a loaded machine).

// A counting global allocator needs `unsafe impl GlobalAlloc`; it only
// delegates to the system allocator.
#![allow(unsafe_code, clippy::unwrap_used)]

use citrine_service::config::{NamespaceConfig, ServiceConfig};
use citrine_service::{ManualClock, Service};
use citrine_wire::digest::{of_key, UserKey};
use citrine_wire::frame::ProtoHeader;
use citrine_wire::msg::{field_type, info1, info2, op_type, MessageWriter, MsgHeader};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
/// The kernel thread id whose allocations count (0: none yet).
static COUNTED_THREAD: AtomicU64 = AtomicU64::new(0);

/// This thread's kernel id: a system call, so asking allocates nothing.
fn thread_id() -> u64 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u64 }
}

fn count() {
    let counted = COUNTED_THREAD.load(Ordering::Relaxed);
    if counted != 0 && counted == thread_id() {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged; counting does not touch the memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(pointer, layout) }
    }
    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(pointer, layout, size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn frame(key: &str, header: MsgHeader, bins: usize) -> Vec<u8> {
    let digest = of_key("demo", &UserKey::String(key.into()));
    let mut out = Vec::new();
    let mut writer = MessageWriter::begin(&mut out, &header);
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::SET, b"demo")
        .field(field_type::DIGEST, &digest.0);
    for bin in 0..bins {
        writer.op(
            op_type::WRITE,
            3,
            format!("bin{bin}").as_bytes(),
            b"0123456789",
        );
    }
    writer.finish();
    out
}

/// Allocations of `runs` requests of `frame`, the reply buffer already grown.
fn allocations_per_request(service: &Service, frame: &[u8], runs: u64) -> f64 {
    let header = ProtoHeader::decode(frame[..8].try_into().unwrap()).unwrap();
    let mut out = Vec::with_capacity(64 * 1024);
    service.handle(header, &frame[8..], &mut out).unwrap();
    COUNTED_THREAD.store(thread_id(), Ordering::Relaxed);
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..runs {
        out.clear();
        service.handle(header, &frame[8..], &mut out).unwrap();
    }
    let counted = ALLOCATIONS.load(Ordering::Relaxed) - before;
    COUNTED_THREAD.store(0, Ordering::Relaxed);
    // Byte 5 of the AS_MSG header, after the 8-byte proto header.
    assert_eq!(out[8 + 5], 0, "the request succeeds");
    counted as f64 / runs as f64
}

#[test]
fn hot_path_allocations() {
    let config = ServiceConfig::local(1, vec![NamespaceConfig::in_memory("test")]);
    let service = Service::new(config, Arc::new(ManualClock::new(1_700_000_000_000)));
    let write = frame(
        "k",
        MsgHeader {
            info2: info2::WRITE,
            ..MsgHeader::default()
        },
        10,
    );
    let read = frame(
        "k",
        MsgHeader {
            info1: info1::READ | info1::GET_ALL,
            ..MsgHeader::default()
        },
        0,
    );
    // A read with the commonest filter, [EQ, [BIN, STRING, "bin0"], "0123456789"].
    let filtered_read = {
        let digest = of_key("demo", &UserKey::String("k".into()));
        let mut out = Vec::new();
        let header = MsgHeader {
            info1: info1::READ | info1::GET_ALL,
            ..MsgHeader::default()
        };
        let mut writer = MessageWriter::begin(&mut out, &header);
        let mut filter = vec![0x93, 0x01, 0x93, 0x51, 0x03, 0xA4];
        filter.extend_from_slice(b"bin0");
        filter.extend_from_slice(&[0xAB, 0x03]);
        filter.extend_from_slice(b"0123456789");
        writer
            .field(field_type::NAMESPACE, b"test")
            .field(field_type::SET, b"demo")
            .field(field_type::DIGEST, &digest.0)
            .field(field_type::FILTER_EXPRESSION, &filter);
        writer.finish();
        out
    };
    let writes = allocations_per_request(&service, &write, 1000);
    let reads = allocations_per_request(&service, &read, 1000);
    let filtered = allocations_per_request(&service, &filtered_read, 1000);
    println!(
        "allocations per request: read (10 bins) {reads}, update (10 bins) {writes}, \
         read with a filter {filtered}"
    );
    // A read copies the stored bins straight into the reply buffer.
    assert_eq!(reads, 0.0, "reads must not allocate");
    // An update allocates the working bin list and the new body (which
    // becomes the stored record) — nothing else.
    assert!(writes <= 2.0, "an update allocates {writes} times");
    // ...and at least the new body: the counter sees this thread.
    assert!(writes >= 1.0, "the counter missed the update's allocations");
    // A filter is parsed once per request (its node tree); evaluating it
    // against the record allocates nothing more.
    assert!(
        filtered <= 3.0,
        "a filtered read allocates {filtered} times"
    );
}
