//! The Lua states UDFs run in: one per thread, for one registry at one
//! generation, built on first use and rebuilt when the registry changes.
//!
//! Owns: the sandbox (which libraries and globals a module sees), loading
//! modules into environments of their own, the time limit (an instruction
//! hook that fails the call past its deadline) and the memory limit, and
//! the two ways in: a record call and a stream.
//!
//! A record UDF call is one call into Lua (the prelude's `apply`, which
//! builds the record, calls the function and reports what it asked for):
//! each step Rust takes through mlua is a protected call of its own, so the
//! record's metadata, bins and the call's arguments go over as the
//! arguments of that one call, and the names that recur from call to call
//! (function, set and bin names, short string arguments) are Lua strings
//! made once per state ([`Names`]). A stream's records go in the same way
//! (`push_record`).
//!
//! Invariants: a state is only touched by its thread (`thread_local`);
//! nothing is kept between calls but the loaded modules, the prelude and
//! the cached names (immutable strings); after a call that failed, the
//! state is dropped (a half-run module or an exhausted memory budget must
//! not leak into the next call).

use crate::convert::{from_lua, to_lua, Budget, Metatables};
use crate::{Applied, Call, Change, RecordIn, Registry, UdfError, HOOK_INSTRUCTIONS, MEMORY_LIMIT};
use citrine_cdt::value::Value;
use mlua::chunk::ChunkMode;
use mlua::{
    HookTriggers, IntoLuaMulti, Lua, LuaOptions, LuaString, MultiValue, StdLib, Table,
    Value as LuaValue, VmState,
};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::Instant;

const PRELUDE: &str = include_str!("prelude.lua");

/// The ways in that run once per record (see the file).
const ENTRY: &str = include_str!("entry.lua");

/// The slots of a record's state in Lua, in the order
/// [`RecordHead::slots`] passes them: its bins (name -> value), whether it
/// exists, whether it is read-only (a stream UDF's), generation, TTL,
/// last-update time, size, set name, key, digest (three integers: bytes
/// 1-8 and 9-16 little-endian, then 17-20) and the digest as Bytes once
/// asked for, then what the UDF asked for: the bins committed by its last
/// create or update (false: none), whether it removed the record, the TTL
/// it set (false: none) and whether it dropped the key. Lua constants, put
/// in front of the first line of [`PRELUDE`] and [`ENTRY`] (no line added:
/// the line numbers in messages stay the files').
const SLOTS: &str = "local BINS <const>, EXISTS <const>, READONLY <const>, GEN <const>, \
    TTL <const>, LAST_UPDATE <const>, SIZE <const>, SET <const>, KEY <const>, \
    DIGEST_1 <const>, DIGEST_2 <const>, DIGEST_3 <const>, DIGEST <const>, \
    COMMITTED <const>, REMOVED <const>, TTL_SET <const>, DROP_KEY <const> = \
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17; ";

/// The longest string [`Names`] keeps.
const NAME_LEN_MAX: usize = 64;

/// How many strings [`Names`] keeps (a power of two).
const NAME_SLOTS: usize = 256;

/// Globals of the base library a module may not use.
/// (The prelude keeps `load` for itself, text only, for `require`.)
const REMOVED_GLOBALS: &[&str] = &["dofile", "loadfile", "require", "collectgarbage"];

struct State {
    registry: u64,
    generation: u64,
    lua: Lua,
    internal: Table,
    meta: Metatables,
    /// The prelude's `apply`.
    apply: mlua::Function,
    names: Names,
    /// The values a call passes after its first few (kept: no allocation
    /// per call).
    values: MultiValue,
    /// Module environments by module name.
    modules: HashMap<String, Table>,
}

/// Lua strings for the short byte strings calls repeat (function, set and
/// bin names, string arguments), made once per state: making a string
/// through mlua is a protected call, finding it here a hash and a compare.
/// [`NAME_SLOTS`] slots, each holding the last string of at most
/// [`NAME_LEN_MAX`] bytes whose hash chose it (a collision costs a new
/// string, never a search). Lua strings are immutable, so a kept one is the
/// same value as a new one.
struct Names {
    slots: Vec<Option<(Box<[u8]>, LuaString)>>,
}

impl Default for Names {
    fn default() -> Names {
        Names {
            slots: vec![None; NAME_SLOTS],
        }
    }
}

impl Names {
    /// `bytes` as a Lua string.
    fn get(&mut self, lua: &Lua, bytes: &[u8]) -> mlua::Result<LuaString> {
        if bytes.len() > NAME_LEN_MAX {
            return lua.create_string(bytes);
        }
        // FNV-1a.
        let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
        });
        let slot = &mut self.slots[(hash as usize) & (NAME_SLOTS - 1)];
        if let Some((known, string)) = slot {
            if **known == *bytes {
                return Ok(string.clone());
            }
        }
        let string = lua.create_string(bytes)?;
        *slot = Some((bytes.into(), string.clone()));
        Ok(string)
    }
}

thread_local! {
    static STATE: RefCell<Option<State>> = const { RefCell::new(None) };
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

fn lua_error(error: mlua::Error) -> UdfError {
    UdfError::Execution(message_of(&error))
}

/// A Lua error's message without mlua's decorations.
fn message_of(error: &mlua::Error) -> String {
    match error {
        mlua::Error::RuntimeError(message) | mlua::Error::SyntaxError { message, .. } => message
            .split_once("\nstack traceback:")
            .map_or(message.as_str(), |(head, _)| head)
            .to_owned(),
        mlua::Error::MemoryError(_) => "UDF ran out of memory".to_owned(),
        mlua::Error::CallbackError { cause, .. } => message_of(cause),
        mlua::Error::WithContext { cause, .. } => message_of(cause),
        other => other.to_string(),
    }
}

/// A sandboxed state with the prelude loaded.
fn new_lua(registry: &Registry) -> mlua::Result<(Lua, Table, Metatables)> {
    let lua = Lua::new_with(
        StdLib::TABLE | StdLib::STRING | StdLib::MATH | StdLib::UTF8,
        LuaOptions::default(),
    )?;
    lua.set_memory_limit(MEMORY_LIMIT)?;
    // Each call makes a few short-lived tables: a generational collector
    // frees them in its minor collections.
    lua.gc_set_mode(mlua::state::GcMode::Generational(
        mlua::state::GcGenParams::default(),
    ));
    let globals = lua.globals();
    for name in REMOVED_GLOBALS {
        globals.raw_set(*name, LuaValue::Nil)?;
    }
    lua.set_hook(
        HookTriggers::new().every_nth_instruction(HOOK_INSTRUCTIONS),
        |_, _| match DEADLINE.get() {
            Some(deadline) if Instant::now() > deadline => Err(mlua::Error::runtime(
                "UDF execution ran past its time limit",
            )),
            _ => Ok(VmState::Continue),
        },
    )?;
    let log = lua.create_function(|_, (level, text): (i64, mlua::LuaString)| {
        let text = text.to_string_lossy();
        match level {
            1 => tracing::warn!(target: "citrine_udf", "{text}"),
            2 => tracing::info!(target: "citrine_udf", "{text}"),
            3 => tracing::debug!(target: "citrine_udf", "{text}"),
            _ => tracing::trace!(target: "citrine_udf", "{text}"),
        }
        Ok(())
    })?;
    // Whether the running call is past its deadline (the prelude's pcall
    // rethrows the time limit's error then).
    let expired = lua.create_function(|_, ()| {
        Ok(DEADLINE
            .get()
            .is_some_and(|deadline| Instant::now() > deadline))
    })?;
    let internal: Table = lua
        .load(format!("{SLOTS}{PRELUDE}"))
        .set_name("=citrine-prelude")
        .set_mode(ChunkMode::Text)
        .call((log, expired, entry(&lua)?))?;
    let meta = metatables(&internal)?;
    set_sources(&lua, &internal, registry)?;
    Ok((lua, internal, meta))
}

/// The prelude's metatables and the functions Rust calls on values.
fn metatables(internal: &Table) -> mlua::Result<Metatables> {
    Ok(Metatables {
        list: internal.get("List")?,
        map: internal.get("Map")?,
        bytes: internal.get("Bytes")?,
        geojson: internal.get("GeoJSON")?,
        record: internal.get("Record")?,
        stream_record: internal.get("StreamRecord")?,
        record_bins: internal.get("bins")?,
        set_length: internal.get("set_length")?,
        length: internal.get("length")?,
        order_flags: internal.get("order_flags")?,
        set_order_flags: internal.get("set_order_flags")?,
    })
}

/// Hands the prelude the registered modules' sources, for `require` (a
/// state is rebuilt whenever the registry changes).
fn set_sources(lua: &Lua, internal: &Table, registry: &Registry) -> mlua::Result<()> {
    let sources = lua.create_table()?;
    for module in registry.list() {
        // Only `.lua` modules load, as the reference's Lua module cache
        // takes only those.
        if let Some(name) = module.filename.strip_suffix(".lua") {
            sources.raw_set(name, lua.create_string(&module.source)?)?;
        }
    }
    let set_sources: mlua::Function = internal.get("set_sources")?;
    set_sources.call::<()>(sources)
}

/// [`ENTRY`], compiled, then loaded again from its bytecode without debug
/// information. (The only binary chunk a state loads: made here, by this
/// Lua, from this source; a module's source is always text. `dump` panics
/// only when the stack cannot grow by a few slots, which a new state's
/// can.)
fn entry(lua: &Lua) -> mlua::Result<mlua::Function> {
    let compiled = lua
        .load(format!("{SLOTS}{ENTRY}"))
        .set_name("=citrine-entry")
        .set_mode(ChunkMode::Text)
        .into_function()?;
    let stripped = compiled.dump(true);
    lua.load(&stripped[..])
        .set_name("=citrine-entry")
        .set_mode(ChunkMode::Binary)
        .into_function()
}

/// Compiles a module's source without running it.
pub(crate) fn compile(filename: &str, source: &[u8]) -> Result<(), String> {
    let lua = Lua::new_with(StdLib::NONE, LuaOptions::default()).map_err(|e| message_of(&e))?;
    lua.load(source)
        .set_name(format!("@{filename}"))
        // Source only: Lua does not check bytecode, so a binary chunk
        // could break the server's memory.
        .set_mode(ChunkMode::Text)
        .into_function()
        .map(drop)
        .map_err(|error| message_of(&error))
}

/// Runs `work` with this thread's state for `registry` (built or rebuilt
/// as needed) and a deadline; drops the state when `work` fails.
fn with_state<R>(
    registry: &Registry,
    deadline: Instant,
    work: impl FnOnce(&mut State) -> Result<R, UdfError>,
) -> Result<R, UdfError> {
    STATE.with(|cell| {
        let mut slot = cell.borrow_mut();
        let generation = registry.generation();
        let current = slot
            .as_ref()
            .is_some_and(|state| state.registry == registry.id() && state.generation == generation);
        if !current {
            *slot = None;
            *slot = Some(State::new(registry, generation).map_err(lua_error)?);
        }
        let Some(state) = slot.as_mut() else {
            return Err(UdfError::Execution("no Lua state".to_owned()));
        };
        DEADLINE.set(Some(deadline));
        let outcome = work(state);
        DEADLINE.set(None);
        if outcome.is_err() {
            *slot = None;
        }
        outcome
    })
}

impl State {
    /// A state for `registry` at `generation`, no module loaded yet.
    fn new(registry: &Registry, generation: u64) -> mlua::Result<State> {
        let (lua, internal, meta) = new_lua(registry)?;
        Ok(State {
            registry: registry.id(),
            generation,
            apply: internal.get("apply")?,
            lua,
            internal,
            meta,
            names: Names::default(),
            values: MultiValue::new(),
            modules: HashMap::new(),
        })
    }

    /// The environment of `module`, loading the module first if needed.
    fn environment(&mut self, registry: &Registry, module: &str) -> Result<Table, UdfError> {
        if let Some(env) = self.modules.get(module) {
            return Ok(env.clone());
        }
        let filename = format!("{module}.lua");
        let source = registry
            .get(&filename)
            .ok_or_else(|| UdfError::ModuleNotFound(module.to_owned()))?;
        // An environment of its own: what it changes stays in it.
        let environment: mlua::Function = self.internal.get("environment").map_err(lua_error)?;
        let env: Table = environment.call(()).map_err(lua_error)?;
        self.lua
            .load(&source.source[..])
            .set_name(format!("@{filename}"))
            .set_mode(ChunkMode::Text)
            .set_environment(env.clone())
            .exec()
            .map_err(lua_error)?;
        self.modules.insert(module.to_owned(), env.clone());
        Ok(env)
    }

    /// Calls the prelude's `apply` for `call` on `record` (its module
    /// already loaded into `env`).
    fn apply(
        &mut self,
        env: Table,
        call: &Call<'_>,
        record: &RecordIn<'_>,
    ) -> mlua::Result<Outcome> {
        let (lua, meta, names) = (&self.lua, &self.meta, &mut self.names);
        let name = names.get(lua, call.function.as_bytes())?;
        let head = RecordHead::new(lua, meta, names, record)?;
        let values = &mut self.values;
        values.clear();
        for arg in call.args.iter() {
            values.push_back(match arg {
                Value::Str(text) => LuaValue::String(names.get(lua, text)?),
                other => to_lua(lua, meta, other)?,
            });
        }
        push_bins(lua, meta, names, record, values)?;
        let outcome = self.apply.call((
            env,
            name,
            call.args.len(),
            record.bins.len(),
            head.slots(false, &self.values),
        ));
        self.values.clear();
        outcome
    }
}

/// What a record's state holds besides its bins, made ready for Lua.
struct RecordHead {
    exists: bool,
    generation: u16,
    ttl: i64,
    last_update_ms: u64,
    size: u64,
    set: LuaString,
    key: LuaValue,
    /// The digest as three integers: bytes 1-8 and 9-16 little-endian,
    /// then 17-20.
    digest: [i64; 3],
}

impl RecordHead {
    fn new(
        lua: &Lua,
        meta: &Metatables,
        names: &mut Names,
        record: &RecordIn<'_>,
    ) -> mlua::Result<RecordHead> {
        let mut words = [[0u8; 8]; 3];
        words[0].copy_from_slice(&record.digest[..8]);
        words[1].copy_from_slice(&record.digest[8..16]);
        words[2][..4].copy_from_slice(&record.digest[16..]);
        Ok(RecordHead {
            exists: record.exists,
            generation: record.generation,
            ttl: record.ttl,
            last_update_ms: record.last_update_ms,
            size: record.size,
            set: names.get(lua, &record.set)?,
            key: match &record.key {
                Some(key) => to_lua(lua, meta, key)?,
                None => LuaValue::Nil,
            },
            digest: words.map(i64::from_le_bytes),
        })
    }

    /// The [`SLOTS`] of the record's state, in order (its bins false:
    /// `apply` and `push_record` fill them in; the digest as Bytes and the
    /// outcome false: nothing yet), then `rest` (the call's arguments and
    /// the bins as name, value pairs). Typed values, pushed straight onto
    /// Lua's stack.
    fn slots<R: IntoLuaMulti>(self, readonly: bool, rest: R) -> impl IntoLuaMulti {
        let [digest_1, digest_2, digest_3] = self.digest;
        (
            false,
            self.exists,
            readonly,
            self.generation,
            self.ttl,
            self.last_update_ms,
            self.size,
            self.set,
            self.key,
            digest_1,
            digest_2,
            digest_3,
            (false, false, false, false, false, rest),
        )
    }
}

/// `record`'s bins as name, value pairs.
fn push_bins(
    lua: &Lua,
    meta: &Metatables,
    names: &mut Names,
    record: &RecordIn<'_>,
    values: &mut MultiValue,
) -> mlua::Result<()> {
    for (name, value) in &record.bins {
        values.push_back(LuaValue::String(names.get(lua, name)?));
        values.push_back(to_lua(lua, meta, value)?);
    }
    Ok(())
}

/// See [`crate::apply_record`].
pub(crate) fn apply_record(
    registry: &Registry,
    call: &Call<'_>,
    record: RecordIn<'_>,
) -> Result<Applied, UdfError> {
    let deadline = Instant::now() + call.time_limit;
    with_state(registry, deadline, |state| {
        let env = state.environment(registry, call.module)?;
        let outcome = state.apply(env, call, &record).map_err(lua_error)?;
        applied(&state.meta, call, outcome, record.exists)
    })
}

/// What `apply` returns: false (no such function), or true, the result,
/// whether the record was removed, the TTL set, whether the key was
/// dropped, and the bins committed (false: none).
type Outcome = (bool, LuaValue, bool, LuaValue, bool, LuaValue);

/// The call's result and change from what `apply` returned.
fn applied(
    meta: &Metatables,
    call: &Call<'_>,
    outcome: Outcome,
    existed: bool,
) -> Result<Applied, UdfError> {
    let (found, returned, removed, ttl_set, drop_key, committed) = outcome;
    if !found {
        return Err(UdfError::FunctionNotFound(call.function.to_owned()));
    }
    let ttl = match ttl_set {
        LuaValue::Integer(ttl) => Some(ttl),
        LuaValue::Number(ttl) => Some(ttl as i64),
        _ => None,
    };
    let result = from_lua(meta, &returned, 0, &mut Budget::new()).map_err(UdfError::Execution)?;
    let change = match committed {
        LuaValue::Table(bins) => Change::Write {
            bins: committed_bins(meta, &bins)?,
            ttl,
            drop_key,
        },
        _ if removed && existed => Change::Remove,
        _ => Change::None,
    };
    Ok(Applied { result, change })
}

/// The bins a UDF committed, by name.
fn committed_bins(meta: &Metatables, bins: &Table) -> Result<Vec<(Vec<u8>, Value)>, UdfError> {
    let mut out = Vec::new();
    let mut budget = Budget::new();
    let mut failure = None;
    bins.for_each(|name: LuaValue, value: LuaValue| {
        let LuaValue::String(name) = name else {
            failure = Some(format!(
                "a bin name must be a string, not a {}",
                name.type_name()
            ));
            return Err(mlua::Error::runtime("stop"));
        };
        match from_lua(meta, &value, 0, &mut budget) {
            Ok(Value::Nil) => {}
            Ok(value) => out.push((name.as_bytes().to_vec(), value)),
            Err(message) => {
                failure = Some(message);
                return Err(mlua::Error::runtime("stop"));
            }
        }
        Ok(())
    })
    .map_err(|error| UdfError::Execution(failure.take().unwrap_or_else(|| message_of(&error))))?;
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// See [`crate::Aggregation`].
pub struct Aggregation {
    lua: Lua,
    meta: Metatables,
    names: Names,
    stream: Table,
    push_record: mlua::Function,
    take: mlua::Function,
    finish: mlua::Function,
    /// Makes an empty stream (for [`Aggregation::restart`]).
    new_stream: mlua::Function,
    /// The module's function, called with a new stream and `args`.
    function: mlua::Function,
    /// The call's arguments after the stream, converted anew for each
    /// stream (a function that changes a table argument changes only its
    /// own stream's copy).
    args: Vec<Value>,
    /// How long each step may run.
    step_limit: std::time::Duration,
}

impl std::fmt::Debug for Aggregation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Aggregation").finish_non_exhaustive()
    }
}

/// Runs `work` with the calling thread's deadline set `limit` from now.
fn with_deadline<R>(limit: std::time::Duration, work: impl FnOnce() -> R) -> R {
    DEADLINE.set(Some(Instant::now() + limit));
    let result = work();
    DEADLINE.set(None);
    result
}

impl Aggregation {
    /// Builds the stream of `call`.
    pub fn new(registry: &Registry, call: &Call<'_>) -> Result<Aggregation, UdfError> {
        // A state of its own, not the thread's: the stream outlives this
        // call and may be stepped on another thread.
        let mut state = State::new(registry, registry.generation()).map_err(lua_error)?;
        with_deadline(call.time_limit, || {
            let env = state.environment(registry, call.module)?;
            let function = match env.get::<LuaValue>(call.function).map_err(lua_error)? {
                LuaValue::Function(function) => function,
                _ => return Err(UdfError::FunctionNotFound(call.function.to_owned())),
            };
            let new_stream: mlua::Function = state.internal.get("stream").map_err(lua_error)?;
            let State {
                lua,
                internal,
                meta,
                names,
                ..
            } = state;
            let stream = lua.create_table().map_err(lua_error)?;
            let mut aggregation = Aggregation {
                push_record: internal.get("push_record").map_err(lua_error)?,
                take: internal.get("take").map_err(lua_error)?,
                finish: internal.get("finish").map_err(lua_error)?,
                lua,
                meta,
                names,
                stream,
                new_stream,
                function,
                args: call.args.to_vec(),
                step_limit: call.time_limit,
            };
            aggregation.begin()?;
            Ok(aggregation)
        })
    }

    /// Builds a new stream: an empty one, through the module's function.
    fn begin(&mut self) -> Result<(), UdfError> {
        let stream: Table = self.new_stream.call(()).map_err(lua_error)?;
        let mut values = Vec::with_capacity(self.args.len() + 1);
        values.push(LuaValue::Table(stream.clone()));
        for arg in &self.args {
            values.push(to_lua(&self.lua, &self.meta, arg).map_err(lua_error)?);
        }
        self.function
            .call::<LuaValue>(MultiValue::from_vec(values))
            .map_err(lua_error)?;
        self.stream = stream;
        Ok(())
    }

    /// Ends the current stream, handing `emit` what it emits at its end
    /// (as [`Aggregation::end`]), and starts a new one of the same call:
    /// one aggregation run over several groups of records (the reference
    /// runs a stream per partition and leaves the final reduce to the
    /// client).
    pub fn restart(
        &mut self,
        emit: &mut dyn FnMut(Value) -> Result<(), String>,
    ) -> Result<(), UdfError> {
        with_deadline(self.step_limit, || {
            self.finish_stream(emit)?;
            self.begin()
        })
    }

    /// Ends the current stream and hands `emit` what it emits at its end
    /// (under the caller's deadline).
    fn finish_stream(
        &self,
        emit: &mut dyn FnMut(Value) -> Result<(), String>,
    ) -> Result<(), UdfError> {
        let out: Table = self.finish.call(self.stream.clone()).map_err(lua_error)?;
        self.emit_all(out, emit)
    }

    /// Sends one record (read-only) through the stream.
    pub fn record(&mut self, record: &RecordIn<'_>) -> Result<(), UdfError> {
        let mut values = MultiValue::with_capacity(2 * record.bins.len());
        with_deadline(self.step_limit, || {
            let (lua, meta, names) = (&self.lua, &self.meta, &mut self.names);
            let head = RecordHead::new(lua, meta, names, record)?;
            push_bins(lua, meta, names, record, &mut values)?;
            self.push_record
                .call::<()>((&self.stream, record.bins.len(), head.slots(true, values)))
        })
        .map_err(lua_error)
    }

    fn emit_all(
        &self,
        table: Table,
        emit: &mut dyn FnMut(Value) -> Result<(), String>,
    ) -> Result<(), UdfError> {
        let mut budget = Budget::new();
        for value in table.sequence_values::<LuaValue>() {
            let value = value.map_err(lua_error)?;
            emit(from_lua(&self.meta, &value, 0, &mut budget).map_err(UdfError::Execution)?)
                .map_err(UdfError::Execution)?;
        }
        Ok(())
    }

    /// Hands `emit` the values emitted so far; an error from `emit` (a
    /// full output, say) ends the run with that message.
    pub fn take(
        &mut self,
        emit: &mut dyn FnMut(Value) -> Result<(), String>,
    ) -> Result<(), UdfError> {
        with_deadline(self.step_limit, || {
            let out: Table = self.take.call(self.stream.clone()).map_err(lua_error)?;
            self.emit_all(out, emit)
        })
    }

    /// Ends the stream and hands `emit` what it emits at the end.
    pub fn end(self, emit: &mut dyn FnMut(Value) -> Result<(), String>) -> Result<(), UdfError> {
        with_deadline(self.step_limit, || self.finish_stream(emit))
    }
}
