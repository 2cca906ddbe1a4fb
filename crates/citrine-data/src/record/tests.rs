//! Unit tests of the record operations that need no namespace.

#![allow(clippy::unwrap_used)]

use super::bins::apply_modify;
use super::*;
use citrine_record::Bin;
use citrine_types::ParticleType;
use citrine_wire::msg::{info2, op_type, MsgHeader, Op};

#[test]
fn generation_checks() {
    let eq = MsgHeader {
        info2: info2::WRITE | info2::GENERATION,
        generation: 3,
        ..MsgHeader::default()
    };
    assert!(check_generation(&eq, 3).is_ok());
    assert_eq!(check_generation(&eq, 2), Err(ResultCode::Generation));
    let gt = MsgHeader {
        info2: info2::WRITE | info2::GENERATION_GT,
        generation: 3,
        ..MsgHeader::default()
    };
    assert!(check_generation(&gt, 2).is_ok());
    assert_eq!(check_generation(&gt, 3), Err(ResultCode::Generation));
}

#[test]
fn modify_ops() {
    let mut bins: Vec<Bin<'_>> = Vec::new();
    let five = 5i64.to_be_bytes();
    let incr = Op {
        op_type: op_type::INCR,
        particle_type: 1,
        flags: 0,
        name: b"n",
        lut: None,
        value: &five,
    };
    apply_modify(&mut bins, &incr).expect("creates");
    apply_modify(&mut bins, &incr).expect("adds");
    assert_eq!(bins[0].as_integer(), Some(10));
    let half = 0.5f64.to_bits().to_be_bytes();
    let float_incr = Op {
        op_type: op_type::INCR,
        particle_type: 2,
        flags: 0,
        name: b"n",
        lut: None,
        value: &half,
    };
    assert_eq!(
        apply_modify(&mut bins, &float_incr),
        Err(ResultCode::IncompatibleType)
    );
    let append = Op {
        op_type: op_type::APPEND,
        particle_type: 3,
        flags: 0,
        name: b"s",
        lut: None,
        value: b"lo",
    };
    let prepend = Op {
        op_type: op_type::PREPEND,
        particle_type: 3,
        flags: 0,
        name: b"s",
        lut: None,
        value: b"hel",
    };
    apply_modify(&mut bins, &append).expect("creates");
    apply_modify(&mut bins, &prepend).expect("prepends");
    assert_eq!(bins[1].value.as_ref(), b"hello");
    let append_to_int = Op {
        op_type: op_type::APPEND,
        particle_type: 3,
        flags: 0,
        name: b"n",
        lut: None,
        value: b"x",
    };
    assert_eq!(
        apply_modify(&mut bins, &append_to_int),
        Err(ResultCode::IncompatibleType)
    );
    let delete_bin = Op {
        op_type: op_type::WRITE,
        particle_type: 0,
        flags: 0,
        name: b"n",
        lut: None,
        value: b"",
    };
    apply_modify(&mut bins, &delete_bin).expect("deletes bin");
    assert_eq!(bins.len(), 1);
}

/// As the reference: an append or prepend of a non-string to a missing
/// bin makes the bin from the operand; to an existing bin it is 12.
#[test]
fn append_or_prepend_of_a_non_string_makes_a_missing_bin() {
    let four = 4i64.to_be_bytes();
    let list = [0x91u8, 0x01];
    let mut bins: Vec<Bin<'_>> = Vec::new();
    for (op_type, particle_type, name, value) in [
        (
            op_type::PREPEND,
            ParticleType::Integer as u8,
            b"i",
            &four[..],
        ),
        (op_type::APPEND, ParticleType::List as u8, b"l", &list[..]),
    ] {
        let op = Op {
            op_type,
            particle_type,
            flags: 0,
            name,
            lut: None,
            value,
        };
        apply_modify(&mut bins, &op).expect("creates the bin");
        assert_eq!(
            apply_modify(&mut bins, &op),
            Err(ResultCode::IncompatibleType),
            "an existing {particle_type} bin"
        );
    }
    assert_eq!(bins[0].as_integer(), Some(4));
    assert_eq!(bins[1].particle_type, ParticleType::List as u8);
}

/// As the reference: an increment, append or prepend of a GeoJSON bin is
/// 1 whatever the operand (12 is for the other mismatched types); a write
/// replaces it.
#[test]
fn modifying_a_geojson_bin_is_a_server_error() {
    let point = br#"{"type":"Point","coordinates":[1.0,2.0]}"#;
    let mut geojson = vec![0u8, 0, 0];
    geojson.extend_from_slice(point);
    let mut bins = vec![Bin {
        name: std::borrow::Cow::Borrowed(b"g"),
        particle_type: ParticleType::GeoJson as u8,
        value: std::borrow::Cow::Owned(geojson),
    }];
    let one = 1i64.to_be_bytes();
    let half = 0.5f64.to_bits().to_be_bytes();
    let ops = [
        (op_type::INCR, ParticleType::Integer, &one[..]),
        (op_type::INCR, ParticleType::Float, &half[..]),
        (op_type::APPEND, ParticleType::String, &b"x"[..]),
        (op_type::PREPEND, ParticleType::Blob, &b"x"[..]),
    ];
    for (op_type, particle_type, value) in ops {
        let op = Op {
            op_type,
            particle_type: particle_type as u8,
            flags: 0,
            name: b"g",
            lut: None,
            value,
        };
        assert_eq!(
            apply_modify(&mut bins, &op),
            Err(ResultCode::ServerError),
            "op {op_type} with a {particle_type:?} operand"
        );
    }
    let write = Op {
        op_type: op_type::WRITE,
        particle_type: ParticleType::Integer as u8,
        flags: 0,
        name: b"g",
        lut: None,
        value: &one,
    };
    apply_modify(&mut bins, &write).expect("a write replaces the bin");
    assert_eq!(bins[0].as_integer(), Some(1));
}
