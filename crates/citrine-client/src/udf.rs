//! User-defined functions (Lua modules run by the server): managing the
//! modules and calling them on records (protocol 03 §4 `udf-*` commands,
//! 02 §3 fields 30–32, 04 §2.3 BatchUDF rows).
//!
//! Owns the module commands — [`Client::register_udf`] (`udf-put`, then a
//! wait until every node lists the module with the source's SHA-1),
//! [`Client::remove_udf`], [`Client::list_udfs`], [`Client::get_udf`] and
//! the parsing of their answers, including the `error=<reason>;file=..;
//! line=..;message=<base64>` form ([`Error::UdfModule`]) — and the calls:
//! [`Client::execute_udf`] on one record (through the single-record
//! routing and retry loop, like any write) and [`Client::batch_udf`] on many
//! (through the batch rounds of [`crate::batch`]). Background UDF jobs are
//! [`crate::query::BackgroundTask::Udf`] given to
//! [`Client::execute_background`]; [`Client::query_aggregate_raw`] runs a
//! stream UDF and returns each node's emitted values unreduced.
//!
//! Invariants: a call's fields are checked and its arguments packed once
//! (`UdfFields`), then sent unchanged on every attempt and every batch
//! row; a call's answer is a value only for result 0 (the `SUCCESS` bin, nil
//! when the function returned nothing), [`Error::Udf`] with the `FAILURE`
//! bin's text for result 100, and the plain server error for any other
//! code. Module names go to the server as given (without `.lua`); file
//! names of the module commands must not contain the info protocol's
//! separators.

use crate::batch::{BatchPolicy, RowSpec};
use crate::client::{answer_node, write_header, Client};
use crate::command::{Key, Record, Request, RequestOps};
use crate::error::{Error, Result, UdfModuleError};
use crate::policy::WritePolicy;
use crate::value::Value;
use base64::Engine as _;
use citrine_types::NodeId;
use citrine_wire::msg::{field_type, info2, MessageWriter};
use std::time::Duration;

/// How long [`Client::register_udf`] and [`Client::remove_udf`] wait for
/// every node to show the change in its `udf-list`.
pub const UDF_PROPAGATION_TIMEOUT: Duration = Duration::from_secs(10);

/// A module as a node lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UdfModule {
    /// The module's file name (`name.lua`).
    pub filename: String,
    /// SHA-1 of its source, lower-case hex.
    pub hash: String,
}

/// One key's outcome of [`Client::batch_udf`]: the function's return
/// value, [`Error::Udf`] (result 100 with the `FAILURE` text) when it
/// failed, or the row's other error (its result code in
/// [`Error::raw_code`]).
pub type BatchUdfResult = Result<Value>;

/// SHA-1 of a module's source as lower-case hex: what `udf-list` shows.
pub fn udf_hash(source: &[u8]) -> String {
    use sha1::Digest as _;
    sha1::Sha1::digest(source)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// A UDF call's three fields (30 module, 31 function, 32 msgpack argument
/// list), checked and packed once.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct UdfFields {
    module: String,
    function: String,
    args: Vec<u8>,
}

impl UdfFields {
    /// How many fields a call adds to a message or batch row.
    pub(crate) const COUNT: u16 = 3;

    pub(crate) fn new(module: &str, function: &str, args: &[Value]) -> Result<UdfFields> {
        if module.is_empty() || function.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "a UDF call needs a module and a function name (got module {module:?}, function {function:?})"
            )));
        }
        let mut packed = Vec::with_capacity(1 + args.len() * 9);
        crate::msgpack::pack_array_header(&mut packed, args.len());
        for arg in args {
            crate::msgpack::pack(&mut packed, arg);
        }
        Ok(UdfFields {
            module: module.to_owned(),
            function: function.to_owned(),
            args: packed,
        })
    }

    /// Adds the fields to a message being written.
    pub(crate) fn write_fields(&self, writer: &mut MessageWriter<'_>) {
        writer.field(field_type::UDF_FILENAME, self.module.as_bytes());
        writer.field(field_type::UDF_FUNCTION, self.function.as_bytes());
        writer.field(field_type::UDF_ARGLIST, &self.args);
    }

    /// Appends the fields in wire format (size, type, data) to a batch row.
    pub(crate) fn push_fields(&self, out: &mut Vec<u8>) {
        for (kind, data) in [
            (field_type::UDF_FILENAME, self.module.as_bytes()),
            (field_type::UDF_FUNCTION, self.function.as_bytes()),
            (field_type::UDF_ARGLIST, &self.args[..]),
        ] {
            // Names and argument lists far below 4 GiB: the frame limit is 128 MiB.
            out.extend_from_slice(&(data.len() as u32 + 1).to_be_bytes());
            out.push(kind);
            out.extend_from_slice(data);
        }
    }
}

/// The outcome of one UDF call's answer (a single record's or a batch row's).
pub(crate) fn call_outcome(code: u8, mut record: Record, node: String) -> Result<Value> {
    match code {
        0 => Ok(record.bins.remove("SUCCESS").unwrap_or(Value::Nil)),
        100 => {
            let message = match record.bins.remove("FAILURE") {
                Some(Value::String(text)) => text,
                Some(other) => other.to_string(),
                None => String::new(),
            };
            Err(Error::Udf { node, message })
        }
        code => Err(Error::server(code, node)),
    }
}

/// A file name that can go into a `udf-*` command.
fn check_filename(filename: &str) -> Result<()> {
    if filename.is_empty() || filename.contains([':', ';', '=', ',', '\t', '\n', '\r', ' ', '/']) {
        return Err(Error::InvalidArgument(format!(
            "UDF file name {filename:?} must be non-empty, without : ; = , / or whitespace (e.g. \"mymodule.lua\")"
        )));
    }
    Ok(())
}

/// The `key=value` items of a `;`-separated answer (values may hold `=`).
fn items(answer: &str) -> impl Iterator<Item = (&str, &str)> {
    answer
        .trim_end()
        .split(';')
        .filter(|item| !item.is_empty())
        .map(|item| item.split_once('=').unwrap_or((item, "")))
}

/// `error=<reason>[;file=..;line=..;message=<base64>]` as an error, or
/// `None` when the answer is not of that form.
fn parse_module_error(answer: &str, node: &str, filename: &str) -> Option<Error> {
    if !answer.starts_with("error=") {
        return None;
    }
    let mut reason = String::new();
    let mut file = None;
    let mut line = None;
    let mut message = None;
    for (name, value) in items(answer) {
        match name {
            "error" => reason = value.to_owned(),
            "file" => file = Some(value.to_owned()),
            "line" => line = value.parse().ok(),
            "message" => {
                // Base64 of the text; keep the raw value if it is not.
                let text = base64::engine::general_purpose::STANDARD
                    .decode(value)
                    .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
                    .unwrap_or_else(|_| value.to_owned());
                message = Some(text);
            }
            _ => {}
        }
    }
    Some(Error::UdfModule(Box::new(UdfModuleError {
        node: node.to_owned(),
        filename: filename.to_owned(),
        reason,
        file,
        line,
        message,
    })))
}

/// The modules of a `udf-list` answer: `filename=F,hash=H,type=LUA;` each.
pub(crate) fn parse_udf_list(answer: &str) -> Vec<UdfModule> {
    answer
        .trim_end()
        .split(';')
        .filter_map(|entry| {
            let mut filename = None;
            let mut hash = String::new();
            for pair in entry.split(',') {
                match pair.split_once('=') {
                    Some(("filename", value)) => filename = Some(value.to_owned()),
                    Some(("hash", value)) => hash = value.to_ascii_lowercase(),
                    _ => {}
                }
            }
            Some(UdfModule {
                filename: filename.filter(|name| !name.is_empty())?,
                hash,
            })
        })
        .collect()
}

/// The source in a `udf-get` answer (`[gen=H;]type=LUA;content=<base64>`),
/// `Ok(None)` for `error=not_found`.
fn parse_udf_get(answer: &str, node: &str, filename: &str) -> Result<Option<Vec<u8>>> {
    if answer.trim_end() == "error=not_found" {
        return Ok(None);
    }
    if let Some(error) = parse_module_error(answer, node, filename) {
        return Err(error);
    }
    let protocol = |message: String| Error::Protocol {
        address: node.to_owned(),
        message,
    };
    let content = items(answer)
        .find_map(|(name, value)| (name == "content").then_some(value))
        .ok_or_else(|| protocol(format!("udf-get answered without content: {answer:?}")))?;
    base64::engine::general_purpose::STANDARD
        .decode(content)
        .map(Some)
        .map_err(|error| protocol(format!("udf-get content is not base64: {error}")))
}

impl Client {
    /// Registers (or replaces) the Lua module `filename` (`name.lua`; calls
    /// name it `name`) with `source`, through one node, then waits until
    /// every node lists it with the source's hash (up to
    /// [`UDF_PROPAGATION_TIMEOUT`]). A module the server refuses — one that
    /// does not compile, say — is an [`Error::UdfModule`] with the server's
    /// reason, file, line and message.
    pub async fn register_udf(&self, filename: &str, source: &[u8]) -> Result<()> {
        check_filename(filename)?;
        if source.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "UDF module {filename:?} has no source"
            )));
        }
        let content = base64::engine::general_purpose::STANDARD.encode(source);
        let command = format!(
            "udf-put:filename={filename};content={content};content-len={};udf-type=LUA;",
            content.len()
        );
        let node = self.any_node()?;
        self.module_command(node, &command, filename).await?;
        // Servers differ in what they hash (Citrine the source, the
        // reference its stored metadata), but every node of one cluster
        // hashes alike: the node that took the put lists the hash the others
        // will. Only if it cannot say is the source's SHA-1 expected.
        let expected = match self.listed_udf(node, filename).await {
            Ok(Some(module)) => module.hash,
            _ => udf_hash(source),
        };
        self.wait_for_udf(filename, Some(&expected), UDF_PROPAGATION_TIMEOUT)
            .await
    }

    /// Module `filename` as `node`'s `udf-list` shows it.
    async fn listed_udf(&self, node: NodeId, filename: &str) -> Result<Option<UdfModule>> {
        let answer = self.info_value(node, "udf-list").await?;
        Ok(parse_udf_list(&answer)
            .into_iter()
            .find(|module| module.filename == filename))
    }

    /// Removes the module `filename` through one node, then waits until no
    /// node lists it (up to [`UDF_PROPAGATION_TIMEOUT`]). Removing a module
    /// that is not there succeeds.
    pub async fn remove_udf(&self, filename: &str) -> Result<()> {
        check_filename(filename)?;
        let node = self.any_node()?;
        self.module_command(node, &format!("udf-remove:filename={filename};"), filename)
            .await?;
        self.wait_for_udf(filename, None, UDF_PROPAGATION_TIMEOUT)
            .await
    }

    /// The modules one node lists (`udf-list`), in its order.
    pub async fn list_udfs(&self) -> Result<Vec<UdfModule>> {
        let node = self.any_node()?;
        let answer = self.info_value(node, "udf-list").await?;
        Ok(parse_udf_list(&answer))
    }

    /// The source of module `filename` as one node holds it; `None` when
    /// the node has no such module.
    pub async fn get_udf(&self, filename: &str) -> Result<Option<Vec<u8>>> {
        check_filename(filename)?;
        let node = self.any_node()?;
        let answer = self
            .info_value(node, &format!("udf-get:filename={filename};"))
            .await?;
        parse_udf_get(&answer, &node.to_string(), filename)
    }

    /// Waits until every node lists module `filename` with hash
    /// `expected_hash` (hex, as the server lists it; Citrine's is
    /// [`udf_hash`]), or, with `None`, until no node lists it; polls every
    /// 50 ms and fails with a timeout after `timeout`. A node that does not
    /// answer counts as not there yet: it is asked again next time (a node
    /// that left the cluster is no longer asked).
    pub async fn wait_for_udf(
        &self,
        filename: &str,
        expected_hash: Option<&str>,
        timeout: Duration,
    ) -> Result<()> {
        crate::query::poll(timeout, Duration::from_millis(50), "UDF module", || async {
            for summary in self.nodes() {
                let Ok(listed) = self.listed_udf(summary.id, filename).await else {
                    return Ok(false);
                };
                let settled = match (expected_hash, listed) {
                    (Some(hash), Some(module)) => module.hash.eq_ignore_ascii_case(hash),
                    (Some(_), None) => false,
                    (None, listed) => listed.is_none(),
                };
                if !settled {
                    return Ok(false);
                }
            }
            Ok(true)
        })
        .await
    }

    /// Sends a `udf-put` or `udf-remove` and expects `ok`.
    async fn module_command(&self, node: NodeId, command: &str, filename: &str) -> Result<()> {
        let answer = self.info_value(node, command).await?;
        let answer = answer.trim_end();
        if answer.eq_ignore_ascii_case("ok") {
            return Ok(());
        }
        let verb = command.split(':').next().unwrap_or(command);
        Err(
            parse_module_error(answer, &node.to_string(), filename).unwrap_or_else(|| {
                Error::Protocol {
                    address: node.to_string(),
                    message: format!("{verb} answered {answer:?} instead of ok"),
                }
            }),
        )
    }

    /// Calls `module.function(record, args...)` on the record of `key`
    /// (module without `.lua`) and returns what it returned
    /// ([`Value::Nil`] for nothing; Lua lists and maps come back as
    /// [`Value::List`] / [`Value::Map`] msgpack). The call is a write: it
    /// goes to the key's master under `policy`'s existence, generation and
    /// TTL rules. It is retried (within `policy`'s retries) only after a
    /// failure that surely did not run it — no connection, or a refusal
    /// (11, 14, 18) — and never after one that may have (a timeout, a lost
    /// answer, a server's 9): that error is in doubt
    /// ([`Error::in_doubt`]). A function that fails (raises an error,
    /// or the module or function does not exist) is [`Error::Udf`]: result
    /// code 100 and the server's message.
    pub async fn execute_udf(
        &self,
        policy: &WritePolicy,
        key: &Key,
        module: &str,
        function: &str,
        args: &[Value],
    ) -> Result<Value> {
        let call = UdfFields::new(module, function, args)?;
        let header = write_header(policy);
        // A UDF need not be idempotent: `run` retries it only after failures
        // that surely did not run it (no connection, a refusal); after a
        // timeout or a lost answer the error is in doubt and the caller
        // decides.
        let answer = self
            .run(
                &policy.base,
                key,
                true,
                &Request {
                    header,
                    ops: RequestOps::Udf(&call),
                },
            )
            .await?;
        let node = answer_node(&answer);
        call_outcome(answer.result_code, answer.record, node)
    }

    /// Calls `module.function(record, args...)` on each key's record, one
    /// request per node. Rows are retried in rounds as other batches are,
    /// except rows that may have reached the server (a stream that broke
    /// or timed out after the request went out): those fail in doubt, since
    /// a UDF need not be idempotent and must not run twice.
    /// Returns one outcome per key, in key order (see [`BatchUdfResult`]).
    /// Rows are writes with the namespace's default TTL, no generation or
    /// existence condition, and carry the user key when
    /// `policy.base.send_key` is set. Fails as a whole only when the
    /// command could not be run.
    pub async fn batch_udf(
        &self,
        policy: &BatchPolicy,
        keys: &[Key],
        module: &str,
        function: &str,
        args: &[Value],
    ) -> Result<Vec<BatchUdfResult>> {
        let call = UdfFields::new(module, function, args)?;
        let spec = RowSpec::Full {
            info1: 0,
            info2: info2::WRITE,
            info3: 0,
            generation: 0,
            record_ttl: 0,
            ops: Vec::new(),
            n_ops: 0,
            send_key: policy.base.send_key,
            udf: Some(call),
        };
        let rows = self.run_batch(policy, keys, &spec, true).await?;
        Ok(rows
            .into_iter()
            .map(|row| {
                row.and_then(|answer| call_outcome(answer.result_code, answer.record, answer.node))
            })
            .collect())
    }
}

/// The values one node's part of an aggregation emitted
/// ([`Client::query_aggregate_raw`]).
#[derive(Clone, Debug, PartialEq)]
pub struct AggregateOutput {
    pub node: NodeId,
    /// In the order the node sent them.
    pub values: Vec<Value>,
}

impl Client {
    /// Runs the stream UDF `module.function(stream, args...)` over the
    /// records `statement` selects (a scan, or a query with an index
    /// filter) and returns what each node's streams emitted, node by node,
    /// **unreduced**. A server runs one stream per partition (as the
    /// reference does), so a function ending in `reduce` yields one value
    /// per partition holding selected records. A reference client would
    /// run the function's final reduce step in Lua over all those values;
    /// this client has no Lua, so that last step — summing the counts,
    /// merging maps... — is the caller's.
    ///
    /// Each node is sent the partitions of `statement.partitions` it
    /// masters. There is no resume: a node that fails (or a partition with
    /// no master) fails the whole attempt. An attempt that failed only
    /// retryably (a partition refused, 11, as while a master fills during
    /// migrations; a network error; a timeout) is run again whole, on a
    /// fresh partition map, up to `policy.base.max_retries` times with its
    /// backoff — an aggregation writes nothing, and no value of a failed
    /// attempt is returned. A UDF error on any node is [`Error::Udf`].
    /// `policy.base.filter` applies to the records;
    /// `policy.max_records` and the statement's bins do not.
    pub async fn query_aggregate_raw(
        &self,
        policy: &crate::query::ScanPolicy,
        statement: &crate::query::Statement,
        module: &str,
        function: &str,
        args: &[Value],
    ) -> Result<Vec<AggregateOutput>> {
        statement.validate()?;
        let call = UdfFields::new(module, function, args)?;
        let total_deadline = policy.base.total_deadline(std::time::Instant::now());
        let mut retry = 0;
        loop {
            let error = match self
                .aggregate_once(policy, statement, &call, total_deadline)
                .await
            {
                Ok(outputs) => return Ok(outputs),
                Err(error) => error,
            };
            let backoff = policy.base.backoff_for(retry + 1, self.next_random());
            let out_of_time = total_deadline
                .is_some_and(|deadline| std::time::Instant::now() + backoff >= deadline);
            if !error.is_retryable() || retry >= policy.base.max_retries || out_of_time {
                return Err(error);
            }
            retry += 1;
            self.cluster
                .counters
                .retries
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::debug!(retry, %error, "running the aggregation again");
            if !backoff.is_zero() {
                tokio::time::sleep(backoff).await;
            }
            // A fresh map before planning again (the tend loop may not
            // have run yet).
            let _ = self.tend_now().await;
        }
    }

    /// One attempt of [`Client::query_aggregate_raw`].
    async fn aggregate_once(
        &self,
        policy: &crate::query::ScanPolicy,
        statement: &crate::query::Statement,
        call: &UdfFields,
        total_deadline: Option<std::time::Instant>,
    ) -> Result<Vec<AggregateOutput>> {
        use std::collections::BTreeMap;
        use std::sync::Arc;
        let mut plan: BTreeMap<NodeId, (Arc<crate::node::Node>, Vec<u16>)> = BTreeMap::new();
        {
            let state = self.cluster.state();
            let table = state.map.namespaces.get(&statement.namespace);
            let (begin, count) = statement.partitions.bounds();
            for partition in begin..begin + count {
                let node = table
                    .and_then(|table| table.node(0, usize::from(partition)))
                    .and_then(|id| state.by_id.get(&id))
                    .ok_or_else(|| Error::NoNode {
                        namespace: statement.namespace.clone(),
                        partition,
                    })?;
                plan.entry(node.id)
                    .or_insert_with(|| (node.clone(), Vec::new()))
                    .1
                    .push(partition);
            }
        }
        self.cluster
            .counters
            .commands
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let task_id = self.next_random() >> 1 | 1;
        let mut tasks = tokio::task::JoinSet::new();
        for (id, (node, partitions)) in plan {
            let mut frame = Vec::with_capacity(256 + partitions.len() * 2);
            encode_aggregate(&mut frame, policy, statement, task_id, &partitions, call);
            let base = policy.base.clone();
            tasks.spawn(async move {
                let values = aggregate_on(&node, &frame, &base, total_deadline).await;
                (id, values)
            });
        }
        let mut outputs = Vec::new();
        let mut failure = None;
        while let Some(joined) = tasks.join_next().await {
            let (node, values) = joined.map_err(|error| Error::Protocol {
                address: String::new(),
                message: format!("aggregation task failed: {error}"),
            })?;
            match values {
                Ok(values) => outputs.push(AggregateOutput { node, values }),
                Err(error) => {
                    failure.get_or_insert(error);
                }
            }
        }
        if let Some(error) = failure {
            self.cluster
                .counters
                .command_failures
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Err(error);
        }
        outputs.sort_by_key(|output| output.node);
        Ok(outputs)
    }
}

/// One node's aggregation request: the query's fields, its partitions in
/// a PID_ARRAY, `UDF_OP` 1 and the call; no ops.
fn encode_aggregate(
    out: &mut Vec<u8>,
    policy: &crate::query::ScanPolicy,
    statement: &crate::query::Statement,
    task_id: u64,
    partitions: &[u16],
    call: &UdfFields,
) {
    use citrine_wire::msg::{info1, MsgHeader};
    let total_ms = u32::try_from(policy.base.total_timeout.as_millis()).unwrap_or(u32::MAX);
    let header = MsgHeader {
        info1: info1::READ,
        transaction_ttl: total_ms,
        ..MsgHeader::default()
    };
    let mut writer = MessageWriter::begin(out, &header);
    crate::query::write_common_fields(
        &mut writer,
        statement,
        &policy.base,
        policy.records_per_second,
        task_id,
    );
    if let Some(filter) = &policy.base.filter {
        writer.field(field_type::FILTER_EXPRESSION, filter);
    }
    let pids: Vec<u8> = partitions.iter().flat_map(|id| id.to_le_bytes()).collect();
    writer.field(field_type::PID_ARRAY, &pids);
    writer.field(field_type::UDF_OP, &[crate::query::UDF_OP_AGGREGATE]);
    call.write_fields(&mut writer);
    writer.finish();
}

/// Sends one node its aggregation request and reads the values it emits
/// up to its LAST message.
async fn aggregate_on(
    node: &crate::node::Node,
    frame: &[u8],
    base: &crate::policy::Policy,
    total_deadline: Option<std::time::Instant>,
) -> Result<Vec<Value>> {
    use citrine_wire::frame::MessageType;
    use citrine_wire::msg::{info3, Message};
    let mut pooled = node.pool.get(base.socket_deadline(total_deadline)).await?;
    let Some(connection) = pooled.connection() else {
        return Err(Error::Closed);
    };
    let protocol = |message: String| Error::Protocol {
        address: node.address.to_string(),
        message,
    };
    let mut values = Vec::new();
    // The first UDF failure the stream reported (before its LAST).
    let mut failure = None;
    let outcome = async {
        connection
            .send(frame, base.socket_deadline(total_deadline))
            .await?;
        loop {
            let (message_type, body) = connection
                .receive(base.socket_deadline(total_deadline))
                .await?;
            if message_type != MessageType::Message {
                return Err(protocol(format!(
                    "expected AS_MSG frames in an aggregation answer, got {message_type:?}"
                )));
            }
            let mut rest = body;
            while !rest.is_empty() {
                let (message, used) = Message::decode_prefix(rest)
                    .map_err(|error| protocol(format!("bad aggregation answer: {error}")))?;
                rest = &rest[used..];
                let header = message.header;
                if header.info3 & info3::LAST != 0 {
                    if !rest.is_empty() {
                        return Err(protocol("bytes after an aggregation's LAST message".into()));
                    }
                    return match (header.result_code, failure.take()) {
                        (0, None) => Ok(()),
                        (_, Some(error)) => Err(error),
                        (code, None) => Err(Error::server(code, node.name())),
                    };
                }
                let record = Record::from_message(&message).map_err(protocol)?;
                match call_outcome(header.result_code, record, node.name()) {
                    Ok(value) => values.push(value),
                    Err(error) => {
                        failure.get_or_insert(error);
                    }
                }
            }
        }
    }
    .await;
    match &outcome {
        // The stream ended with its LAST message: the connection is clean.
        Ok(()) | Err(Error::Server { .. } | Error::Udf { .. }) => {
            pooled.release();
            node.record_success();
        }
        Err(error) => {
            pooled.discard();
            if error.counts_against_node() {
                node.record_failure();
            }
            if matches!(error, Error::Network { .. }) {
                node.pool.clear_idle();
            }
        }
    }
    outcome.map(|()| values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::encode_request;
    use citrine_wire::msg::Message;

    #[test]
    fn hashes_are_lower_case_sha1() {
        assert_eq!(udf_hash(b"abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");
        assert_eq!(udf_hash(b""), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
    }

    #[test]
    fn lists_parse() {
        let modules = parse_udf_list(
            "filename=a.lua,hash=ABCDEF,type=LUA;filename=b.lua,hash=12,type=LUA;\n",
        );
        assert_eq!(
            modules,
            vec![
                UdfModule {
                    filename: "a.lua".into(),
                    hash: "abcdef".into()
                },
                UdfModule {
                    filename: "b.lua".into(),
                    hash: "12".into()
                }
            ]
        );
        assert!(parse_udf_list("").is_empty());
        assert!(parse_udf_list("hash=1,type=LUA;").is_empty());
    }

    #[test]
    fn module_errors_carry_file_line_and_decoded_message() {
        let message = base64::engine::general_purpose::STANDARD.encode("'end' expected");
        let answer = format!("error=compile_error;file=bad.lua;line=3;message={message}");
        let error = parse_module_error(&answer, "N1", "bad.lua").expect("an error answer");
        match &error {
            Error::UdfModule(refusal) => assert_eq!(
                **refusal,
                UdfModuleError {
                    node: "N1".into(),
                    filename: "bad.lua".into(),
                    reason: "compile_error".into(),
                    file: Some("bad.lua".into()),
                    line: Some(3),
                    message: Some("'end' expected".into()),
                }
            ),
            other => panic!("{other:?}"),
        }
        let text = error.to_string();
        assert!(
            text.contains("compile_error at bad.lua:3: 'end' expected"),
            "{text}"
        );
        assert!(parse_module_error("ok", "N1", "x.lua").is_none());
        let bare = parse_module_error("error=invalid_filename", "N1", "x").expect("error");
        assert_eq!(
            bare.to_string(),
            "UDF module \"x\" refused by N1: invalid_filename"
        );
    }

    #[test]
    fn get_answers_parse() {
        let content = base64::engine::general_purpose::STANDARD.encode("return 1\n");
        assert_eq!(
            parse_udf_get(&format!("gen=ab;type=LUA;content={content}"), "N", "m.lua")
                .expect("parses"),
            Some(b"return 1\n".to_vec())
        );
        assert_eq!(
            parse_udf_get(&format!("type=LUA;content={content};"), "N", "m.lua").expect("parses"),
            Some(b"return 1\n".to_vec())
        );
        assert_eq!(
            parse_udf_get("error=not_found", "N", "m.lua").expect("parses"),
            None
        );
        assert!(matches!(
            parse_udf_get("error=invalid_filename", "N", "m"),
            Err(Error::UdfModule(_))
        ));
        assert!(matches!(
            parse_udf_get("type=LUA;", "N", "m.lua"),
            Err(Error::Protocol { .. })
        ));
    }

    #[test]
    fn file_names_are_checked() {
        assert!(check_filename("ok_name-1.lua").is_ok());
        for bad in ["", "a;b.lua", "a b.lua", "a=b.lua", "dir/a.lua", "a,b.lua"] {
            assert!(check_filename(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_call_goes_in_fields_thirty_to_thirty_two_after_the_key_fields() {
        let call =
            UdfFields::new("mod", "fun", &[Value::Int(1), Value::from("s")]).expect("valid call");
        assert!(UdfFields::new("", "fun", &[]).is_err());
        assert!(UdfFields::new("mod", "", &[]).is_err());
        let key = Key::new("test", "demo", 5i64);
        let header = write_header(&WritePolicy::default());
        let mut out = Vec::new();
        encode_request(
            &mut out,
            &key,
            true,
            None,
            &Request {
                header,
                ops: RequestOps::Udf(&call),
            },
        )
        .expect("encodes");
        let message = Message::decode(&out[8..]).expect("decodes");
        assert_eq!(message.header.info2, info2::WRITE);
        assert_eq!(message.header.n_ops, 0);
        let kinds: Vec<u8> = message.fields().map(|field| field.field_type).collect();
        assert_eq!(kinds, [0, 1, 4, 2, 30, 31, 32]);
        assert_eq!(message.field(field_type::UDF_FILENAME), Some(&b"mod"[..]));
        assert_eq!(message.field(field_type::UDF_FUNCTION), Some(&b"fun"[..]));
        assert_eq!(
            message.field(field_type::UDF_ARGLIST),
            Some(&[0x92, 0x01, 0xa2, 3, b's'][..])
        );
        let mut row = Vec::new();
        call.push_fields(&mut row);
        assert_eq!(&row[..9], &[0, 0, 0, 4, 30, b'm', b'o', b'd', 0]);
    }

    #[test]
    fn batch_rows_carry_the_call_after_namespace_and_set_and_repeat() {
        let keys = [Key::new("test", "s", 1i64), Key::new("test", "s", 2i64)];
        let spec = RowSpec::Full {
            info1: 0,
            info2: info2::WRITE,
            info3: 0,
            generation: 0,
            record_ttl: 0,
            ops: Vec::new(),
            n_ops: 0,
            send_key: false,
            udf: Some(UdfFields::new("m", "f", &[Value::Int(7)]).expect("valid call")),
        };
        let mut frame = Vec::new();
        crate::batch::encode_batch(&mut frame, &BatchPolicy::default(), &keys, &[0, 1], &spec);
        let message = Message::decode(&frame[8..]).expect("decodes");
        let payload = message.field(field_type::BATCH_INDEX).expect("batch field");
        let row = 5;
        assert_eq!(&payload[row..row + 4], &0u32.to_be_bytes());
        assert_eq!(payload[row + 24], 0x0E, "INFO|GEN|TTL");
        assert_eq!(&payload[row + 25..row + 28], &[0, info2::WRITE, 0]);
        assert_eq!(
            &payload[row + 28..row + 34],
            &[0, 0, 0, 0, 0, 0],
            "gen, ttl"
        );
        assert_eq!(
            &payload[row + 34..row + 38],
            &[0, 5, 0, 0],
            "5 fields, no ops"
        );
        let mut at = row + 38;
        let mut kinds = Vec::new();
        for _ in 0..5 {
            let size = u32::from_be_bytes([
                payload[at],
                payload[at + 1],
                payload[at + 2],
                payload[at + 3],
            ]) as usize;
            kinds.push(payload[at + 4]);
            if payload[at + 4] == field_type::UDF_ARGLIST {
                assert_eq!(&payload[at + 5..at + 4 + size], &[0x91, 7]);
            }
            at += 4 + size;
        }
        assert_eq!(kinds, [0, 1, 30, 31, 32]);
        assert_eq!(&payload[at..at + 4], &1u32.to_be_bytes());
        assert_eq!(payload[at + 24], 0x01, "the second row repeats the first");
        assert_eq!(payload.len(), at + 25);
    }

    #[test]
    fn aggregations_send_their_partitions_and_udf_op_one() {
        let statement = crate::query::Statement::new("test", "s");
        let call = UdfFields::new("m", "f", &[]).expect("valid call");
        let mut frame = Vec::new();
        encode_aggregate(
            &mut frame,
            &crate::query::ScanPolicy::default(),
            &statement,
            9,
            &[3, 4],
            &call,
        );
        let message = Message::decode(&frame[8..]).expect("decodes");
        assert_eq!(message.header.info1, citrine_wire::msg::info1::READ);
        assert_eq!(message.header.info2, 0);
        assert_eq!(message.header.n_ops, 0);
        assert_eq!(
            message.field(field_type::PID_ARRAY),
            Some(&[3, 0, 4, 0][..])
        );
        assert_eq!(message.field(field_type::UDF_OP), Some(&[1][..]));
        assert_eq!(message.field(field_type::UDF_FILENAME), Some(&b"m"[..]));
        assert_eq!(message.field(field_type::UDF_FUNCTION), Some(&b"f"[..]));
        assert_eq!(message.field(field_type::UDF_ARGLIST), Some(&[0x90][..]));
    }

    #[test]
    fn answers_become_values_or_typed_errors() {
        let mut record = Record::default();
        record
            .bins
            .insert("SUCCESS".into(), Value::String("done".into()));
        assert_eq!(
            call_outcome(0, record, "N".into()).expect("success"),
            Value::String("done".into())
        );
        assert_eq!(
            call_outcome(0, Record::default(), "N".into()).expect("nil"),
            Value::Nil
        );
        let mut failed = Record::default();
        failed
            .bins
            .insert("FAILURE".into(), Value::String("boom".into()));
        let error = call_outcome(100, failed, "N".into()).expect_err("fails");
        assert_eq!(error.raw_code(), Some(100));
        assert_eq!(
            error.result_code(),
            Some(citrine_types::ResultCode::UdfExecution)
        );
        assert!(matches!(&error, Error::Udf { message, .. } if message == "boom"));
        assert!(!error.is_retryable());
        let other = call_outcome(2, Record::default(), "N".into()).expect_err("fails");
        assert!(matches!(other, Error::Server { code: 2, .. }));
    }
}
