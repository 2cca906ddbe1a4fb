//! The bytes of a backup file between the text format and the disk:
//! optional zstd compression and AES encryption, laid out as asbackup
//! lays them out so either tool reads the other's files.
//!
//! Writing: text → zstd → AES-CTR → file. Each block handed to
//! [`Sink::write_block`] becomes one whole zstd frame (a decoder reads
//! concatenated frames as one stream), so the file can be cut back to any
//! block boundary and continued: how an interrupted backup resumes.
//! Encryption (asbackup's scheme): the AES key is the first 16 or 32 bytes
//! of the SHA-256 of the key file's private key in DER (PKCS#1 for an RSA
//! key); the file starts with a random IV encrypted as one AES block, and
//! the data is AES-CTR with the counter starting at IV + 1 (128-bit,
//! big-endian). Reading ([`open_source`]) undoes the same steps in reverse.

use aes::cipher::{generic_array::GenericArray, StreamCipherSeek};
use aes::cipher::{BlockDecrypt, BlockEncrypt, KeyInit, KeyIvInit, StreamCipher};
use base64::Engine as _;
use sha2::Digest as _;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// AES key sizes asbackup offers.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encryption {
    Aes128,
    Aes256,
}

/// Compression algorithms asbackup offers.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    Zstd,
}

/// How a file's bytes are transformed.
#[derive(Clone, Default)]
pub struct Transform {
    /// zstd level, when compressing.
    pub zstd_level: Option<i32>,
    /// The AES key, when encrypting.
    pub key: Option<Vec<u8>>,
}

impl Transform {
    /// From the command line: the key is read from `key_file`.
    pub fn new(
        compress: Option<Compression>,
        level: i32,
        encrypt: Option<Encryption>,
        key_file: Option<&Path>,
    ) -> Result<Transform, String> {
        let key = match (encrypt, key_file) {
            (None, None) => None,
            (Some(_), None) => return Err("--encrypt needs --encryption-key-file FILE".into()),
            (None, Some(_)) => {
                return Err("--encryption-key-file needs --encrypt aes128|aes256".into())
            }
            (Some(mode), Some(path)) => {
                let pem = std::fs::read_to_string(path)
                    .map_err(|error| format!("cannot read key file {}: {error}", path.display()))?;
                let der = private_key_der(&pem)
                    .map_err(|error| format!("key file {}: {error}", path.display()))?;
                let digest = sha2::Sha256::digest(&der);
                let length = if mode == Encryption::Aes128 { 16 } else { 32 };
                Some(digest[..length].to_vec())
            }
        };
        Ok(Transform {
            zstd_level: compress.map(|_| level),
            key,
        })
    }
}

/// The DER of a PEM private key as asbackup hashes it: PKCS#1 for an RSA
/// key (from a `RSA PRIVATE KEY` block, or taken out of a PKCS#8
/// `PRIVATE KEY` block).
pub fn private_key_der(pem: &str) -> Result<Vec<u8>, String> {
    let begin = pem
        .find("-----BEGIN ")
        .ok_or("no `-----BEGIN ... PRIVATE KEY-----` line (a PEM private key is needed)")?;
    let rest = &pem[begin + 11..];
    let label_end = rest.find("-----").ok_or("a malformed PEM BEGIN line")?;
    let label = &rest[..label_end];
    let body_start = label_end + 5;
    let end = rest
        .find("-----END ")
        .ok_or("no `-----END` line: the key is cut short")?;
    let body: String = rest[body_start..end]
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .map_err(|_| "the PEM body is not base64")?;
    match label {
        "RSA PRIVATE KEY" => Ok(der),
        "PRIVATE KEY" => pkcs8_rsa(&der),
        other => Err(format!(
            "a `{other}` block: an unencrypted RSA private key (PEM) is needed"
        )),
    }
}

/// The RSAPrivateKey inside a PKCS#8 PrivateKeyInfo.
fn pkcs8_rsa(der: &[u8]) -> Result<Vec<u8>, String> {
    const RSA_OID: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
    let bad = || "not a PKCS#8 private key".to_string();
    let (tag, info, _) = der_item(der).ok_or_else(bad)?;
    if tag != 0x30 {
        return Err(bad());
    }
    let (version_tag, _, rest) = der_item(info).ok_or_else(bad)?;
    let (algorithm_tag, algorithm, rest) = der_item(rest).ok_or_else(bad)?;
    let (key_tag, key, _) = der_item(rest).ok_or_else(bad)?;
    if version_tag != 0x02 || algorithm_tag != 0x30 || key_tag != 0x04 {
        return Err(bad());
    }
    let (oid_tag, oid, _) = der_item(algorithm).ok_or_else(bad)?;
    if oid_tag != 0x06 || oid != RSA_OID {
        return Err("not an RSA key: asbackup's key files are RSA keys".into());
    }
    Ok(key.to_vec())
}

/// One DER item: (tag, contents, what follows).
fn der_item(bytes: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = bytes.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (length, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let length = rest[..count]
            .iter()
            .fold(0usize, |acc, b| acc << 8 | usize::from(*b));
        (length, &rest[count..])
    };
    (rest.len() >= length).then(|| (tag, &rest[..length], &rest[length..]))
}

/// AES-CTR of either key size.
enum Ctr {
    Aes128(Box<ctr::Ctr128BE<aes::Aes128>>),
    Aes256(Box<ctr::Ctr128BE<aes::Aes256>>),
}

impl Ctr {
    /// The cipher whose first keystream block is AES(iv + 1).
    fn new(key: &[u8], iv: [u8; 16]) -> Result<Ctr, String> {
        let counter = (u128::from_be_bytes(iv).wrapping_add(1)).to_be_bytes();
        let counter = GenericArray::from_slice(&counter);
        match key.len() {
            16 => Ok(Ctr::Aes128(Box::new(ctr::Ctr128BE::new(
                GenericArray::from_slice(key),
                counter,
            )))),
            32 => Ok(Ctr::Aes256(Box::new(ctr::Ctr128BE::new(
                GenericArray::from_slice(key),
                counter,
            )))),
            other => Err(format!("an AES key of {other} bytes")),
        }
    }

    fn apply(&mut self, data: &mut [u8]) {
        match self {
            Ctr::Aes128(cipher) => cipher.apply_keystream(data),
            Ctr::Aes256(cipher) => cipher.apply_keystream(data),
        }
    }

    fn seek(&mut self, position: u64) {
        match self {
            Ctr::Aes128(cipher) => cipher.seek(position),
            Ctr::Aes256(cipher) => cipher.seek(position),
        }
    }
}

/// One AES block of the IV header, encrypted (`decrypt` false) or decrypted.
fn iv_block(key: &[u8], block: [u8; 16], decrypt: bool) -> Result<[u8; 16], String> {
    let mut data = GenericArray::from(block);
    match key.len() {
        16 => {
            let cipher = aes::Aes128::new(GenericArray::from_slice(key));
            if decrypt {
                cipher.decrypt_block(&mut data)
            } else {
                cipher.encrypt_block(&mut data)
            }
        }
        32 => {
            let cipher = aes::Aes256::new(GenericArray::from_slice(key));
            if decrypt {
                cipher.decrypt_block(&mut data)
            } else {
                cipher.encrypt_block(&mut data)
            }
        }
        other => return Err(format!("an AES key of {other} bytes")),
    }
    Ok(data.into())
}

/// A fresh IV: the time and process mixed through SHA-256 (CTR needs it
/// unique, which this is across runs and processes).
fn fresh_iv() -> [u8; 16] {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or(0);
    let mut hasher = sha2::Sha256::new();
    hasher.update(nanos.to_le_bytes());
    hasher.update(std::process::id().to_le_bytes());
    hasher.update((&nanos as *const u128 as usize).to_le_bytes());
    let digest = hasher.finalize();
    let mut iv = [0u8; 16];
    iv.copy_from_slice(&digest[..16]);
    iv
}

/// A backup file being written, block by block.
pub struct Sink {
    file: File,
    cipher: Option<Ctr>,
    /// Bytes in the file.
    length: u64,
}

impl Sink {
    /// A new file (an existing one is replaced); writes the IV header when
    /// encrypting.
    pub fn create(path: &Path, transform: &Transform) -> Result<Sink, String> {
        let mut file = File::create(path)
            .map_err(|error| format!("cannot create {}: {error}", path.display()))?;
        let mut sink = Sink {
            file: file.try_clone().map_err(|error| error.to_string())?,
            cipher: None,
            length: 0,
        };
        if let Some(key) = &transform.key {
            let iv = fresh_iv();
            let header = iv_block(key, iv, false)?;
            file.write_all(&header)
                .map_err(|error| format!("cannot write {}: {error}", path.display()))?;
            sink.cipher = Some(Ctr::new(key, iv)?);
            sink.length = 16;
        }
        Ok(sink)
    }

    /// An existing file cut back to `length` bytes and continued there.
    pub fn resume(path: &Path, transform: &Transform, length: u64) -> Result<Sink, String> {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|error| format!("cannot reopen {}: {error}", path.display()))?;
        let size = file.metadata().map_err(|error| error.to_string())?.len();
        if size < length {
            return Err(format!(
                "{} holds {size} bytes, less than the {length} the state file recorded: \
                 it is not the file that backup wrote",
                path.display()
            ));
        }
        file.set_len(length).map_err(|error| error.to_string())?;
        let mut cipher = None;
        if let Some(key) = &transform.key {
            let mut header = [0u8; 16];
            file.seek(SeekFrom::Start(0))
                .and_then(|_| file.read_exact(&mut header))
                .map_err(|error| format!("cannot read the IV of {}: {error}", path.display()))?;
            let mut ctr = Ctr::new(key, iv_block(key, header, true)?)?;
            ctr.seek(length.saturating_sub(16));
            cipher = Some(ctr);
        }
        file.seek(SeekFrom::End(0))
            .map_err(|error| error.to_string())?;
        Ok(Sink {
            file,
            cipher,
            length,
        })
    }

    /// Writes one block (already compressed by [`compress`] when the
    /// backup compresses); returns the file's length after it.
    pub fn write_block(&mut self, mut block: Vec<u8>) -> Result<u64, String> {
        if let Some(cipher) = &mut self.cipher {
            cipher.apply(&mut block);
        }
        self.file
            .write_all(&block)
            .map_err(|error| format!("cannot write the backup file: {error}"))?;
        self.length += block.len() as u64;
        Ok(self.length)
    }

    /// Bytes in the file.
    pub fn length(&self) -> u64 {
        self.length
    }

    /// Flushes the file to the device.
    pub fn sync(&mut self) -> Result<(), String> {
        self.file
            .sync_all()
            .map_err(|error| format!("cannot sync the backup file: {error}"))
    }
}

/// `text` as one whole zstd frame, or unchanged without compression.
pub fn compress(transform: &Transform, text: Vec<u8>) -> Result<Vec<u8>, String> {
    match transform.zstd_level {
        Some(level) => zstd::bulk::compress(&text, level)
            .map_err(|error| format!("zstd compression failed: {error}")),
        None => Ok(text),
    }
}

/// Counts the bytes read through it (the file's bytes, for progress).
pub struct Counting<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        let read = self.inner.read(buffer)?;
        self.count.fetch_add(read as u64, Ordering::Relaxed);
        Ok(read)
    }
}

/// Decrypts as it reads.
struct Decrypting<R> {
    inner: R,
    cipher: Ctr,
}

impl<R: Read> Read for Decrypting<R> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        let read = self.inner.read(buffer)?;
        self.cipher.apply(&mut buffer[..read]);
        Ok(read)
    }
}

const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// The text of a backup file: decrypted and decompressed as `transform`
/// says (a zstd file is recognised without being told). `count` follows
/// the bytes read from the file.
pub fn open_source(
    path: &Path,
    transform: &Transform,
    count: Arc<AtomicU64>,
) -> Result<Box<dyn BufRead + Send>, String> {
    let file =
        File::open(path).map_err(|error| format!("cannot open {}: {error}", path.display()))?;
    let mut raw: Box<dyn Read + Send> = Box::new(Counting { inner: file, count });
    if let Some(key) = &transform.key {
        let mut header = [0u8; 16];
        raw.read_exact(&mut header).map_err(|_| {
            format!(
                "{} is shorter than the IV of an encrypted backup",
                path.display()
            )
        })?;
        let cipher = Ctr::new(key, iv_block(key, header, true)?)?;
        raw = Box::new(Decrypting { inner: raw, cipher });
    }
    let mut buffered = BufReader::with_capacity(1 << 20, raw);
    let looks_compressed = buffered
        .fill_buf()
        .map(|bytes| bytes.starts_with(&ZSTD_MAGIC))
        .unwrap_or(false);
    if transform.zstd_level.is_some() || looks_compressed {
        let decoder = zstd::stream::read::Decoder::with_buffer(buffered)
            .map_err(|error| format!("cannot start zstd decompression: {error}"))?;
        return Ok(Box::new(BufReader::with_capacity(1 << 20, decoder)));
    }
    Ok(Box::new(buffered))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = include_str!("../../tests/data/backup-key.pem");
    /// `openssl pkey -in tests/data/backup-key.pem -traditional -outform DER | sha256sum`:
    /// the digest OpenSSL's i2d_PrivateKey bytes hash to, as asbackup hashes them.
    const OPENSSL_SHA256: &str = "9733848166507860fc684b754ae3574cd6895c92f86391b9f3964d1b222eee23";

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn the_key_is_derived_as_asbackup_derives_it() {
        let der = private_key_der(KEY).expect("a PKCS#8 RSA key");
        assert_eq!(hex(&sha2::Sha256::digest(&der)), OPENSSL_SHA256);
        // The same key as PKCS#1 gives the same bytes.
        let pkcs1 = format!(
            "-----BEGIN RSA PRIVATE KEY-----\n{}\n-----END RSA PRIVATE KEY-----\n",
            base64::engine::general_purpose::STANDARD.encode(&der)
        );
        assert_eq!(private_key_der(&pkcs1).expect("PKCS#1"), der);
        assert!(private_key_der("nothing").is_err());
        assert!(private_key_der(
            "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----"
        )
        .is_err());
    }

    #[test]
    fn blocks_written_then_resumed_read_back_whole() {
        let dir = std::env::temp_dir().join(format!("citrine-io-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("blocks");
        let transform = Transform {
            zstd_level: Some(3),
            key: Some(vec![7; 32]),
        };
        let mut sink = Sink::create(&path, &transform).expect("create");
        let first = sink
            .write_block(compress(&transform, b"Version 3.1\n".to_vec()).expect("zstd"))
            .expect("write");
        sink.write_block(compress(&transform, b"torn".to_vec()).expect("zstd"))
            .expect("write");
        drop(sink);
        // Continue after the first block: the second is dropped.
        let mut sink = Sink::resume(&path, &transform, first).expect("resume");
        sink.write_block(compress(&transform, b"# namespace x\n".to_vec()).expect("zstd"))
            .expect("write");
        drop(sink);
        let mut text = String::new();
        let count = Arc::new(AtomicU64::new(0));
        open_source(&path, &transform, count.clone())
            .expect("open")
            .read_to_string(&mut text)
            .expect("read");
        assert_eq!(text, "Version 3.1\n# namespace x\n");
        assert_eq!(
            count.load(Ordering::Relaxed),
            std::fs::metadata(&path).expect("meta").len()
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
