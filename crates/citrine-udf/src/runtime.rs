//! The Lua states UDFs run in: one per thread, for one registry at one
//! generation, built on first use and rebuilt when the registry changes.
//!
//! Owns: the sandbox (which libraries and globals a module sees), loading
//! modules into environments of their own, the time limit (an instruction
//! hook that fails the call past its deadline) and the memory limit, and
//! the two ways in: a record call and a stream.
//!
//! Invariants: a state is only touched by its thread (`thread_local`);
//! nothing is kept between calls but the loaded modules and the prelude;
//! after a call that failed, the state is dropped (a half-run module or an
//! exhausted memory budget must not leak into the next call).

use crate::convert::{from_lua, to_lua, Budget, Metatables};
use crate::{Applied, Call, Change, RecordIn, Registry, UdfError, HOOK_INSTRUCTIONS, MEMORY_LIMIT};
use citrine_cdt::value::Value;
use mlua::chunk::ChunkMode;
use mlua::{HookTriggers, Lua, LuaOptions, StdLib, Table, Value as LuaValue, VmState};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::Instant;

const PRELUDE: &str = include_str!("prelude.lua");

/// Globals of the base library a module may not use.
/// (The prelude keeps `load` for itself, text only, for `require`.)
const REMOVED_GLOBALS: &[&str] = &["dofile", "loadfile", "require", "collectgarbage"];

struct State {
    registry: u64,
    generation: u64,
    lua: Lua,
    internal: Table,
    meta: Metatables,
    /// Module environments by module name.
    modules: HashMap<String, Table>,
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
        .load(PRELUDE)
        .set_name("=citrine-prelude")
        .set_mode(ChunkMode::Text)
        .call((log, expired))?;
    let meta = Metatables {
        list: internal.get("List")?,
        map: internal.get("Map")?,
        bytes: internal.get("Bytes")?,
        geojson: internal.get("GeoJSON")?,
        record: internal.get("Record")?,
        state: internal.get("state")?,
        set_length: internal.get("set_length")?,
        length: internal.get("length")?,
        order_flags: internal.get("order_flags")?,
        set_order_flags: internal.get("set_order_flags")?,
        record_of: internal.get("record")?,
        outcome: internal.get("outcome")?,
    };
    // The registered modules' sources, for `require` (a state is rebuilt
    // whenever the registry changes).
    let sources = lua.create_table()?;
    for module in registry.list() {
        // Only `.lua` modules load, as the reference's Lua module cache
        // takes only those.
        if let Some(name) = module.filename.strip_suffix(".lua") {
            sources.raw_set(name, lua.create_string(&module.source)?)?;
        }
    }
    let set_sources: mlua::Function = internal.get("set_sources")?;
    set_sources.call::<()>(sources)?;
    Ok((lua, internal, meta))
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
            let (lua, internal, meta) = new_lua(registry).map_err(lua_error)?;
            *slot = Some(State {
                registry: registry.id(),
                generation,
                lua,
                internal,
                meta,
                modules: HashMap::new(),
            });
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
    /// The function `call` names, loading its module first if needed.
    fn function(
        &mut self,
        registry: &Registry,
        call: &Call<'_>,
    ) -> Result<mlua::Function, UdfError> {
        let env = match self.modules.get(call.module) {
            Some(env) => env.clone(),
            None => {
                let filename = format!("{}.lua", call.module);
                let module = registry
                    .get(&filename)
                    .ok_or_else(|| UdfError::ModuleNotFound(call.module.to_owned()))?;
                // An environment of its own: what it changes stays in it.
                let environment: mlua::Function =
                    self.internal.get("environment").map_err(lua_error)?;
                let env: Table = environment.call(()).map_err(lua_error)?;
                self.lua
                    .load(&module.source[..])
                    .set_name(format!("@{filename}"))
                    .set_mode(ChunkMode::Text)
                    .set_environment(env.clone())
                    .exec()
                    .map_err(lua_error)?;
                self.modules.insert(call.module.to_owned(), env.clone());
                env
            }
        };
        match env.get::<LuaValue>(call.function).map_err(lua_error)? {
            LuaValue::Function(function) => Ok(function),
            _ => Err(UdfError::FunctionNotFound(call.function.to_owned())),
        }
    }

    /// The call's arguments as Lua values, after `first`.
    fn arguments(&self, first: LuaValue, args: &[Value]) -> Result<mlua::MultiValue, UdfError> {
        call_arguments(&self.lua, &self.meta, first, args)
    }

    /// A record table for `record`.
    fn record(&self, record: &RecordIn<'_>, readonly: bool) -> Result<Table, UdfError> {
        record_table(&self.lua, &self.meta, record, readonly)
    }
}

/// A call's Lua arguments: `first` (the record or the stream), then
/// `args` converted.
fn call_arguments(
    lua: &Lua,
    meta: &Metatables,
    first: LuaValue,
    args: &[Value],
) -> Result<mlua::MultiValue, UdfError> {
    let mut values = Vec::with_capacity(args.len() + 1);
    values.push(first);
    for arg in args {
        values.push(to_lua(lua, meta, arg).map_err(lua_error)?);
    }
    Ok(mlua::MultiValue::from_vec(values))
}

/// A Lua record table for `record` (see the prelude's `Record`).
fn record_table(
    lua: &Lua,
    meta: &Metatables,
    record: &RecordIn<'_>,
    readonly: bool,
) -> Result<Table, UdfError> {
    let build = || -> mlua::Result<Table> {
        let bins = lua.create_table_with_capacity(0, record.bins.len())?;
        for (name, value) in &record.bins {
            let value = to_lua(lua, meta, value)?;
            bins.raw_set(lua.create_string(name.as_ref())?, value)?;
        }
        let key = match &record.key {
            Some(key) => to_lua(lua, meta, key)?,
            None => LuaValue::Nil,
        };
        meta.record_of.call((
            bins,
            record.exists,
            readonly,
            i64::from(record.generation),
            record.ttl,
            record.last_update_ms,
            record.size,
            lua.create_string(&record.set)?,
            lua.create_string(record.digest)?,
            key,
        ))
    };
    build().map_err(lua_error)
}

/// See [`crate::apply_record`].
pub(crate) fn apply_record(
    registry: &Registry,
    call: &Call<'_>,
    record: RecordIn<'_>,
) -> Result<Applied, UdfError> {
    let deadline = Instant::now() + call.time_limit;
    with_state(registry, deadline, |state| {
        let function = state.function(registry, call)?;
        let rec = state.record(&record, false)?;
        let args = state.arguments(LuaValue::Table(rec.clone()), &call.args)?;
        let returned: LuaValue = function.call(args).map_err(lua_error)?;
        let result =
            from_lua(&state.meta, &returned, 0, &mut Budget::new()).map_err(UdfError::Execution)?;
        let change = change_of(state, &rec, record.exists)?;
        Ok(Applied { result, change })
    })
}

/// What the UDF asked to be done with its record.
fn change_of(state: &State, rec: &Table, existed: bool) -> Result<Change, UdfError> {
    let (committed, removed, ttl_set, drop_key): (Option<Table>, bool, LuaValue, bool) =
        state.meta.outcome.call(rec.clone()).map_err(lua_error)?;
    match committed {
        Some(bins) => {
            let mut out = Vec::new();
            let mut budget = Budget::new();
            for pair in bins.pairs::<LuaValue, LuaValue>() {
                let (name, value) = pair.map_err(lua_error)?;
                let LuaValue::String(name) = name else {
                    return Err(UdfError::Execution(format!(
                        "a bin name must be a string, not a {}",
                        name.type_name()
                    )));
                };
                let value =
                    from_lua(&state.meta, &value, 0, &mut budget).map_err(UdfError::Execution)?;
                if matches!(value, Value::Nil) {
                    continue;
                }
                out.push((name.as_bytes().to_vec(), value));
            }
            out.sort_by(|a, b| a.0.cmp(&b.0));
            let ttl: Option<i64> = match ttl_set {
                LuaValue::Integer(ttl) => Some(ttl),
                LuaValue::Number(ttl) => Some(ttl as i64),
                _ => None,
            };
            Ok(Change::Write {
                bins: out,
                ttl,
                drop_key,
            })
        }
        None if removed && existed => Ok(Change::Remove),
        None => Ok(Change::None),
    }
}

/// See [`crate::Aggregation`].
pub struct Aggregation {
    lua: Lua,
    meta: Metatables,
    stream: Table,
    push: mlua::Function,
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
        let (lua, internal, meta) = new_lua(registry).map_err(lua_error)?;
        // A state of its own, not the thread's: the stream outlives this
        // call and may be stepped on another thread.
        let mut state = State {
            registry: registry.id(),
            generation: registry.generation(),
            lua,
            internal,
            meta,
            modules: HashMap::new(),
        };
        with_deadline(call.time_limit, || {
            let function = state.function(registry, call)?;
            let new_stream: mlua::Function = state.internal.get("stream").map_err(lua_error)?;
            let State {
                lua,
                internal,
                meta,
                ..
            } = state;
            let stream = lua.create_table().map_err(lua_error)?;
            let mut aggregation = Aggregation {
                push: internal.get("push").map_err(lua_error)?,
                take: internal.get("take").map_err(lua_error)?,
                finish: internal.get("finish").map_err(lua_error)?,
                lua,
                meta,
                stream,
                new_stream,
                function,
                args: call.args.clone(),
                step_limit: call.time_limit,
            };
            aggregation.begin()?;
            Ok(aggregation)
        })
    }

    /// Builds a new stream: an empty one, through the module's function.
    fn begin(&mut self) -> Result<(), UdfError> {
        let stream: Table = self.new_stream.call(()).map_err(lua_error)?;
        let values = call_arguments(
            &self.lua,
            &self.meta,
            LuaValue::Table(stream.clone()),
            &self.args,
        )?;
        self.function.call::<LuaValue>(values).map_err(lua_error)?;
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

    /// A record table for `record`, read-only.
    fn record_of(&self, record: &RecordIn<'_>) -> Result<Table, UdfError> {
        record_table(&self.lua, &self.meta, record, true)
    }

    /// Sends one record through the stream.
    pub fn record(&mut self, record: &RecordIn<'_>) -> Result<(), UdfError> {
        with_deadline(self.step_limit, || {
            let rec = self.record_of(record)?;
            self.push
                .call::<()>((self.stream.clone(), rec))
                .map_err(lua_error)
        })
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
