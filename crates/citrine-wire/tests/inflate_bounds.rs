//! Compressed (type 4) frames cost what they announce, not what their zlib
//! stream expands to: a small frame that inflates to 100 MiB is refused
//! quickly and without a large allocation. A counting global allocator
//! measures the peak bytes allocated while `inflate` runs.

use citrine_wire::frame::{inflate, inflate_within, MessageType, ProtoHeader};
use flate2::{Compress, Compression, FlushCompress};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Counts the bytes allocated now and the peak since the last reset.
struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// The tests share the counters: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

// SAFETY: only counts; every allocation and release is the system
// allocator's, with the caller's layout and pointer passed through unchanged.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(now, Ordering::Relaxed);
        System.alloc(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const MIB: usize = 1024 * 1024;

/// Runs `work`; its result, how long it took and the most bytes allocated
/// at once above what was allocated before it.
fn measured<T>(work: impl FnOnce() -> T) -> (T, Duration, usize) {
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let began = Instant::now();
    let result = work();
    let took = began.elapsed();
    (
        result,
        took,
        PEAK.load(Ordering::Relaxed).saturating_sub(base),
    )
}

/// Adler-32 of `prefix` followed by `zeros` zero bytes.
fn adler32(prefix: &[u8], zeros: usize) -> u32 {
    const MOD: u64 = 65_521;
    let (mut a, mut b) = (1u64, 0u64);
    for &byte in prefix {
        a = (a + u64::from(byte)) % MOD;
        b = (b + a) % MOD;
    }
    b = (b + (zeros as u64 % MOD) * a) % MOD;
    ((b << 16) | a) as u32
}

/// Compresses `input` completely with a full flush (the compressor's
/// history is reset after it), appending to `out`.
fn compress_flushed(
    compress: &mut Compress,
    input: &[u8],
    flush: FlushCompress,
    out: &mut Vec<u8>,
) {
    let mut offset = 0;
    loop {
        out.reserve(64 * 1024);
        let before = compress.total_in();
        compress
            .compress_vec(&input[offset..], out, flush)
            .expect("compresses");
        offset += (compress.total_in() - before) as usize;
        if offset == input.len() && out.len() < out.capacity() {
            return;
        }
    }
}

/// A type-4 body whose zlib stream inflates to `prefix` then `zeros` zero
/// bytes and announces that many bytes. Built in 256 KiB chunks compressed
/// once and repeated (each follows a full flush, so every chunk compresses
/// to the same bytes), so building it costs milliseconds.
fn bomb(prefix: &[u8], zeros: usize) -> Vec<u8> {
    const CHUNK: usize = 256 * 1024;
    assert_eq!(zeros % CHUNK, 0);
    let mut compress = Compress::new(Compression::best(), true);
    let mut stream = Vec::new();
    compress_flushed(&mut compress, prefix, FlushCompress::Full, &mut stream);
    let chunk_zeros = vec![0u8; CHUNK];
    let mut first = Vec::new();
    compress_flushed(&mut compress, &chunk_zeros, FlushCompress::Full, &mut first);
    let mut chunk = Vec::new();
    compress_flushed(&mut compress, &chunk_zeros, FlushCompress::Full, &mut chunk);
    assert_eq!(
        first, chunk,
        "a flushed chunk compresses the same every time"
    );
    for _ in 0..zeros / CHUNK {
        stream.extend_from_slice(&chunk);
    }
    let mut tail = Vec::new();
    compress_flushed(&mut compress, &[], FlushCompress::Finish, &mut tail);
    // The trailer's checksum is of what this compressor saw; the stream
    // carries more.
    let trailer = tail.len() - 4;
    tail[trailer..].copy_from_slice(&adler32(prefix, zeros).to_be_bytes());
    stream.extend_from_slice(&tail);
    let mut body = ((prefix.len() + zeros) as u64).to_be_bytes().to_vec();
    body.extend_from_slice(&stream);
    body
}

/// The bombs below are built as this one is, 100 MiB in a ~100 KiB frame
/// (inflating all 100 MiB here would take seconds in a debug build).
#[test]
fn a_bomb_really_inflates_to_what_it_announces() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let body = bomb(&[7; 8], 8 * MIB);
    let mut decoder = flate2::read::ZlibDecoder::new(&body[8..]);
    let inflated = std::io::copy(&mut decoder, &mut std::io::sink()).expect("a valid stream");
    assert_eq!(inflated, 8 * MIB as u64 + 8);
    let large = bomb(&[], 100 * MIB);
    assert!(large.len() < 200 * 1024, "{} bytes", large.len());
}

#[test]
fn a_small_frame_of_zeros_announcing_100_mib_is_refused_without_inflating_it() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let body = bomb(&[], 100 * MIB);
    let (result, took, peak) = measured(|| inflate(&body));
    assert!(result.is_err(), "zeros are no proto header");
    assert!(took < Duration::from_millis(500), "took {took:?}");
    assert!(peak < 4 * MIB, "allocated {peak} bytes");
}

#[test]
fn an_announced_size_over_the_limit_is_refused_before_inflating() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let header = ProtoHeader::encode(MessageType::Message, 100 * MIB as u64);
    let body = bomb(&header, 100 * MIB);
    let (result, took, peak) = measured(|| inflate_within(&body, MIB as u64));
    let error = result.expect_err("over the limit").to_string();
    assert!(error.contains("largest message"), "{error}");
    assert!(took < Duration::from_millis(100), "took {took:?}");
    assert!(peak < 64 * 1024, "allocated {peak} bytes");
}

#[test]
fn a_stream_longer_than_announced_stops_one_byte_past_it() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // The header announces 1 MiB; the stream carries 100 MiB.
    let header = ProtoHeader::encode(MessageType::Message, MIB as u64);
    let mut body = bomb(&header, 100 * MIB);
    body[..8].copy_from_slice(&(MIB as u64 + 8).to_be_bytes());
    let (result, took, peak) = measured(|| inflate(&body));
    assert!(result.is_err(), "an overrun is refused");
    assert!(took < Duration::from_secs(2), "took {took:?}");
    assert!(peak < 4 * MIB, "allocated {peak} bytes");
}

#[test]
fn a_frame_within_the_limit_inflates() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let header = ProtoHeader::encode(MessageType::Message, 2 * MIB as u64);
    let body = bomb(&header, 2 * MIB);
    let (inner, original) = inflate_within(&body, 2 * MIB as u64).expect("inflates");
    assert_eq!(inner.size, 2 * MIB as u64);
    assert_eq!(original.len(), 2 * MIB);
    assert!(original.iter().all(|&byte| byte == 0));
    assert!(inflate_within(&body, 2 * MIB as u64 - 1).is_err());
}
