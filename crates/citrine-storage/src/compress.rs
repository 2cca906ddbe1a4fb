//! Storage compression (Aerospike's namespace `compression` and
//! `compression-level`): record bodies compressed with LZ4 or Zstandard
//! before they are stored, decompressed when read.
//!
//! A compressed body is stored as its uncompressed length (`u32`,
//! little-endian) followed by the compressed bytes; the algorithm is named
//! by the record's flags (the device engine's `FLAG_LZ4` / `FLAG_ZSTD`), so
//! compressed records and raw ones (written before compression was on, or
//! that did not shrink) live side by side and the setting can change at
//! run time ([`CompressionSetting`]) without rewriting anything.
//!
//! Invariants:
//! - a body is stored compressed only if that makes it smaller
//!   ([`compress`] returns `None` otherwise: the caller stores it raw);
//! - [`decompress`] never panics and never allocates more than the
//!   caller's limit: the declared length is checked against the limit
//!   before any allocation, and the decompressed length must equal it;
//! - [`CompressionStats`] counts the bodies of every write through the
//!   engine, compressed or not, so the ratio is stored / uncompressed bytes.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Bytes of the uncompressed-length prefix of a compressed body.
pub const LENGTH_PREFIX: usize = 4;
/// Highest `compression-level` (zstd): the reference's range is 1 to 9.
pub const LEVEL_MAX: u8 = 9;
/// The zstd level used when `compression-level` is 0 (not set): zstd's
/// own default.
pub const ZSTD_DEFAULT_LEVEL: i32 = 3;

/// A compression algorithm (the `compression` option's values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Algorithm {
    #[default]
    None,
    Lz4,
    Zstd,
}

impl Algorithm {
    /// The option's value: `none`, `lz4`, `zstd`.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::None => "none",
            Algorithm::Lz4 => "lz4",
            Algorithm::Zstd => "zstd",
        }
    }

    /// The algorithm named `name` (as [`Self::name`] spells it).
    pub fn from_name(name: &str) -> Option<Algorithm> {
        [Algorithm::None, Algorithm::Lz4, Algorithm::Zstd]
            .into_iter()
            .find(|algorithm| algorithm.name() == name)
    }
}

/// A namespace's compression settings, already validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Compression {
    pub algorithm: Algorithm,
    /// `compression-level`: 0 (the algorithm's default) or 1 to
    /// [`LEVEL_MAX`]; used by zstd, ignored by LZ4 (as the reference).
    pub level: u8,
}

impl Compression {
    /// Checks a level: 0 to [`LEVEL_MAX`].
    pub fn valid_level(level: u64) -> Option<u8> {
        u8::try_from(level).ok().filter(|level| *level <= LEVEL_MAX)
    }

    fn pack(self) -> u32 {
        let algorithm = match self.algorithm {
            Algorithm::None => 0,
            Algorithm::Lz4 => 1,
            Algorithm::Zstd => 2,
        };
        algorithm | u32::from(self.level) << 8
    }

    fn unpack(word: u32) -> Compression {
        let algorithm = match word & 0xFF {
            1 => Algorithm::Lz4,
            2 => Algorithm::Zstd,
            _ => Algorithm::None,
        };
        Compression {
            algorithm,
            level: (word >> 8) as u8,
        }
    }
}

/// The current setting of an engine, changed at run time by `set-config`
/// (one word: a write sees the old or the new setting, never a mix).
#[derive(Debug, Default)]
pub struct CompressionSetting(AtomicU32);

impl CompressionSetting {
    pub fn new(compression: Compression) -> CompressionSetting {
        CompressionSetting(AtomicU32::new(compression.pack()))
    }

    pub fn get(&self) -> Compression {
        Compression::unpack(self.0.load(Ordering::Relaxed))
    }

    pub fn set(&self, compression: Compression) {
        self.0.store(compression.pack(), Ordering::Relaxed)
    }
}

/// Bytes of the bodies written, before and after compression.
#[derive(Debug, Default)]
pub struct CompressionStats {
    pub uncompressed_bytes: AtomicU64,
    pub stored_bytes: AtomicU64,
    /// Bodies stored compressed.
    pub compressed_records: AtomicU64,
}

impl CompressionStats {
    /// Counts one body written: `original` bytes stored in `stored`.
    pub fn count(&self, original: usize, stored: usize, compressed: bool) {
        self.uncompressed_bytes
            .fetch_add(original as u64, Ordering::Relaxed);
        self.stored_bytes
            .fetch_add(stored as u64, Ordering::Relaxed);
        if compressed {
            self.compressed_records.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Stored bytes over uncompressed bytes of the bodies written since the
    /// start (the reference's `data_compression_ratio`: 1.0 without
    /// compression or before any write, lower is better).
    pub fn ratio(&self) -> f64 {
        let original = self.uncompressed_bytes.load(Ordering::Relaxed);
        if original == 0 {
            return 1.0;
        }
        self.stored_bytes.load(Ordering::Relaxed) as f64 / original as f64
    }
}

thread_local! {
    /// One zstd compression context per thread and level (a context costs
    /// hundreds of KiB: not one per record).
    static ZSTD_COMPRESSOR: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { RefCell::new(None) };
    static ZSTD_DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
}

fn zstd_compress(body: &[u8], level: u8) -> Option<Vec<u8>> {
    let level = if level == 0 {
        ZSTD_DEFAULT_LEVEL
    } else {
        i32::from(level)
    };
    ZSTD_COMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().map(|(cached, _)| *cached) != Some(level) {
            *slot = Some((level, zstd::bulk::Compressor::new(level).ok()?));
        }
        let (_, compressor) = slot.as_mut()?;
        compressor.compress(body).ok()
    })
}

/// `body` in its stored compressed form (length prefix and compressed
/// bytes), or `None` when the setting is `none`, compression fails, or
/// the result is not smaller than `body`.
pub fn compress(compression: Compression, body: &[u8]) -> Option<Vec<u8>> {
    let length = u32::try_from(body.len()).ok()?;
    let payload = match compression.algorithm {
        Algorithm::None => return None,
        Algorithm::Lz4 => lz4_flex::block::compress(body),
        Algorithm::Zstd => zstd_compress(body, compression.level)?,
    };
    if LENGTH_PREFIX + payload.len() >= body.len() {
        return None;
    }
    let mut stored = Vec::with_capacity(LENGTH_PREFIX + payload.len());
    stored.extend_from_slice(&length.to_le_bytes());
    stored.extend_from_slice(&payload);
    Some(stored)
}

/// The uncompressed body of a `stored` compressed body, whose declared
/// length must be at most `limit`. An error (never a panic) for anything
/// that is not a valid compressed body of exactly the declared length.
pub fn decompress(algorithm: Algorithm, stored: &[u8], limit: usize) -> Result<Vec<u8>, String> {
    let Some((prefix, payload)) = stored.split_first_chunk::<LENGTH_PREFIX>() else {
        return Err(format!("compressed body of {} bytes", stored.len()));
    };
    let declared = u32::from_le_bytes(*prefix) as usize;
    if declared > limit {
        return Err(format!(
            "compressed body declares {declared} bytes, more than the {limit} allowed"
        ));
    }
    let body = match algorithm {
        Algorithm::None => return Err("a compressed body without an algorithm".into()),
        Algorithm::Lz4 => {
            let mut body = vec![0u8; declared];
            let length = lz4_flex::block::decompress_into(payload, &mut body)
                .map_err(|error| format!("lz4: {error}"))?;
            body.truncate(length);
            body
        }
        Algorithm::Zstd => ZSTD_DECOMPRESSOR.with(|cell| {
            let mut slot = cell.borrow_mut();
            if slot.is_none() {
                *slot = Some(
                    zstd::bulk::Decompressor::new().map_err(|error| format!("zstd: {error}"))?,
                );
            }
            let decompressor = slot.as_mut().ok_or("zstd: no context")?;
            decompressor
                .decompress(payload, declared)
                .map_err(|error| format!("zstd: {error}"))
        })?,
    };
    if body.len() != declared {
        return Err(format!(
            "compressed body gave {} bytes, declared {declared}",
            body.len()
        ));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compressible(length: usize) -> Vec<u8> {
        (0..length).map(|index| (index % 7) as u8 + b'a').collect()
    }

    fn incompressible(length: usize, seed: u64) -> Vec<u8> {
        let mut state = seed | 1;
        (0..length)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect()
    }

    const SETTINGS: [Compression; 3] = [
        Compression {
            algorithm: Algorithm::Lz4,
            level: 0,
        },
        Compression {
            algorithm: Algorithm::Zstd,
            level: 0,
        },
        Compression {
            algorithm: Algorithm::Zstd,
            level: 9,
        },
    ];

    #[test]
    fn round_trips_and_shrinks() {
        for setting in SETTINGS {
            let body = compressible(10_000);
            let stored = compress(setting, &body).expect("compressible data shrinks");
            assert!(
                stored.len() < body.len() / 4,
                "{setting:?}: {}",
                stored.len()
            );
            let back = decompress(setting.algorithm, &stored, body.len()).expect("decompresses");
            assert_eq!(back, body);
        }
    }

    #[test]
    fn incompressible_and_none_are_stored_raw() {
        for setting in SETTINGS {
            assert_eq!(compress(setting, &incompressible(4096, 3)), None);
            assert_eq!(compress(setting, &[]), None);
            assert_eq!(compress(setting, b"ab"), None);
        }
        assert_eq!(compress(Compression::default(), &compressible(4096)), None);
    }

    #[test]
    fn declared_length_is_bounded() {
        for setting in SETTINGS {
            let body = compressible(10_000);
            let stored = compress(setting, &body).expect("shrinks");
            let error =
                decompress(setting.algorithm, &stored, body.len() - 1).expect_err("over the limit");
            assert!(error.contains("more than"), "{error}");
            // A smaller declared length than the data holds is an error too.
            let mut lying = stored.clone();
            lying[..4].copy_from_slice(&5000u32.to_le_bytes());
            assert!(decompress(setting.algorithm, &lying, body.len()).is_err());
        }
        assert!(decompress(Algorithm::Lz4, &[1, 2], 100).is_err());
    }

    /// Corrupt compressed bytes (every single-byte change, then random
    /// overwrites) give an error or the declared length, never a panic.
    #[test]
    fn corrupt_bytes_are_errors_not_panics() {
        for setting in SETTINGS {
            let body = compressible(3000);
            let stored = compress(setting, &body).expect("shrinks");
            let mut errors = 0;
            for at in LENGTH_PREFIX..stored.len() {
                for flip in [0x01u8, 0x80, 0xFF] {
                    let mut bad = stored.clone();
                    bad[at] ^= flip;
                    match decompress(setting.algorithm, &bad, body.len()) {
                        Ok(back) => assert_eq!(back.len(), body.len()),
                        Err(_) => errors += 1,
                    }
                }
            }
            assert!(errors > 0, "{setting:?}: no corruption was detected");
            for seed in 1..200u64 {
                let mut bad = stored.clone();
                let noise = incompressible(8, seed);
                let at = LENGTH_PREFIX + (seed as usize * 31) % (stored.len() - LENGTH_PREFIX);
                let end = (at + noise.len()).min(bad.len());
                bad[at..end].copy_from_slice(&noise[..end - at]);
                let _ = decompress(setting.algorithm, &bad, body.len());
                let _ = decompress(setting.algorithm, &bad[..at], body.len());
            }
        }
    }

    #[test]
    fn setting_packs() {
        let setting = CompressionSetting::default();
        assert_eq!(setting.get(), Compression::default());
        let zstd = Compression {
            algorithm: Algorithm::Zstd,
            level: 7,
        };
        setting.set(zstd);
        assert_eq!(setting.get(), zstd);
        assert_eq!(Algorithm::from_name("lz4"), Some(Algorithm::Lz4));
        assert_eq!(Algorithm::from_name("snappy"), None);
        assert_eq!(Compression::valid_level(10), None);
        assert_eq!(Compression::valid_level(9), Some(9));
    }
}
