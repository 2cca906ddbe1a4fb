//! The on-device format, version 1: device header, metadata slots, write
//! block headers and records. `docs/storage.md` documents every byte; this
//! module is the only code that encodes or decodes them.
//!
//! All integers are little-endian. Every structure carries a CRC-32C
//! (Castagnoli) so that a torn or corrupted write is detected, never trusted.
//!
//! Invariants:
//! - a record starts on a 128-byte read-block (rblock) boundary inside a
//!   write block, after the 128-byte block header, and occupies
//!   `rblocks_for(..)` whole rblocks;
//! - a record is valid only if its magic, version, header checksum, body
//!   checksum *and* block incarnation all check out: records left over from
//!   an earlier use of a reused block carry an older incarnation and are
//!   ignored;
//! - decoding never panics on any input (every length is checked).

use citrine_types::Digest;

/// Size of a read block: the unit records are addressed in.
pub const RBLOCK: usize = 128;
/// Bytes reserved at the start of every device for the device header and
/// the metadata slots. Write block 0 starts here.
pub const RESERVED_BYTES: u64 = 1 << 20;
/// Bytes of the device header.
pub const DEVICE_HEADER_BYTES: usize = 128;
/// Offsets of the two metadata slots (device 0 only).
pub const META_SLOT_OFFSETS: [u64; 2] = [256 * 1024, 512 * 1024];
/// Largest metadata slot.
pub const META_SLOT_BYTES: usize = 256 * 1024;
/// Bytes of a write block header (one rblock).
pub const BLOCK_HEADER_BYTES: usize = 128;
/// Bytes of a record header, before the set name and body.
pub const RECORD_HEADER_BYTES: usize = 72;
/// Current format version.
pub const FORMAT_VERSION: u32 = 1;
/// Longest set name stored with a record.
pub const SET_NAME_MAX: usize = 63;

const DEVICE_MAGIC: &[u8; 8] = b"CITRDEV\0";
const META_MAGIC: &[u8; 4] = b"CMET";
const BLOCK_MAGIC: &[u8; 4] = b"CWBK";
const RECORD_MAGIC: &[u8; 4] = b"CREC";

/// Record flag: this record is a tombstone (a durable delete).
pub const FLAG_TOMBSTONE: u8 = 1;
/// Record flag: the body is LZ4-compressed (`crate::compress`'s stored
/// form: uncompressed length, then the compressed bytes). Records written
/// before compression existed have neither flag and are read as raw.
pub const FLAG_LZ4: u8 = 2;
/// Record flag: the body is Zstandard-compressed (same stored form).
pub const FLAG_ZSTD: u8 = 4;

/// The record flag of a body compressed with `algorithm` (0: raw).
pub fn compression_flag(algorithm: crate::compress::Algorithm) -> u8 {
    match algorithm {
        crate::compress::Algorithm::None => 0,
        crate::compress::Algorithm::Lz4 => FLAG_LZ4,
        crate::compress::Algorithm::Zstd => FLAG_ZSTD,
    }
}

/// How a record's body is stored, from its flags; `Err` when both
/// compression flags are set (written so by no version).
pub fn compression_of(flags: u8) -> Result<crate::compress::Algorithm, String> {
    match (flags & FLAG_LZ4 != 0, flags & FLAG_ZSTD != 0) {
        (false, false) => Ok(crate::compress::Algorithm::None),
        (true, false) => Ok(crate::compress::Algorithm::Lz4),
        (false, true) => Ok(crate::compress::Algorithm::Zstd),
        (true, true) => Err(format!("record flags {flags:#04x} name two compressions")),
    }
}

// ---------------------------------------------------------------- CRC-32C

const fn crc_table() -> [[u32; 256]; 8] {
    let mut table = [[0u32; 256]; 8];
    let mut index = 0;
    while index < 256 {
        let mut crc = index as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
            bit += 1;
        }
        table[0][index] = crc;
        index += 1;
    }
    let mut slice = 1;
    while slice < 8 {
        let mut index = 0;
        while index < 256 {
            let previous = table[slice - 1][index];
            table[slice][index] = (previous >> 8) ^ table[0][(previous & 0xFF) as usize];
            index += 1;
        }
        slice += 1;
    }
    table
}

static CRC_TABLE: [[u32; 256]; 8] = crc_table();

/// CRC-32C of `bytes` (slice-by-8, software).
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c_append(0, bytes)
}

/// Continues a CRC-32C over more bytes.
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    let table = &CRC_TABLE;
    let mut crc = !crc;
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let low = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]) ^ crc;
        let high = u32::from_le_bytes([chunk[4], chunk[5], chunk[6], chunk[7]]);
        crc = table[7][(low & 0xFF) as usize]
            ^ table[6][((low >> 8) & 0xFF) as usize]
            ^ table[5][((low >> 16) & 0xFF) as usize]
            ^ table[4][(low >> 24) as usize]
            ^ table[3][(high & 0xFF) as usize]
            ^ table[2][((high >> 8) & 0xFF) as usize]
            ^ table[1][((high >> 16) & 0xFF) as usize]
            ^ table[0][(high >> 24) as usize];
    }
    for byte in chunks.remainder() {
        crc = (crc >> 8) ^ table[0][((crc ^ u32::from(*byte)) & 0xFF) as usize];
    }
    !crc
}

// ---------------------------------------------------------------- helpers

fn get_u16(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}
fn get_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}
fn get_u64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}
fn put(bytes: &mut [u8], at: usize, value: &[u8]) {
    bytes[at..at + value.len()].copy_from_slice(value);
}

/// Whole rblocks a record with this set name and body occupies.
pub fn rblocks_for(set_len: usize, body_len: usize) -> usize {
    (RECORD_HEADER_BYTES + set_len + body_len).div_ceil(RBLOCK)
}

// ---------------------------------------------------------------- device header

/// The header at offset 0 of every device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHeader {
    /// Random at format time, the same on every device of the namespace.
    pub instance_id: u64,
    pub device_index: u32,
    pub device_count: u32,
    pub write_block_size: u32,
    /// Usable bytes of the device (reserved area plus whole write blocks).
    pub device_bytes: u64,
    pub namespace: String,
}

impl DeviceHeader {
    pub fn encode(&self) -> [u8; DEVICE_HEADER_BYTES] {
        let mut out = [0u8; DEVICE_HEADER_BYTES];
        put(&mut out, 0, DEVICE_MAGIC);
        put(&mut out, 8, &FORMAT_VERSION.to_le_bytes());
        put(&mut out, 12, &(DEVICE_HEADER_BYTES as u32).to_le_bytes());
        put(&mut out, 16, &self.instance_id.to_le_bytes());
        put(&mut out, 24, &self.device_index.to_le_bytes());
        put(&mut out, 28, &self.device_count.to_le_bytes());
        put(&mut out, 32, &self.write_block_size.to_le_bytes());
        put(&mut out, 40, &self.device_bytes.to_le_bytes());
        let name = self.namespace.as_bytes();
        let length = name.len().min(32);
        put(&mut out, 48, &name[..length]);
        let crc = crc32c(&out[..124]);
        put(&mut out, 124, &crc.to_le_bytes());
        out
    }

    /// `Ok(None)` when the bytes are all zero (an unformatted device).
    pub fn decode(bytes: &[u8]) -> Result<Option<DeviceHeader>, String> {
        if bytes.len() < DEVICE_HEADER_BYTES {
            return Err("device header truncated".into());
        }
        if bytes[..DEVICE_HEADER_BYTES].iter().all(|byte| *byte == 0) {
            return Ok(None);
        }
        if &bytes[..8] != DEVICE_MAGIC {
            return Err("not a Citrine device (bad magic): refusing to overwrite it".into());
        }
        let version = get_u32(bytes, 8);
        if version != FORMAT_VERSION {
            return Err(format!(
                "device format version {version}, this build reads version {FORMAT_VERSION}"
            ));
        }
        if get_u32(bytes, 124) != crc32c(&bytes[..124]) {
            return Err("device header checksum mismatch".into());
        }
        let name_bytes = &bytes[48..80];
        let end = name_bytes
            .iter()
            .position(|byte| *byte == 0)
            .unwrap_or(name_bytes.len());
        Ok(Some(DeviceHeader {
            instance_id: get_u64(bytes, 16),
            device_index: get_u32(bytes, 24),
            device_count: get_u32(bytes, 28),
            write_block_size: get_u32(bytes, 32),
            device_bytes: get_u64(bytes, 40),
            namespace: String::from_utf8_lossy(&name_bytes[..end]).into_owned(),
        }))
    }
}

// ---------------------------------------------------------------- metadata slot

/// Durable namespace metadata: truncation times. Kept on device 0 in two
/// alternating slots; the valid slot with the higher sequence wins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metadata {
    pub sequence: u64,
    pub truncate_lut_ms: u64,
    pub set_truncations: Vec<(Vec<u8>, u64)>,
}

impl Metadata {
    pub fn encode(&self) -> Vec<u8> {
        let mut payload = Vec::new();
        for (name, lut) in &self.set_truncations {
            let length = name.len().min(SET_NAME_MAX);
            payload.push(length as u8);
            payload.extend_from_slice(&name[..length]);
            payload.extend_from_slice(&lut.to_le_bytes());
        }
        let mut out = vec![0u8; 32];
        put(&mut out, 0, META_MAGIC);
        put(&mut out, 4, &FORMAT_VERSION.to_le_bytes());
        put(&mut out, 8, &self.sequence.to_le_bytes());
        put(&mut out, 16, &self.truncate_lut_ms.to_le_bytes());
        put(
            &mut out,
            24,
            &(self.set_truncations.len() as u32).to_le_bytes(),
        );
        put(&mut out, 28, &(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&payload);
        let crc = crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// `None` for an empty, torn or foreign slot.
    pub fn decode(bytes: &[u8]) -> Option<Metadata> {
        if bytes.len() < 36 || &bytes[..4] != META_MAGIC || get_u32(bytes, 4) != FORMAT_VERSION {
            return None;
        }
        let count = get_u32(bytes, 24) as usize;
        let length = get_u32(bytes, 28) as usize;
        let end = 32usize.checked_add(length)?;
        if end + 4 > bytes.len() || get_u32(bytes, end) != crc32c(&bytes[..end]) {
            return None;
        }
        let mut set_truncations = Vec::with_capacity(count.min(1024));
        let mut at = 32;
        for _ in 0..count {
            let name_len = usize::from(*bytes.get(at)?);
            let name = bytes.get(at + 1..at + 1 + name_len)?.to_vec();
            let lut_at = at + 1 + name_len;
            if lut_at + 8 > end {
                return None;
            }
            set_truncations.push((name, get_u64(bytes, lut_at)));
            at = lut_at + 8;
        }
        Some(Metadata {
            sequence: get_u64(bytes, 8),
            truncate_lut_ms: get_u64(bytes, 16),
            set_truncations,
        })
    }
}

// ---------------------------------------------------------------- block header

/// What a write block holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    /// Records written by clients.
    Client = 1,
    /// Records moved by defragmentation.
    Defrag = 2,
}

/// The header at the start of every write block in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHeader {
    pub kind: BlockKind,
    pub instance_id: u64,
    pub block_index: u32,
    /// The namespace sequence number when the block was opened.
    pub incarnation: u64,
}

/// What the first rblock of a write block says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockHeaderState {
    /// All zero: never used, or freed.
    Free,
    Valid(BlockHeader),
    /// Not zero, not valid: torn or corrupt.
    Corrupt,
}

impl BlockHeader {
    pub fn encode(&self) -> [u8; BLOCK_HEADER_BYTES] {
        let mut out = [0u8; BLOCK_HEADER_BYTES];
        put(&mut out, 0, BLOCK_MAGIC);
        put(&mut out, 4, &(FORMAT_VERSION as u16).to_le_bytes());
        put(&mut out, 6, &(self.kind as u16).to_le_bytes());
        put(&mut out, 8, &self.instance_id.to_le_bytes());
        put(&mut out, 16, &self.block_index.to_le_bytes());
        put(&mut out, 24, &self.incarnation.to_le_bytes());
        let crc = crc32c(&out[..124]);
        put(&mut out, 124, &crc.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> BlockHeaderState {
        if bytes.len() < BLOCK_HEADER_BYTES {
            return BlockHeaderState::Corrupt;
        }
        if bytes[..BLOCK_HEADER_BYTES].iter().all(|byte| *byte == 0) {
            return BlockHeaderState::Free;
        }
        if &bytes[..4] != BLOCK_MAGIC
            || u32::from(get_u16(bytes, 4)) != FORMAT_VERSION
            || get_u32(bytes, 124) != crc32c(&bytes[..124])
        {
            return BlockHeaderState::Corrupt;
        }
        let kind = match get_u16(bytes, 6) {
            1 => BlockKind::Client,
            2 => BlockKind::Defrag,
            _ => return BlockHeaderState::Corrupt,
        };
        BlockHeaderState::Valid(BlockHeader {
            kind,
            instance_id: get_u64(bytes, 8),
            block_index: get_u32(bytes, 16),
            incarnation: get_u64(bytes, 24),
        })
    }
}

// ---------------------------------------------------------------- records

/// Record metadata as stored on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecordHeader {
    pub flags: u8,
    pub generation: u16,
    /// The record's life (`citrine_index::RecordMeta::life`); 0 in records
    /// written before lives were kept (the bytes were reserved as zeros).
    pub life: u16,
    pub digest: Digest,
    pub void_time: u32,
    pub last_update_ms: u64,
    /// Namespace-wide write sequence: orders every copy of a digest.
    pub sequence: u64,
    pub incarnation: u64,
    pub body_len: u32,
    pub set_len: u8,
}

impl RecordHeader {
    pub fn is_tombstone(&self) -> bool {
        self.flags & FLAG_TOMBSTONE != 0
    }

    /// Total rblocks this record occupies.
    pub fn rblocks(&self) -> usize {
        rblocks_for(usize::from(self.set_len), self.body_len as usize)
    }
}

/// Encodes a record (header, set name, body, zero padding) into `out`, which
/// must be exactly `rblocks_for(set.len(), body.len()) * RBLOCK` bytes.
pub fn encode_record(out: &mut [u8], header: &RecordHeader, set: &[u8], body: &[u8]) {
    // In release builds too: what goes to the device must frame itself.
    assert_eq!(out.len(), rblocks_for(set.len(), body.len()) * RBLOCK);
    assert!(set.len() <= SET_NAME_MAX);
    put(out, 0, RECORD_MAGIC);
    out[4] = FORMAT_VERSION as u8;
    out[5] = header.flags;
    put(out, 6, &header.generation.to_le_bytes());
    put(out, 8, &header.digest.0);
    put(out, 28, &header.void_time.to_le_bytes());
    put(out, 32, &header.last_update_ms.to_le_bytes());
    put(out, 40, &header.sequence.to_le_bytes());
    put(out, 48, &header.incarnation.to_le_bytes());
    put(out, 56, &(body.len() as u32).to_le_bytes());
    out[60] = set.len() as u8;
    put(out, 61, &header.life.to_le_bytes());
    out[63] = 0;
    let body_crc = crc32c_append(crc32c(set), body);
    put(out, 64, &body_crc.to_le_bytes());
    let header_crc = crc32c(&out[..68]);
    put(out, 68, &header_crc.to_le_bytes());
    put(out, RECORD_HEADER_BYTES, set);
    put(out, RECORD_HEADER_BYTES + set.len(), body);
    out[RECORD_HEADER_BYTES + set.len() + body.len()..].fill(0);
}

/// Rewrites the incarnation of an encoded record (a defrag move) and fixes
/// its header checksum. The body checksum is unchanged.
pub fn set_record_incarnation(record: &mut [u8], incarnation: u64) {
    if record.len() < RECORD_HEADER_BYTES {
        return;
    }
    put(record, 48, &incarnation.to_le_bytes());
    let header_crc = crc32c(&record[..68]);
    put(record, 68, &header_crc.to_le_bytes());
}

/// Why bytes are not a valid record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordError {
    /// No record starts here (zero bytes or end of the written part).
    End,
    /// The header is damaged: the rest of the block cannot be walked.
    BadHeader(String),
    /// The header is sound but the body does not match its checksum; the
    /// walk can continue after it.
    BadBody { rblocks: usize },
    /// A record of an earlier use of this block.
    Stale,
}

/// Decodes the record header at the start of `bytes`, checking the header
/// checksum and the incarnation (`None` = do not check).
pub fn decode_record_header(
    bytes: &[u8],
    incarnation: Option<u64>,
) -> Result<RecordHeader, RecordError> {
    if bytes.len() < RECORD_HEADER_BYTES {
        return Err(RecordError::End);
    }
    if &bytes[..4] != RECORD_MAGIC {
        return if bytes[..RBLOCK.min(bytes.len())]
            .iter()
            .all(|byte| *byte == 0)
        {
            Err(RecordError::End)
        } else {
            Err(RecordError::BadHeader("bad record magic".into()))
        };
    }
    if u32::from(bytes[4]) != FORMAT_VERSION {
        return Err(RecordError::BadHeader(format!(
            "record version {}",
            bytes[4]
        )));
    }
    if get_u32(bytes, 68) != crc32c(&bytes[..68]) {
        return Err(RecordError::BadHeader(
            "record header checksum mismatch".into(),
        ));
    }
    let mut digest = [0u8; 20];
    digest.copy_from_slice(&bytes[8..28]);
    let header = RecordHeader {
        flags: bytes[5],
        generation: get_u16(bytes, 6),
        digest: Digest(digest),
        void_time: get_u32(bytes, 28),
        last_update_ms: get_u64(bytes, 32),
        sequence: get_u64(bytes, 40),
        incarnation: get_u64(bytes, 48),
        body_len: get_u32(bytes, 56),
        set_len: bytes[60],
        life: get_u16(bytes, 61),
    };
    if usize::from(header.set_len) > SET_NAME_MAX {
        return Err(RecordError::BadHeader("set name too long".into()));
    }
    if incarnation.is_some_and(|expected| expected != header.incarnation) {
        return Err(RecordError::Stale);
    }
    Ok(header)
}

/// After a damaged record header: the offset of the next rblock in `block`,
/// at or after `from`, where a valid record header of this incarnation
/// starts (header checksum and incarnation both match), or `block.len()`.
pub fn resync(block: &[u8], from: usize, incarnation: u64) -> usize {
    let mut offset = from.div_ceil(RBLOCK) * RBLOCK;
    while offset + RECORD_HEADER_BYTES <= block.len() {
        if decode_record_header(&block[offset..], Some(incarnation)).is_ok() {
            return offset;
        }
        offset += RBLOCK;
    }
    block.len()
}

/// A whole record, checked: header, set name and body.
#[derive(Debug)]
pub struct DecodedRecord<'a> {
    pub header: RecordHeader,
    pub set: &'a [u8],
    pub body: &'a [u8],
}

/// Decodes and fully verifies the record at the start of `bytes`.
pub fn decode_record(
    bytes: &[u8],
    incarnation: Option<u64>,
) -> Result<DecodedRecord<'_>, RecordError> {
    let header = decode_record_header(bytes, incarnation)?;
    let rblocks = header.rblocks();
    let set_end = RECORD_HEADER_BYTES + usize::from(header.set_len);
    let body_end = set_end + header.body_len as usize;
    if body_end > bytes.len() {
        return Err(RecordError::BadHeader(format!(
            "record of {body_end} bytes runs past the {} available",
            bytes.len()
        )));
    }
    let set = &bytes[RECORD_HEADER_BYTES..set_end];
    let body = &bytes[set_end..body_end];
    if get_u32(bytes, 64) != crc32c_append(crc32c(set), body) {
        return Err(RecordError::BadBody { rblocks });
    }
    Ok(DecodedRecord { header, set, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_known_answer() {
        // RFC 3720 test vector: 32 bytes of zeros.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c_append(crc32c(b"1234"), b"56789"), 0xE306_9283);
    }

    #[test]
    fn record_round_trip_and_corruption() {
        let header = RecordHeader {
            generation: 7,
            digest: Digest([9; 20]),
            void_time: 5,
            last_update_ms: 11,
            sequence: 42,
            incarnation: 3,
            life: 0x2A5,
            ..RecordHeader::default()
        };
        let body = vec![1u8; 300];
        let mut bytes = vec![0u8; rblocks_for(4, body.len()) * RBLOCK];
        encode_record(&mut bytes, &header, b"demo", &body);
        let decoded = decode_record(&bytes, Some(3)).expect("valid");
        assert_eq!(decoded.header.generation, 7);
        assert_eq!(decoded.header.life, 0x2A5);
        assert_eq!(decoded.header.sequence, 42);
        assert_eq!(decoded.set, b"demo");
        assert_eq!(decoded.body, &body[..]);
        assert_eq!(
            decode_record(&bytes, Some(4)).err(),
            Some(RecordError::Stale)
        );
        let mut torn = bytes.clone();
        torn[200] ^= 0xFF;
        assert!(matches!(
            decode_record(&torn, Some(3)),
            Err(RecordError::BadBody { .. })
        ));
        let mut bad_header = bytes.clone();
        bad_header[10] ^= 1;
        assert!(matches!(
            decode_record(&bad_header, Some(3)),
            Err(RecordError::BadHeader(_))
        ));
        set_record_incarnation(&mut bytes, 8);
        assert!(decode_record(&bytes, Some(8)).is_ok());
        assert_eq!(
            decode_record(&[0u8; 128], None).err(),
            Some(RecordError::End)
        );
    }

    /// The two forms of a record body: raw (flags without a compression
    /// bit, as every record written before compression) and compressed
    /// (flag, then the stored form); the bytes of a raw record are those
    /// the version without compression wrote (pinned by a checksum).
    #[test]
    fn raw_and_compressed_records() {
        use crate::compress::{compress, decompress, Algorithm, Compression};
        let header = RecordHeader {
            generation: 2,
            digest: Digest([5; 20]),
            sequence: 9,
            incarnation: 4,
            ..RecordHeader::default()
        };
        let body = b"abcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabc".repeat(10);
        let mut raw = vec![0u8; rblocks_for(1, body.len()) * RBLOCK];
        encode_record(&mut raw, &header, b"s", &body);
        assert_eq!(crc32c(&raw), 0xB679_ACFE, "the raw record's bytes changed");
        let decoded = decode_record(&raw, Some(4)).expect("valid");
        assert_eq!(compression_of(decoded.header.flags), Ok(Algorithm::None));
        assert_eq!(decoded.body, &body[..]);
        for algorithm in [Algorithm::Lz4, Algorithm::Zstd] {
            let stored = compress(
                Compression {
                    algorithm,
                    level: 0,
                },
                &body,
            )
            .expect("shrinks");
            let flags = compression_flag(algorithm);
            let mut bytes = vec![0u8; rblocks_for(1, stored.len()) * RBLOCK];
            encode_record(&mut bytes, &RecordHeader { flags, ..header }, b"s", &stored);
            assert!(bytes.len() < raw.len());
            let decoded = decode_record(&bytes, Some(4)).expect("valid");
            assert_eq!(compression_of(decoded.header.flags), Ok(algorithm));
            let back = decompress(algorithm, decoded.body, 1 << 20).expect("decompresses");
            assert_eq!(back, body);
        }
        assert_eq!(compression_of(FLAG_TOMBSTONE), Ok(Algorithm::None));
        assert!(compression_of(FLAG_LZ4 | FLAG_ZSTD).is_err());
    }

    #[test]
    fn headers_round_trip() {
        let device = DeviceHeader {
            instance_id: 77,
            device_index: 1,
            device_count: 2,
            write_block_size: 1 << 20,
            device_bytes: 64 << 20,
            namespace: "test".into(),
        };
        assert_eq!(
            DeviceHeader::decode(&device.encode()).expect("valid"),
            Some(device)
        );
        assert_eq!(DeviceHeader::decode(&[0u8; 128]).expect("zero"), None);
        let block = BlockHeader {
            kind: BlockKind::Defrag,
            instance_id: 77,
            block_index: 5,
            incarnation: 99,
        };
        assert_eq!(
            BlockHeader::decode(&block.encode()),
            BlockHeaderState::Valid(block)
        );
        let mut torn = block.encode();
        torn[30] ^= 1;
        assert_eq!(BlockHeader::decode(&torn), BlockHeaderState::Corrupt);
        let meta = Metadata {
            sequence: 3,
            truncate_lut_ms: 10,
            set_truncations: vec![(b"s".to_vec(), 20)],
        };
        assert_eq!(Metadata::decode(&meta.encode()), Some(meta));
    }
}
