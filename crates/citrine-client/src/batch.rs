//! Batch commands: many records, one request per node (protocol 04 §1–§2).
//!
//! Owns the batch-index request encoding (rows, REPEAT rows, parent flags,
//! the call fields of BatchUDF rows),
//! the parsing of a node's answer stream (row messages carrying their batch
//! index in `transaction_ttl`, then a LAST message), and the execution
//! loop: group the keys by the node that serves each one (master for
//! writes, per [`crate::Replica`] for reads), run every node's request
//! concurrently, and send the rows a failed node did not answer again in a
//! new round, regrouped on the current partition map, until the policy's
//! retries or total timeout run out.
//!
//! Invariants: every key of the caller's list gets exactly one outcome; an
//! answer is accepted only for a row that was sent to the node answering it
//! and not answered before; a connection is returned to its pool only after
//! the LAST message of its stream.

use crate::client::Client;
use crate::command::{Bins, Key, Operation, Record};
use crate::error::{Error, Result};
use crate::node::Node;
use crate::policy::{Policy, WritePolicy};
use crate::udf::UdfFields;
use citrine_types::NodeId;
use citrine_wire::frame::MessageType;
use citrine_wire::msg::{
    field_type, info1, info2, info3, op_type, Message, MessageWriter, MsgHeader,
};
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Policy of batch commands.
#[derive(Clone, Debug)]
pub struct BatchPolicy {
    /// Timeouts, retries, replica choice, filter expression (sent once, in
    /// the parent message, for every row) and `send_key` (write rows).
    pub base: Policy,
    /// Ask the server to answer every row even after a row failed
    /// (parent flag 0x04). Citrine always does; the reference server stops
    /// at the first row error without it.
    pub respond_all_keys: bool,
    /// Let the server run the rows inline in its service thread (parent
    /// flags 0x01 and 0x02).
    pub allow_inline: bool,
    /// At most this many rows in one request; a node's larger share goes
    /// in several requests (servers refuse more than `batch-max-requests`,
    /// 5000 by default, with 151). 0: no limit.
    pub max_rows_per_request: usize,
}

impl Default for BatchPolicy {
    fn default() -> BatchPolicy {
        BatchPolicy {
            base: Policy::default(),
            respond_all_keys: true,
            allow_inline: true,
            max_rows_per_request: 5000,
        }
    }
}

/// Parent flags of the BATCH_INDEX field.
mod parent_flag {
    pub const INLINE_IN_MEMORY: u8 = 0x01;
    pub const INLINE_ON_DEVICE: u8 = 0x02;
    pub const REPORT_ALL_ERRORS: u8 = 0x04;
    pub const REPORT_ERROR_RECORD: u8 = 0x08;
}

/// Row type byte.
mod row_type {
    /// Legacy read row: only `info1` follows.
    pub const READ: u8 = 0x00;
    /// Same namespace, set, flags, fields and ops as the previous row.
    pub const REPEAT: u8 = 0x01;
    /// `info2` and `info3` follow.
    pub const INFO: u8 = 0x02;
    /// A u16 generation follows.
    pub const GENERATION: u8 = 0x04;
    /// A u32 record TTL follows.
    pub const TTL: u8 = 0x08;
}

/// What each row of one batch asks for (the same for every key).
pub(crate) enum RowSpec {
    /// A legacy read row: `info1` and READ ops naming bins.
    Read { info1: u8, names: Vec<String> },
    /// A full row: info bits, generation, TTL and encoded ops.
    Full {
        info1: u8,
        info2: u8,
        info3: u8,
        generation: u16,
        record_ttl: u32,
        /// The ops, encoded once (op wire format, 02 §4).
        ops: Vec<u8>,
        n_ops: u16,
        /// Whether a row with a user key carries it (write rows).
        send_key: bool,
        /// A UDF call's fields, after the key (BatchUDF rows).
        udf: Option<UdfFields>,
    },
}

/// The rows' specs of a batch: one for every row, or one per row (a
/// [`Client::batch_write`], whose rows differ).
#[derive(Clone, Copy)]
pub(crate) enum Specs<'a> {
    Same(&'a RowSpec),
    PerRow(&'a [RowSpec]),
}

impl<'a> From<&'a RowSpec> for Specs<'a> {
    fn from(spec: &'a RowSpec) -> Specs<'a> {
        Specs::Same(spec)
    }
}

impl<'a> Specs<'a> {
    /// The spec of row `index` (the last one past the end: rows and
    /// specs are checked to be as many).
    fn of(self, index: usize) -> &'a RowSpec {
        match self {
            Specs::Same(spec) => spec,
            Specs::PerRow(specs) => &specs[index.min(specs.len().saturating_sub(1))],
        }
    }

    /// Whether any row calls a UDF.
    fn any_udf(self) -> bool {
        match self {
            Specs::Same(spec) => spec.udf().is_some(),
            Specs::PerRow(specs) => specs.iter().any(|spec| spec.udf().is_some()),
        }
    }
}

/// One record's write in a [`Client::batch_write`]: its key, the policy
/// of its row (existence, generation, TTL, `send_key`) and its write ops.
#[derive(Clone, Debug)]
pub struct BatchWrite {
    pub key: Key,
    pub policy: WritePolicy,
    pub ops: Vec<Operation>,
}

/// One row's answer.
#[derive(Debug)]
pub(crate) struct RowAnswer {
    pub result_code: u8,
    pub record: Record,
    pub node: String,
}

impl Client {
    /// Reads many records at once: one request per node. The answer is in
    /// key order; `None` where the record does not exist (or the policy's
    /// filter expression left it out). Fails when a row fails otherwise.
    pub async fn batch_get(
        &self,
        policy: &BatchPolicy,
        keys: &[Key],
        bins: Bins,
    ) -> Result<Vec<Option<Record>>> {
        let spec = match bins {
            Bins::All => RowSpec::Read {
                info1: info1::READ | info1::GET_ALL,
                names: Vec::new(),
            },
            Bins::Names(names) => {
                check_bin_names(names.iter().map(String::as_str))?;
                RowSpec::Read {
                    info1: info1::READ,
                    names,
                }
            }
            Bins::Header => RowSpec::Read {
                info1: info1::READ | info1::GET_NO_BINS,
                names: Vec::new(),
            },
        };
        let rows = self.run_batch(policy, keys, &spec, false).await?;
        rows.into_iter()
            .map(|row| match row {
                Ok(answer) => match answer.result_code {
                    0 => Ok(Some(answer.record)),
                    2 | 27 => Ok(None),
                    code => Err(Error::server(code, answer.node)),
                },
                Err(error) => Err(error),
            })
            .collect()
    }

    /// Whether each record exists, in key order.
    pub async fn batch_exists(&self, policy: &BatchPolicy, keys: &[Key]) -> Result<Vec<bool>> {
        Ok(self
            .batch_get(policy, keys, Bins::Header)
            .await?
            .into_iter()
            .map(|record| record.is_some())
            .collect())
    }

    /// Runs the same operations on each record, atomically per record (the
    /// write ones under `write`'s TTL, generation and existence rules).
    /// Returns one outcome per key, in key order: the bins the read ops
    /// produced, or the row's error (result 2 when the record does not
    /// exist, 27 when the filter left it out). Fails as a whole only when
    /// the command could not be run.
    pub async fn batch_operate(
        &self,
        policy: &BatchPolicy,
        write: &WritePolicy,
        keys: &[Key],
        ops: &[Operation],
    ) -> Result<Vec<Result<Record>>> {
        if ops.is_empty() {
            return Err(Error::InvalidArgument(
                "a batch operate needs at least one operation".into(),
            ));
        }
        check_bin_names(ops.iter().filter_map(Operation::bin_name))?;
        let (bits1, has_write) = crate::command::operate_flags(ops);
        let respond_all = if crate::command::respond_all_ops(ops) {
            info2::RESPOND_ALL_OPS
        } else {
            0
        };
        let (encoded, n_ops) = encode_ops(ops);
        let spec = if has_write {
            let (bits2, bits3, generation) = write.header_bits();
            RowSpec::Full {
                info1: bits1,
                info2: bits2 | respond_all,
                info3: bits3,
                generation: row_generation(generation)?,
                record_ttl: write.expiration.wire(),
                ops: encoded,
                n_ops,
                send_key: policy.base.send_key,
                udf: None,
            }
        } else {
            RowSpec::Full {
                info1: bits1,
                info2: respond_all,
                info3: 0,
                generation: 0,
                record_ttl: 0,
                ops: encoded,
                n_ops,
                send_key: false,
                udf: None,
            }
        };
        let rows = self.run_batch(policy, keys, &spec, has_write).await?;
        Ok(rows
            .into_iter()
            .map(|row| {
                row.and_then(|answer| match answer.result_code {
                    0 => Ok(answer.record),
                    code => Err(Error::server(code, answer.node)),
                })
            })
            .collect())
    }

    /// Deletes many records; per key, whether it existed (or the row's error).
    pub async fn batch_delete(
        &self,
        policy: &BatchPolicy,
        write: &WritePolicy,
        keys: &[Key],
    ) -> Result<Vec<Result<bool>>> {
        let (bits2, bits3, generation) = write.header_bits();
        let spec = RowSpec::Full {
            info1: 0,
            info2: bits2 | info2::DELETE,
            info3: bits3,
            generation: row_generation(generation)?,
            record_ttl: 0,
            ops: Vec::new(),
            n_ops: 0,
            send_key: policy.base.send_key,
            udf: None,
        };
        let rows = self.run_batch(policy, keys, &spec, true).await?;
        Ok(rows
            .into_iter()
            .map(|row| {
                row.and_then(|answer| match answer.result_code {
                    0 => Ok(true),
                    2 => Ok(false),
                    code => Err(Error::server(code, answer.node)),
                })
            })
            .collect())
    }

    /// Writes many records, each with its own ops and row policy (what
    /// asrestore's batch mode sends), one request per node; per row, `Ok`
    /// or the row's error. Every row must have write ops only.
    pub async fn batch_write(
        &self,
        policy: &BatchPolicy,
        rows: &[BatchWrite],
    ) -> Result<Vec<Result<()>>> {
        let mut specs = Vec::with_capacity(rows.len());
        for row in rows {
            specs.push(write_row_spec(row)?);
        }
        let keys: Vec<Key> = rows.iter().map(|row| row.key.clone()).collect();
        let answers = self
            .run_batch(policy, &keys, Specs::PerRow(&specs), true)
            .await?;
        Ok(answers
            .into_iter()
            .map(|row| {
                row.and_then(|answer| match answer.result_code {
                    0 => Ok(()),
                    code => Err(Error::server(code, answer.node)),
                })
            })
            .collect())
    }

    /// The execution loop: rounds of one request per node until every row
    /// has an outcome.
    pub(crate) async fn run_batch<'a>(
        &self,
        policy: &BatchPolicy,
        keys: &[Key],
        specs: impl Into<Specs<'a>>,
        is_write: bool,
    ) -> Result<Vec<Result<RowAnswer>>> {
        let specs = specs.into();
        keys.iter().try_for_each(Key::validate)?;
        let count = u32::try_from(keys.len())
            .map_err(|_| Error::InvalidArgument("too many keys for one batch".into()))?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let counters = &self.cluster.counters;
        counters.commands.fetch_add(1, Ordering::Relaxed);
        let mut run = BatchRun {
            client: self,
            policy,
            keys,
            specs,
            is_write,
            count,
            total_deadline: policy.base.total_deadline(Instant::now()),
            spin: self.next_random(),
            // A UDF need not be idempotent: rows that may have reached the
            // server are never sent again (a UDF must not run twice).
            runs_udf: specs.any_udf(),
            outcomes: (0..count).map(|_| None).collect(),
            pending: (0..keys.len()).collect(),
            attempt: 0,
            in_doubt: false,
        };
        loop {
            let (requests, mut last_error) = run.group();
            let finished = run.round(requests).await?;
            run.settle(finished, &mut last_error);
            run.pending.retain(|&index| run.outcomes[index].is_none());
            let Some(error) = last_error.filter(|_| !run.pending.is_empty()) else {
                break;
            };
            if !run.back_off(error).await {
                break;
            }
        }
        Ok(run.into_outcomes())
    }
}

/// One node's request of a round, once answered: the node, the rows it
/// carried, their answers, and how the request ended.
type Finished = (Arc<Node>, Vec<usize>, Vec<(usize, RowAnswer)>, Result<()>);

/// One node's request of a round: the node and the rows it carries.
type Request = (Arc<Node>, Vec<usize>);

/// A batch on its way ([`Client::run_batch`]): the request, and each row's
/// outcome so far.
struct BatchRun<'a> {
    client: &'a Client,
    policy: &'a BatchPolicy,
    keys: &'a [Key],
    specs: Specs<'a>,
    is_write: bool,
    /// How many rows the batch has.
    count: u32,
    total_deadline: Option<Instant>,
    /// The replica choice's random start.
    spin: u64,
    /// Whether the rows run a UDF (never sent again once in doubt).
    runs_udf: bool,
    outcomes: Vec<Option<Result<RowAnswer>>>,
    /// The rows with no outcome yet.
    pending: Vec<usize>,
    /// Rounds run again so far (0 in the first).
    attempt: u32,
    /// Whether a failed request may have applied its rows.
    in_doubt: bool,
}

impl BatchRun<'_> {
    /// The unanswered rows grouped by the node serving each now, in
    /// requests of at most `max_rows_per_request` rows; and the error of
    /// a row no node serves.
    fn group(&self) -> (Vec<Request>, Option<Error>) {
        let base = &self.policy.base;
        let mut groups: BTreeMap<NodeId, (Arc<Node>, Vec<usize>)> = BTreeMap::new();
        let mut last_error = None;
        {
            let state = self.client.cluster.state();
            for &index in &self.pending {
                let key = &self.keys[index];
                let picked = self.client.pick_node(
                    &state,
                    base,
                    key,
                    self.is_write,
                    self.attempt,
                    self.spin,
                );
                match picked {
                    Some(node) => groups
                        .entry(node.id)
                        .or_insert_with(|| (node, Vec::new()))
                        .1
                        .push(index),
                    None => {
                        last_error = Some(Error::NoNode {
                            namespace: key.namespace.clone(),
                            partition: key.partition().get(),
                        })
                    }
                }
            }
        }
        let chunk = match self.policy.max_rows_per_request {
            0 => usize::MAX,
            rows => rows,
        };
        let requests = groups
            .into_values()
            .flat_map(|(node, indexes)| {
                indexes
                    .chunks(chunk)
                    .map(|rows| (node.clone(), rows.to_vec()))
                    .collect::<Vec<_>>()
            })
            .collect();
        (requests, last_error)
    }

    /// Runs one round's requests, concurrently when there are several.
    async fn round(&self, requests: Vec<Request>) -> Result<Vec<Finished>> {
        let mut finished = Vec::with_capacity(requests.len());
        if requests.len() == 1 {
            // One node (a single-node cluster, or keys of one node):
            // no task to spawn.
            for (node, indexes) in requests {
                finished.push(self.request(node, indexes).await);
            }
        } else {
            let mut tasks = tokio::task::JoinSet::new();
            for (node, indexes) in requests {
                tasks.spawn(self.request(node, indexes));
            }
            while let Some(joined) = tasks.join_next().await {
                finished.push(joined.map_err(|error| Error::Protocol {
                    address: String::new(),
                    message: format!("batch task failed: {error}"),
                })?);
            }
        }
        Ok(finished)
    }

    /// One node's request for the rows `indexes`, encoded now and run by
    /// the future returned.
    fn request(
        &self,
        node: Arc<Node>,
        indexes: Vec<usize>,
    ) -> impl std::future::Future<Output = Finished> + Send + 'static {
        let mut frame = Vec::with_capacity(64 + indexes.len() * 40);
        encode_batch(&mut frame, self.policy, self.keys, &indexes, self.specs);
        let base = self.policy.base.clone();
        let (count, total_deadline) = (self.count, self.total_deadline);
        async move {
            let mut answers = Vec::with_capacity(indexes.len());
            let deadlines = Deadlines {
                policy: &base,
                total: total_deadline,
            };
            let outcome =
                run_on_node(&node, &frame, &indexes, count, deadlines, &mut answers).await;
            (node, indexes, answers, outcome)
        }
    }

    /// Takes a round's answers: each answered row's outcome, each node's
    /// health, and the rows of a failed request — to be sent again (its
    /// error left in `last_error`) or failed with its error.
    fn settle(&mut self, finished: Vec<Finished>, last_error: &mut Option<Error>) {
        for (node, indexes, answers, outcome) in finished {
            for (index, answer) in answers {
                self.outcomes[index] = Some(Ok(answer));
            }
            match outcome {
                Ok(()) => node.record_success(),
                Err(error) => {
                    if error.counts_against_node() {
                        node.record_failure();
                    }
                    self.in_doubt |= error.in_doubt();
                    if error.is_retryable() && !(self.runs_udf && error.in_doubt()) {
                        *last_error = Some(error);
                    } else {
                        // Not worth another round, or one that could run a
                        // UDF twice: the rows it did not answer fail.
                        for index in indexes {
                            if self.outcomes[index].is_none() {
                                self.outcomes[index] = Some(Err(error.clone()));
                            }
                        }
                    }
                }
            }
        }
    }

    /// Before another round for the pending rows: false (and the pending
    /// rows failed with `error`) when the retries or the time are used up;
    /// else true, after the backoff.
    async fn back_off(&mut self, mut error: Error) -> bool {
        let base = &self.policy.base;
        let counters = &self.client.cluster.counters;
        self.attempt += 1;
        let attempt = self.attempt;
        let backoff = base.backoff_for(attempt, self.client.next_random());
        let out_of_time = self
            .total_deadline
            .is_some_and(|deadline| Instant::now() + backoff >= deadline);
        if attempt > base.max_retries || out_of_time {
            counters.command_failures.fetch_add(1, Ordering::Relaxed);
            if let Error::Timeout { iterations, .. } = &mut error {
                *iterations = attempt;
            }
            error.set_in_doubt(self.is_write && self.in_doubt);
            for &index in &self.pending {
                self.outcomes[index] = Some(Err(error.clone()));
            }
            return false;
        }
        counters.retries.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(attempt, rows = self.pending.len(), %error, "retrying batch rows");
        if !backoff.is_zero() {
            tokio::time::sleep(backoff).await;
        }
        true
    }

    /// Each row's outcome, in the caller's order.
    fn into_outcomes(self) -> Vec<Result<RowAnswer>> {
        self.outcomes
            .into_iter()
            .map(|outcome| {
                // Every row left the loop with an outcome (see `pending`).
                outcome.unwrap_or_else(|| {
                    Err(Error::Protocol {
                        address: String::new(),
                        message: "batch row left without an answer".into(),
                    })
                })
            })
            .collect()
    }
}

/// A write policy's generation as a row's 16-bit field.
fn row_generation(generation: u32) -> Result<u16> {
    u16::try_from(generation).map_err(|_| {
        Error::InvalidArgument(format!(
            "generation {generation} does not fit a batch row (at most 65535)"
        ))
    })
}

fn check_bin_names<'a>(mut names: impl Iterator<Item = &'a str>) -> Result<()> {
    match names.find(|name| name.len() > citrine_types::BIN_NAME_MAX) {
        Some(name) => Err(Error::InvalidArgument(format!(
            "bin name {name:?} is longer than 15 bytes"
        ))),
        None => Ok(()),
    }
}

/// The ops in wire format and their count.
fn encode_ops(ops: &[Operation]) -> (Vec<u8>, u16) {
    let mut scratch = Vec::new();
    let mut writer = MessageWriter::begin_bare(&mut scratch, &MsgHeader::default());
    for op in ops {
        op.encode(&mut writer);
    }
    let count = writer.op_count();
    writer.finish();
    scratch.drain(..citrine_wire::msg::MSG_HEADER_SIZE);
    (scratch, count)
}

fn push_field(out: &mut Vec<u8>, kind: u8, data: &[u8]) {
    // Namespace, set and key fields are far below 4 GiB (validated).
    out.extend_from_slice(&(data.len() as u32 + 1).to_be_bytes());
    out.push(kind);
    out.extend_from_slice(data);
}

/// Encodes the batch request for `indexes` (positions in `keys`) as one
/// complete frame.
pub(crate) fn encode_batch<'a>(
    out: &mut Vec<u8>,
    policy: &BatchPolicy,
    keys: &[Key],
    indexes: &[usize],
    specs: impl Into<Specs<'a>>,
) {
    let specs = specs.into();
    let header = MsgHeader {
        info1: info1::BATCH,
        transaction_ttl: policy.base.server_timeout_ms(),
        ..MsgHeader::default()
    };
    let mut payload = Vec::with_capacity(5 + indexes.len() * 40);
    payload.extend_from_slice(&(indexes.len() as u32).to_be_bytes());
    payload.push(parent_flags(policy));
    let mut previous: Option<&Key> = None;
    for &index in indexes {
        let key = &keys[index];
        // Rows are at most u32::MAX (checked by the caller).
        payload.extend_from_slice(&(index as u32).to_be_bytes());
        payload.extend_from_slice(&key.digest.0);
        let spec = specs.of(index);
        let carries_key = spec.carries_key(key);
        // Rows of their own specs never repeat the one before.
        let repeats = !carries_key
            && matches!(specs, Specs::Same(_))
            && previous.is_some_and(|previous| {
                !spec.carries_key(previous)
                    && previous.namespace == key.namespace
                    && previous.set == key.set
            });
        previous = Some(key);
        if repeats {
            payload.push(row_type::REPEAT);
            continue;
        }
        push_row(&mut payload, key, spec, carries_key);
    }
    let mut writer = MessageWriter::begin(out, &header);
    if let Some(filter) = &policy.base.filter {
        writer.field(field_type::FILTER_EXPRESSION, filter);
    }
    writer.field(field_type::BATCH_INDEX, &payload);
    writer.finish();
}

/// The row of one [`BatchWrite`]: its policy's bits and TTL, its ops.
fn write_row_spec(row: &BatchWrite) -> Result<RowSpec> {
    if row.ops.is_empty() || !row.ops.iter().all(Operation::is_write) {
        return Err(Error::InvalidArgument(
            "a batch write row needs write operations only".into(),
        ));
    }
    check_bin_names(row.ops.iter().filter_map(Operation::bin_name))?;
    let (bits1, _) = crate::command::operate_flags(&row.ops);
    let (bits2, bits3, generation) = row.policy.header_bits();
    let (ops, n_ops) = encode_ops(&row.ops);
    Ok(RowSpec::Full {
        info1: bits1,
        info2: bits2,
        info3: bits3,
        generation: row_generation(generation)?,
        record_ttl: row.policy.expiration.wire(),
        ops,
        n_ops,
        send_key: row.policy.base.send_key,
        udf: None,
    })
}

/// The parent message's flags for `policy`.
fn parent_flags(policy: &BatchPolicy) -> u8 {
    let mut flags = parent_flag::REPORT_ERROR_RECORD;
    if policy.allow_inline {
        flags |= parent_flag::INLINE_IN_MEMORY | parent_flag::INLINE_ON_DEVICE;
    }
    if policy.respond_all_keys {
        flags |= parent_flag::REPORT_ALL_ERRORS;
    }
    flags
}

impl RowSpec {
    /// Whether the row of `key` carries its user key (write rows that
    /// send keys, for a key that has one).
    fn carries_key(&self, key: &Key) -> bool {
        match self {
            RowSpec::Read { .. } => false,
            RowSpec::Full { send_key, .. } => *send_key && key.user_key.is_some(),
        }
    }

    /// The UDF call of BatchUDF rows.
    fn udf(&self) -> Option<&UdfFields> {
        match self {
            RowSpec::Full { udf, .. } => udf.as_ref(),
            RowSpec::Read { .. } => None,
        }
    }
}

/// A row that does not repeat the previous one, after its index and
/// digest: its type and flags, field and op counts, fields, and ops.
fn push_row(payload: &mut Vec<u8>, key: &Key, spec: &RowSpec, carries_key: bool) {
    let udf = spec.udf();
    let n_fields = 1
        + u16::from(!key.set.is_empty())
        + u16::from(carries_key)
        + if udf.is_some() { UdfFields::COUNT } else { 0 };
    let (ops, n_ops): (&[u8], u16) = match spec {
        RowSpec::Read { info1, names } => {
            payload.push(row_type::READ);
            payload.push(*info1);
            (&[], names.len() as u16)
        }
        RowSpec::Full {
            info1,
            info2,
            info3,
            generation,
            record_ttl,
            ops,
            n_ops,
            ..
        } => {
            payload.push(row_type::INFO | row_type::GENERATION | row_type::TTL);
            payload.extend_from_slice(&[*info1, *info2, *info3]);
            payload.extend_from_slice(&generation.to_be_bytes());
            payload.extend_from_slice(&record_ttl.to_be_bytes());
            (ops, *n_ops)
        }
    };
    payload.extend_from_slice(&n_fields.to_be_bytes());
    payload.extend_from_slice(&n_ops.to_be_bytes());
    push_field(payload, field_type::NAMESPACE, key.namespace.as_bytes());
    if !key.set.is_empty() {
        push_field(payload, field_type::SET, key.set.as_bytes());
    }
    if carries_key {
        if let Some(user_key) = &key.user_key {
            push_field(payload, field_type::KEY, &user_key.to_field());
        }
    }
    if let Some(udf) = udf {
        udf.push_fields(payload);
    }
    match spec {
        RowSpec::Read { names, .. } => {
            for name in names {
                payload.extend_from_slice(&(4 + name.len() as u32).to_be_bytes());
                payload.extend_from_slice(&[op_type::READ, 0, 0, name.len() as u8]);
                payload.extend_from_slice(name.as_bytes());
            }
        }
        RowSpec::Full { .. } => payload.extend_from_slice(ops),
    }
}

/// The deadline of each step of a node's request: the socket timeout from
/// the start of the step (the pool wait, the send, each answer frame),
/// capped by the command's total deadline.
#[derive(Clone, Copy)]
struct Deadlines<'a> {
    policy: &'a Policy,
    total: Option<Instant>,
}

impl Deadlines<'_> {
    fn next(&self) -> Option<Instant> {
        self.policy.socket_deadline(self.total)
    }
}

/// Runs one node's request and collects its row answers into `answers`
/// (also when the stream breaks part-way: the rows answered so far stand).
async fn run_on_node(
    node: &Node,
    frame: &[u8],
    indexes: &[usize],
    count: u32,
    deadlines: Deadlines<'_>,
    answers: &mut Vec<(usize, RowAnswer)>,
) -> Result<()> {
    let mut pooled = node.pool.get(deadlines.next()).await?;
    let Some(connection) = pooled.connection() else {
        return Err(Error::Closed);
    };
    let protocol = |message: String| Error::Protocol {
        address: node.address.to_string(),
        message,
    };
    // Rows sent to this node and not yet answered.
    let mut expected: HashSet<usize> = indexes.iter().copied().collect();
    let outcome = async {
        connection.send(frame, deadlines.next()).await?;
        loop {
            let (message_type, body) = connection.receive(deadlines.next()).await?;
            if message_type != MessageType::Message {
                return Err(protocol(format!(
                    "expected AS_MSG frames in a batch answer, got {message_type:?}"
                )));
            }
            let mut rest = body;
            while !rest.is_empty() {
                let (message, used) = Message::decode_prefix(rest)
                    .map_err(|error| protocol(format!("bad batch answer: {error}")))?;
                rest = &rest[used..];
                let header = message.header;
                if header.info3 & info3::LAST != 0 {
                    if !rest.is_empty() {
                        return Err(protocol("bytes after a batch's LAST message".into()));
                    }
                    return match header.result_code {
                        0 if expected.is_empty() => Ok(()),
                        0 => Err(protocol(format!(
                            "the batch ended with {} of its rows unanswered",
                            expected.len()
                        ))),
                        code => Err(Error::server(code, node.name())),
                    };
                }
                let index = header.transaction_ttl as usize;
                if header.transaction_ttl >= count || !expected.remove(&index) {
                    return Err(protocol(format!(
                        "batch answer for row {index}, which was not asked of this node or was answered twice"
                    )));
                }
                let record = Record::from_message(&message).map_err(protocol)?;
                answers.push((
                    index,
                    RowAnswer {
                        result_code: header.result_code,
                        record,
                        node: node.name(),
                    },
                ));
            }
        }
    }
    .await;
    match outcome {
        // A LAST with an error code still ended the stream cleanly.
        Ok(()) | Err(Error::Server { .. }) => pooled.release(),
        Err(_) => {
            pooled.discard();
            if matches!(outcome, Err(Error::Network { .. })) {
                node.pool.clear_idle();
            }
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Vec<Key> {
        vec![
            Key::new("test", "s", 1i64),
            Key::new("test", "s", 2i64),
            Key::new("test", "t", 3i64),
            Key::new("other", "t", 4i64),
        ]
    }

    fn rows(frame: &[u8]) -> Vec<u8> {
        let message = Message::decode(&frame[8..]).expect("decodes");
        assert_eq!(message.header.info1, info1::BATCH);
        message
            .field(field_type::BATCH_INDEX)
            .expect("batch field")
            .to_vec()
    }

    #[test]
    fn read_rows_repeat_within_a_namespace_and_set() {
        let keys = keys();
        let spec = RowSpec::Read {
            info1: info1::READ,
            names: vec!["a".into()],
        };
        let mut frame = Vec::new();
        encode_batch(
            &mut frame,
            &BatchPolicy::default(),
            &keys,
            &[0, 1, 2, 3],
            &spec,
        );
        let payload = rows(&frame);
        assert_eq!(&payload[..4], &4u32.to_be_bytes());
        assert_eq!(payload[4], 0x0F, "inline, all errors, error record");
        // Row 0: index, digest, type 0, info1, 2 fields, 1 op.
        let mut at = 5;
        assert_eq!(&payload[at..at + 4], &0u32.to_be_bytes());
        assert_eq!(&payload[at + 4..at + 24], &keys[0].digest.0);
        assert_eq!(&payload[at + 24..at + 30], &[0, info1::READ, 0, 2, 0, 1]);
        at += 30 + (4 + 1 + 4) + (4 + 1 + 1) + (4 + 4 + 1);
        // Row 1 repeats row 0.
        assert_eq!(&payload[at..at + 4], &1u32.to_be_bytes());
        assert_eq!(payload[at + 24], row_type::REPEAT);
        at += 25;
        // Row 2 has another set: a full row.
        assert_eq!(&payload[at..at + 4], &2u32.to_be_bytes());
        assert_eq!(payload[at + 24], row_type::READ);
    }

    #[test]
    fn write_rows_carry_info_generation_ttl_and_keys() {
        let keys = keys();
        let (ops, n_ops) = encode_ops(&[Operation::incr("n", 1)]);
        let spec = RowSpec::Full {
            info1: 0,
            info2: info2::WRITE,
            info3: 0,
            generation: 7,
            record_ttl: 60,
            ops,
            n_ops,
            send_key: true,
            udf: None,
        };
        let mut frame = Vec::new();
        let policy = BatchPolicy {
            allow_inline: false,
            respond_all_keys: false,
            ..BatchPolicy::default()
        };
        encode_batch(&mut frame, &policy, &keys, &[1, 0], &spec);
        let payload = rows(&frame);
        assert_eq!(payload[4], parent_flag::REPORT_ERROR_RECORD);
        let at = 5;
        assert_eq!(&payload[at..at + 4], &1u32.to_be_bytes());
        assert_eq!(payload[at + 24], 0x0E);
        assert_eq!(&payload[at + 25..at + 28], &[0, info2::WRITE, 0]);
        assert_eq!(&payload[at + 28..at + 30], &7u16.to_be_bytes());
        assert_eq!(&payload[at + 30..at + 34], &60u32.to_be_bytes());
        assert_eq!(
            &payload[at + 34..at + 38],
            &[0, 3, 0, 1],
            "ns, set, key; one op"
        );
        // Rows carrying a key are never repeated.
        // Fields: namespace "test" (9 bytes), set "s" (6), integer key (14);
        // the op: size, header, name "n", 8-byte value (17).
        let row = at + 38 + 9 + 6 + 14 + 17;
        assert_eq!(&payload[row..row + 4], &0u32.to_be_bytes());
        assert_eq!(&payload[row + 4..row + 24], &keys[0].digest.0);
        assert_eq!(payload[row + 24], 0x0E);
    }

    /// Rows of a batch write carry their own policy: neither row repeats
    /// the other though both are of one namespace and set.
    #[test]
    fn batch_write_rows_carry_their_own_ttl_and_ops() {
        let keys = keys();
        let row = |key: &Key, ttl: u32| BatchWrite {
            key: key.clone(),
            policy: WritePolicy {
                expiration: crate::Expiration::Seconds(ttl),
                ..WritePolicy::default()
            },
            ops: vec![Operation::Write(crate::Bin::new("n", 1i64))],
        };
        let specs = [
            write_row_spec(&row(&keys[0], 60)).expect("a write row"),
            write_row_spec(&row(&keys[1], 90)).expect("a write row"),
        ];
        let mut frame = Vec::new();
        encode_batch(
            &mut frame,
            &BatchPolicy::default(),
            &keys,
            &[0, 1],
            Specs::PerRow(&specs),
        );
        let payload = rows(&frame);
        let first = 5;
        assert_eq!(&payload[first + 30..first + 34], &60u32.to_be_bytes());
        // Namespace (9 bytes) and set (6) fields, one op of 17.
        let second = first + 38 + 9 + 6 + 17;
        assert_eq!(&payload[second..second + 4], &1u32.to_be_bytes());
        assert_eq!(payload[second + 24], 0x0E, "a full row, not a repeat");
        assert_eq!(&payload[second + 30..second + 34], &90u32.to_be_bytes());
        let read = BatchWrite {
            ops: vec![Operation::Read("n".into())],
            ..row(&keys[0], 1)
        };
        assert!(write_row_spec(&read).is_err());
    }

    #[test]
    fn generations_beyond_sixteen_bits_are_refused() {
        assert_eq!(row_generation(65_535).ok(), Some(65_535));
        assert!(row_generation(65_536).is_err());
    }
}
