//! User-defined functions on the service: the Lua modules the cluster
//! shares, and record UDFs on the transaction path.
//!
//! Owns:
//! - `Udfs`: this node's modules ([`citrine_udf::Registry`], which the
//!   Lua states load from) and their versioned entries — a module's source
//!   or the tombstone of a removed one — kept in `udf.smd` in the work
//!   directory and pushed to every other member (the service's `smd`: the
//!   later version wins everywhere, tombstones are kept);
//! - `Modules`: the handle module management takes (the store, the
//!   layers, the index builds' queue), not the `Service`: loading at start,
//!   merging a peer's push, pushing, and the info commands `udf-put`,
//!   `udf-get`, `udf-list`, `udf-remove`;
//! - `UdfCall`: the UDF fields of a request (30 module, 31 function, 32
//!   arguments), checked before the request runs;
//! - `apply`: a record UDF, stored like any write: the record's bins and
//!   metadata go to the function (run on a copy, without the partition
//!   lock), what it did comes back as a new set of bins (stored under the
//!   write lock through [`transaction::install`], so secondary indexes,
//!   replication and storage see an ordinary write, if the record did not
//!   change meanwhile; otherwise the function runs again), a removal, or
//!   nothing. The reply carries the function's return value in a bin
//!   `SUCCESS`, or result 100 and the error's text in a bin `FAILURE`;
//! - aggregations ([`AggregateRun`]), streamed like scans; they take
//!   `Aggregations` (the layers, the indexes, the modules, the jobs), not
//!   the `Service`: a part that runs here goes through the dispatcher
//!   (`LocalParts`, [`Service::serve_aggregate_part`]), which holds the
//!   shared service a thread of its own needs.
//!
//! A record UDF (fields 30-32) takes the single-record path up to the
//! point where it runs ([`crate::transaction`]). The record is copied
//! under the partition's read lock and the lock released; this thread's
//! Lua state (`citrine_udf::runtime`, rebuilt when the module registry's
//! generation moved) calls the function with no lock held; what it
//! committed through `aerospike:create` / `update` / `remove` is stored
//! under the write lock only if the record is still the one it read
//! (generation, last-update and void time), else the function runs again
//! on the new record (14, key busy, after [`APPLY_ATTEMPTS`] tries). In a
//! cluster the master runs the UDF and replicates the record's resulting
//! state, never the call. Batch UDF rows and each record of a background
//! UDF job take the same path.
//!
//! An aggregation (field 33 = 1) walks the query's records with the scan
//! cursor, a chunk a step, through a `citrine_udf::Aggregation` that owns
//! its own Lua state (so it may be stepped on any thread), one stream per
//! partition as the reference runs them (the client reduces the
//! partitions' results). One for all partitions that reaches a master
//! still filling some of them first runs their part on the acting master
//! holding each whole: an `AGGREGATE_PART` fabric call listing those
//! partitions, served there on a thread of its own (`offload`: not on the
//! fabric's serving thread), its values relayed into the stream. A part
//! whose whole answer shows it could not cover its partitions
//! (unreachable, or its LAST carries 11 after a handover) is run again,
//! routed afresh — here once this node serves them whole — for up to 5 s.
//! An aggregation that still cannot cover a partition it must (one it
//! masters that no acting master holds, one it was asked for by list and
//! does not serve, or a part still refused) fails with 11 rather than
//! leave the partition's records out.
//!
//! Invariants: the entries lock is held across a change's registry update
//! and its file write, so the file never lags a change answered `ok`; a UDF
//! that fails changes nothing; a UDF runs for at most three quarters of the
//! request's server-side timeout, or [`DEFAULT_TIME_LIMIT`] without one, and
//! never more than [`MAX_TIME_LIMIT`]; no partition lock is held while Lua
//! runs; a change is stored only over the record the function read.

use crate::filter::{self, RecordView};
use crate::namespace::Namespace;
use crate::replication::call_kind;
use crate::smd::{PushClock, Version};
use crate::transaction::{self, is_live, Now, Request, TTL_DONT_UPDATE, TTL_NEVER_EXPIRE};
use crate::Service;
use base64::Engine as _;
use citrine_cdt::value::{self, Value};
use citrine_data::tally::{Lang, Outcome};
use citrine_index::RecordMeta;
use citrine_record::{encode_body_reserving, valid_bin_name, validate_value, Bin, BodyView};
use citrine_storage::MEMORY_BODY_SPARE;
use citrine_types::{NodeId, ParticleType, PartitionId, ResultCode};
use citrine_udf::{Change, Registry, UdfError};
use citrine_wire::info::InfoCommand;
use citrine_wire::msg::{field_type, info2, info3, op_type, Message, MessageWriter, MsgHeader};
use parking_lot::Mutex;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The modules file in the work directory.
pub const MODULES_FILE: &str = "udf.smd";

/// How long a record UDF may run when the request sets no timeout.
pub const DEFAULT_TIME_LIMIT: Duration = Duration::from_secs(1);

/// The longest a record UDF may run, whatever the request asks.
pub const MAX_TIME_LIMIT: Duration = Duration::from_secs(10);

/// The longest module file name.
const FILENAME_MAX: usize = 127;

/// The most bytes of source all modules together may hold: every push
/// carries them all, in base64, in one fabric message (at most 16 MiB).
pub const MODULES_BYTES_MAX: usize = 8 << 20;

/// One module's entry: its source, or the tombstone of its removal.
#[derive(Clone, Debug)]
struct Entry {
    version: Version,
    /// `None`: removed.
    source: Option<Vec<u8>>,
}

type Entries = BTreeMap<String, Entry>;

/// This node's modules.
#[derive(Default)]
pub(crate) struct Udfs {
    /// What the Lua states load.
    pub registry: Registry,
    entries: Mutex<Entries>,
    /// The modules file, once the server names its directory.
    file: OnceLock<PathBuf>,
    push: PushClock,
    /// Aggregations running on this node.
    aggregations: Arc<std::sync::atomic::AtomicUsize>,
}

fn line(filename: &str, entry: &Entry) -> String {
    let version = entry.version.param();
    match &entry.source {
        Some(source) => format!(
            "{version};filename={filename};content={}",
            base64::engine::general_purpose::STANDARD.encode(source)
        ),
        None => format!("{version};deleted=true;filename={filename}"),
    }
}

fn parse_line(text: &str) -> Result<(String, Entry), String> {
    let param = citrine_sindex::def::params(text);
    let version = Version::parse(param("version"))?;
    let filename = param("filename")
        .filter(|name| valid_filename(name))
        .ok_or("no valid filename")?;
    let source = if param("deleted") == Some("true") {
        None
    } else {
        let content = param("content").ok_or("no content")?;
        let source = base64::engine::general_purpose::STANDARD
            .decode(content)
            .map_err(|error| format!("bad content: {error}"))?;
        Some(source)
    };
    Ok((filename.to_owned(), Entry { version, source }))
}

fn text(entries: &Entries) -> String {
    let mut text = String::new();
    for (filename, entry) in entries {
        text.push_str(&line(filename, entry));
        text.push('\n');
    }
    text
}

/// A module file name as the reference takes one: at most 127 bytes of
/// letters, digits, `.`, `_`, `-` and `$`, not starting with `.` (so never
/// a path). Only a `.lua` module can be called (its name without the
/// extension); the reference registers and lists others too.
fn valid_filename(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= FILENAME_MAX
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-' | b'.' | b'$'))
}

/// What `udf-put` also asks of a name: an extension after its first `.`.
fn has_extension(name: &str) -> bool {
    name.find('.').is_some_and(|dot| dot + 1 < name.len())
}

/// Compiles an entry's source (a tombstone passes): what a file or a peer
/// holds is checked as `udf-put` checks it.
fn compiles(filename: &str, entry: &Entry) -> Result<(), String> {
    match &entry.source {
        Some(source) => citrine_udf::check(filename, source).map_err(|error| error.message),
        None => Ok(()),
    }
}

/// Puts an entry into the registry and the entries (the caller holds them).
fn adopt(registry: &Registry, entries: &mut Entries, filename: String, entry: Entry) {
    match &entry.source {
        Some(source) => {
            registry.put(citrine_udf::Module::new(&filename, source.clone()));
        }
        None => {
            registry.remove(&filename);
        }
    }
    entries.insert(filename, entry);
}

impl Udfs {
    fn save(&self, entries: &Entries) -> Result<(), String> {
        match self.file.get() {
            Some(path) => crate::smd::save_atomically(path, &text(entries)),
            None => Ok(()),
        }
    }
}

impl Service {
    /// This node's UDF modules.
    pub fn udf_registry(&self) -> &Registry {
        &self.udfs.registry
    }

    /// The module-management feature's handle.
    pub(crate) fn udf_modules(&self) -> Modules<'_> {
        Modules {
            udfs: &self.udfs,
            layers: self.layers(),
            builds: &self.sindex_builds,
        }
    }

    /// Keeps UDF modules in `directory` from now on; see
    /// [`Modules::keep_in`].
    pub fn keep_udf_modules(&self, directory: &Path) -> Result<(), String> {
        self.udf_modules().keep_in(directory)
    }

    /// The aggregation feature's handle.
    pub(crate) fn aggregations(&self) -> Aggregations<'_> {
        Aggregations {
            layers: self.layers(),
            indexes: self.indexes(),
            udfs: &self.udfs,
            monitors: &self.jobs.monitors,
            parts: self,
        }
    }

    /// Serves a part of another master's aggregation (`AGGREGATE_PART`):
    /// runs it as a listed aggregation — on a thread of its own, off the
    /// fabric's runtime, when the service is shared — and answers its
    /// whole stream.
    pub(crate) async fn serve_aggregate_part(&self, payload: &[u8]) -> Vec<u8> {
        if self.is_orphan() {
            return vec![ResultCode::Unavailable.code()];
        }
        match self.shared() {
            Some(service) => {
                let body = payload.to_vec();
                crate::offload::run("citrine-agg-part", move || {
                    aggregate_part(&service.aggregations(), &body)
                })
                .await
                .unwrap_or_else(|| vec![ResultCode::ServerError.code()])
            }
            None => aggregate_part(&self.aggregations(), payload),
        }
    }
}

/// A part of an aggregation run here, off the calling thread; the
/// dispatcher runs it ([`Service::serve_aggregate_part`]): a thread of
/// its own needs the shared service, which the feature does not hold.
pub(crate) trait LocalParts: Sync {
    /// The answer of the `AGGREGATE_PART` call `body`, run on this node.
    fn run_part<'a>(
        &'a self,
        body: &'a [u8],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Vec<u8>> + Send + 'a>>;
}

impl LocalParts for Service {
    fn run_part<'a>(
        &'a self,
        body: &'a [u8],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Vec<u8>> + Send + 'a>> {
        Box::pin(self.serve_aggregate_part(body))
    }
}

/// What the aggregation feature works with, and all it works with: the two
/// layers, the indexes its queries read, the UDF modules and the node's
/// aggregation places, the jobs `query-show` lists, and the dispatcher's
/// runner for the parts that run here. Dispatch hands it out
/// ([`Service::aggregations`]).
#[derive(Clone, Copy)]
pub(crate) struct Aggregations<'s> {
    layers: crate::Layers<'s>,
    indexes: crate::sindex::Indexes<'s>,
    udfs: &'s Udfs,
    monitors: &'s crate::job::monitor::Monitors,
    parts: &'s dyn LocalParts,
}

impl<'s> Aggregations<'s> {
    /// The node's scan counters, which count aggregations too.
    fn scans(&self) -> &'s crate::scan::ScanStats {
        &self.layers.stats.scan
    }

    /// Counts one aggregation ended (among the scans).
    fn completed(&self) {
        self.scans().completed.fetch_add(1, Ordering::Relaxed);
    }

    /// This node's id.
    fn node_id(&self) -> NodeId {
        self.layers.node_id()
    }
}

/// The module-management feature's handle: this node's modules, and what
/// a change needs from the layers (the clock and the node id that version
/// it, the distribution layer that pushes it to the other members) and the
/// index builds' queue (woken to push a change soon).
pub(crate) struct Modules<'s> {
    udfs: &'s Udfs,
    layers: crate::Layers<'s>,
    builds: &'s crate::sindex::Builds,
}

impl Modules<'_> {
    /// Keeps UDF modules in `directory` from now on, and loads the ones
    /// the file there holds. A line that no longer makes a module is logged
    /// and dropped from the file.
    pub(crate) fn keep_in(&self, directory: &Path) -> Result<(), String> {
        let path = directory.join(MODULES_FILE);
        let text = crate::smd::read(&path)?;
        if self.udfs.file.set(path.clone()).is_err() {
            return Err("the UDF modules directory is already set".to_owned());
        }
        let mut entries = self.udfs.entries.lock();
        for item in text.lines().map(str::trim).filter(|line| !line.is_empty()) {
            let parsed = parse_line(item).and_then(|(filename, entry)| {
                compiles(&filename, &entry).map(|()| (filename, entry))
            });
            match parsed {
                Ok((filename, entry)) => adopt(&self.udfs.registry, &mut entries, filename, entry),
                Err(message) => {
                    tracing::error!(file = %path.display(), "UDF module not restored: {message}")
                }
            }
        }
        self.udfs.save(&entries)
    }

    /// Merges a peer's modules (the text its push carries): each entry
    /// newer than this node's is taken.
    pub(crate) fn merge(&self, incoming: &str) {
        let mut entries = self.udfs.entries.lock();
        let mut changed = false;
        for item in incoming.lines().filter(|line| !line.trim().is_empty()) {
            let (filename, entry) = match parse_line(item) {
                Ok(parsed) => parsed,
                Err(message) => {
                    tracing::warn!("a peer's UDF module is not understood: {message}");
                    continue;
                }
            };
            if entries
                .get(&filename)
                .is_some_and(|known| known.version >= entry.version)
            {
                continue;
            }
            // Compiled only once it is known to be newer.
            if let Err(message) = compiles(&filename, &entry) {
                tracing::warn!(module = %filename, "a peer's UDF module does not compile here: {message}");
                continue;
            }
            tracing::info!(module = %filename, removed = entry.source.is_none(), "UDF module merged from a peer");
            adopt(&self.udfs.registry, &mut entries, filename, entry);
            changed = true;
        }
        if changed {
            self.udfs.push.mark();
            if let Err(message) = self.udfs.save(&entries) {
                tracing::error!("merged UDF modules not saved: {message}");
            }
        }
    }

    /// Every module and tombstone, one line each (what a push carries).
    pub(crate) fn text(&self) -> String {
        text(&self.udfs.entries.lock())
    }

    /// Sends every module to every other member when a push is due (the
    /// `citrine-sindex` thread calls it beside the index definitions').
    pub(crate) fn push(&self) {
        crate::smd::push_to_peers(
            self.layers.dist,
            &self.udfs.push,
            call_kind::UDF_MODULES,
            "UDF modules",
            || self.text(),
        );
    }

    /// Records a change made here and answers the command. The change is
    /// saved first: a change the file could not keep is refused and takes
    /// no effect (it would be lost at the next restart).
    fn commit(&self, filename: &str, source: Option<Vec<u8>>) -> String {
        let mut entries = self.udfs.entries.lock();
        let known = entries.get(filename).map(|entry| entry.version);
        let now_ms = self.layers.now().unix_ms;
        let version = crate::smd::next_version(known, now_ms, self.layers.node_id());
        let entry = Entry { version, source };
        let mut next = entries.clone();
        next.insert(filename.to_owned(), entry.clone());
        if let Err(message) = self.udfs.save(&next) {
            tracing::error!("UDF module change not saved, so not made: {message}");
            return format!("error=write_failed;message={}", encode(&message));
        }
        adopt(
            &self.udfs.registry,
            &mut entries,
            filename.to_owned(),
            entry,
        );
        drop(entries);
        self.udfs.push.mark();
        self.builds.queue.wake();
        "ok".to_owned()
    }
}

fn encode(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// `udf-put:filename=F;content=B64;content-len=N;udf-type=LUA;`
pub(crate) fn put(modules: &Modules<'_>, command: &InfoCommand<'_>) -> String {
    let Some(filename) = command
        .param("filename")
        .filter(|name| valid_filename(name) && has_extension(name))
    else {
        return "error=invalid_filename".to_owned();
    };
    if command
        .param("udf-type")
        .is_some_and(|kind| !kind.eq_ignore_ascii_case("LUA"))
    {
        return "error=invalid_udf_type".to_owned();
    }
    let Some(content) = command.param("content") else {
        return "error=empty_content".to_owned();
    };
    if let Some(length) = command.param("content-len") {
        if length.parse::<usize>().ok() != Some(content.len()) {
            return "error=invalid_content_len".to_owned();
        }
    }
    let Ok(source) = base64::engine::general_purpose::STANDARD.decode(content) else {
        return "error=invalid_base64_content".to_owned();
    };
    let others: usize = modules
        .udfs
        .registry
        .list()
        .iter()
        .filter(|module| module.filename != filename)
        .map(|module| module.source.len())
        .sum();
    if others + source.len() > MODULES_BYTES_MAX {
        return format!(
            "error=too_large;message={}",
            encode(&format!(
                "the modules may hold at most {MODULES_BYTES_MAX} bytes together"
            ))
        );
    }
    if let Err(error) = citrine_udf::check(filename, &source) {
        let line = error
            .line
            .map(|line| format!(";line={line}"))
            .unwrap_or_default();
        return format!(
            "error=compile_error;file={filename}{line};message={}",
            encode(&error.message)
        );
    }
    modules.commit(filename, Some(source))
}

/// `udf-get:filename=F;` → `gen=<base64 SHA-1>;type=LUA;content=<base64>;`
pub(crate) fn get(modules: &Modules<'_>, command: &InfoCommand<'_>) -> String {
    match command
        .param("filename")
        .and_then(|name| modules.udfs.registry.get(name))
    {
        Some(module) => {
            // `gen` is the source's SHA-1 in base64 (the 20 bytes, not the
            // hex `udf-list` shows), as the reference answers it.
            let digest: Vec<u8> = (0..module.hash.len() / 2)
                .filter_map(|at| u8::from_str_radix(module.hash.get(at * 2..at * 2 + 2)?, 16).ok())
                .collect();
            format!(
                "gen={};type=LUA;content={};",
                base64::engine::general_purpose::STANDARD.encode(digest),
                base64::engine::general_purpose::STANDARD.encode(&module.source)
            )
        }
        None => "error=not_found".to_owned(),
    }
}

/// `udf-list`: `filename=F,hash=H,type=LUA;` per module.
pub(crate) fn list(modules: &Modules<'_>) -> String {
    modules
        .udfs
        .registry
        .list()
        .iter()
        .map(|module| {
            format!(
                "filename={},hash={},type=LUA;",
                module.filename, module.hash
            )
        })
        .collect()
}

/// `udf-remove:filename=F;`. As the reference checks it, only a missing
/// name or one longer than a name can be is refused: any other name that
/// is not registered (an empty one, one `udf-put` would refuse) has
/// nothing to remove and answers `ok`.
pub(crate) fn remove(modules: &Modules<'_>, command: &InfoCommand<'_>) -> String {
    let Some(filename) = command
        .param("filename")
        .filter(|name| name.len() <= FILENAME_MAX)
    else {
        return "error=invalid_filename".to_owned();
    };
    if modules.udfs.registry.get(filename).is_none() {
        return "ok".to_owned();
    }
    modules.commit(filename, None)
}

/// A request's UDF fields.
#[derive(Clone, Copy, Debug)]
pub(crate) struct UdfCall<'m> {
    pub registry: &'m Registry,
    pub module: &'m str,
    pub function: &'m str,
    /// The msgpack list of arguments (empty: none).
    pub args: &'m [u8],
    /// How long it may run when the caller bounds it more tightly than the
    /// request's own timeout does (a batch's UDF rows share one deadline);
    /// `None`: [`time_limit`] of the request's timeout.
    pub time_limit: Option<Duration>,
}

/// The UDF a request names, if any: module and function are both needed,
/// as UTF-8; the arguments must be a msgpack list. An empty module or
/// function name is a call like any other, which fails when it runs (100:
/// no such module or function), as the reference answers it.
pub(crate) fn parse_call<'m>(
    registry: &'m Registry,
    field: impl Fn(u8) -> Option<&'m [u8]>,
) -> Result<Option<UdfCall<'m>>, ResultCode> {
    let module = field(field_type::UDF_FILENAME);
    let function = field(field_type::UDF_FUNCTION);
    let (module, function) = match (module, function) {
        (None, None) => return Ok(None),
        (Some(module), Some(function)) => (module, function),
        _ => return Err(ResultCode::Parameter),
    };
    let module = std::str::from_utf8(module).map_err(|_| ResultCode::Parameter)?;
    let function = std::str::from_utf8(function).map_err(|_| ResultCode::Parameter)?;
    let args = field(field_type::UDF_ARGLIST).unwrap_or_default();
    if !args.is_empty() && !matches!(value::decode(args), Ok(Value::List(_))) {
        return Err(ResultCode::Parameter);
    }
    Ok(Some(UdfCall {
        registry,
        module,
        function,
        args,
        time_limit: None,
    }))
}

/// The UDF fields of a decoded message.
pub(crate) fn call_of<'m>(
    registry: &'m Registry,
    message: &Message<'m>,
) -> Result<Option<UdfCall<'m>>, ResultCode> {
    parse_call(registry, |kind| message.field(kind))
}

/// The key field's value as a UDF sees it.
fn key_value(particle_type: u8, bytes: &[u8]) -> Option<Value> {
    citrine_udf::bin_value(particle_type, bytes)
}

/// The time limit of a request whose server-side timeout is `timeout_ms`:
/// three quarters of it, so that the failure reaches the client before it
/// gives up on the request.
pub(crate) fn time_limit(timeout_ms: u32) -> Duration {
    match timeout_ms {
        0 => DEFAULT_TIME_LIMIT,
        ms => Duration::from_millis(u64::from(ms) * 3 / 4).min(MAX_TIME_LIMIT),
    }
}

/// How often a record UDF runs again when its record changed while it ran.
pub const APPLY_ATTEMPTS: usize = 3;

/// A record as it was read for a UDF: enough to tell, under the write lock,
/// whether it is still the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    generation: u16,
    last_update_ms: u64,
    void_time: u32,
}

/// What a UDF's run read: the live record's metadata, body and stamp.
struct Snapshot {
    meta: Option<RecordMeta>,
    body: Option<Vec<u8>>,
    size: u64,
}

impl Snapshot {
    fn stamp(&self) -> Option<Stamp> {
        self.meta.map(|meta| Stamp {
            generation: meta.generation,
            last_update_ms: meta.last_update_ms,
            void_time: meta.void_time,
        })
    }
}

/// The live record's metadata, a copy of its body and its stored size,
/// read under the partition's read lock (released on return).
fn snapshot(
    namespace: &Namespace,
    request: &Request<'_>,
    now: Now,
) -> Result<Snapshot, ResultCode> {
    let partition = namespace.index.partition(request.digest.partition()).read();
    if let Some(own) = crate::txn::udf_base(namespace, request)? {
        // Inside a transaction holding the record: its own version.
        let size = own.as_ref().map_or(0, |(_, body)| body.len() as u64);
        let (meta, body) = own.unzip();
        return Ok(Snapshot { meta, body, size });
    }
    let live = partition
        .get(&request.digest)
        .map(|entry| (entry, entry.meta()))
        .filter(|(_, meta)| is_live(namespace, meta, now));
    Ok(match live {
        None => Snapshot {
            meta: None,
            body: None,
            size: 0,
        },
        Some((entry, meta)) => Snapshot {
            meta: Some(meta),
            body: Some(
                namespace
                    .storage
                    .read(&entry.location)
                    .map_err(|_| ResultCode::ServerError)?
                    .into_owned(),
            ),
            size: entry.location.size() as u64,
        },
    })
}

/// Runs a record UDF and writes its one reply. Errors before the function
/// runs (namespace full, unknown set, the write policy's checks, a filter
/// that does not pass) are returned for the caller to answer; the
/// function's own failure is answered here (100 and `FAILURE`).
///
/// The function runs without the partition lock: the record is read under
/// the read lock, the function runs on that copy, and its change is stored
/// under the write lock only if the record is still the one it read (same
/// generation, last-update time and void time, or still absent); otherwise
/// the UDF runs again on the new record, up to [`APPLY_ATTEMPTS`] times,
/// then answers 14 (key busy). Every run sees one consistent record and
/// the stored result follows from it, as if the UDF had held the lock.
/// Inside a transaction the record is the transaction's own version when
/// it holds one, and the change is kept as its provisional version
/// (`keep_in_txn`); a record another transaction holds answers 120.
pub(crate) fn apply(
    namespace: &Namespace,
    request: &Request<'_>,
    call: &UdfCall<'_>,
    now: Now,
    out: &mut Vec<u8>,
) -> Result<(), ResultCode> {
    namespace.serving(request.digest.partition())?;
    transaction::admit_write(namespace)?;
    let args = match value::decode(call.args) {
        Ok(Value::List(list)) => list.items,
        _ => Vec::new(),
    };
    for _ in 0..APPLY_ATTEMPTS {
        let snapshot = snapshot(namespace, request, now)?;
        let view = match &snapshot.body {
            Some(bytes) => Some(BodyView::parse(bytes).map_err(|_| ResultCode::ServerError)?),
            None => None,
        };
        check_write_policy(&request.header, snapshot.meta)?;
        let key = check_filter_and_key(namespace, request, &snapshot, view.as_ref(), now)?;
        let (input, hidden) = record_in(request, &snapshot, view.as_ref(), key, now);
        let udf = citrine_udf::Call {
            module: call.module,
            function: call.function,
            args: Cow::Borrowed(&args),
            time_limit: call
                .time_limit
                .unwrap_or_else(|| time_limit(request.header.transaction_ttl)),
        };
        let applied = match citrine_udf::apply_record(call.registry, &udf, input) {
            Ok(applied) => applied,
            Err(error) => return udf_failed(namespace, call, out, request, &error),
        };
        // What the change stores, built before the lock is taken.
        let planned = match plan(
            namespace,
            &request.header,
            &applied.change,
            key,
            &hidden,
            snapshot.meta,
            now,
        ) {
            Ok(planned) => planned,
            Err(Refusal::Code(code)) => return Err(code),
            Err(Refusal::Udf(error)) => return udf_failed(namespace, call, out, request, &error),
        };
        // `None`: changed while the UDF ran: run it again on the new record.
        let Some((generation, void_time)) = commit(namespace, request, &snapshot, planned, now)?
        else {
            continue;
        };
        let lang = match applied.change {
            Change::None => Lang::Read,
            Change::Write { .. } => Lang::Write,
            Change::Remove => Lang::Delete,
        };
        namespace
            .stats
            .count(request.tally, Outcome::UdfComplete(lang));
        reply_success(out, request, generation, void_time, &applied.result);
        return Ok(());
    }
    Err(ResultCode::KeyBusy)
}

/// The write policy's record-exists action and generation check, as a
/// write honours them (a background job's writes are UPDATE_ONLY: a record
/// deleted meanwhile stays gone).
fn check_write_policy(header: &MsgHeader, meta: Option<RecordMeta>) -> Result<(), ResultCode> {
    match meta {
        Some(meta) => {
            if header.info2 & info2::CREATE_ONLY != 0 {
                return Err(ResultCode::RecordExists);
            }
            transaction::check_generation(header, meta.generation)
        }
        None => {
            if header.info3 & (info3::UPDATE_ONLY | info3::REPLACE_ONLY) != 0 {
                return Err(ResultCode::NotFound);
            }
            if header.info2 & info2::GENERATION != 0 && header.generation != 0 {
                return Err(ResultCode::Generation);
            }
            Ok(())
        }
    }
}

/// The request's filter over the record as read, and its key against the
/// stored one (a different key: 19). Answers the record's key: the one
/// sent, else the stored one.
fn check_filter_and_key<'a>(
    namespace: &Namespace,
    request: &Request<'a>,
    snapshot: &Snapshot,
    view: Option<&BodyView<'a>>,
    now: Now,
) -> Result<Option<(u8, &'a [u8])>, ResultCode> {
    if let (Some(expression), Some(view), Some(meta)) = (request.filter, view, snapshot.meta) {
        let record = RecordView::stored(namespace, &request.digest.0, view, meta, snapshot.size);
        filter::check(expression, &record, now)?;
    }
    let stored_key = view.and_then(BodyView::key);
    if let (Some(sent), Some(stored)) = (request.key, stored_key) {
        if sent != stored {
            return Err(ResultCode::KeyMismatch);
        }
    }
    Ok(request.key.or(stored_key))
}

/// The record as the UDF sees it, and the bins it cannot see (no value
/// the Lua side has: kept as they are when it writes the record).
fn record_in<'v>(
    request: &Request<'_>,
    snapshot: &Snapshot,
    view: Option<&BodyView<'v>>,
    key: Option<(u8, &[u8])>,
    now: Now,
) -> (citrine_udf::RecordIn<'v>, Vec<Bin<'v>>) {
    let mut hidden: Vec<Bin<'v>> = Vec::new();
    let mut bins: Vec<(Cow<'v, [u8]>, Value)> = Vec::new();
    for bin in view.into_iter().flat_map(BodyView::bins) {
        match citrine_udf::bin_value(bin.particle_type, &bin.value) {
            Some(value) => bins.push((bin.name, value)),
            None => hidden.push(bin),
        }
    }
    let ttl = match snapshot.meta {
        None => 0,
        Some(meta) if meta.void_time == 0 => -1,
        Some(meta) => i64::from(meta.void_time.saturating_sub(now.citrusleaf_seconds)),
    };
    // The record's set is the request's: its digest is of that set.
    let set_name = request.set.to_vec();
    let input = citrine_udf::RecordIn {
        exists: snapshot.meta.is_some(),
        bins,
        generation: snapshot.meta.map_or(0, |meta| meta.generation),
        ttl,
        last_update_ms: snapshot.meta.map_or(0, |meta| meta.last_update_ms),
        digest: request.digest.0,
        set: Cow::Owned(set_name),
        key: key.and_then(|(particle_type, bytes)| key_value(particle_type, bytes)),
        size: snapshot.size,
    };
    (input, hidden)
}

/// Stores what the UDF planned under the partition's write lock, if the
/// record is still the one it read. Answers the record's generation and
/// void time, or `None` when the record changed meanwhile.
fn commit(
    namespace: &Namespace,
    request: &Request<'_>,
    snapshot: &Snapshot,
    planned: Planned,
    now: Now,
) -> Result<Option<(u16, u32)>, ResultCode> {
    let mut partition = namespace
        .index
        .partition(request.digest.partition())
        .write();
    // The LUT is taken under the lock (see `Namespace::now_under_lock`).
    let now = namespace.now_under_lock(now);
    // A record another transaction holds takes no UDF write (120); one
    // inside a transaction compares with, and keeps, its own version.
    let txn = citrine_data::txn::begin_write(namespace, request, now)?;
    let current = match crate::txn::udf_own_meta(txn.as_ref()) {
        Some(own) => own,
        None => partition
            .get(&request.digest)
            .map(|entry| entry.meta())
            .filter(|meta| is_live(namespace, meta, now)),
    }
    .map(|meta| Stamp {
        generation: meta.generation,
        last_update_ms: meta.last_update_ms,
        void_time: meta.void_time,
    });
    if current != snapshot.stamp() {
        return Ok(None);
    }
    if let Some(txn) = txn {
        if txn.own.is_none() {
            let live = partition
                .get(&request.digest)
                .map(|entry| entry.meta())
                .filter(|meta| is_live(namespace, meta, now));
            citrine_data::txn::check_read_version(namespace, request, live.as_ref())?;
        }
        return keep_in_txn(namespace, request, &partition, snapshot, txn, planned, now);
    }
    Ok(Some(match planned {
        Planned::Nothing => snapshot
            .meta
            .map_or((0, 0), |meta| (meta.generation, meta.void_time)),
        Planned::Remove => {
            if let Some(entry) = partition.get(&request.digest) {
                transaction::write_tombstone(namespace, &request.digest, &entry.meta(), now)?;
            }
            transaction::remove_deleted(
                namespace,
                &mut partition,
                &request.digest,
                now.unix_ms,
                transaction::is_durable_delete(&request.header),
            );
            (0, 0)
        }
        Planned::Store { body, void_time } => {
            let meta = new_meta(namespace, request, &partition, snapshot, void_time, now)?;
            let previous =
                transaction::install(namespace, &mut partition, request.digest, meta, body)?;
            drop(partition);
            if let Some(old) = previous {
                old.release(namespace);
            }
            (meta.generation, meta.void_time)
        }
    }))
}

/// The reply of a UDF that ran: the record's generation and void time and
/// the function's result as bin `SUCCESS`.
fn reply_success(
    out: &mut Vec<u8>,
    request: &Request<'_>,
    generation: u16,
    void_time: u32,
    result: &Value,
) {
    let reply = MsgHeader {
        generation: u32::from(generation),
        record_ttl: void_time,
        ..MsgHeader::default()
    };
    let (particle_type, bytes) =
        citrine_udf::particle_of(result).unwrap_or((ParticleType::Null as u8, Vec::new()));
    let mut writer = transaction::begin_reply(out, reply, request.reply);
    writer.op(op_type::READ, particle_type, b"SUCCESS", &bytes);
    writer.finish();
}

/// Counts and answers a UDF's failure (100 and `FAILURE`): the request is
/// answered, so the caller returns `Ok`.
fn udf_failed(
    namespace: &Namespace,
    call: &UdfCall<'_>,
    out: &mut Vec<u8>,
    request: &Request<'_>,
    error: &UdfError,
) -> Result<(), ResultCode> {
    namespace.stats.count(request.tally, Outcome::UdfFailed);
    tracing::debug!(
        module = call.module,
        function = call.function,
        "UDF failed: {error}"
    );
    write_failure(out, request, error);
    Ok(())
}

/// The metadata of the version a UDF stores: the next generation of the
/// record it read, or where a new life starts; a record it creates
/// creates its set, if new.
fn new_meta(
    namespace: &Namespace,
    request: &Request<'_>,
    partition: &citrine_index::PartitionIndex,
    snapshot: &Snapshot,
    void_time: u32,
    now: Now,
) -> Result<RecordMeta, ResultCode> {
    let (life, generation) = match snapshot.meta {
        Some(meta) => (meta.life, RecordMeta::next_generation(meta.generation)),
        None => transaction::start_after(
            partition.get(&request.digest).map(|entry| entry.meta()),
            partition.tombstone(&request.digest),
        ),
    };
    let record_set = match snapshot.meta {
        Some(meta) => meta.set_id,
        None => transaction::set_of_new_record(namespace, request.set)?,
    };
    Ok(RecordMeta {
        generation,
        life,
        set_id: record_set,
        void_time,
        last_update_ms: namespace.version_lut_ms(record_set, now.unix_ms),
        xdr_write: false,
    })
}

/// A UDF's change inside a transaction, under the partition's write lock:
/// kept as the transaction's provisional version (the committed record
/// stays until the roll forward). Answers the generation and void time.
fn keep_in_txn(
    namespace: &Namespace,
    request: &Request<'_>,
    partition: &citrine_index::PartitionIndex,
    snapshot: &Snapshot,
    txn: citrine_data::txn::TxnWrite,
    planned: Planned,
    now: Now,
) -> Result<Option<(u16, u32)>, ResultCode> {
    let version = match planned {
        Planned::Nothing => {
            let kept = snapshot
                .meta
                .map_or((0, 0), |meta| (meta.generation, meta.void_time));
            return Ok(Some(kept));
        }
        Planned::Remove => citrine_data::txn::Version::Delete,
        Planned::Store { body, void_time } => citrine_data::txn::Version::Store {
            meta: new_meta(namespace, request, partition, snapshot, void_time, now)?,
            body,
        },
    };
    let answered = match &version {
        citrine_data::txn::Version::Store { meta, .. } => (meta.generation, meta.void_time),
        citrine_data::txn::Version::Delete => (0, 0),
    };
    citrine_data::txn::keep(namespace, request, &txn, version);
    Ok(Some(answered))
}

/// What a UDF's change stores.
enum Planned {
    Nothing,
    Remove,
    Store { body: Vec<u8>, void_time: u32 },
}

/// Why a change cannot be stored: a result code, or a failure of the UDF
/// (a bin it made that no write could store).
enum Refusal {
    Code(ResultCode),
    Udf(UdfError),
}

impl From<ResultCode> for Refusal {
    fn from(code: ResultCode) -> Refusal {
        Refusal::Code(code)
    }
}

/// Builds what `change` stores: the new body with its void time (every bin
/// checked as a write checks it, the bins the UDF could not see kept), or
/// a removal (also when no bin is left).
fn plan(
    namespace: &Namespace,
    header: &MsgHeader,
    change: &Change,
    key: Option<(u8, &[u8])>,
    hidden: &[Bin<'_>],
    live: Option<RecordMeta>,
    now: Now,
) -> Result<Planned, Refusal> {
    let (bins, ttl, drop_key) = match change {
        Change::None => return Ok(Planned::Nothing),
        Change::Remove => return Ok(Planned::Remove),
        Change::Write {
            bins,
            ttl,
            drop_key,
        } => (bins, ttl, *drop_key),
    };
    let mut stored: Vec<Bin<'_>> = Vec::with_capacity(bins.len() + hidden.len());
    for (name, value) in bins {
        if let Some(bin) = stored_bin(namespace, name, value)? {
            stored.push(bin);
        }
    }
    for bin in hidden {
        if !stored.iter().any(|kept| kept.name == bin.name) {
            stored.push(bin.clone());
        }
    }
    if stored.is_empty() {
        return Ok(if live.is_some() {
            Planned::Remove
        } else {
            Planned::Nothing
        });
    }
    let requested_ttl = match ttl {
        None => header.record_ttl,
        // record.set_ttl: -1 never expires, -2 keeps the current TTL, 0
        // the namespace default (02 §2.5's encodings).
        Some(-1) => TTL_NEVER_EXPIRE,
        Some(-2) => TTL_DONT_UPDATE,
        Some(seconds) => u32::try_from(*seconds).map_err(|_| ResultCode::Parameter)?,
    };
    let void_time = transaction::void_time_for(
        namespace,
        requested_ttl,
        live.map(|meta| meta.void_time),
        now,
    )?;
    let key = if drop_key { None } else { key };
    let body = encode_body_reserving(key, &stored, MEMORY_BODY_SPARE)
        .map_err(|_| ResultCode::Parameter)?;
    transaction::check_record_size(namespace, body.len())?;
    Ok(Planned::Store { body, void_time })
}

/// One bin a UDF wrote, checked as a write checks it: its name, its value
/// (an ordered collection back in order; HLL and GeoJSON valid) and the
/// record size limit. `None`: a value no bin holds (a nil: the bin goes).
fn stored_bin<'b>(
    namespace: &Namespace,
    name: &'b [u8],
    value: &Value,
) -> Result<Option<Bin<'b>>, Refusal> {
    let bad = |why: &str| {
        Refusal::Udf(UdfError::Execution(format!(
            "bin {}: {why}",
            String::from_utf8_lossy(name)
        )))
    };
    if !valid_bin_name(name) {
        return Err(bad("the name is longer than 15 bytes"));
    }
    // An ordered list or map the UDF changed goes back in order (a
    // `list.append` to an ordered list appends at the end in Lua).
    let canonical;
    let value = if value.is_collection() {
        let mut copy = value.clone();
        value::canonicalize(&mut copy);
        canonical = copy;
        &canonical
    } else {
        value
    };
    let Some((particle_type, bytes)) = citrine_udf::particle_of(value) else {
        return Ok(None);
    };
    let valid = validate_value(particle_type, &bytes).is_ok()
        && (particle_type != ParticleType::Hll as u8 || citrine_cdt::hll::valid_particle(&bytes));
    if !valid {
        return Err(bad("not a value a bin can hold"));
    }
    if transaction::bins::check_geojson(particle_type, &bytes).is_err() {
        return Err(bad("not a GeoJSON shape the server supports"));
    }
    transaction::check_record_size(namespace, bytes.len())?;
    Ok(Some(Bin {
        name: Cow::Borrowed(name),
        particle_type,
        value: Cow::Owned(bytes),
    }))
}

/// Writes result 100 with the error's text in a `FAILURE` bin.
fn write_failure(out: &mut Vec<u8>, request: &Request<'_>, error: &UdfError) {
    let header = MsgHeader {
        result_code: ResultCode::UdfExecution.code(),
        ..MsgHeader::default()
    };
    let message = error.to_string();
    let mut writer: MessageWriter<'_> = transaction::begin_reply(out, header, request.reply);
    writer.op(
        op_type::READ,
        ParticleType::String as u8,
        b"FAILURE",
        message.as_bytes(),
    );
    writer.finish();
}

/// Whether a scan or query message is an aggregation (UDF_OP 1, not a
/// background write).
pub(crate) fn is_aggregation(message: &Message<'_>) -> bool {
    message.field(field_type::UDF_OP) == Some(&[crate::scan::udf_op::AGGREGATE][..])
        && message.header.info2
            & (citrine_wire::msg::info2::WRITE | citrine_wire::msg::info2::DELETE)
            == 0
}

/// A query or scan with a stream UDF (UDF_OP 1), streamed like a scan: each
/// step walks one chunk of the records the request selects (the same
/// cursor a foreground query uses), sends them through the stream, and
/// writes one frame holding a message per value emitted (no fields, one bin
/// `SUCCESS`). As the reference does, each partition's records go through
/// a stream of their own: when the walk moves to the next partition the
/// stream ends, its result is written, and a new one starts; the client
/// reduces the partitions' results (the official clients run the
/// function's last `reduce` over them). The last step ends the last
/// partition's stream, then writes LAST. A partition with no selected
/// record emits nothing. A failure is answered with a message of result
/// 100 and a bin `FAILURE`, then LAST carrying 100.
///
/// Invariant: a step holds its thread for one chunk of the walk (and each
/// Lua call for at most [`AGGREGATE_STEP_LIMIT`]), as a scan step does; the
/// stream's Lua state travels with the run.
pub struct AggregateRun {
    /// Counts this run among the node's aggregations while it lives.
    _slot: AggregateSlot,
    cursor: Box<crate::scan::ScanCursor>,
    aggregation: citrine_udf::Aggregation,
    namespace: Arc<Namespace>,
    /// Bytes of values sent so far.
    sent: usize,
    /// The partition whose records the current stream holds (`None`
    /// before the first record).
    partition: Option<citrine_types::PartitionId>,
    /// The parts of the partitions this node masters but is still
    /// filling: the acting master holding them whole, and those
    /// partitions. They run there first ([`AggregateRun::run_delegated`]).
    delegated: Vec<(NodeId, Vec<PartitionId>)>,
    /// The request as received (it lists no partitions), which each part
    /// repeats with its partitions listed; empty when nothing is
    /// delegated.
    request: Vec<u8>,
    /// How long a part may take (the request's timeout).
    part_timeout: Duration,
    /// A client's aggregation: the job `query-show` shows (a peer's part
    /// is not one of this node's jobs).
    watch: Option<crate::job::monitor::Watch>,
}

/// One of the node's [`MAX_AGGREGATIONS`] places, given back on drop.
struct AggregateSlot(Arc<std::sync::atomic::AtomicUsize>);

impl AggregateSlot {
    fn take(count: &Arc<std::sync::atomic::AtomicUsize>) -> Option<AggregateSlot> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |running| {
                (running < MAX_AGGREGATIONS).then_some(running + 1)
            })
            .ok()
            .map(|_| AggregateSlot(Arc::clone(count)))
    }
}

impl Drop for AggregateSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for AggregateRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AggregateRun")
            .field("sent", &self.sent)
            .finish_non_exhaustive()
    }
}

/// How long each Lua call of an aggregation (building the stream, one
/// record, taking what it emitted, or the end) may run.
pub const AGGREGATE_STEP_LIMIT: Duration = Duration::from_secs(2);

/// Aggregations one node runs at once (each holds a Lua state of up to
/// [`citrine_udf::MEMORY_LIMIT`]); one more is refused with 211.
pub const MAX_AGGREGATIONS: usize = 16;

/// The most bytes of values an aggregation may send from one node.
pub const AGGREGATE_OUTPUT_MAX: usize = 1 << 30;

/// Starts an aggregation, or writes its refusal (LAST with the code) to
/// `out` and returns `None`.
pub(crate) fn start_aggregate(
    aggregations: &Aggregations<'_>,
    message: &Message<'_>,
    out: &mut Vec<u8>,
    origin: crate::job::Origin,
) -> Option<Box<AggregateRun>> {
    let refuse = |out: &mut Vec<u8>, code: ResultCode| {
        aggregations.scans().refused.fetch_add(1, Ordering::Relaxed);
        transaction::write_stream_end(out, code);
        None
    };
    let Some(namespace) = message
        .field(field_type::NAMESPACE)
        .and_then(|name| aggregations.layers.data.namespace_shared(name))
    else {
        return refuse(out, ResultCode::Namespace);
    };
    let call = match call_of(&aggregations.udfs.registry, message) {
        Ok(Some(call)) => call,
        Ok(None) => return refuse(out, ResultCode::Parameter),
        Err(code) => return refuse(out, code),
    };
    let mut cursor = match aggregate_cursor(aggregations, message, &namespace) {
        Ok(Some(cursor)) => cursor,
        Ok(None) => {
            // Unknown set: no records, nothing emitted.
            transaction::write_stream_end(out, ResultCode::Ok);
            return None;
        }
        Err(code) => return refuse(out, code),
    };
    let (delegated, request) = match delegate(aggregations, message, &namespace, &mut cursor) {
        Ok(delegated) => delegated,
        Err(code) => return refuse(out, code),
    };
    let part_timeout = match message.header.transaction_ttl {
        0 => AGGREGATE_PART_TIMEOUT,
        ms => Duration::from_millis(u64::from(ms)),
    };
    let udf = aggregate_call(&call);
    let Some(slot) = AggregateSlot::take(&aggregations.udfs.aggregations) else {
        return refuse(out, ResultCode::QueryQueueFull);
    };
    let watch = match watch_aggregation(aggregations, message, &namespace, &cursor, origin) {
        Ok(watch) => watch,
        Err(code) => return refuse(out, code),
    };
    aggregations.scans().started.fetch_add(1, Ordering::Relaxed);
    let aggregation = match citrine_udf::Aggregation::new(call.registry, &udf) {
        Ok(aggregation) => aggregation,
        Err(error) => {
            aggregation_not_started(aggregations, &namespace, out, &error, watch);
            return None;
        }
    };
    Some(Box::new(AggregateRun {
        _slot: slot,
        cursor: Box::new(cursor),
        aggregation,
        namespace,
        sent: 0,
        partition: None,
        delegated,
        request,
        part_timeout,
        watch,
    }))
}

/// The parts of the aggregation that run first on acting masters (see
/// [`delegate_partitions`]), once `cursor` keeps only the partitions this
/// node serves, and the request each part repeats (empty when there are
/// none); `Err` (11) when a partition it must cover is not served whole
/// here.
fn delegate(
    aggregations: &Aggregations<'_>,
    message: &Message<'_>,
    namespace: &Namespace,
    cursor: &mut crate::scan::ScanCursor,
) -> Result<(Parts, Vec<u8>), ResultCode> {
    // Only those that list their partitions follow acting-master claims
    // (see there); a claim lost during the walk fails the run.
    if aggregations.layers.dist.routes() || crate::sc::is_sc(namespace) {
        cursor.keep_served_partitions(aggregations.layers, crate::scan::lists_partitions(message));
    }
    let delegated =
        match delegate_partitions(aggregations, message, namespace, cursor.take_unavailable()) {
            Ok(delegated) => delegated,
            Err(partition) => {
                // An aggregation's stream has no per-partition answers (the
                // official clients read none), so a partition left out would
                // be a silently wrong result: fail it instead, to be tried
                // again.
                tracing::debug!(
                    partition = partition.index(),
                    "aggregation refused: a partition it must cover is not served whole here"
                );
                return Err(ResultCode::Unavailable);
            }
        };
    let request = if delegated.is_empty() {
        Vec::new()
    } else {
        part_request(message, &[])
    };
    Ok((delegated, request))
}

/// The cursor over the records an aggregation reads. `Ok(None)`: its set
/// is unknown here, so it has no records.
fn aggregate_cursor(
    aggregations: &Aggregations<'_>,
    message: &Message<'_>,
    namespace: &Arc<Namespace>,
) -> Result<Option<crate::scan::ScanCursor>, ResultCode> {
    let parse = || {
        crate::scan::parse(
            message,
            Arc::clone(namespace),
            aggregations.indexes.of(namespace),
            false,
        )
    };
    match parse()? {
        Some(cursor) => Ok(Some(cursor)),
        None if fills_a_mastered_partition(aggregations, message, namespace) => {
            // The set is unknown here, but records of it may be in the
            // partitions this node masters and is still filling: it gets
            // the set (it will hold its records soon) and delegates them.
            let set = message.field(field_type::SET).unwrap_or_default();
            namespace
                .sets
                .id_of(set)
                .and_then(|_| parse().ok())
                .flatten()
                .map(Some)
                .ok_or(ResultCode::Unavailable)
        }
        None => Ok(None),
    }
}

/// An aggregation's Lua call: its module, function and arguments, each
/// step limited to [`AGGREGATE_STEP_LIMIT`].
fn aggregate_call<'c>(call: &UdfCall<'c>) -> citrine_udf::Call<'c> {
    let args = match value::decode(call.args) {
        Ok(Value::List(list)) => list.items,
        _ => Vec::new(),
    };
    citrine_udf::Call {
        module: call.module,
        function: call.function,
        args: Cow::Owned(args),
        time_limit: AGGREGATE_STEP_LIMIT,
    }
}

/// An aggregation whose stream could not be built: counted, answered with
/// its failure, and its job (if any) finished.
fn aggregation_not_started(
    aggregations: &Aggregations<'_>,
    namespace: &Namespace,
    out: &mut Vec<u8>,
    error: &UdfError,
    watch: Option<crate::job::monitor::Watch>,
) {
    namespace
        .stats
        .client_udf_error
        .fetch_add(1, Ordering::Relaxed);
    let start = out.len();
    write_aggregate_failure(out, error);
    aggregations.completed();
    if let Some(watch) = watch {
        watch.monitor.add_net_io(out.len() - start);
        watch.finish(crate::job::monitor::Reason::Unknown);
    }
}

/// The job `query-show` shows of a client's aggregation (none for a
/// peer's part of one); refused with 4 while an active job has its task
/// id.
fn watch_aggregation(
    aggregations: &Aggregations<'_>,
    message: &Message<'_>,
    namespace: &Namespace,
    cursor: &crate::scan::ScanCursor,
    origin: crate::job::Origin,
) -> Result<Option<crate::job::monitor::Watch>, ResultCode> {
    use crate::job::monitor::{JobType, Monitor};
    let crate::job::Origin::Client(from) = origin else {
        return Ok(None);
    };
    let monitor = Monitor::new(
        message,
        JobType::Aggregation,
        &namespace.config.name,
        cursor.index_name(),
        from,
        aggregations.layers.now().unix_ms,
    );
    aggregations
        .monitors
        .add_foreground(monitor, aggregations.layers.data.clock_shared())
        .map(Some)
}

/// True when this node, in a cluster, masters a partition it is still
/// filling and `message` asks for all partitions (so it must cover that
/// partition's records, which are elsewhere for now).
fn fills_a_mastered_partition(
    aggregations: &Aggregations<'_>,
    message: &Message<'_>,
    namespace: &Namespace,
) -> bool {
    if !aggregations.layers.dist.routes() || crate::scan::lists_partitions(message) {
        return false;
    }
    let cluster = aggregations.layers.cluster();
    let Some(map) = cluster.namespace(&namespace.config.name) else {
        return false;
    };
    PartitionId::all().any(|partition| {
        map.map.replicas(partition).first() == Some(&aggregations.node_id())
            && !aggregations
                .layers
                .migrations()
                .serves_whole(&namespace.config.name, partition)
    })
}

/// Where the partitions this aggregation must cover but this node does not
/// serve whole (`unavailable`) are served: asked by partition list, it must
/// serve every one itself (`Err` with the first it cannot); asked for all
/// (the reference clients' aggregations), it must cover those it masters,
/// the others being their masters' part (see
/// `ScanCursor::keep_served_partitions`), and those it masters but is
/// still filling are delegated to the acting master holding each whole.
/// `Err` with a partition it masters that no acting master holds (the
/// copies are distinct: a split's sides, a full restart).
fn delegate_partitions(
    aggregations: &Aggregations<'_>,
    message: &Message<'_>,
    namespace: &Namespace,
    unavailable: Vec<PartitionId>,
) -> Result<Vec<(NodeId, Vec<PartitionId>)>, PartitionId> {
    if crate::scan::lists_partitions(message) {
        return match unavailable.first() {
            Some(partition) => Err(*partition),
            None => Ok(Vec::new()),
        };
    }
    let cluster = aggregations.layers.cluster();
    let Some(map) = cluster.namespace(&namespace.config.name) else {
        return Ok(Vec::new());
    };
    let mastered = unavailable
        .into_iter()
        .filter(|partition| map.map.replicas(*partition).first() == Some(&aggregations.node_id()));
    let (parts, unroutable) = route_parts(aggregations, &map.map, &namespace.config.name, mastered);
    match unroutable.first() {
        Some(partition) => Err(*partition),
        None => Ok(parts),
    }
}

/// Groups `partitions` (which this node masters in `map`) by the node
/// that serves each whole now ([`part_target`]); also those none does.
fn route_parts(
    aggregations: &Aggregations<'_>,
    map: &citrine_cluster::partition_map::PartitionMap,
    namespace: &str,
    partitions: impl IntoIterator<Item = PartitionId>,
) -> (Vec<(NodeId, Vec<PartitionId>)>, Vec<PartitionId>) {
    let mut parts: Vec<(NodeId, Vec<PartitionId>)> = Vec::new();
    let mut unroutable = Vec::new();
    for partition in partitions {
        let Some(target) = part_target(aggregations, map, namespace, partition) else {
            unroutable.push(partition);
            continue;
        };
        match parts.iter_mut().find(|(node, _)| *node == target) {
            Some((_, listed)) => listed.push(partition),
            None => parts.push((target, vec![partition])),
        }
    }
    (parts, unroutable)
}

/// Where a part covering `partition`, which this node masters, runs: here
/// once this node serves it whole, else on its acting master; `None` while
/// neither holds (a handover in progress, distinct copies, or this node no
/// longer its master).
fn part_target(
    aggregations: &Aggregations<'_>,
    map: &citrine_cluster::partition_map::PartitionMap,
    namespace: &str,
    partition: PartitionId,
) -> Option<NodeId> {
    if map.replicas(partition).first() != Some(&aggregations.node_id()) {
        return None;
    }
    if aggregations
        .layers
        .migrations()
        .serves_whole(namespace, partition)
    {
        return Some(aggregations.node_id());
    }
    aggregations
        .layers
        .migrations()
        .acting_target(namespace, partition)
        .filter(|acting| *acting != aggregations.node_id())
}

/// The most bytes a part of an aggregation may answer with: its stream
/// travels in one fabric message.
pub const AGGREGATE_PART_MAX: usize = 8 << 20;

/// How long a part may take when the request sets no timeout.
const AGGREGATE_PART_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the parts of an aggregation may be tried again, from its
/// start: a handover settles in milliseconds; longer is a split or a
/// restart, which the client is better told about (11).
const PART_RETRY_WINDOW: Duration = Duration::from_secs(5);

/// The first pause before parts are routed again; it doubles up to
/// [`PART_RETRY_PAUSE_MAX`].
const PART_RETRY_PAUSE: Duration = Duration::from_millis(5);
const PART_RETRY_PAUSE_MAX: Duration = Duration::from_millis(200);

/// The body of the part of aggregation `message` (asked for all
/// partitions) that covers `partitions`: the same request, listing them
/// (none listed: the request as it came).
fn part_request(message: &Message<'_>, partitions: &[PartitionId]) -> Vec<u8> {
    debug_assert!(!crate::scan::lists_partitions(message));
    let mut body = Vec::new();
    let mut writer = MessageWriter::begin_bare(&mut body, &message.header);
    for field in message.fields() {
        writer.field(field.field_type, field.data);
    }
    if !partitions.is_empty() {
        let pids: Vec<u8> = partitions
            .iter()
            .flat_map(|partition| (partition.index() as u16).to_le_bytes())
            .collect();
        writer.field(field_type::PID_ARRAY, &pids);
    }
    for op in message.ops() {
        writer.op(op.op_type, op.particle_type, op.name, op.value);
    }
    writer.finish();
    body
}

impl AggregateRun {
    /// When its walk's next step is due under RECS_PER_SEC (see
    /// [`crate::scan::ScanCursor::not_before_ms`]).
    pub(crate) fn not_before_ms(&self) -> Option<u64> {
        self.cursor.not_before_ms()
    }

    /// True when parts of the aggregation run on acting masters first.
    pub(crate) fn has_delegated(&self) -> bool {
        !self.delegated.is_empty()
    }

    /// Runs the delegated parts on their acting masters and relays their
    /// values (each partition's, as that node's stream emitted them) into
    /// `out`; returns the run for the partitions left here.
    ///
    /// A part's whole answer arrives before any of it is relayed, so a
    /// part that could not run whole (unreachable, or its LAST carries 11:
    /// a claim ended, a handover happened) is run again, routed afresh —
    /// here once this node serves its partitions whole — with pauses, for
    /// at most [`PART_RETRY_WINDOW`] (and the request's timeout). Past
    /// that, or when a part fails otherwise, the whole run fails (LAST
    /// with 11, or the part's own failure), as a partition left out would.
    pub(crate) async fn run_delegated(
        mut self: Box<Self>,
        aggregations: &Aggregations<'_>,
        out: &mut Vec<u8>,
    ) -> Option<Box<Self>> {
        let watch = self.watch.take();
        let start = out.len();
        let run = self.run_parts(aggregations, out).await;
        let Some(watch) = watch else {
            return run;
        };
        watch.monitor.add_net_io(out.len() - start);
        match run {
            Some(mut run) => {
                run.watch = Some(watch);
                Some(run)
            }
            None => {
                // A part failed (or could not run): so did the whole.
                watch.finish(crate::job::monitor::Reason::Unknown);
                None
            }
        }
    }

    /// [`AggregateRun::run_delegated`]'s parts.
    async fn run_parts(
        mut self: Box<Self>,
        aggregations: &Aggregations<'_>,
        out: &mut Vec<u8>,
    ) -> Option<Box<Self>> {
        let fail = |out: &mut Vec<u8>, code: ResultCode| {
            transaction::write_stream_end(out, code);
            aggregations.completed();
            None
        };
        let Some(fabric) = aggregations.layers.dist.fabric() else {
            return fail(out, ResultCode::Unavailable);
        };
        let started = Instant::now();
        let retry_until = started + self.part_timeout.min(PART_RETRY_WINDOW);
        let mut pause = PART_RETRY_PAUSE;
        let mut parts: std::collections::VecDeque<(NodeId, Vec<PartitionId>)> =
            std::mem::take(&mut self.delegated).into();
        let mut waiting: Vec<PartitionId> = Vec::new();
        loop {
            let Some((node, partitions)) = parts.pop_front() else {
                if waiting.is_empty() {
                    return Some(self);
                }
                if Instant::now() + pause > retry_until {
                    tracing::debug!(
                        left = waiting.len(),
                        "aggregation refused: partitions it must cover stayed unavailable"
                    );
                    return fail(out, ResultCode::Unavailable);
                }
                crate::offload::run("citrine-agg-pause", move || std::thread::sleep(pause)).await;
                pause = (pause * 2).min(PART_RETRY_PAUSE_MAX);
                let Some((routed, unroutable)) =
                    self.reroute(aggregations, std::mem::take(&mut waiting))
                else {
                    return fail(out, ResultCode::Unavailable);
                };
                parts = routed.into();
                waiting = unroutable;
                continue;
            };
            let Some(body) = Message::decode(&self.request)
                .ok()
                .map(|request| part_request(&request, &partitions))
            else {
                return fail(out, ResultCode::ServerError);
            };
            let answer = if node == aggregations.node_id() {
                Ok(aggregations.parts.run_part(&body).await)
            } else {
                let left = self.part_timeout.saturating_sub(started.elapsed());
                fabric
                    .call(node, call_kind::AGGREGATE_PART, body, left)
                    .await
            };
            let frames = match judge_part(node, answer.as_deref()) {
                PartAnswer::Frames(frames) => frames,
                PartAnswer::Refused => return fail(out, ResultCode::Unavailable),
                PartAnswer::Again => {
                    waiting.extend(partitions);
                    continue;
                }
            };
            match relay_part(frames, out, &mut self.sent) {
                Relayed::Values => {}
                Relayed::Ended => {
                    aggregations.completed();
                    return None;
                }
                Relayed::Broken => return fail(out, ResultCode::Unavailable),
            }
        }
    }

    /// The parts covering `waiting` routed afresh on the current map
    /// ([`route_parts`]): those routed, and those none serves whole yet;
    /// `None` when the map no longer has the namespace.
    fn reroute(
        &self,
        aggregations: &Aggregations<'_>,
        waiting: Vec<PartitionId>,
    ) -> Option<(Parts, Vec<PartitionId>)> {
        let cluster = aggregations.layers.cluster();
        let map = cluster.namespace(&self.namespace.config.name)?;
        Some(route_parts(
            aggregations,
            &map.map,
            &self.namespace.config.name,
            waiting,
        ))
    }

    /// Appends the next step's frame (and, at the end, LAST) to `out`;
    /// returns the run while it continues. A client's aggregation that
    /// `query-abort` stopped ends here with 15 (query aborted).
    pub(crate) fn step(
        mut self: Box<Self>,
        aggregations: &Aggregations<'_>,
        out: &mut Vec<u8>,
    ) -> Option<Box<Self>> {
        use crate::job::monitor::Reason;
        let watch = self.watch.take();
        let start = out.len();
        let (step, counts, progress) = match &watch {
            Some(watch) if watch.monitor.abort_requested() => {
                transaction::write_stream_end(out, ResultCode::QueryAbort);
                aggregations.completed();
                let counts = (self.cursor.counts(), self.cursor.progress_hundredths());
                (Step::Ended(Reason::UserAborted), counts.0, counts.1)
            }
            _ => self.run_step(aggregations, out),
        };
        if let Some(watch) = &watch {
            watch.monitor.add_net_io(out.len() - start);
            watch.monitor.set_counts(counts, progress);
        }
        match step {
            Step::More(mut run) => {
                run.watch = watch;
                Some(run)
            }
            Step::Ended(reason) => {
                if let Some(watch) = watch {
                    watch.finish(reason);
                }
                None
            }
        }
    }

    /// [`AggregateRun::step`]'s walk and stream: how the run goes on, and
    /// the walk's counts and progress after it.
    fn run_step(
        mut self: Box<Self>,
        aggregations: &Aggregations<'_>,
        out: &mut Vec<u8>,
    ) -> (Step, crate::job::monitor::Counts, u64) {
        use crate::job::monitor::Reason;
        let now = aggregations.layers.now();
        let mut chunk = Vec::new();
        let finished = self.cursor.advance(aggregations.layers, now, &mut chunk);
        let counts = self.cursor.counts();
        let progress = self.cursor.progress_hundredths();
        let ended = |reason| (Step::Ended(reason), counts, progress);
        let mut records = std::collections::VecDeque::new();
        if records_of(&chunk, now, &mut records) {
            // A partition walked here is no longer served here (its acting
            // master's claim ended): its result could miss writes, and an
            // aggregation has no per-partition answer to retry it by.
            tracing::debug!("aggregation refused: a partition's claim ended during its walk");
            transaction::write_stream_end(out, ResultCode::Unavailable);
            if !finished {
                aggregations.completed();
            }
            return ended(Reason::Unknown);
        }
        let frame_start = out.len();
        out.extend_from_slice(&[0u8; citrine_wire::frame::PROTO_HEADER_SIZE]);
        let mut sent = self.sent;
        let mut emit = |value: Value| emit_value(out, &mut sent, value);
        let outcome = self.feed(&records, &mut emit);
        let reason = match outcome {
            Ok(()) if finished => {
                let AggregateRun {
                    aggregation,
                    namespace,
                    ..
                } = *self;
                let result = aggregation.end(&mut emit);
                close_frame(out, frame_start);
                match result {
                    Ok(()) => {
                        transaction::write_stream_end(out, ResultCode::Ok);
                        Reason::Ok
                    }
                    Err(error) => {
                        namespace
                            .stats
                            .client_udf_error
                            .fetch_add(1, Ordering::Relaxed);
                        write_aggregate_failure(out, &error);
                        Reason::Unknown
                    }
                }
            }
            Ok(()) => {
                close_frame(out, frame_start);
                self.sent = sent;
                return (Step::More(self), counts, progress);
            }
            Err(error) => {
                close_frame(out, frame_start);
                self.namespace
                    .stats
                    .client_udf_error
                    .fetch_add(1, Ordering::Relaxed);
                write_aggregate_failure(out, &error);
                Reason::Unknown
            }
        };
        if !finished {
            // The cursor counts the runs it finished itself.
            aggregations.completed();
        }
        ended(reason)
    }
}

impl AggregateRun {
    /// Feeds one step's records to the aggregation, sending a partition's
    /// result when the walk moves on to the next partition.
    fn feed(
        &mut self,
        records: &std::collections::VecDeque<citrine_udf::RecordIn<'static>>,
        emit: &mut dyn FnMut(Value) -> Result<(), String>,
    ) -> Result<(), UdfError> {
        for record in records {
            let partition = citrine_types::Digest(record.digest).partition();
            if self.partition.is_some_and(|current| current != partition) {
                // The walk moved on: the last partition's result goes out.
                self.aggregation.restart(emit)?;
            }
            self.partition = Some(partition);
            self.aggregation.record(record)?;
            self.aggregation.take(emit)?;
        }
        Ok(())
    }
}

/// Writes one value an aggregation emitted as a bare message (bin
/// `SUCCESS`), refusing once the run's output passes
/// [`AGGREGATE_OUTPUT_MAX`].
fn emit_value(out: &mut Vec<u8>, sent: &mut usize, value: Value) -> Result<(), String> {
    let (particle_type, bytes) =
        citrine_udf::particle_of(&value).unwrap_or((ParticleType::Null as u8, Vec::new()));
    *sent += bytes.len();
    if *sent > AGGREGATE_OUTPUT_MAX {
        return Err(format!(
            "the aggregation's output passed {AGGREGATE_OUTPUT_MAX} bytes"
        ));
    }
    let mut writer = MessageWriter::begin_bare(out, &MsgHeader::default());
    writer.op(op_type::READ, particle_type, b"SUCCESS", &bytes);
    writer.finish();
    Ok(())
}

/// How an aggregation goes on after a step.
enum Step {
    More(Box<AggregateRun>),
    Ended(crate::job::monitor::Reason),
}

/// Patches the frame started at `start`, or drops it when it holds no
/// message.
fn close_frame(out: &mut Vec<u8>, start: usize) {
    if out.len() == start + citrine_wire::frame::PROTO_HEADER_SIZE {
        out.truncate(start);
    } else {
        citrine_wire::frame::ProtoHeader::patch(
            &mut out[start..],
            citrine_wire::frame::MessageType::Message,
        );
    }
}

/// Runs the listed aggregation `body` to its end; the answer of an
/// `AGGREGATE_PART` call.
fn aggregate_part(aggregations: &Aggregations<'_>, body: &[u8]) -> Vec<u8> {
    let Ok(message) = Message::decode(body) else {
        return vec![ResultCode::Parameter.code()];
    };
    if message.field(field_type::DIGEST).is_some()
        || !is_aggregation(&message)
        || !crate::scan::lists_partitions(&message)
    {
        return vec![ResultCode::Parameter.code()];
    }
    let mut answer = vec![ResultCode::Ok.code()];
    let mut next = start_aggregate(
        aggregations,
        &message,
        &mut answer,
        crate::job::Origin::Peer,
    )
    .and_then(|run| run.step(aggregations, &mut answer));
    while let Some(run) = next {
        if answer.len() > AGGREGATE_PART_MAX {
            tracing::warn!(
                "an aggregation part passed {AGGREGATE_PART_MAX} bytes; the aggregation fails"
            );
            aggregations.completed();
            return vec![ResultCode::Unavailable.code()];
        }
        next = run.step(aggregations, &mut answer);
    }
    answer
}

/// Parts of an aggregation: the node each runs on, and its partitions.
type Parts = Vec<(NodeId, Vec<PartitionId>)>;

/// What a part's answer means for the aggregation ([`judge_part`]).
enum PartAnswer<'a> {
    /// Its whole stream, covering its partitions: relay it.
    Frames(&'a [u8]),
    /// Refused otherwise than for unavailable partitions: the aggregation
    /// fails.
    Refused,
    /// Unreachable, timed out, or it could not cover its partitions whole:
    /// nothing of it was relayed; run it again.
    Again,
}

/// Judges the answer of the part sent to `node` (the first byte is the
/// call's result code, then the part's stream).
fn judge_part<'a, E: std::fmt::Debug>(
    node: NodeId,
    answer: Result<&'a [u8], &E>,
) -> PartAnswer<'a> {
    match answer {
        Ok([code, frames @ ..])
            if *code == ResultCode::Ok.code()
                && part_end(frames) != Some(ResultCode::Unavailable.code()) =>
        {
            PartAnswer::Frames(frames)
        }
        Ok([code, ..])
            if *code != ResultCode::Ok.code() && *code != ResultCode::Unavailable.code() =>
        {
            tracing::debug!(?node, code, "aggregation part refused");
            PartAnswer::Refused
        }
        other => {
            tracing::debug!(?node, answer = ?other.map(|bytes| bytes.first().copied()), "aggregation part to run again");
            PartAnswer::Again
        }
    }
}

/// How a part's stream was relayed ([`relay_part`]).
enum Relayed {
    /// Its values are in the stream; the aggregation goes on.
    Values,
    /// It failed: its failure messages and its LAST, with its code, are in
    /// the stream, which that LAST ends.
    Ended,
    /// Malformed, or past [`AGGREGATE_OUTPUT_MAX`]: the stream still needs
    /// its end.
    Broken,
}

/// Calls `visit` with each message of a part's stream (its frames of
/// messages) and the message's bytes, until `visit` breaks, the stream
/// ends, or it is malformed.
fn walk_part<'a>(
    frames: &'a [u8],
    mut visit: impl FnMut(&Message<'a>, &'a [u8]) -> std::ops::ControlFlow<()>,
) {
    use citrine_wire::frame::{ProtoHeader, PROTO_HEADER_SIZE};
    let mut rest = frames;
    while let Some((head, after)) = rest.split_first_chunk::<PROTO_HEADER_SIZE>() {
        let Ok(header) = ProtoHeader::decode(head) else {
            return;
        };
        let Some((mut messages, next)) = usize::try_from(header.size)
            .ok()
            .and_then(|size| after.split_at_checked(size))
        else {
            return;
        };
        rest = next;
        while !messages.is_empty() {
            let Ok((message, used)) = Message::decode_prefix(messages) else {
                return;
            };
            let Some((bytes, later)) = messages.split_at_checked(used) else {
                return;
            };
            if visit(&message, bytes).is_break() {
                return;
            }
            messages = later;
        }
    }
}

/// The result code of the LAST message ending a part's stream; `None`
/// when the stream is malformed or has no LAST.
fn part_end(frames: &[u8]) -> Option<u8> {
    let mut end = None;
    walk_part(frames, |message, _| {
        if message.header.info3 & info3::LAST == 0 {
            return std::ops::ControlFlow::Continue(());
        }
        end = Some(message.header.result_code);
        std::ops::ControlFlow::Break(())
    });
    end
}

/// Copies a part's stream (its frames of messages) into `out` as one frame:
/// its values, and its LAST only when that carries a failure.
fn relay_part(frames: &[u8], out: &mut Vec<u8>, sent: &mut usize) -> Relayed {
    use std::ops::ControlFlow::{Break, Continue};
    let frame_start = out.len();
    out.extend_from_slice(&[0u8; citrine_wire::frame::PROTO_HEADER_SIZE]);
    let mut outcome = Relayed::Broken;
    walk_part(frames, |message, bytes| {
        if message.header.info3 & info3::LAST != 0 {
            outcome = if message.header.result_code == ResultCode::Ok.code() {
                Relayed::Values
            } else {
                out.extend_from_slice(bytes);
                Relayed::Ended
            };
            return Break(());
        }
        *sent += bytes.len();
        if *sent > AGGREGATE_OUTPUT_MAX {
            return Break(());
        }
        out.extend_from_slice(bytes);
        Continue(())
    });
    close_frame(out, frame_start);
    outcome
}

/// Writes an aggregation's failure: a message of result 100 with a bin
/// `FAILURE`, then LAST carrying 100.
fn write_aggregate_failure(out: &mut Vec<u8>, error: &UdfError) {
    tracing::debug!("aggregation failed: {error}");
    let header = MsgHeader {
        result_code: ResultCode::UdfExecution.code(),
        ..MsgHeader::default()
    };
    let text = error.to_string();
    let mut writer = MessageWriter::begin(out, &header);
    writer.op(
        op_type::READ,
        ParticleType::String as u8,
        b"FAILURE",
        text.as_bytes(),
    );
    writer.finish();
    transaction::write_stream_end(out, ResultCode::UdfExecution);
}

/// The records of one frame of a scan's stream (its record messages; the
/// partition-done and LAST messages carry none) as a stream UDF sees them.
/// True (and the records so far) when the frame reports a partition
/// unavailable: one this node stopped serving while it walked it.
fn records_of(
    frame: &[u8],
    now: Now,
    into: &mut std::collections::VecDeque<citrine_udf::RecordIn<'static>>,
) -> bool {
    let mut rest = frame
        .get(citrine_wire::frame::PROTO_HEADER_SIZE..)
        .unwrap_or_default();
    while !rest.is_empty() {
        let Ok((message, used)) = Message::decode_prefix(rest) else {
            return false;
        };
        rest = rest.get(used..).unwrap_or_default();
        let header = message.header;
        if header.info3 & citrine_wire::msg::info3::PARTITION_DONE != 0 && header.result_code != 0 {
            return true;
        }
        if header.result_code != 0
            || header.info3
                & (citrine_wire::msg::info3::LAST | citrine_wire::msg::info3::PARTITION_DONE)
                != 0
        {
            continue;
        }
        let mut digest = [0u8; 20];
        if let Some(bytes) = message.field(field_type::DIGEST) {
            if bytes.len() == digest.len() {
                digest.copy_from_slice(bytes);
            }
        }
        let bins = message
            .ops()
            .filter_map(|op| {
                let value = citrine_udf::bin_value(op.particle_type, op.value)?;
                Some((Cow::Owned(op.name.to_vec()), value))
            })
            .collect();
        into.push_back(citrine_udf::RecordIn {
            exists: true,
            bins,
            generation: u16::try_from(header.generation).unwrap_or(u16::MAX),
            ttl: match header.record_ttl {
                0 => -1,
                void_time => i64::from(void_time.saturating_sub(now.citrusleaf_seconds)),
            },
            last_update_ms: 0,
            digest,
            set: Cow::Owned(message.field(field_type::SET).unwrap_or_default().to_vec()),
            key: message
                .field(field_type::KEY)
                .and_then(|field| transaction::parse_key(field).ok())
                .and_then(|(particle_type, bytes)| key_value(particle_type, bytes)),
            size: 0,
        });
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::tests::decode_stream;

    /// A part's stream: one value frame, then (in a frame of its own) LAST
    /// with `code`, after a failure message when `code` is not 0.
    fn part_stream(code: ResultCode) -> Vec<u8> {
        let mut stream = Vec::new();
        let mut writer = MessageWriter::begin(&mut stream, &MsgHeader::default());
        writer.op(
            op_type::READ,
            ParticleType::Integer as u8,
            b"SUCCESS",
            &7i64.to_be_bytes(),
        );
        writer.finish();
        if code == ResultCode::UdfExecution {
            write_aggregate_failure(&mut stream, &UdfError::Execution("boom".into()));
        } else {
            transaction::write_stream_end(&mut stream, code);
        }
        stream
    }

    #[test]
    fn a_parts_values_are_relayed_and_its_failure_ends_the_stream() {
        let mut sent = 0;
        let mut out = Vec::new();
        assert!(matches!(
            relay_part(&part_stream(ResultCode::Ok), &mut out, &mut sent),
            Relayed::Values
        ));
        let messages = decode_stream(&out).0;
        assert_eq!(messages.len(), 1, "the value, not LAST");
        assert_eq!(messages[0].bin("SUCCESS"), Some(&7i64.to_be_bytes()[..]));
        assert!(sent > 0);
        for code in [ResultCode::UdfExecution, ResultCode::QueryQueueFull] {
            let mut out = Vec::new();
            assert!(matches!(
                relay_part(&part_stream(code), &mut out, &mut sent),
                Relayed::Ended
            ));
            let messages = decode_stream(&out).0;
            let last = messages.last().expect("LAST");
            assert_eq!(
                (last.header.info3, last.header.result_code),
                (info3::LAST, code.code())
            );
        }
        // Cut short, or without LAST: the stream still needs its end.
        let whole = part_stream(ResultCode::Ok);
        for cut in [&whole[..whole.len() - 3], &whole[..30], &[][..]] {
            let mut out = Vec::new();
            assert!(matches!(
                relay_part(cut, &mut out, &mut sent),
                Relayed::Broken
            ));
        }
    }
}
