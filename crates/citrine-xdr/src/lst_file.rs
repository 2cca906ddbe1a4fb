//! The file a node keeps one DC and namespace's last-ship times in, so
//! that they survive a restart: `MAGIC`, then 4096 little-endian u64
//! LSTs (Unix ms), then a u64 checksum of those bytes. Pure codec; the
//! server writes it atomically (temporary file, then rename).
//!
//! Invariant: [`decode`] accepts only what [`encode`] wrote (length,
//! magic and checksum checked); anything else is `None` and the caller
//! starts from its default LST.

use citrine_types::PARTITIONS;

const MAGIC: &[u8; 8] = b"CTXDRLS1";

/// The file name for a DC and namespace.
pub fn name(dc: &str, namespace: &str) -> String {
    format!("xdr-lst-{dc}-{namespace}.dat")
}

pub fn encode(lsts: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAGIC.len() + 8 * (PARTITIONS + 1));
    out.extend_from_slice(MAGIC);
    for partition in 0..PARTITIONS {
        let lst = lsts.get(partition).copied().unwrap_or(0);
        out.extend_from_slice(&lst.to_le_bytes());
    }
    let sum = checksum(&out[MAGIC.len()..]);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

pub fn decode(bytes: &[u8]) -> Option<Vec<u64>> {
    let body = bytes.strip_prefix(MAGIC.as_slice())?;
    if body.len() != 8 * (PARTITIONS + 1) {
        return None;
    }
    let (lsts, sum) = body.split_at(8 * PARTITIONS);
    if u64::from_le_bytes(sum.try_into().ok()?) != checksum(lsts) {
        return None;
    }
    Some(
        lsts.chunks_exact(8)
            .map(|chunk| u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8])))
            .collect(),
    )
}

/// FNV-1a over the bytes.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        let lsts: Vec<u64> = (0..PARTITIONS as u64).map(|p| p * 1000 + 7).collect();
        let mut bytes = encode(&lsts);
        assert_eq!(decode(&bytes), Some(lsts));
        bytes[100] ^= 1;
        assert_eq!(decode(&bytes), None);
        assert_eq!(decode(&bytes[..50]), None);
    }
}
