//! Writes an XDR shipper sends (08 §3): a record's whole state, replacing
//! the destination's copy, or its delete as a durable delete; each with
//! info1 `XDR` set and field 14 `LUT` (8 bytes big-endian: the source id
//! in the bits above 40, the record's last-update time in Citrusleaf-epoch
//! milliseconds below), so the destination can tell them from a client's
//! writes and resolve conflicts by last-update time.
//!
//! With compression asked (`enable-compression` at the shipper), a write
//! of at least the threshold's bytes travels as a compressed (type 4)
//! message, as the reference's XDR sends it.
//!
//! Invariant: a shipped write is idempotent (a replace or a delete of a
//! known version), so the client's retries and a re-shipment after a
//! failure do no harm.

use crate::client::{write_header, Client, Retries};
use crate::command::Key;
use crate::error::{Error, Result};
use crate::policy::{RecordExistsAction, WritePolicy};
use crate::value::Bin;
use citrine_wire::msg::{field_type, info1, info2, op_type, MessageWriter, MsgHeader};

pub use citrine_wire::msg::xdr_lut_field as lut_field;

/// When a shipped write travels compressed: zlib at `level`, for
/// messages of at least `threshold` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compression {
    pub level: u32,
    pub threshold: usize,
}

/// A shipped write's answer and what it cost on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shipped {
    /// The destination's result code.
    pub result_code: u8,
    /// The message's bytes before compression.
    pub original_bytes: usize,
    /// The bytes sent: `original_bytes` when not compressed.
    pub sent_bytes: usize,
    pub compressed: bool,
}

impl Client {
    /// Ships a record's state: replaces the destination's copy with `bins`.
    /// Returns the destination's result code (0, or 28 when its copy won).
    pub async fn xdr_put(
        &self,
        policy: &WritePolicy,
        key: &Key,
        bins: &[Bin],
        last_update_unix_ms: u64,
    ) -> Result<u8> {
        let shipped = self
            .xdr_put_with(policy, key, bins, last_update_unix_ms, None)
            .await?;
        Ok(shipped.result_code)
    }

    /// [`Client::xdr_put`], compressed as `compression` asks.
    pub async fn xdr_put_with(
        &self,
        policy: &WritePolicy,
        key: &Key,
        bins: &[Bin],
        last_update_unix_ms: u64,
        compression: Option<Compression>,
    ) -> Result<Shipped> {
        if bins.is_empty() {
            return Err(Error::InvalidArgument("a shipped record has bins".into()));
        }
        let replace = WritePolicy {
            record_exists: RecordExistsAction::Replace,
            ..policy.clone()
        };
        let mut header = write_header(&replace);
        header.info1 |= info1::XDR;
        let frame = encode(
            &header,
            key,
            policy.base.send_key,
            last_update_unix_ms,
            |writer| {
                for bin in bins {
                    writer.op_with(
                        op_type::WRITE,
                        bin.value.particle_type(),
                        bin.name.as_bytes(),
                        |out| bin.value.encode_into(out),
                    );
                }
            },
        )?;
        let original_bytes = frame.len();
        let compress = compression.filter(|asked| original_bytes >= asked.threshold);
        let frame = match compress {
            Some(asked) => citrine_wire::frame::deflate_at(&frame, asked.level),
            None => frame,
        };
        let result_code = self.ship(policy, key, &frame).await?;
        Ok(Shipped {
            result_code,
            original_bytes,
            sent_bytes: frame.len(),
            compressed: compress.is_some(),
        })
    }

    /// Ships a delete, durable. Returns the destination's result code
    /// (0, 2 when it had no record, 28 when its copy won).
    pub async fn xdr_delete(
        &self,
        policy: &WritePolicy,
        key: &Key,
        last_update_unix_ms: u64,
    ) -> Result<u8> {
        let durable = WritePolicy {
            durable_delete: true,
            ..policy.clone()
        };
        let mut header = write_header(&durable);
        header.info1 |= info1::XDR;
        header.info2 |= info2::DELETE;
        let frame = encode(&header, key, false, last_update_unix_ms, |_| {})?;
        self.ship(policy, key, &frame).await
    }

    async fn ship(&self, policy: &WritePolicy, key: &Key, frame: &[u8]) -> Result<u8> {
        let answer = self
            .execute(&policy.base, key, true, frame, Retries::Any)
            .await?;
        Ok(answer.result_code)
    }
}

fn encode(
    header: &MsgHeader,
    key: &Key,
    send_key: bool,
    last_update_unix_ms: u64,
    ops: impl FnOnce(&mut MessageWriter<'_>),
) -> Result<Vec<u8>> {
    key.validate()?;
    let mut frame = Vec::with_capacity(128);
    let mut writer = MessageWriter::begin(&mut frame, header);
    writer.field(field_type::NAMESPACE, key.namespace.as_bytes());
    if !key.set.is_empty() {
        writer.field(field_type::SET, key.set.as_bytes());
    }
    writer.field(field_type::DIGEST, &key.digest.0);
    if let (true, Some(user_key)) = (send_key, &key.user_key) {
        writer.field(field_type::KEY, &user_key.to_field());
    }
    writer.field(field_type::LUT, &lut_field(0, last_update_unix_ms));
    ops(&mut writer);
    writer.finish();
    Ok(frame)
}
