//! Storage compression through the service: a device namespace (simulated
//! disk) stores records with bins of every particle type compressed with
//! LZ4, then zstd, then not at all (changed by `set-config`), and reads them
//! back identical to a memory namespace's copies, before and after a fast
//! restart and a cold start; `get-config` and `data_compression_ratio`
//! show the setting and its effect.

#![allow(clippy::unwrap_used)]

use crate::config::{
    Compression, CompressionAlgorithm, NamespaceConfig, ServiceConfig, StorageEngineConfig,
};
use crate::{ManualClock, Service};
use citrine_storage::device::io::SimDisk;
use citrine_storage::device::{DeviceConfig, Media};
use citrine_wire::digest::{of_key, UserKey};
use citrine_wire::frame::ProtoHeader;
use citrine_wire::msg::{field_type, info1, info2, op_type, Message, MessageWriter, MsgHeader};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

const START_MS: u64 = 1_700_000_000_000;

type Bins = Vec<(Vec<u8>, u8, Vec<u8>)>;

fn service(disk: &SimDisk, image: &Path) -> Service {
    let engine = DeviceConfig {
        write_block_size: 64 << 10,
        media: Media::Simulated(vec![disk.clone()]),
        compression: Compression {
            algorithm: CompressionAlgorithm::Lz4,
            level: 0,
        },
        ..DeviceConfig::new("test", vec!["sim0".into()], 0)
    };
    let device = NamespaceConfig {
        storage_engine: StorageEngineConfig::Device {
            engine,
            flush_max_ms: 1000,
            index_image: Some(image.to_path_buf()),
        },
        ..NamespaceConfig::in_memory("test")
    };
    let config = ServiceConfig::local(
        0xBB9020011AC4202,
        vec![device, NamespaceConfig::in_memory("mem")],
    );
    Service::new(config, Arc::new(ManualClock::new(START_MS)))
}

/// Sends one request frame; the reply's result code and bins.
fn send(service: &Service, frame: &[u8]) -> (u8, Bins) {
    let mut header_bytes = [0u8; 8];
    header_bytes.copy_from_slice(&frame[..8]);
    let mut out = Vec::new();
    service
        .handle(
            ProtoHeader::decode(&header_bytes).unwrap(),
            &frame[8..],
            &mut out,
        )
        .unwrap();
    let message = Message::decode(&out[8..]).unwrap();
    let bins = message
        .ops()
        .map(|op| (op.name.to_vec(), op.particle_type, op.value.to_vec()))
        .collect();
    (message.header.result_code, bins)
}

fn request(
    namespace: &str,
    key: &str,
    header: MsgHeader,
    ops: &[(u8, u8, &str, Vec<u8>)],
) -> Vec<u8> {
    let digest = of_key("demo", &UserKey::String(key.into()));
    let mut out = Vec::new();
    let mut writer = MessageWriter::begin(&mut out, &header);
    writer
        .field(field_type::NAMESPACE, namespace.as_bytes())
        .field(field_type::SET, b"demo")
        .field(field_type::DIGEST, &digest.0);
    for (op, particle, name, value) in ops {
        writer.op(*op, *particle, name.as_bytes(), value);
    }
    writer.finish();
    out
}

fn noise(seed: u64, length: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// Writes of every particle type, with values that compress (`seed`
/// even) or not.
fn every_particle(seed: u64) -> Vec<(u8, u8, &'static str, Vec<u8>)> {
    let compressible = seed.is_multiple_of(2);
    let text = if compressible {
        format!("value {seed} ").repeat(60).into_bytes()
    } else {
        noise(seed, 40)
    };
    let blob = if compressible {
        vec![seed as u8; 700]
    } else {
        noise(seed + 1, 700)
    };
    let mut list = vec![0xDC, 0x01, 0x00]; // array16 of 256
    list.extend((0..256u32).map(|index| {
        if compressible {
            1
        } else {
            (index as u8 ^ seed as u8) & 0x7F
        }
    }));
    let map = [0x82, 0xA1, b'a', 0x01, 0xA1, b'b', 0xC3].to_vec();
    let mut geo = vec![0, 0, 0];
    geo.extend_from_slice(br#"{"type":"Point","coordinates":[-122.5,37.5]}"#);
    let write = op_type::WRITE;
    vec![
        (write, 1, "int", (seed as i64 * 7919).to_be_bytes().to_vec()),
        (
            write,
            2,
            "float",
            (seed as f64 / 3.0).to_be_bytes().to_vec(),
        ),
        (write, 3, "str", text),
        (write, 4, "blob", blob),
        (write, 17, "bool", vec![u8::from(compressible)]),
        (write, 20, "list", list),
        (write, 19, "map", map),
        (write, 23, "geo", geo),
        // HLL init: [INIT, 12 index bits, 0 minhash bits, no flags].
        (
            op_type::HLL_MODIFY,
            4,
            "hll",
            vec![0x94, 0x00, 0x0C, 0x00, 0x00],
        ),
    ]
}

fn put(service: &Service, namespace: &str, seed: u64) {
    let header = MsgHeader {
        info2: info2::WRITE,
        ..MsgHeader::default()
    };
    let (code, _) = send(
        service,
        &request(
            namespace,
            &format!("k{seed}"),
            header,
            &every_particle(seed),
        ),
    );
    assert_eq!(code, 0, "write of k{seed} to {namespace}");
}

fn get(service: &Service, namespace: &str, seed: u64) -> Bins {
    let header = MsgHeader {
        info1: info1::READ | info1::GET_ALL,
        ..MsgHeader::default()
    };
    let (code, bins) = send(
        service,
        &request(namespace, &format!("k{seed}"), header, &[]),
    );
    assert_eq!(code, 0, "read of k{seed} from {namespace}");
    bins
}

fn info_value(service: &Service, command: &str, name: &str) -> String {
    let answers = crate::tests::info(service, &[command]);
    let answer = &answers[0].1;
    answer
        .split(';')
        .find_map(|pair| pair.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("{name} not in {answer}"))
        .to_owned()
}

fn set_config(service: &Service, params: &str) -> String {
    let command = format!("set-config:context=namespace;id=test;{params}");
    crate::tests::info(service, &[&command])[0].1.clone()
}

#[test]
fn every_particle_type_round_trips_compressed_and_not_across_restarts() {
    let dir = std::env::temp_dir().join(format!("citrine-compress-service-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let image = dir.join("test.index");
    let disk = SimDisk::new((1 << 20) + 32 * (64 << 10), 11);
    let mut expected: HashMap<u64, Bins> = HashMap::new();
    {
        let service = service(&disk, &image);
        let config = "get-config:context=namespace;id=test";
        assert_eq!(
            info_value(&service, config, "storage-engine.compression"),
            "lz4"
        );
        for (part, change) in [
            "",
            "compression=zstd;compression-level=3",
            "compression=none",
        ]
        .iter()
        .enumerate()
        {
            if !change.is_empty() {
                assert_eq!(set_config(&service, change), "ok");
            }
            for seed in part as u64 * 20..(part as u64 + 1) * 20 {
                put(&service, "test", seed);
                put(&service, "mem", seed);
                let bins = get(&service, "mem", seed);
                assert_eq!(bins.len(), 9, "every bin stored");
                assert_eq!(get(&service, "test", seed), bins, "k{seed}");
                expected.insert(seed, bins);
            }
        }
        assert_eq!(
            info_value(&service, config, "storage-engine.compression"),
            "none"
        );
        assert_eq!(
            info_value(&service, config, "storage-engine.compression-level"),
            "3"
        );
        assert!(set_config(&service, "compression=snappy").starts_with("ERROR:4"));
        assert!(set_config(&service, "compression-level=10").starts_with("ERROR:4"));
        let ratio: f64 = info_value(&service, "namespace/test", "data_compression_ratio")
            .parse()
            .unwrap();
        assert!(ratio < 0.9, "ratio {ratio}");
        assert_eq!(
            info_value(&service, "namespace/mem", "data_compression_ratio"),
            "1.000"
        );
        let namespace = service.namespace(b"test").unwrap();
        crate::device::shutdown(namespace, &ManualClock::new(START_MS)).unwrap();
    }
    for restart in ["fast", "cold"] {
        let service = service(&disk, &image);
        assert!(!image.exists(), "{restart}: the image is consumed at start");
        for (seed, bins) in &expected {
            assert_eq!(
                &get(&service, "test", *seed),
                bins,
                "{restart} restart: k{seed}"
            );
        }
        // Not shut down: the next start scans.
        crate::device::flush_tick(service.namespace(b"test").unwrap());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
