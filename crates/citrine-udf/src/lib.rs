//! User-defined functions (UDFs): Lua modules that clients register and
//! then call on one record ("record UDFs", `execute` / batch UDF rows /
//! background UDF jobs) or on the records a query selects ("stream UDFs",
//! aggregations).
//!
//! Owns:
//! - [`Registry`]: a node's modules (file name → source and its SHA-1),
//!   with a generation that moves on every change; the server fills it from
//!   `udf-put` / `udf-remove` and from the cluster's shared copy;
//! - [`check`]: compiling a module before it is accepted;
//! - [`apply_record`]: calling a function of a module on one record and
//!   saying what it returned and what it did to the record (nothing, a new
//!   set of bins, or a removal) — the caller stores that under the record's
//!   partition lock like any other write;
//! - [`aggregate`]: running a stream UDF over records the caller feeds one
//!   at a time, and returning the values the stream emits on this node.
//!
//! Sandbox (`runtime`): one Lua 5.4 state per thread and registry
//! generation, with Lua's base, string, table, math and utf8 libraries and
//! the API of `prelude.lua`; no `io`, `os`, `package`, `debug`,
//! `coroutine`, `load` or `dofile`. `require(name)` loads another
//! registered module (source only), once per state. Each module runs in an
//! environment of its own.
//! A state may use at most [`MEMORY_LIMIT`] bytes, and a call stops with an
//! error once it runs past its time limit (checked every
//! [`HOOK_INSTRUCTIONS`] Lua instructions), so a UDF that loops forever
//! fails instead of holding a service thread.
//!
//! Values cross between Lua and the record model as
//! [`citrine_cdt::value::Value`]s (`convert`). A UDF's changes reach the
//! record only through `aerospike:create` / `aerospike:update` (the bins as
//! they were at the last such call) or `aerospike:remove`; a UDF that
//! fails changes nothing.

mod convert;
mod runtime;

pub use convert::{bin_value, particle_of};

use citrine_cdt::value::Value;
use parking_lot::RwLock;
use sha1::{Digest as _, Sha1};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The most memory one Lua state may hold.
pub const MEMORY_LIMIT: usize = 64 << 20;

/// How many Lua instructions run between two checks of the time limit.
pub const HOOK_INSTRUCTIONS: u32 = 10_000;

/// The longest a module's source may be.
pub const MODULE_SIZE_MAX: usize = 1 << 20;

/// Deepest nesting of lists and maps a UDF may return or be given.
pub const DEPTH_MAX: usize = 64;

/// One registered module.
#[derive(Debug)]
pub struct Module {
    /// The file name clients use (`name.lua`).
    pub filename: String,
    /// Lua source.
    pub source: Vec<u8>,
    /// SHA-1 of the source, lower-case hex (what `udf-list` shows).
    pub hash: String,
}

impl Module {
    /// A module with its hash computed.
    pub fn new(filename: &str, source: Vec<u8>) -> Module {
        let digest = Sha1::digest(&source);
        let hash = digest.iter().map(|byte| format!("{byte:02x}")).collect();
        Module {
            filename: filename.to_owned(),
            source,
            hash,
        }
    }
}

/// A node's modules. Cheap to read; every change moves the generation, so
/// each thread's Lua state knows when to load the modules again.
#[derive(Debug)]
pub struct Registry {
    /// Tells registries apart in a thread's cache (tests run several
    /// nodes in one process).
    id: u64,
    modules: RwLock<BTreeMap<String, Arc<Module>>>,
    generation: AtomicU64,
}

impl Default for Registry {
    fn default() -> Registry {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Registry {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            modules: RwLock::new(BTreeMap::new()),
            generation: AtomicU64::new(0),
        }
    }
}

impl Registry {
    /// Adds or replaces a module (already [`check`]ed). Returns whether
    /// anything changed.
    pub fn put(&self, module: Module) -> bool {
        let mut modules = self.modules.write();
        if modules
            .get(&module.filename)
            .is_some_and(|known| known.source == module.source)
        {
            return false;
        }
        modules.insert(module.filename.clone(), Arc::new(module));
        self.generation.fetch_add(1, Ordering::Release);
        true
    }

    /// Removes a module. Returns whether it was there.
    pub fn remove(&self, filename: &str) -> bool {
        let removed = self.modules.write().remove(filename).is_some();
        if removed {
            self.generation.fetch_add(1, Ordering::Release);
        }
        removed
    }

    /// One module by file name.
    pub fn get(&self, filename: &str) -> Option<Arc<Module>> {
        self.modules.read().get(filename).cloned()
    }

    /// Every module, by file name.
    pub fn list(&self) -> Vec<Arc<Module>> {
        self.modules.read().values().cloned().collect()
    }

    /// Moves on every change.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn id(&self) -> u64 {
        self.id
    }
}

/// Why a module's source was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileError {
    /// The line Lua names, if it names one.
    pub line: Option<u32>,
    pub message: String,
}

/// Compiles `source` (without running it) as the module `filename`.
pub fn check(filename: &str, source: &[u8]) -> Result<(), CompileError> {
    if source.len() > MODULE_SIZE_MAX {
        return Err(CompileError {
            line: None,
            message: format!("a module may hold at most {MODULE_SIZE_MAX} bytes"),
        });
    }
    runtime::compile(filename, source).map_err(|message| {
        let line = error_line(filename, &message);
        // Lua's "name.lua:3: syntax error ..." without the place, which
        // the error names apart.
        let message = match line {
            Some(line) => message
                .strip_prefix(&format!("{filename}:{line}: "))
                .map_or(message.clone(), str::to_owned),
            None => message,
        };
        CompileError { line, message }
    })
}

/// The line number in a Lua message `"name.lua:12: ..."`.
fn error_line(filename: &str, message: &str) -> Option<u32> {
    let rest = message.split_once(&format!("{filename}:"))?.1;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Which function to call, with what.
#[derive(Clone, Debug)]
pub struct Call<'a> {
    /// The module's name as clients send it (no `.lua`).
    pub module: &'a str,
    pub function: &'a str,
    pub args: Cow<'a, [Value]>,
    /// The call fails once it has run this long.
    pub time_limit: Duration,
}

/// Why a UDF call failed: every case answers 100 (UDF error) with this
/// message in the `FAILURE` bin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UdfError {
    /// No module of that name is registered.
    ModuleNotFound(String),
    /// The module has no such function.
    FunctionNotFound(String),
    /// The module did not load, the function raised an error, ran past its
    /// time limit or memory, or returned something that is not a value.
    Execution(String),
}

impl std::fmt::Display for UdfError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // The reference's words for a module it cannot load (the
            // name stays in the value).
            UdfError::ModuleNotFound(_) => f.write_str("UDF: Execution Error 1"),
            // The reference's exact words (its Lua prelude raises them),
            // which clients compare against; the name stays in the value.
            UdfError::FunctionNotFound(_) => f.write_str("function not found"),
            UdfError::Execution(message) => f.write_str(message),
        }
    }
}

/// A record as a record UDF sees it.
#[derive(Clone, Debug, Default)]
pub struct RecordIn<'a> {
    pub exists: bool,
    /// Bin names and values.
    pub bins: Vec<(Cow<'a, [u8]>, Value)>,
    pub generation: u16,
    /// Seconds left to live; -1 when the record never expires (0 when it
    /// does not exist).
    pub ttl: i64,
    /// Milliseconds since the Unix epoch.
    pub last_update_ms: u64,
    pub digest: [u8; 20],
    pub set: Cow<'a, [u8]>,
    /// The key stored with the record (or sent with the request).
    pub key: Option<Value>,
    /// Stored size in bytes.
    pub size: u64,
}

/// What a record UDF did to its record.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// Nothing: no create, update or remove took effect.
    None,
    /// Store these bins (the whole record), with this TTL if the UDF set
    /// one (`record.set_ttl`).
    Write {
        bins: Vec<(Vec<u8>, Value)>,
        ttl: Option<i64>,
        /// `record.drop_key`: store the record without its key.
        drop_key: bool,
    },
    /// Remove the record.
    Remove,
}

/// A record UDF's outcome.
#[derive(Clone, Debug)]
pub struct Applied {
    /// What the function returned (`Value::Nil` for nothing).
    pub result: Value,
    pub change: Change,
}

/// Calls `call.function` of `call.module` on `record`.
pub fn apply_record(
    registry: &Registry,
    call: &Call<'_>,
    record: RecordIn<'_>,
) -> Result<Applied, UdfError> {
    runtime::apply_record(registry, call, record)
}

/// A stream UDF (an aggregation) run step by step: [`Aggregation::new`]
/// calls the module's function to build its stream, [`Aggregation::record`]
/// sends one record through it, [`Aggregation::take`] hands over the
/// values emitted so far (one per record that passes a stream of filters
/// and maps), and [`Aggregation::end`] ends the stream and hands over the
/// rest (the accumulated value of a stream that aggregates or reduces). The
/// records are read-only.
///
/// An aggregation owns a Lua state of its own (not the thread's), so it can
/// be stepped from any thread, one step at a time; each step may run for
/// the call's time limit.
pub use runtime::Aggregation;

/// Runs the stream UDF `call` over the records `next` yields (until it
/// yields `None`) and hands `emit` every value it emits (see
/// [`Aggregation`]).
pub fn aggregate<'r>(
    registry: &Registry,
    call: &Call<'_>,
    next: &mut dyn FnMut() -> Option<RecordIn<'r>>,
    emit: &mut dyn FnMut(Value) -> Result<(), String>,
) -> Result<(), UdfError> {
    let mut aggregation = Aggregation::new(registry, call)?;
    while let Some(record) = next() {
        aggregation.record(&record)?;
        aggregation.take(emit)?;
    }
    aggregation.end(emit)
}

#[cfg(test)]
mod tests;
