//! A stable, dependency-free mutation fuzzer for the wire decoders, run by a
//! plain `cargo test`. It is the always-available complement of the
//! coverage-guided cargo-fuzz targets in `fuzz/` (which need libFuzzer and
//! nightly, or RUSTC_BOOTSTRAP): same oracle (`fuzz/src/oracle.rs`, included
//! below), same seeds, but blind random mutations instead of coverage feedback.
//!
//! Deterministic: the seed is printed and fixed unless overridden.
//! Environment:
//! - `CITRINE_FUZZ_ITERATIONS`: iterations (default 1 000 000 in release,
//!   200 000 in debug builds: a few seconds either way);
//! - `CITRINE_FUZZ_SEED`: PRNG seed (decimal or 0x-hex);
//! - `CITRINE_FUZZ_REPLAY`: path of one input to replay through both oracles
//!   instead of fuzzing (e.g. a crash file written by this test or by
//!   cargo-fuzz).
//!
//! A panic in a decoder or an oracle assertion fails the test; the input is
//! printed in hex and written under the cargo target tmp dir for replay.
//!
//! Regenerate the committed cargo-fuzz seeds (fuzz/seeds/) with
//! `cargo test -p citrine-wire --test fuzz_smoke -- --ignored write_fuzz_seeds`.

#[path = "../../../fuzz/src/oracle.rs"]
mod oracle;

use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const DEFAULT_SEED: u64 = 0xC17_214E_F022_2026;
const DEFAULT_ITERATIONS_RELEASE: u64 = 1_000_000;
const DEFAULT_ITERATIONS_DEBUG: u64 = 200_000;
/// Largest input the fuzzer builds (mutations that would grow past it are cut).
const MAX_INPUT: usize = 8 * 1024;
/// How many decoded mutants are kept to be mutated further.
const POOL_SIZE: usize = 512;

/// splitmix64: tiny, fast, good enough to drive mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (`bound` > 0; the modulo bias is irrelevant here).
    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }

    fn chance(&mut self, numerator: u64, denominator: u64) -> bool {
        self.next() % denominator < numerator
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Bytes that matter to these decoders: boundaries, the AS_MSG header size,
/// proto types and versions, and the info protocol's separators.
const INTERESTING_U8: &[u8] = &[
    0, 1, 2, 3, 4, 5, 7, 8, 0x10, 0x14, 0x16, 0x20, 0x7f, 0x80, 0xfe, 0xff, b'\n', b'\t', b':',
    b';', b'=', b'/', 0xc3,
];
const INTERESTING_U16: &[u16] = &[
    0, 1, 2, 3, 0x7f, 0x80, 0xff, 0x100, 0x7fff, 0x8000, 0xfffe, 0xffff,
];
/// Length-field values: tiny, off-by-one around the op/field minimums, and
/// huge (overflow bait, 128 MiB limits).
const INTERESTING_U32: &[u32] = &[
    0,
    1,
    3,
    4,
    5,
    8,
    9,
    0x16,
    0x7f,
    0x80,
    0xff,
    0x100,
    0xffff,
    0x1_0000,
    0x0800_0000,
    0x0800_0001,
    0x0800_0008,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_fff8,
    0xffff_fffb,
    0xffff_fffc,
    0xffff_ffff,
];
const INTERESTING_U64: &[u64] = &[
    0,
    7,
    8,
    9,
    0x0800_0000,
    0x0800_0008,
    0x0800_0009,
    0xffff_ffff,
    0x1_0000_0000,
    0x7fff_ffff_ffff_ffff,
    0xffff_ffff_ffff_fff8,
    u64::MAX,
];

fn write_be(data: &mut [u8], at: usize, bytes: &[u8]) {
    if data.len() >= bytes.len() && at <= data.len() - bytes.len() {
        data[at..at + bytes.len()].copy_from_slice(bytes);
    }
}

/// Applies one random mutation in place. `donors` are other inputs to splice from.
fn mutate_once(rng: &mut Rng, data: &mut Vec<u8>, donors: &[Vec<u8>]) {
    let len = data.len();
    match rng.below(16) {
        0 if len > 0 => {
            let at = rng.below(len);
            data[at] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let at = rng.below(len);
            data[at] = rng.next() as u8;
        }
        2 if len > 0 => {
            let at = rng.below(len);
            data[at] = *rng.pick(INTERESTING_U8);
        }
        3 if len > 0 => {
            let at = rng.below(len);
            data[at] = data[at].wrapping_add((rng.below(33) as u8).wrapping_sub(16));
        }
        4 if len >= 2 => {
            let value = *rng.pick(INTERESTING_U16);
            write_be(data, rng.below(len - 1), &value.to_be_bytes());
        }
        5 if len >= 4 => {
            let value = *rng.pick(INTERESTING_U32);
            write_be(data, rng.below(len - 3), &value.to_be_bytes());
        }
        6 if len >= 8 => {
            let value = *rng.pick(INTERESTING_U64);
            write_be(data, rng.below(len - 7), &value.to_be_bytes());
        }
        // Structural targets: the proto size (bytes 2..8), the AS_MSG counts
        // (frame offsets 26 and 28), the compressed original length (8..16),
        // each set to an interesting or the self-consistent value.
        7 => match rng.below(4) {
            0 if len >= 8 => {
                let body = (len - 8) as u64;
                let size = if rng.chance(1, 2) {
                    body
                } else {
                    *rng.pick(INTERESTING_U64) & 0xFFFF_FFFF_FFFF
                };
                write_be(data, 2, &size.to_be_bytes()[2..]);
            }
            1 if len >= 30 => {
                let at = if rng.chance(1, 2) { 26 } else { 28 };
                write_be(data, at, &rng.pick(INTERESTING_U16).to_be_bytes());
            }
            2 if len >= 16 => {
                let value = if rng.chance(1, 2) {
                    *rng.pick(INTERESTING_U64)
                } else {
                    rng.next() >> rng.below(64)
                };
                write_be(data, 8, &value.to_be_bytes());
            }
            _ if len >= 4 => {
                // Huge length at a random 4-aligned-ish spot.
                let at = rng.below(len - 3);
                write_be(
                    data,
                    at,
                    &(0xffff_ffffu32 - rng.below(16) as u32).to_be_bytes(),
                );
            }
            _ => {}
        },
        8 if len > 0 => data.truncate(rng.below(len)),
        9 => {
            let extra = 1 + rng.below(32);
            for _ in 0..extra {
                let byte = if rng.chance(1, 2) {
                    *rng.pick(INTERESTING_U8)
                } else {
                    rng.next() as u8
                };
                data.push(byte);
            }
        }
        10 if len > 0 => {
            // Delete a range.
            let start = rng.below(len);
            let end = start + 1 + rng.below((len - start).min(64));
            data.drain(start..end);
        }
        11 if len > 0 => {
            // Duplicate a range in place (repeated fields/ops).
            let start = rng.below(len);
            let end = start + 1 + rng.below((len - start).min(128));
            let chunk = data[start..end].to_vec();
            let at = rng.below(data.len() + 1);
            data.splice(at..at, chunk);
        }
        12 | 13 if !donors.is_empty() => {
            // Splice: our head + a donor's tail, or insert a donor chunk.
            let donor = rng.pick(donors);
            if donor.is_empty() {
                return;
            }
            let from = rng.below(donor.len());
            let to = from + 1 + rng.below(donor.len() - from);
            if rng.chance(1, 2) {
                data.truncate(rng.below(len + 1));
                data.extend_from_slice(&donor[from..]);
            } else {
                let at = rng.below(len + 1);
                data.splice(at..at, donor[from..to].iter().copied());
            }
        }
        14 => {
            // Insert interesting bytes.
            let at = rng.below(len + 1);
            let count = 1 + rng.below(8);
            let bytes: Vec<u8> = (0..count).map(|_| *rng.pick(INTERESTING_U8)).collect();
            data.splice(at..at, bytes);
        }
        _ if len > 0 => {
            // Swap two bytes.
            let (a, b) = (rng.below(len), rng.below(len));
            data.swap(a, b);
        }
        _ => data.push(rng.next() as u8),
    }
    data.truncate(MAX_INPUT);
}

fn mutate(rng: &mut Rng, data: &mut Vec<u8>, donors: &[Vec<u8>]) {
    // 1 mutation most often, up to 8 now and then.
    let spread = 1 + rng.below(8);
    let rounds = 1 + rng.below(spread);
    for _ in 0..rounds {
        mutate_once(rng, data, donors);
    }
}

/// Rewrites the proto size to match the body, so mutations that changed the
/// body length still pass the framing checks a server would apply.
fn reframe(data: &mut [u8]) {
    if data.len() >= 8 {
        let body = ((data.len() - 8) as u64).min(citrine_wire::PROTO_SIZE_MAX);
        data[2..8].copy_from_slice(&body.to_be_bytes()[2..]);
    }
}

fn hex(data: &[u8]) -> String {
    data.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn env_number(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    let text = text.trim().replace('_', "");
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex_digits) => u64::from_str_radix(hex_digits, 16),
        None => text.parse(),
    };
    match parsed {
        Ok(value) => Some(value),
        Err(error) => panic!("{name}={text:?} is not a number: {error}"),
    }
}

#[derive(Clone, Copy, Debug)]
enum Target {
    Frame,
    Messages,
}

fn run(target: Target, input: &[u8]) -> bool {
    match target {
        Target::Frame => oracle::check_frame(input),
        Target::Messages => oracle::check_messages(input) > 0,
    }
}

fn crash_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz_smoke")
}

/// Runs one input, turning a panic into a report with a saved reproducer.
fn run_reporting(target: Target, input: &[u8], seed: u64, iteration: u64) -> bool {
    match panic::catch_unwind(AssertUnwindSafe(|| run(target, input))) {
        Ok(accepted) => accepted,
        Err(_) => {
            let dir = crash_dir();
            let path = dir.join(format!("crash-{target:?}-{seed:016x}-{iteration}.bin"));
            let saved = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, input));
            eprintln!(
                "fuzz_smoke: PANIC on iteration {iteration} (seed {seed:#018x}, target {target:?})"
            );
            eprintln!("fuzz_smoke: input ({} bytes): {}", input.len(), hex(input));
            match saved {
                Ok(()) => eprintln!(
                    "fuzz_smoke: saved to {} — replay with CITRINE_FUZZ_REPLAY={}",
                    path.display(),
                    path.display()
                ),
                Err(error) => eprintln!("fuzz_smoke: could not save the input: {error}"),
            }
            panic!("citrine-wire decoder or oracle panicked; see the input above (seed {seed:#018x}, iteration {iteration})");
        }
    }
}

fn replay(path: &Path) {
    // cargo runs tests from the crate directory; also accept paths relative
    // to the workspace root.
    let from_root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path);
    let path = if path.is_relative() && !path.exists() {
        from_root.as_path()
    } else {
        path
    };
    let input = match std::fs::read(path) {
        Ok(input) => input,
        Err(error) => panic!("cannot read {}: {error}", path.display()),
    };
    println!(
        "fuzz_smoke: replaying {} ({} bytes)",
        path.display(),
        input.len()
    );
    let frame = oracle::check_frame(&input);
    let messages = oracle::check_messages(&input);
    println!("fuzz_smoke: replay passed (frame decoded: {frame}, messages decoded: {messages})");
}

#[test]
fn mutation_fuzz_decoders() {
    if let Some(path) = std::env::var_os("CITRINE_FUZZ_REPLAY") {
        replay(Path::new(&path));
        return;
    }
    let seed = env_number("CITRINE_FUZZ_SEED").unwrap_or(DEFAULT_SEED);
    let default_iterations = if cfg!(debug_assertions) {
        DEFAULT_ITERATIONS_DEBUG
    } else {
        DEFAULT_ITERATIONS_RELEASE
    };
    let iterations = env_number("CITRINE_FUZZ_ITERATIONS").unwrap_or(default_iterations);
    println!("fuzz_smoke: seed {seed:#018x}, {iterations} iterations (CITRINE_FUZZ_SEED / CITRINE_FUZZ_ITERATIONS override)");

    let frames = oracle::seed_frames();
    let streams = oracle::seed_message_streams();
    let plain_messages: Vec<Vec<u8>> = frames
        .iter()
        .filter(|frame| frame.get(1) == Some(&3))
        .cloned()
        .collect();
    let mut message_bodies: Vec<Vec<u8>> = plain_messages
        .iter()
        .map(|frame| frame[8..].to_vec())
        .collect();
    message_bodies.extend(streams.iter().cloned());
    let mut donors: Vec<Vec<u8>> = frames.clone();
    donors.extend(message_bodies.iter().cloned());

    let mut frame_pool: Vec<Vec<u8>> = frames.clone();
    let mut message_pool: Vec<Vec<u8>> = message_bodies.clone();
    let mut rng = Rng(seed);
    let started = Instant::now();
    let mut slowest = (Duration::ZERO, 0u64, target_placeholder());
    let mut accepted = [0u64; 2];
    let mut executed = [0u64; 2];

    for iteration in 0..iterations {
        let (target, input) = match rng.below(10) {
            // Mutated AS_MSG frame, re-framed and compressed into a type-4 frame.
            0 => {
                let mut inner = rng.pick(&plain_messages).clone();
                mutate(&mut rng, &mut inner, &donors);
                reframe(&mut inner);
                let mut compressed = citrine_wire::frame::deflate(&inner);
                if rng.chance(1, 4) {
                    mutate(&mut rng, &mut compressed, &donors);
                }
                (Target::Frame, compressed)
            }
            1..=6 => {
                let mut input = if rng.chance(1, 3) {
                    rng.pick(&frame_pool).clone()
                } else {
                    rng.pick(&frames).clone()
                };
                mutate(&mut rng, &mut input, &donors);
                if rng.chance(1, 3) {
                    reframe(&mut input);
                }
                (Target::Frame, input)
            }
            _ => {
                let mut input = if rng.chance(1, 3) {
                    rng.pick(&message_pool).clone()
                } else {
                    rng.pick(&message_bodies).clone()
                };
                mutate(&mut rng, &mut input, &donors);
                (Target::Messages, input)
            }
        };
        let one = Instant::now();
        let decoded = run_reporting(target, &input, seed, iteration);
        let took = one.elapsed();
        if took > slowest.0 {
            slowest = (took, iteration, (target, input.clone()));
        }
        let slot = target as usize;
        executed[slot] += 1;
        if decoded {
            accepted[slot] += 1;
            // Keep decoded mutants to go deeper from them.
            let pool = match target {
                Target::Frame => &mut frame_pool,
                Target::Messages => &mut message_pool,
            };
            if pool.len() < POOL_SIZE {
                pool.push(input);
            } else {
                let at = rng.below(POOL_SIZE);
                pool[at] = input;
            }
        }
    }
    let elapsed = started.elapsed();
    println!(
        "fuzz_smoke: {iterations} inputs in {elapsed:.2?} ({:.0}/s); frames {}/{} decoded, streams {}/{} decoded; slowest {:.2?} (iteration {})",
        iterations as f64 / elapsed.as_secs_f64().max(1e-9),
        accepted[0],
        executed[0],
        accepted[1],
        executed[1],
        slowest.0,
        slowest.1
    );
    // Hangs would stall the test; a merely slow input is saved for a look.
    if slowest.0 > Duration::from_millis(100) {
        let (target, input) = &slowest.2;
        let path = crash_dir().join(format!("slowest-{target:?}-{seed:016x}-{}.bin", slowest.1));
        let saved =
            std::fs::create_dir_all(crash_dir()).and_then(|()| std::fs::write(&path, input));
        println!(
            "fuzz_smoke: slowest input ({} bytes) saved to {}: {saved:?}",
            input.len(),
            path.display()
        );
    }
}

fn target_placeholder() -> (Target, Vec<u8>) {
    (Target::Frame, Vec::new())
}

#[test]
fn seeds_decode_and_round_trip() {
    for (index, frame) in oracle::seed_frames().iter().enumerate() {
        assert!(
            oracle::check_frame(frame),
            "seed frame {index} does not decode: {}",
            hex(frame)
        );
        let mut header = [0u8; 8];
        header.copy_from_slice(&frame[..8]);
        let proto = citrine_wire::ProtoHeader::decode(&header).expect("seed header");
        assert_eq!(
            proto.size as usize,
            frame.len() - 8,
            "seed frame {index} size"
        );
        if proto.message_type == citrine_wire::MessageType::Message {
            let compressed = citrine_wire::frame::deflate(frame);
            let (inner, body) = citrine_wire::frame::inflate(&compressed[8..]).expect("round trip");
            assert_eq!(inner, proto);
            assert_eq!(body, &frame[8..]);
            assert!(oracle::check_frame(&compressed));
        }
    }
    let expected = [1, 1, 4, 4];
    for (stream, count) in oracle::seed_message_streams().iter().zip(expected) {
        assert_eq!(
            oracle::check_messages(stream),
            count,
            "stream {}",
            hex(stream)
        );
    }
}

/// Edge cases worth pinning, independent of the PRNG.
#[test]
fn hand_made_edge_cases() {
    let mut inputs: Vec<Vec<u8>> = vec![
        vec![],
        vec![2],
        vec![2, 3, 0, 0, 0, 0, 0, 0],
        vec![2, 4, 0, 0, 0, 0, 0, 0],
        vec![2, 1, 0, 0, 0, 0, 0, 0],
        vec![0, 2, 0, 0, 0, 0, 0, 0],
        vec![2, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        vec![2, 5, 0, 0, 0, 0, 0, 0],
    ];
    // AS_MSG headers claiming the maximum counts with nothing behind them.
    let mut counts = vec![2, 3, 0, 0, 0, 0, 0, 22, 22];
    counts.extend_from_slice(&[0; 17]);
    counts.extend_from_slice(&[0xff, 0xff, 0xff, 0xff]);
    inputs.push(counts);
    // A field and an op whose lengths are u32::MAX.
    for tail in [[0xff, 0xff, 0xff, 0xff, 0], [0xff, 0xff, 0xff, 0xfb, 1]] {
        let mut huge = vec![2, 3, 0, 0, 0, 0, 0, 27, 22];
        huge.extend_from_slice(&[0; 17]);
        huge.extend_from_slice(if tail[4] == 0 {
            &[0, 1, 0, 0]
        } else {
            &[0, 0, 0, 1]
        });
        huge.extend_from_slice(&tail[..4]);
        huge.push(0);
        inputs.push(huge);
    }
    // Compressed frames announcing absurd original lengths.
    for announced in [0u64, 7, 8, 9, 0x0800_0008, 0x0800_0009, u64::MAX] {
        let mut frame = vec![2, 4, 0, 0, 0, 0, 0, 10];
        frame.extend_from_slice(&announced.to_be_bytes());
        frame.extend_from_slice(&[0x78, 0x01]);
        inputs.push(frame);
    }
    // A compressed frame whose inner frame is an info frame (must be rejected).
    inputs.push(citrine_wire::frame::deflate(
        &citrine_wire::info::request_frame(&["node"]),
    ));
    // Info bodies made of separators and invalid UTF-8.
    let mut info = vec![2, 1, 0, 0, 0, 0, 0, 0];
    info.extend_from_slice(b"\n\n:\n/\n;\n=\n:;=;\n\xff\xfe/\xc3:\xc3=\t\t\n");
    inputs.push(info);
    for input in &inputs {
        run_reporting(Target::Frame, input, 0, 0);
        run_reporting(Target::Messages, input, 0, 0);
        if input.len() > 8 {
            run_reporting(Target::Messages, &input[8..], 0, 0);
        }
    }
}

/// Writes the seed corpus committed under fuzz/seeds/ (run on demand).
#[test]
#[ignore = "writes fuzz/seeds/; run explicitly to regenerate the committed seed corpus"]
fn write_fuzz_seeds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds");
    let sets = [
        ("wire_frame", oracle::seed_frames()),
        ("wire_message", oracle::seed_message_streams()),
    ];
    for (target, seeds) in sets {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).expect("create seed dir");
        for (index, seed) in seeds.iter().enumerate() {
            let path = dir.join(format!("seed-{index:02}.bin"));
            std::fs::write(&path, seed).expect("write seed");
            println!("wrote {} ({} bytes)", path.display(), seed.len());
        }
    }
    // Bodies of the AS_MSG seed frames are single-message streams too.
    let dir = root.join("wire_message");
    let streams = oracle::seed_message_streams();
    let bodies = oracle::seed_frames()
        .into_iter()
        .filter(|frame| frame.get(1) == Some(&3))
        .map(|frame| frame[8..].to_vec());
    for (index, body) in bodies.filter(|body| !streams.contains(body)).enumerate() {
        std::fs::write(dir.join(format!("body-{index:02}.bin")), body).expect("write seed");
    }
}
