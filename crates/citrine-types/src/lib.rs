//! Shared vocabulary of Citrine.
//!
//! This crate owns the small value types every other crate speaks in: the
//! record [`Digest`], the [`PartitionId`] derived from it, the [`NodeId`], the
//! wire [`ResultCode`]s and the [`ParticleType`]s of bin values, plus the
//! citrusleaf-epoch time helpers and the striped statistics ([`stripes`])
//! every request updates.
//!
//! Invariants:
//! - a `PartitionId` is always `< PARTITIONS` (4096);
//! - `ResultCode` values are exactly the numbers the Aerospike protocol puts in
//!   byte 5 of an AS_MSG header; they never change meaning.
//!
//! It has no dependencies and does no I/O.

#![forbid(unsafe_code)]

mod result_code;
pub mod stripes;
mod time;

pub use result_code::ResultCode;
pub use time::{
    citrusleaf_epoch_ms, citrusleaf_epoch_seconds, unix_to_citrusleaf, CITRUSLEAF_EPOCH_UNIX_MS,
    CITRUSLEAF_EPOCH_UNIX_SECONDS,
};

/// Number of partitions of every namespace. Fixed by the protocol.
pub const PARTITIONS: usize = 4096;
const _: () = assert!(PARTITIONS.is_power_of_two());

/// Size in bytes of a record digest (RIPEMD-160).
pub const DIGEST_SIZE: usize = 20;

/// Longest namespace name, in bytes.
pub const NAMESPACE_NAME_MAX: usize = 31;
/// Longest set name, in bytes.
pub const SET_NAME_MAX: usize = 63;
/// Longest bin name, in bytes.
pub const BIN_NAME_MAX: usize = 15;
/// Largest number of ops in one AS_MSG.
pub const OPS_MAX: usize = 32_768;
/// Largest number of bins in one record.
pub const BINS_MAX: usize = 32_767;

/// The 20-byte RIPEMD-160 identity of a record within its namespace.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Digest(pub [u8; DIGEST_SIZE]);

impl Digest {
    /// The partition this digest falls into: the first two digest bytes read
    /// as a little-endian u16, modulo 4096, exactly as the clients compute it.
    #[inline]
    pub fn partition(&self) -> PartitionId {
        let raw = u16::from_le_bytes([self.0[0], self.0[1]]);
        PartitionId(raw & (PARTITIONS as u16 - 1))
    }

    /// Lower-case hexadecimal form, for logs and debug commands.
    pub fn to_hex(&self) -> String {
        let mut out = String::with_capacity(DIGEST_SIZE * 2);
        for byte in self.0 {
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
        out
    }

    /// Parses 40 hexadecimal characters.
    pub fn from_hex(text: &str) -> Option<Digest> {
        let bytes = text.as_bytes();
        if bytes.len() != DIGEST_SIZE * 2 {
            return None;
        }
        let mut out = [0u8; DIGEST_SIZE];
        for (slot, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
            let high = hex_value(pair[0])?;
            let low = hex_value(pair[1])?;
            *slot = (high << 4) | low;
        }
        Some(Digest(out))
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn hex_value(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Digest({})", self.to_hex())
    }
}

/// One of the 4096 partitions of a namespace.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct PartitionId(u16);

impl PartitionId {
    /// Builds a partition id; `None` when `raw >= 4096`.
    pub fn new(raw: u16) -> Option<PartitionId> {
        (usize::from(raw) < PARTITIONS).then_some(PartitionId(raw))
    }

    /// The id as an index into per-partition tables.
    #[inline]
    pub fn index(self) -> usize {
        debug_assert!(usize::from(self.0) < PARTITIONS);
        usize::from(self.0)
    }

    /// The raw id.
    #[inline]
    pub fn get(self) -> u16 {
        self.0
    }

    /// Every partition, in ascending order.
    pub fn all() -> impl Iterator<Item = PartitionId> {
        (0..PARTITIONS as u16).map(PartitionId)
    }
}

/// A node's 64-bit identity. Printed as upper-case hex without leading zeros,
/// which is what the `node` info command answers.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct NodeId(pub u64);

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:X}", self.0)
    }
}

impl std::str::FromStr for NodeId {
    type Err = std::num::ParseIntError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        u64::from_str_radix(text, 16).map(NodeId)
    }
}

/// Particle (value) types of bins and keys, as numbered on the wire.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
#[repr(u8)]
pub enum ParticleType {
    Null = 0,
    Integer = 1,
    Float = 2,
    String = 3,
    Blob = 4,
    JavaBlob = 7,
    CsharpBlob = 8,
    PythonBlob = 9,
    RubyBlob = 10,
    PhpBlob = 11,
    ErlangBlob = 12,
    Bool = 17,
    Hll = 18,
    Map = 19,
    List = 20,
    GeoJson = 23,
}

impl ParticleType {
    /// Decodes a wire particle type; `None` for numbers the protocol does not define.
    pub fn from_u8(raw: u8) -> Option<ParticleType> {
        Some(match raw {
            0 => ParticleType::Null,
            1 => ParticleType::Integer,
            2 => ParticleType::Float,
            3 => ParticleType::String,
            4 => ParticleType::Blob,
            7 => ParticleType::JavaBlob,
            8 => ParticleType::CsharpBlob,
            9 => ParticleType::PythonBlob,
            10 => ParticleType::RubyBlob,
            11 => ParticleType::PhpBlob,
            12 => ParticleType::ErlangBlob,
            17 => ParticleType::Bool,
            18 => ParticleType::Hll,
            19 => ParticleType::Map,
            20 => ParticleType::List,
            23 => ParticleType::GeoJson,
            _ => return None,
        })
    }

    /// True for the types whose value is an opaque byte string that append
    /// and prepend may extend.
    pub fn is_blob_like(self) -> bool {
        matches!(
            self,
            ParticleType::Blob
                | ParticleType::JavaBlob
                | ParticleType::CsharpBlob
                | ParticleType::PythonBlob
                | ParticleType::RubyBlob
                | ParticleType::PhpBlob
                | ParticleType::ErlangBlob
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_of_known_digest() {
        // Set "demo", string key "key1" (protocol reference 02 §5).
        let digest = Digest::from_hex("ec91192d4b7f8ce35d5d78d34bca65cbaaaac960").expect("hex");
        assert_eq!(digest.partition().get(), 492);
    }

    #[test]
    fn hex_round_trip() {
        let digest = Digest([0xab; DIGEST_SIZE]);
        assert_eq!(Digest::from_hex(&digest.to_hex()), Some(digest));
        assert_eq!(Digest::from_hex("zz"), None);
    }

    #[test]
    fn partition_bounds() {
        assert!(PartitionId::new(4095).is_some());
        assert!(PartitionId::new(4096).is_none());
        assert_eq!(PartitionId::all().count(), PARTITIONS);
    }

    #[test]
    fn node_id_formats_like_the_reference() {
        assert_eq!(NodeId(0x0BB9020011AC4202).to_string(), "BB9020011AC4202");
        assert_eq!(
            "BB9020011AC4202".parse::<NodeId>(),
            Ok(NodeId(0x0BB9020011AC4202))
        );
    }
}
