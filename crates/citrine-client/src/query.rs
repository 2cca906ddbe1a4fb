//! Scans and secondary-index queries (protocol 04 §1, §3).
//!
//! Owns the partition-based scan/query protocol of clients for servers
//! ≥ 6.0: a [`Statement`] names a namespace, set, bins, the partitions to
//! cover and optionally an index filter; the client sends each node one
//! request listing the partitions it masters (PID_ARRAY, or DIGEST_ARRAY
//! and BVAL_ARRAY to resume a partition after its last record), streams the
//! records to the caller through a bounded channel ([`RecordStream`]), and
//! tracks every partition: its last digest (and bval), and whether it is
//! finished. A node that fails, or reports a partition unavailable, has the
//! unfinished partitions sent again in a new round (after a tend, so the
//! round uses the current partition map), resuming strictly after the last
//! record delivered: a record is delivered once even across retries.
//!
//! Also here: background scans and queries that apply write ops or a
//! record UDF on the server ([`Client::execute_background`],
//! [`BackgroundTask`], [`Client::job_status`]) and the
//! secondary-index info commands ([`Client::create_index`],
//! [`Client::drop_index`], [`Client::wait_for_index`]).
//!
//! Invariants: a partition is marked finished only when the node that was
//! sent it ended its stream with LAST/0, did not report it unavailable and
//! did not stop at its record limit; the resume point of a partition only
//! moves forward, to the last record handed to the channel.

use crate::client::Client;
use crate::command::{Bins, Key, Operation, Record};
use crate::error::{Error, Result};
use crate::node::Node;
use crate::policy::{Policy, WritePolicy};
use crate::udf::UdfFields;
use crate::value::Value;
use citrine_types::{Digest, NodeId, PARTITIONS as PARTITION_COUNT};
use citrine_wire::digest::UserKey;
use citrine_wire::frame::MessageType;
use citrine_wire::msg::{
    field_type, info1, info2, info3, op_type, Message, MessageWriter, MsgHeader,
};
use parking_lot::Mutex;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Policy of scans and queries.
#[derive(Clone, Debug)]
pub struct ScanPolicy {
    /// Timeouts and retries. The socket timeout bounds each wait for the
    /// next frame of a node's stream (and is sent to the server); the total
    /// timeout (none by default) bounds the whole scan; `max_retries` is the
    /// number of extra rounds for partitions a failed node left unfinished.
    /// The filter expression applies to every record.
    pub base: Policy,
    /// At most this many records in all (0: no limit).
    pub max_records: u64,
    /// Records a second the server sends, per node (0: no limit).
    pub records_per_second: u32,
    /// Return the bins (false: keys and metadata only).
    pub include_bin_data: bool,
    /// Records buffered between the nodes' streams and the caller.
    pub queue_size: usize,
    /// Return every bin as [`Value::Raw`] (particle type and bytes exactly
    /// as the server sent them), as a backup needs.
    pub raw_values: bool,
}

impl Default for ScanPolicy {
    fn default() -> ScanPolicy {
        ScanPolicy {
            base: Policy {
                total_timeout: Duration::ZERO,
                socket_timeout: Duration::from_secs(30),
                max_retries: 5,
                ..Policy::default()
            },
            max_records: 0,
            records_per_second: 0,
            include_bin_data: true,
            queue_size: 1024,
            raw_values: false,
        }
    }
}

/// Which partitions a scan or query covers: `count` partitions from `begin`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionFilter {
    begin: u16,
    count: u16,
    /// Resume the first partition strictly after this digest.
    after: Option<Digest>,
}

impl PartitionFilter {
    /// Every partition.
    pub fn all() -> PartitionFilter {
        PartitionFilter {
            begin: 0,
            count: PARTITION_COUNT as u16,
            after: None,
        }
    }

    /// `count` partitions from `begin` (ids are 0..4096).
    pub fn range(begin: u16, count: u16) -> Result<PartitionFilter> {
        if count == 0 || usize::from(begin) + usize::from(count) > PARTITION_COUNT {
            return Err(Error::InvalidArgument(format!(
                "partitions {begin}..{} are not within 0..{PARTITION_COUNT}",
                u32::from(begin) + u32::from(count)
            )));
        }
        Ok(PartitionFilter {
            begin,
            count,
            after: None,
        })
    }

    /// The records of one partition after `digest` (in the order scans
    /// return them: ascending digest), or all of them for `None`: how an
    /// interrupted scan of that partition is resumed.
    pub fn partition_after(partition: u16, digest: Option<Digest>) -> Result<PartitionFilter> {
        if let Some(digest) = digest {
            if digest.partition().get() != partition {
                return Err(Error::InvalidArgument(format!(
                    "digest {} is not of partition {partition}",
                    digest.partition().get()
                )));
            }
        }
        Ok(PartitionFilter {
            after: digest,
            ..PartitionFilter::range(partition, 1)?
        })
    }

    /// The partition of `key` alone.
    pub fn of_key(key: &Key) -> PartitionFilter {
        PartitionFilter {
            begin: key.partition().get(),
            count: 1,
            after: None,
        }
    }

    /// The first partition and how many.
    pub(crate) fn bounds(self) -> (u16, u16) {
        (self.begin, self.count)
    }
}

impl Default for PartitionFilter {
    fn default() -> PartitionFilter {
        PartitionFilter::all()
    }
}

/// What an index indexes in a bin.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IndexCollection {
    /// The bin's value itself.
    #[default]
    Default,
    /// Each element of a list.
    List,
    /// Each key of a map.
    MapKeys,
    /// Each value of a map.
    MapValues,
}

impl IndexCollection {
    fn wire(self) -> u8 {
        match self {
            IndexCollection::Default => 0,
            IndexCollection::List => 1,
            IndexCollection::MapKeys => 2,
            IndexCollection::MapValues => 3,
        }
    }

    fn info_name(self) -> &'static str {
        match self {
            IndexCollection::Default => "default",
            IndexCollection::List => "list",
            IndexCollection::MapKeys => "mapkeys",
            IndexCollection::MapValues => "mapvalues",
        }
    }
}

/// The type of the values an index holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexType {
    Numeric,
    String,
    Blob,
    /// GeoJSON points and regions (`GEO2DSPHERE`).
    Geo2DSphere,
}

impl IndexType {
    fn info_name(self) -> &'static str {
        match self {
            IndexType::Numeric => "numeric",
            IndexType::String => "string",
            IndexType::Blob => "blob",
            IndexType::Geo2DSphere => "geo2dsphere",
        }
    }
}

/// A value an index filter compares with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FilterValue {
    Int(i64),
    String(String),
    Blob(Vec<u8>),
    /// GeoJSON text: a region (points inside it) or a point (regions
    /// holding it).
    GeoJson(String),
}

impl From<i64> for FilterValue {
    fn from(value: i64) -> FilterValue {
        FilterValue::Int(value)
    }
}
impl From<&str> for FilterValue {
    fn from(value: &str) -> FilterValue {
        FilterValue::String(value.to_owned())
    }
}
impl From<String> for FilterValue {
    fn from(value: String) -> FilterValue {
        FilterValue::String(value)
    }
}
impl From<Vec<u8>> for FilterValue {
    fn from(value: Vec<u8>) -> FilterValue {
        FilterValue::Blob(value)
    }
}

impl FilterValue {
    fn particle_type(&self) -> u8 {
        match self {
            FilterValue::Int(_) => 1,
            FilterValue::String(_) => 3,
            FilterValue::Blob(_) => 4,
            FilterValue::GeoJson(_) => 23,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        match self {
            FilterValue::Int(value) => value.to_be_bytes().to_vec(),
            FilterValue::String(value) => value.as_bytes().to_vec(),
            FilterValue::Blob(value) => value.clone(),
            FilterValue::GeoJson(text) => text.as_bytes().to_vec(),
        }
    }
}

/// The secondary-index condition of a query (one per query).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexFilter {
    pub bin: String,
    pub collection: IndexCollection,
    pub begin: FilterValue,
    pub end: FilterValue,
    /// A CDT context (msgpack, 05 §2) when the index is on a nested element.
    pub context: Option<Vec<u8>>,
}

impl IndexFilter {
    /// Integers from `begin` to `end`, both included.
    pub fn range(bin: impl Into<String>, begin: i64, end: i64) -> IndexFilter {
        IndexFilter {
            bin: bin.into(),
            collection: IndexCollection::Default,
            begin: FilterValue::Int(begin),
            end: FilterValue::Int(end),
            context: None,
        }
    }

    /// Values equal to `value` (an integer, string or blob).
    pub fn equal(bin: impl Into<String>, value: impl Into<FilterValue>) -> IndexFilter {
        let value = value.into();
        IndexFilter {
            bin: bin.into(),
            collection: IndexCollection::Default,
            begin: value.clone(),
            end: value,
            context: None,
        }
    }

    /// Records of a `GEO2DSPHERE` index whose point lies inside `region`
    /// (GeoJSON `Polygon`, `MultiPolygon` or `AeroCircle`), or, when
    /// `region` is a `Point`, whose region holds it.
    pub fn geo(bin: impl Into<String>, geojson: impl Into<String>) -> IndexFilter {
        IndexFilter::equal(bin, FilterValue::GeoJson(geojson.into()))
    }

    /// Records whose point lies within `radius_m` metres of (lng, lat).
    pub fn geo_within_radius(
        bin: impl Into<String>,
        lng: f64,
        lat: f64,
        radius_m: f64,
    ) -> IndexFilter {
        IndexFilter::geo(
            bin,
            format!(r#"{{"type":"AeroCircle","coordinates":[[{lng},{lat}],{radius_m}]}}"#),
        )
    }

    /// The same filter on a list's elements or a map's keys or values.
    pub fn on(mut self, collection: IndexCollection) -> IndexFilter {
        self.collection = collection;
        self
    }

    /// The same filter on the element `context` selects.
    pub fn within(mut self, context: Vec<u8>) -> IndexFilter {
        self.context = Some(context);
        self
    }

    fn validate(&self) -> Result<()> {
        if self.bin.is_empty() || self.bin.len() > citrine_types::BIN_NAME_MAX {
            return Err(Error::InvalidArgument(format!(
                "filter bin name {:?} must be 1..=15 bytes",
                self.bin
            )));
        }
        match (&self.begin, &self.end) {
            (FilterValue::Int(begin), FilterValue::Int(end)) if begin > end => Err(
                Error::InvalidArgument(format!("range {begin}..={end} is empty")),
            ),
            (FilterValue::Int(_), FilterValue::Int(_)) => Ok(()),
            (begin, end) if begin == end => Ok(()),
            _ => Err(Error::InvalidArgument(
                "string, blob and geo filters are equalities: begin and end must be the same"
                    .into(),
            )),
        }
    }

    /// INDEX_RANGE payload (04 §3.2).
    fn encode(&self) -> Vec<u8> {
        let mut out = vec![1, self.bin.len() as u8];
        out.extend_from_slice(self.bin.as_bytes());
        out.push(self.begin.particle_type());
        for value in [&self.begin, &self.end] {
            let bytes = value.bytes();
            out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
            out.extend_from_slice(&bytes);
        }
        out
    }
}

/// What a scan or query reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Statement {
    pub namespace: String,
    /// Only this set's records (empty: the whole namespace).
    pub set: String,
    pub bins: Bins,
    /// The index condition; `None` scans every record.
    pub filter: Option<IndexFilter>,
    /// Query this index by name instead of finding it by bin and type.
    pub index_name: Option<String>,
    pub partitions: PartitionFilter,
    /// Writes a second a background job makes on each node (0: no limit),
    /// as the official clients' statements carry it; scans and queries
    /// take theirs from [`ScanPolicy::records_per_second`].
    pub records_per_second: u32,
}

impl Statement {
    /// Every record of `set` (or of the namespace when `set` is empty), all bins.
    pub fn new(namespace: impl Into<String>, set: impl Into<String>) -> Statement {
        Statement {
            namespace: namespace.into(),
            set: set.into(),
            bins: Bins::All,
            filter: None,
            index_name: None,
            partitions: PartitionFilter::all(),
            records_per_second: 0,
        }
    }

    /// With an index condition.
    pub fn filter(mut self, filter: IndexFilter) -> Statement {
        self.filter = Some(filter);
        self
    }

    /// Only these bins (or `Bins::Header` for none).
    pub fn bins(mut self, bins: Bins) -> Statement {
        self.bins = bins;
        self
    }

    /// Only these partitions.
    pub fn partitions(mut self, partitions: PartitionFilter) -> Statement {
        self.partitions = partitions;
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        Key::from_digest(self.namespace.clone(), self.set.clone(), Digest([0; 20])).validate()?;
        if let Bins::Names(names) = &self.bins {
            if let Some(name) = names
                .iter()
                .find(|name| name.len() > citrine_types::BIN_NAME_MAX)
            {
                return Err(Error::InvalidArgument(format!(
                    "bin name {name:?} is longer than 15 bytes"
                )));
            }
        }
        if let Some(filter) = &self.filter {
            filter.validate()?;
        }
        Ok(())
    }
}

/// A record returned by a scan or query, with its key.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyRecord {
    /// Namespace, set and digest; the user key when the server stored it.
    pub key: Key,
    pub record: Record,
}

/// The records of a running scan or query, in arrival order. Dropping it
/// stops the scan.
#[derive(Debug)]
pub struct RecordStream {
    receiver: mpsc::Receiver<Result<KeyRecord>>,
    driver: tokio::task::JoinHandle<()>,
}

impl RecordStream {
    /// The next record; `None` once every partition is finished. An error
    /// ends the stream.
    pub async fn next(&mut self) -> Option<Result<KeyRecord>> {
        self.receiver.recv().await
    }

    /// Every remaining record, or the first error.
    pub async fn collect(mut self) -> Result<Vec<KeyRecord>> {
        let mut records = Vec::new();
        while let Some(record) = self.next().await {
            records.push(record?);
        }
        Ok(records)
    }
}

impl Drop for RecordStream {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// What a background job does to each record it selects.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BackgroundTask<'a> {
    /// These write operations (sent as the request's ops).
    Operations(&'a [Operation]),
    /// This record UDF (`UDF_OP` 2 and the call's fields, no ops): the
    /// module's name without `.lua`, the function, its arguments after
    /// the record.
    Udf {
        module: &'a str,
        function: &'a str,
        args: &'a [Value],
    },
}

impl<'a> From<&'a [Operation]> for BackgroundTask<'a> {
    fn from(ops: &'a [Operation]) -> BackgroundTask<'a> {
        BackgroundTask::Operations(ops)
    }
}

impl<'a, const N: usize> From<&'a [Operation; N]> for BackgroundTask<'a> {
    fn from(ops: &'a [Operation; N]) -> BackgroundTask<'a> {
        BackgroundTask::Operations(ops)
    }
}

impl<'a> From<&'a Vec<Operation>> for BackgroundTask<'a> {
    fn from(ops: &'a Vec<Operation>) -> BackgroundTask<'a> {
        BackgroundTask::Operations(ops)
    }
}

/// `UDF_OP` (field 33): a stream UDF over the selected records.
pub(crate) const UDF_OP_AGGREGATE: u8 = 1;
/// `UDF_OP` (field 33): a record UDF applied by a background job.
pub(crate) const UDF_OP_BACKGROUND: u8 = 2;

/// Progress of a background job across the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobStatus {
    /// Some node is still running it.
    InProgress,
    /// Every node that knows it has finished it.
    Done,
    /// No node knows the job (never started, or forgotten).
    NotFound,
}

impl Client {
    /// Scans `statement`'s partitions (its filter must be `None`).
    pub fn scan(&self, policy: &ScanPolicy, statement: &Statement) -> Result<RecordStream> {
        if statement.filter.is_some() {
            return Err(Error::InvalidArgument(
                "a scan has no index filter; use query".into(),
            ));
        }
        self.query(policy, statement)
    }

    /// Runs a query: the records `statement.filter` selects through a
    /// secondary index, or every record when it has no filter. Records
    /// stream as the nodes send them.
    pub fn query(&self, policy: &ScanPolicy, statement: &Statement) -> Result<RecordStream> {
        statement.validate()?;
        let (sender, receiver) = mpsc::channel(policy.queue_size.max(1));
        let driver = tokio::spawn(drive(
            self.clone(),
            policy.clone(),
            statement.clone(),
            sender,
        ));
        Ok(RecordStream { receiver, driver })
    }

    /// Starts a background job doing `task` — write operations, or a
    /// record UDF ([`BackgroundTask::Udf`]) — to every record `statement`
    /// selects, on every node, under `write`'s TTL, generation and
    /// existence rules and filter expression. Returns the job's id for
    /// [`Client::job_status`]; the server runs it on its own.
    /// It is sent to every node at once. A node is asked again (up to
    /// `write.base.max_retries`, with its backoff) only while its error
    /// says the job surely did not start there: no connection, or a
    /// retryable refusal; a lost answer is not resent (Citrine would run
    /// the same task id once, other servers may not). After an error the
    /// job may be running on the nodes that accepted it (the error says
    /// which node failed), so do not start it again blindly when its work
    /// is not idempotent.
    pub async fn execute_background<'a>(
        &self,
        write: &WritePolicy,
        statement: &Statement,
        task: impl Into<BackgroundTask<'a>>,
    ) -> Result<u64> {
        statement.validate()?;
        if statement.partitions != PartitionFilter::all() {
            return Err(Error::InvalidArgument(
                "a background job covers every partition".into(),
            ));
        }
        let task = task.into();
        let udf = task.checked()?;
        let task_id = self.next_random() >> 1 | 1;
        let frame = encode_background(write, statement, task_id, (task, udf.as_ref()));
        let nodes = self.cluster.state().nodes.clone();
        if nodes.is_empty() {
            return Err(Error::NoNode {
                namespace: statement.namespace.clone(),
                partition: 0,
            });
        }
        self.submit_everywhere(nodes, &frame, &write.base).await?;
        Ok(task_id)
    }

    /// Sends the job's request `frame` to every node at once; each retried
    /// on its own while its error says the job was certainly not started
    /// there (nothing sent, or a retryable refusal). A job that may have
    /// started is never sent again: its writes need not be idempotent.
    /// The first error of any node, if one failed.
    async fn submit_everywhere(
        &self,
        nodes: Vec<Arc<Node>>,
        frame: &[u8],
        base: &Policy,
    ) -> Result<()> {
        let deadline = base.total_deadline(Instant::now());
        let mut submissions = tokio::task::JoinSet::new();
        for node in nodes {
            let (client, frame, base) = (self.clone(), frame.to_vec(), base.clone());
            submissions.spawn(async move {
                let mut retry = 0;
                loop {
                    let outcome = submit_job(&node, &frame, base.socket_deadline(deadline)).await;
                    let again =
                        matches!(&outcome, Err(error) if error.is_retryable() && !error.in_doubt());
                    if !again || retry >= base.max_retries {
                        return outcome;
                    }
                    retry += 1;
                    let backoff = base.backoff_for(retry, client.next_random());
                    if deadline.is_some_and(|deadline| Instant::now() + backoff >= deadline) {
                        return outcome;
                    }
                    tokio::time::sleep(backoff).await;
                }
            });
        }
        let mut first_error = None;
        while let Some(joined) = submissions.join_next().await {
            let outcome = joined.unwrap_or_else(|error| {
                Err(Error::Protocol {
                    address: String::new(),
                    message: format!("job submission task failed: {error}"),
                })
            });
            if let Err(error) = outcome {
                first_error.get_or_insert(error);
            }
        }
        match first_error {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Where background job `task_id` stands, asking every node
    /// (`query-show:trid=ID`).
    pub async fn job_status(&self, task_id: u64) -> Result<JobStatus> {
        let command = format!("query-show:trid={task_id}");
        let mut known = false;
        for summary in self.nodes() {
            let value = self.info_value(summary.id, &command).await;
            match value {
                // No answer for the command: this node does not know the job.
                Ok(value) if value.trim().is_empty() => {}
                Ok(value) => {
                    known = true;
                    let status = value
                        .split(':')
                        .find_map(|pair| pair.strip_prefix("status="))
                        .unwrap_or("");
                    if !status.starts_with("done") {
                        return Ok(JobStatus::InProgress);
                    }
                }
                Err(Error::Info { code: 2, .. }) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(if known {
            JobStatus::Done
        } else {
            JobStatus::NotFound
        })
    }

    /// Waits until background job `task_id` is done on every node, polling
    /// every 100 ms; fails after `timeout`, or at once when no node knows it.
    pub async fn wait_for_job(&self, task_id: u64, timeout: Duration) -> Result<()> {
        poll(
            timeout,
            Duration::from_millis(100),
            "background job",
            || async {
                match self.job_status(task_id).await? {
                    JobStatus::Done => Ok(true),
                    JobStatus::NotFound => Err(Error::InvalidArgument(format!(
                        "no node knows background job {task_id}"
                    ))),
                    JobStatus::InProgress => Ok(false),
                }
            },
        )
        .await
    }

    /// Creates a secondary index (`sindex-create`) through one node; the
    /// cluster spreads the definition to the others. Returns once the node
    /// accepted it: [`Client::wait_for_index`] waits for it to be built.
    #[allow(clippy::too_many_arguments)]
    pub async fn create_index(
        &self,
        namespace: &str,
        set: &str,
        name: &str,
        bin: &str,
        index_type: IndexType,
        collection: IndexCollection,
        context: Option<&[u8]>,
    ) -> Result<()> {
        use base64::Engine as _;
        check_info_words(&[("namespace", namespace), ("index name", name), ("bin", bin)])?;
        if !set.is_empty() {
            check_info_words(&[("set", set)])?;
        }
        let mut command = format!("sindex-create:namespace={namespace}");
        if !set.is_empty() {
            command.push_str(&format!(";set={set}"));
        }
        command.push_str(&format!(
            ";indexname={name};bin={bin};type={};indextype={}",
            index_type.info_name(),
            collection.info_name()
        ));
        if let Some(context) = context {
            command.push_str(";context=");
            command.push_str(&base64::engine::general_purpose::STANDARD.encode(context));
        }
        let node = self.any_node()?;
        self.info_value(node, &command).await.map(|_| ())
    }

    /// Drops a secondary index (`sindex-delete`) through one node.
    pub async fn drop_index(&self, namespace: &str, name: &str) -> Result<()> {
        check_info_words(&[("namespace", namespace), ("index name", name)])?;
        let node = self.any_node()?;
        self.info_value(
            node,
            &format!("sindex-delete:namespace={namespace};indexname={name}"),
        )
        .await
        .map(|_| ())
    }

    /// Waits until every node reports index `name` built (`load_pct=100`),
    /// polling every 50 ms; fails after `timeout`.
    pub async fn wait_for_index(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<()> {
        let command = format!("sindex-stat:namespace={namespace};indexname={name}");
        poll(
            timeout,
            Duration::from_millis(50),
            "index build",
            || async {
                let mut built = true;
                for summary in self.nodes() {
                    match self.info_value(summary.id, &command).await {
                        Ok(value) => {
                            built &= value.split(';').any(|pair| pair == "load_pct=100");
                        }
                        // Not there yet: the definition is still on its way.
                        Err(Error::Info { code: 201, .. }) => built = false,
                        Err(error) => return Err(error),
                    }
                }
                Ok(built)
            },
        )
        .await
    }

    /// One info command's value on one node; an `ERROR:`/`FAIL:` value is
    /// an [`Error::Info`].
    pub(crate) async fn info_value(&self, node: NodeId, command: &str) -> Result<String> {
        let mut answers = self.info(node, &[command]).await?;
        let value = answers.remove(command).unwrap_or_default();
        if crate::conn::is_info_error(&value) {
            let (code, message) = crate::conn::parse_info_error(value.trim_end());
            return Err(Error::Info {
                node: node.to_string(),
                command: command.to_owned(),
                code,
                message,
            });
        }
        Ok(value)
    }

    pub(crate) fn any_node(&self) -> Result<NodeId> {
        self.nodes()
            .into_iter()
            .find(|node| node.reachable)
            .map(|node| node.id)
            .ok_or_else(|| Error::NoNode {
                namespace: String::new(),
                partition: 0,
            })
    }
}

/// Calls `check` every `every` until it answers true; a timeout named
/// `what` past `timeout`, and `check`'s error at once.
pub(crate) async fn poll<F, Fut>(
    timeout: Duration,
    every: Duration,
    what: &'static str,
    mut check: F,
) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what,
                iterations: 1,
                in_doubt: false,
            });
        }
        tokio::time::sleep(every).await;
    }
}

/// Names that go into an info command must be non-empty and free of the
/// command's separators.
fn check_info_words(words: &[(&str, &str)]) -> Result<()> {
    for (what, text) in words {
        if text.is_empty() || text.contains([':', ';', '=', '\t', '\n', ' ']) {
            return Err(Error::InvalidArgument(format!(
                "{what} {text:?} must be non-empty, without : ; = or whitespace"
            )));
        }
    }
    Ok(())
}

/// One partition's progress.
#[derive(Clone, Debug)]
struct PartitionState {
    id: u16,
    /// The last record delivered: resume strictly after it.
    digest: Option<Digest>,
    bval: i64,
    done: bool,
    /// Reported unavailable in the current round.
    unavailable: bool,
}

/// Every partition of one scan or query.
#[derive(Debug)]
struct Tracker {
    parts: Vec<PartitionState>,
    /// Partition id → position in `parts` (`usize::MAX`: not covered).
    position: Vec<usize>,
    received: u64,
}

impl Tracker {
    fn new(filter: PartitionFilter) -> Tracker {
        let mut position = vec![usize::MAX; PARTITION_COUNT];
        let parts = (filter.begin..filter.begin + filter.count)
            .enumerate()
            .map(|(at, id)| {
                position[usize::from(id)] = at;
                PartitionState {
                    id,
                    digest: filter.after.filter(|_| at == 0),
                    bval: 0,
                    done: false,
                    unavailable: false,
                }
            })
            .collect();
        Tracker {
            parts,
            position,
            received: 0,
        }
    }

    fn part_mut(&mut self, id: u16) -> Option<&mut PartitionState> {
        let at = *self.position.get(usize::from(id))?;
        self.parts.get_mut(at)
    }

    fn complete(&self) -> bool {
        self.parts.iter().all(|part| part.done)
    }
}

/// How one node's stream ended.
enum NodeOutcome {
    /// LAST/0 after `records` records.
    Finished {
        records: u64,
    },
    Failed(Error),
    /// The caller dropped the stream.
    Cancelled,
}

/// Runs a query to the end, sending its records (or its one error) to `sender`.
async fn drive(
    client: Client,
    policy: ScanPolicy,
    statement: Statement,
    sender: mpsc::Sender<Result<KeyRecord>>,
) {
    if let Err(error) = rounds(&client, &policy, &statement, &sender).await {
        client
            .cluster
            .counters
            .command_failures
            .fetch_add(1, Ordering::Relaxed);
        let _ = sender.send(Err(error)).await;
    }
}

async fn rounds(
    client: &Client,
    policy: &ScanPolicy,
    statement: &Statement,
    sender: &mpsc::Sender<Result<KeyRecord>>,
) -> Result<()> {
    client
        .cluster
        .counters
        .commands
        .fetch_add(1, Ordering::Relaxed);
    let mut run = QueryRun {
        client,
        policy,
        statement,
        sender,
        total_deadline: policy.base.total_deadline(Instant::now()),
        tracker: Arc::new(Mutex::new(Tracker::new(statement.partitions))),
        namespace: Arc::from(statement.namespace.as_str()),
        attempt: 0,
    };
    loop {
        // A fresh id each round: a server may still be running the last
        // round's request (after a timeout) and refuse a second one under
        // its id.
        let task_id = client.next_random() >> 1 | 1;
        let (plan, mut last_error) = run.assign();
        let node_limit = run.node_limit(plan.len());
        let tasks = run.spawn(plan, task_id, node_limit);
        let Some(unavailable) = run.collect(tasks, node_limit, &mut last_error).await? else {
            // The caller dropped the stream.
            return Ok(());
        };
        if run.is_complete() {
            return Ok(());
        }
        if last_error.is_none() && !unavailable {
            // Only record limits stopped nodes: go on, this is no retry.
            continue;
        }
        let error = last_error.unwrap_or_else(|| Error::server(11, "partitions unavailable"));
        run.back_off(error).await?;
    }
}

/// The nodes of a round and the partitions each is asked for.
type Plan = Vec<(Arc<Node>, Vec<PartitionState>)>;

/// One node's stream of a round, once ended: the node, its partitions and
/// how it ended.
type NodeEnd = (Arc<Node>, Vec<PartitionState>, NodeOutcome);

/// A query on its way ([`rounds`]): the request, where its records go, and
/// the partitions still to finish.
struct QueryRun<'a> {
    client: &'a Client,
    policy: &'a ScanPolicy,
    statement: &'a Statement,
    sender: &'a mpsc::Sender<Result<KeyRecord>>,
    total_deadline: Option<Instant>,
    tracker: Arc<Mutex<Tracker>>,
    namespace: Arc<str>,
    /// Rounds run again so far (0 in the first).
    attempt: u32,
}

impl QueryRun<'_> {
    /// Assigns the unfinished partitions to their masters in the current
    /// map; also the error of a partition no node masters. The
    /// namespace's table is looked up once, and the few nodes found by a
    /// short linear search (no hashing per partition).
    fn assign(&self) -> (Plan, Option<Error>) {
        let mut last_error = None;
        let mut plan: Plan = Vec::new();
        let state = self.client.cluster.state();
        let table = state.map.namespaces.get(&self.statement.namespace);
        let mut tracker = self.tracker.lock();
        for part in tracker.parts.iter_mut().filter(|part| !part.done) {
            part.unavailable = false;
            let master = table.and_then(|table| table.node(0, usize::from(part.id)));
            let slot =
                master.and_then(|id| match plan.iter().position(|(node, _)| node.id == id) {
                    Some(slot) => Some(slot),
                    None => {
                        let node = state.by_id.get(&id)?;
                        plan.push((node.clone(), Vec::new()));
                        Some(plan.len() - 1)
                    }
                });
            match slot {
                Some(slot) => plan[slot].1.push(part.clone()),
                None => {
                    last_error = Some(Error::NoNode {
                        namespace: self.statement.namespace.clone(),
                        partition: part.id,
                    })
                }
            }
        }
        (plan, last_error)
    }

    /// Each node's share of the records still wanted under
    /// `max_records` (0: no limit).
    fn node_limit(&self, nodes: usize) -> u64 {
        match self.policy.max_records {
            0 => 0,
            max => {
                let remaining = max.saturating_sub(self.tracker.lock().received);
                remaining.div_ceil(nodes.max(1) as u64).max(1)
            }
        }
    }

    /// Starts each node's stream of the round.
    fn spawn(&self, plan: Plan, task_id: u64, node_limit: u64) -> tokio::task::JoinSet<NodeEnd> {
        let policy = self.policy;
        let mut tasks = tokio::task::JoinSet::new();
        for (node, parts) in plan {
            let mut frame = Vec::with_capacity(256 + parts.len() * 24);
            encode_query(
                &mut frame,
                policy,
                self.statement,
                task_id,
                &parts,
                node_limit,
            );
            let stream = NodeStream {
                node: node.clone(),
                base: policy.base.clone(),
                total_deadline: self.total_deadline,
                namespace: self.namespace.clone(),
                tracker: self.tracker.clone(),
                sender: self.sender.clone(),
                max_records: policy.max_records,
                raw_values: policy.raw_values,
            };
            tasks.spawn(async move {
                let outcome = stream.run(&frame).await;
                (node, parts, outcome)
            });
        }
        tasks
    }

    /// Takes the round's streams as they end: the partitions each
    /// finished, each node's health, a retryable failure into
    /// `last_error`. `Some(true)` when a partition answered unavailable;
    /// `None` when the caller dropped the stream; `Err` on a failure not
    /// worth another round.
    async fn collect(
        &self,
        mut tasks: tokio::task::JoinSet<NodeEnd>,
        node_limit: u64,
        last_error: &mut Option<Error>,
    ) -> Result<Option<bool>> {
        let mut unavailable = false;
        while let Some(joined) = tasks.join_next().await {
            let (node, parts, outcome) = joined.map_err(|error| Error::Protocol {
                address: String::new(),
                message: format!("scan task failed: {error}"),
            })?;
            match outcome {
                NodeOutcome::Finished { records } => {
                    node.record_success();
                    // A node stopped by its record limit may have more.
                    let limited = node_limit > 0 && records >= node_limit;
                    unavailable |= self.finish_parts(&parts, limited);
                }
                NodeOutcome::Failed(error) => {
                    if error.counts_against_node() {
                        node.record_failure();
                    }
                    if !error.is_retryable() {
                        return Err(error);
                    }
                    *last_error = Some(error);
                }
                NodeOutcome::Cancelled => return Ok(None),
            }
        }
        Ok(Some(unavailable))
    }

    /// Marks a node's partitions done (unless its record limit stopped
    /// it); true when one of them answered unavailable.
    fn finish_parts(&self, parts: &[PartitionState], limited: bool) -> bool {
        let mut unavailable = false;
        let mut tracker = self.tracker.lock();
        for part in parts {
            if let Some(state) = tracker.part_mut(part.id) {
                if state.unavailable {
                    unavailable = true;
                } else if !limited {
                    state.done = true;
                }
            }
        }
        unavailable
    }

    /// Whether every partition is done, or `max_records` were received.
    fn is_complete(&self) -> bool {
        let tracker = self.tracker.lock();
        tracker.complete()
            || (self.policy.max_records > 0 && tracker.received >= self.policy.max_records)
    }

    /// Before another round: `Err(error)` when the retries or the time are
    /// used up; else the backoff and a fresh map.
    async fn back_off(&mut self, error: Error) -> Result<()> {
        let base = &self.policy.base;
        self.attempt += 1;
        let attempt = self.attempt;
        let backoff = base.backoff_for(attempt, self.client.next_random());
        let out_of_time = self
            .total_deadline
            .is_some_and(|deadline| Instant::now() + backoff >= deadline);
        if attempt > base.max_retries || out_of_time {
            return Err(error);
        }
        self.client
            .cluster
            .counters
            .retries
            .fetch_add(1, Ordering::Relaxed);
        tracing::debug!(attempt, %error, "retrying unfinished partitions");
        if !backoff.is_zero() {
            tokio::time::sleep(backoff).await;
        }
        // A fresh map before reassigning (the tend loop may not have run yet).
        let _ = self.client.tend_now().await;
        Ok(())
    }
}

/// Namespace, set, pacing, socket timeout, task id and index fields.
pub(crate) fn write_common_fields(
    writer: &mut MessageWriter<'_>,
    statement: &Statement,
    base: &Policy,
    records_per_second: u32,
    task_id: u64,
) {
    writer.field(field_type::NAMESPACE, statement.namespace.as_bytes());
    if !statement.set.is_empty() {
        writer.field(field_type::SET, statement.set.as_bytes());
    }
    if records_per_second > 0 {
        writer.field(
            field_type::RECORDS_PER_SECOND,
            &records_per_second.to_be_bytes(),
        );
    }
    let socket_ms = u32::try_from(base.socket_timeout.as_millis()).unwrap_or(u32::MAX);
    writer.field(field_type::SOCKET_TIMEOUT, &socket_ms.to_be_bytes());
    writer.field(field_type::TASK_ID, &task_id.to_be_bytes());
    if let Some(filter) = &statement.filter {
        if let Some(name) = &statement.index_name {
            writer.field(field_type::INDEX_NAME, name.as_bytes());
        }
        if filter.collection != IndexCollection::Default {
            writer.field(field_type::INDEX_TYPE, &[filter.collection.wire()]);
        }
        writer.field(field_type::INDEX_RANGE, &filter.encode());
        if let Some(context) = &filter.context {
            writer.field(field_type::INDEX_CONTEXT, context);
        }
    }
}

/// Encodes one node's request: its partitions from the start (PID_ARRAY)
/// or after their last record (DIGEST_ARRAY, and BVAL_ARRAY for a query).
fn encode_query(
    out: &mut Vec<u8>,
    policy: &ScanPolicy,
    statement: &Statement,
    task_id: u64,
    parts: &[PartitionState],
    max_records: u64,
) {
    debug_assert!(!parts.is_empty(), "a node is sent at least one partition");
    let mut bits1 = info1::READ;
    if !policy.include_bin_data || statement.bins == Bins::Header {
        bits1 |= info1::GET_NO_BINS;
    }
    // The server's deadline for the whole scan is the total timeout (0:
    // none); the socket timeout goes in its own field.
    let total_ms = u32::try_from(policy.base.total_timeout.as_millis()).unwrap_or(u32::MAX);
    let header = MsgHeader {
        info1: bits1,
        info3: info3::PARTITION_DONE,
        transaction_ttl: total_ms,
        ..MsgHeader::default()
    };
    let mut writer = MessageWriter::begin(out, &header);
    write_common_fields(
        &mut writer,
        statement,
        &policy.base,
        policy.records_per_second,
        task_id,
    );
    if let Some(filter) = &policy.base.filter {
        writer.field(field_type::FILTER_EXPRESSION, filter);
    }
    let fresh: Vec<u8> = parts
        .iter()
        .filter(|part| part.digest.is_none())
        .flat_map(|part| part.id.to_le_bytes())
        .collect();
    if !fresh.is_empty() {
        writer.field(field_type::PID_ARRAY, &fresh);
    }
    let resumed: Vec<&PartitionState> = parts.iter().filter(|part| part.digest.is_some()).collect();
    if !resumed.is_empty() {
        let digests: Vec<u8> = resumed
            .iter()
            .filter_map(|part| part.digest)
            .flat_map(|digest| digest.0)
            .collect();
        writer.field(field_type::DIGEST_ARRAY, &digests);
        if statement.filter.is_some() {
            let bvals: Vec<u8> = resumed
                .iter()
                .flat_map(|part| part.bval.to_le_bytes())
                .collect();
            writer.field(field_type::BVAL_ARRAY, &bvals);
        }
    }
    if max_records > 0 {
        writer.field(field_type::MAX_RECORDS, &max_records.to_be_bytes());
    }
    if policy.include_bin_data {
        if let Bins::Names(names) = &statement.bins {
            for name in names {
                writer.op(op_type::READ, 0, name.as_bytes(), &[]);
            }
        }
    }
    // A query's records come with RESPOND_ALL_OPS unset: bins as stored.
    debug_assert_eq!(header.info2 & info2::RESPOND_ALL_OPS, 0);
    writer.finish();
}

/// One node's part of a round.
struct NodeStream {
    node: Arc<Node>,
    base: Policy,
    total_deadline: Option<Instant>,
    namespace: Arc<str>,
    tracker: Arc<Mutex<Tracker>>,
    sender: mpsc::Sender<Result<KeyRecord>>,
    max_records: u64,
    raw_values: bool,
}

impl NodeStream {
    async fn run(&self, frame: &[u8]) -> NodeOutcome {
        let node = &self.node;
        let mut pooled = match node
            .pool
            .get(self.base.socket_deadline(self.total_deadline))
            .await
        {
            Ok(pooled) => pooled,
            Err(error) => return NodeOutcome::Failed(error),
        };
        let Some(connection) = pooled.connection() else {
            return NodeOutcome::Failed(Error::Closed);
        };
        let mut records = 0u64;
        let outcome = async {
            connection
                .send(frame, self.base.socket_deadline(self.total_deadline))
                .await?;
            loop {
                let deadline = self.base.socket_deadline(self.total_deadline);
                let (message_type, body) = connection.receive(deadline).await?;
                if message_type != MessageType::Message {
                    return Err(self.protocol(format!(
                        "expected AS_MSG frames in a scan answer, got {message_type:?}"
                    )));
                }
                let mut rest = body;
                while !rest.is_empty() {
                    let (message, used) = Message::decode_prefix(rest)
                        .map_err(|error| self.protocol(format!("bad scan answer: {error}")))?;
                    rest = &rest[used..];
                    match self.absorb(&message)? {
                        Step::Record(record) => {
                            records += 1;
                            if let Some(record) = record {
                                if self.sender.send(Ok(record)).await.is_err() {
                                    return Ok(None);
                                }
                            }
                        }
                        Step::Continue => {}
                        Step::Last => {
                            if !rest.is_empty() {
                                return Err(
                                    self.protocol("bytes after a scan's LAST message".into())
                                );
                            }
                            return Ok(Some(true));
                        }
                        Step::Absent => return Ok(Some(false)),
                    }
                }
            }
        }
        .await;
        match outcome {
            Ok(Some(true)) => {
                pooled.release();
                NodeOutcome::Finished { records }
            }
            // Ended by a message after which the server may still send.
            Ok(Some(false)) => NodeOutcome::Finished { records },
            Ok(None) => {
                pooled.discard();
                NodeOutcome::Cancelled
            }
            Err(error) => {
                // The stream is not at a message boundary any more.
                pooled.discard();
                if matches!(error, Error::Network { .. }) {
                    node.pool.clear_idle();
                }
                NodeOutcome::Failed(error)
            }
        }
    }

    fn protocol(&self, message: String) -> Error {
        Error::Protocol {
            address: self.node.address.to_string(),
            message,
        }
    }

    /// Takes one message of the stream into the tracker.
    fn absorb(&self, message: &Message<'_>) -> Result<Step> {
        let header = message.header;
        if header.result_code == 2 && header.info3 & info3::PARTITION_DONE == 0 {
            // No such set: the reference ends such a stream this way, with
            // or without LAST; either way nothing more is to be read.
            return Ok(if header.info3 & info3::LAST != 0 {
                Step::Last
            } else {
                Step::Absent
            });
        }
        if header.info3 & info3::LAST != 0 {
            return match header.result_code {
                0 => Ok(Step::Last),
                code => Err(Error::server(code, self.node.name())),
            };
        }
        if header.info3 & info3::PARTITION_DONE != 0 {
            if header.result_code != 0 {
                let id = u16::try_from(header.generation).unwrap_or(u16::MAX);
                if let Some(part) = self.tracker.lock().part_mut(id) {
                    part.unavailable = true;
                }
            }
            return Ok(Step::Continue);
        }
        if header.result_code != 0 {
            return Err(Error::server(header.result_code, self.node.name()));
        }
        let mut digest = None;
        let mut set = String::new();
        let mut user_key = None;
        let mut bval = 0;
        for field in message.fields() {
            match field.field_type {
                field_type::DIGEST => {
                    let bytes: [u8; 20] = field
                        .data
                        .try_into()
                        .map_err(|_| self.protocol("a digest field is not 20 bytes".into()))?;
                    digest = Some(Digest(bytes));
                }
                field_type::SET => set = String::from_utf8_lossy(field.data).into_owned(),
                field_type::KEY => user_key = UserKey::from_field(field.data),
                field_type::BVAL_ARRAY => {
                    let bytes: [u8; 8] = field
                        .data
                        .try_into()
                        .map_err(|_| self.protocol("a bval field is not 8 bytes".into()))?;
                    bval = i64::from_le_bytes(bytes);
                }
                _ => {}
            }
        }
        let Some(digest) = digest else {
            return Err(self.protocol("a scan record without a digest".into()));
        };
        let record = Record::from_message_as(message, self.raw_values)
            .map_err(|text| self.protocol(text))?;
        {
            let mut tracker = self.tracker.lock();
            if self.max_records > 0 && tracker.received >= self.max_records {
                // Past the caller's limit (several nodes ran at once): drop it.
                return Ok(Step::Record(None));
            }
            let Some(part) = tracker.part_mut(digest.partition().get()) else {
                return Err(self.protocol(format!(
                    "a record of partition {}, which this scan did not ask for",
                    digest.partition().get()
                )));
            };
            part.digest = Some(digest);
            part.bval = bval;
            tracker.received += 1;
        }
        Ok(Step::Record(Some(KeyRecord {
            key: Key {
                namespace: self.namespace.to_string(),
                set,
                user_key,
                digest,
            },
            record,
        })))
    }
}

/// What one stream message means.
enum Step {
    /// A record (`None`: beyond the caller's limit, not delivered).
    Record(Option<KeyRecord>),
    Continue,
    Last,
    /// Result 2 without LAST (no such set): the stream is over, but the
    /// connection is not known to be at a message boundary.
    Absent,
}

impl BackgroundTask<'_> {
    /// Checks the task: write operations only, bin names that fit; the
    /// call's fields for a UDF.
    fn checked(self) -> Result<Option<UdfFields>> {
        match self {
            BackgroundTask::Operations(ops) => {
                if ops.is_empty() || ops.iter().any(|op| !op.is_write()) {
                    return Err(Error::InvalidArgument(
                        "a background job needs write operations only".into(),
                    ));
                }
                if let Some(name) = ops
                    .iter()
                    .filter_map(Operation::bin_name)
                    .find(|name| name.len() > citrine_types::BIN_NAME_MAX)
                {
                    return Err(Error::InvalidArgument(format!(
                        "bin name {name:?} is longer than 15 bytes"
                    )));
                }
                Ok(None)
            }
            BackgroundTask::Udf {
                module,
                function,
                args,
            } => UdfFields::new(module, function, args).map(Some),
        }
    }
}

/// The request of background job `task_id`: the statement's fields, the
/// filter, and the task (its write ops, or the UDF call `udf`).
fn encode_background(
    write: &WritePolicy,
    statement: &Statement,
    task_id: u64,
    (task, udf): (BackgroundTask<'_>, Option<&UdfFields>),
) -> Vec<u8> {
    let (bits2, bits3, generation) = write.header_bits();
    let header = MsgHeader {
        info2: bits2,
        info3: bits3,
        generation,
        record_ttl: write.expiration.wire(),
        transaction_ttl: write.base.server_timeout_ms(),
        ..MsgHeader::default()
    };
    let mut frame = Vec::new();
    let mut writer = MessageWriter::begin(&mut frame, &header);
    write_common_fields(
        &mut writer,
        statement,
        &write.base,
        statement.records_per_second,
        task_id,
    );
    if let Some(filter) = &write.base.filter {
        writer.field(field_type::FILTER_EXPRESSION, filter);
    }
    match (udf, task) {
        (Some(call), _) => {
            writer.field(field_type::UDF_OP, &[UDF_OP_BACKGROUND]);
            call.write_fields(&mut writer);
        }
        (None, BackgroundTask::Operations(ops)) => {
            for op in ops {
                op.encode(&mut writer);
            }
        }
        (None, BackgroundTask::Udf { .. }) => {}
    }
    writer.finish();
    frame
}

/// Sends a background job's request to one node and reads its one answer.
async fn submit_job(node: &Node, frame: &[u8], deadline: Option<Instant>) -> Result<()> {
    let mut pooled = node.pool.get(deadline).await?;
    let Some(connection) = pooled.connection() else {
        return Err(Error::Closed);
    };
    let answer = match connection.exchange(frame, deadline).await {
        Ok((MessageType::Message, body)) => Message::decode_prefix(body)
            .map(|(message, _)| message.header)
            .map_err(|error| error.to_string()),
        Ok((other, _)) => Err(format!("expected an AS_MSG answer, got {other:?}")),
        Err(error) => {
            pooled.discard();
            return Err(error);
        }
    };
    match answer {
        Ok(header) if header.result_code == 0 => {
            pooled.release();
            Ok(())
        }
        Ok(header) => {
            pooled.release();
            Err(Error::server(header.result_code, node.name()))
        }
        Err(message) => {
            pooled.discard();
            Err(Error::Protocol {
                address: node.address.to_string(),
                message,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(frame: &[u8]) -> Message<'_> {
        Message::decode(&frame[8..]).expect("decodes")
    }

    #[test]
    fn fresh_partitions_go_in_the_pid_array() {
        let statement = Statement::new("test", "s").bins(Bins::Names(vec!["a".into()]));
        let tracker = Tracker::new(PartitionFilter::range(10, 3).expect("range"));
        let mut frame = Vec::new();
        encode_query(
            &mut frame,
            &ScanPolicy::default(),
            &statement,
            77,
            &tracker.parts,
            0,
        );
        let message = decode(&frame);
        assert_eq!(message.header.info1, info1::READ);
        assert_eq!(message.header.info3, info3::PARTITION_DONE);
        assert_eq!(
            message.field(field_type::PID_ARRAY),
            Some(&[10, 0, 11, 0, 12, 0][..])
        );
        assert_eq!(message.field(field_type::DIGEST_ARRAY), None);
        assert_eq!(
            message.field(field_type::TASK_ID),
            Some(&77u64.to_be_bytes()[..])
        );
        assert_eq!(
            message.field(field_type::SOCKET_TIMEOUT),
            Some(&30_000u32.to_be_bytes()[..])
        );
        assert_eq!(message.field(field_type::MAX_RECORDS), None);
        assert_eq!(message.ops().count(), 1);
    }

    #[test]
    fn resumed_partitions_carry_digest_and_bval() {
        let statement = Statement::new("test", "")
            .filter(IndexFilter::range("n", 5, 9).on(IndexCollection::List));
        let mut tracker = Tracker::new(PartitionFilter::range(0, 2).expect("range"));
        let digest = Key::new("test", "", 1i64).digest;
        tracker.parts[1].digest = Some(digest);
        tracker.parts[1].bval = -3;
        let mut frame = Vec::new();
        encode_query(
            &mut frame,
            &ScanPolicy::default(),
            &statement,
            1,
            &tracker.parts,
            40,
        );
        let message = decode(&frame);
        assert_eq!(message.field(field_type::PID_ARRAY), Some(&[0, 0][..]));
        assert_eq!(message.field(field_type::DIGEST_ARRAY), Some(&digest.0[..]));
        assert_eq!(
            message.field(field_type::BVAL_ARRAY),
            Some(&(-3i64).to_le_bytes()[..])
        );
        assert_eq!(message.field(field_type::INDEX_TYPE), Some(&[1][..]));
        assert_eq!(
            message.field(field_type::MAX_RECORDS),
            Some(&40u64.to_be_bytes()[..])
        );
        let range = message.field(field_type::INDEX_RANGE).expect("range");
        let mut expected = vec![1, 1, b'n', 1, 0, 0, 0, 8];
        expected.extend_from_slice(&5i64.to_be_bytes());
        expected.extend_from_slice(&[0, 0, 0, 8]);
        expected.extend_from_slice(&9i64.to_be_bytes());
        assert_eq!(range, &expected[..]);
    }

    #[test]
    fn a_partition_resumes_after_its_digest() {
        let digest = Key::new("test", "", 1i64).digest;
        let partition = digest.partition().get();
        let filter = PartitionFilter::partition_after(partition, Some(digest)).expect("filter");
        let tracker = Tracker::new(filter);
        assert_eq!(tracker.parts.len(), 1);
        assert_eq!(tracker.parts[0].id, partition);
        assert_eq!(tracker.parts[0].digest, Some(digest));
        let other = (partition + 1) % 4096;
        assert!(PartitionFilter::partition_after(other, Some(digest)).is_err());
        let fresh = Tracker::new(PartitionFilter::partition_after(other, None).expect("filter"));
        assert_eq!(fresh.parts[0].digest, None);
    }

    #[test]
    fn filters_and_partition_ranges_are_checked() {
        assert!(PartitionFilter::range(4095, 1).is_ok());
        assert!(PartitionFilter::range(4095, 2).is_err());
        assert!(PartitionFilter::range(0, 0).is_err());
        assert!(IndexFilter::range("n", 2, 1).validate().is_err());
        assert!(IndexFilter::equal("s", "x").validate().is_ok());
        let mixed = IndexFilter {
            end: FilterValue::String("y".into()),
            ..IndexFilter::equal("s", "x")
        };
        assert!(mixed.validate().is_err());
        assert!(IndexFilter::equal("a_very_long_bin_name", 1i64)
            .validate()
            .is_err());
        let key = Key::new("test", "", 9i64);
        let one = Tracker::new(PartitionFilter::of_key(&key));
        assert_eq!(one.parts.len(), 1);
        assert_eq!(one.parts[0].id, key.partition().get());
    }
}
