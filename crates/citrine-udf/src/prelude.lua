-- The Lua side of Citrine's UDF API: what a module sees besides Lua's own
-- base, string, table, math and utf8 libraries. Written for Citrine after
-- the documented Aerospike UDF API (list, map, bytes, record, aerospike,
-- stream, logging); Rust (src/runtime.rs) loads it once per Lua state and
-- keeps the table it returns.
--
-- Values: a list is a Lua table (elements 1..n) whose metatable is List, a
-- map a table whose metatable is Map, a blob a table {s = bytes, t =
-- particle subtype} whose metatable is Bytes, GeoJSON a table {json =
-- text} whose metatable is GeoJSON. A list may hold nils: its length is
-- kept apart (`lengths`); a map entry set to nil is removed.
--
-- A record UDF's record is a table holding its bins (name -> value), whose
-- metatable is Record (which sees only names not yet there); a stream
-- UDF's record is an empty table whose metatable is StreamRecord (read-
-- only: reads go to its bins). A record's state (its bins, metadata and
-- what the UDF asked to be done with it) sits in `states`, keyed by the
-- record, which module code cannot reach. A state is an array (one table
-- constructor per call, no hashing of field names) whose slots are named
-- by constants (BINS, EXISTS, ... DROP_KEY) that Rust puts in front of
-- this file's first line (runtime.rs, SLOTS).
--
-- Isolation: every module gets an environment of its own
-- (`internal.environment`) holding copies of the library tables, so a
-- module that changes `aerospike.update` or `string.find` changes them for
-- itself only; the metatables the prelude relies on are protected
-- (`getmetatable` answers their name, `setmetatable` refuses them); this
-- file uses only the locals it captured below, never a global a module
-- could replace.
--
-- Limits (with the instruction hook Rust sets): `pcall`/`xpcall` cannot
-- swallow the time limit's error; `setmetatable` refuses `__gc` (Lua runs
-- finalizers without hooks); the pattern functions of `string` refuse a
-- pattern whose worst case on its subject would run for long (they run in
-- C, where the hook cannot stop them).

local log, expired, entry = ...

local rawget, rawset, rawlen, next, type, tostring, select, error =
  rawget, rawset, rawlen, next, type, tostring, select, error
local raw_setmetatable, raw_getmetatable, raw_pcall, raw_xpcall =
  setmetatable, getmetatable, pcall, xpcall
local string_rep, string_sub, string_char, string_byte, string_format =
  string.rep, string.sub, string.char, string.byte, string.format
local string_find, string_match, string_gmatch, string_gsub =
  string.find, string.match, string.gmatch, string.gsub
local table_insert, table_concat, table_unpack = table.insert, table.concat, table.unpack
local string_pack = string.pack
local math_min, math_log = math.min, math.log
-- Kept for `require` only (source text, never bytecode), then hidden.
local raw_load = load
load = nil

local List = { __name = "List", __metatable = "List" }
local Map = { __name = "Map", __metatable = "Map" }
local Bytes = { __name = "Bytes", __metatable = "Bytes" }
local GeoJSON = { __name = "GeoJSON", __metatable = "GeoJSON" }
local Record = { __name = "Record", __metatable = "Record" }
local StreamRecord = { __name = "Record", __metatable = "Record" }

-- Strings' shared metatable: out of modules' reach.
raw_getmetatable("").__metatable = "string"

-- limits ----------------------------------------------------------------

local function rethrow_if_expired(ok, ...)
  if not ok and expired() then error((...), 0) end
  return ok, ...
end

pcall = function(f, ...) return rethrow_if_expired(raw_pcall(f, ...)) end
xpcall = function(f, handler, ...) return rethrow_if_expired(raw_xpcall(f, handler, ...)) end

setmetatable = function(t, mt)
  if type(mt) == "table" and rawget(mt, "__gc") ~= nil then
    error("__gc metamethods are not allowed in UDFs", 2)
  end
  return raw_setmetatable(t, mt)
end

-- Lua's matcher backtracks: each repetition item (*, +, -, ?) can multiply
-- the work by the subject's length. A pattern is refused when that worst
-- case passes about 10^8 steps.
local function guard(subject, pattern, plain)
  if plain then return end
  subject, pattern = tostring(subject), tostring(pattern)
  local items, i = 0, 1
  while i <= #pattern do
    local c = string_byte(pattern, i)
    if c == 37 then -- '%': the next character is escaped
      i = i + 2
    else
      if c == 42 or c == 43 or c == 45 or c == 63 then items = items + 1 end
      i = i + 1
    end
  end
  if items > 0 and (items + 1) * math_log(#subject + 1, 10) > 8 then
    error("pattern too costly for a subject of " .. #subject .. " bytes", 3)
  end
end

string.find = function(s, p, init, plain) guard(s, p, plain); return string_find(s, p, init, plain) end
string.match = function(s, p, init) guard(s, p); return string_match(s, p, init) end
string.gmatch = function(s, p, init) guard(s, p); return string_gmatch(s, p, init) end
string.gsub = function(s, p, r, n) guard(s, p); return string_gsub(s, p, r, n) end

-- list ------------------------------------------------------------------

-- The length of lists that hold nils (a Lua sequence cannot say it), by
-- list; weak, so a list's entry goes with it.
local lengths = raw_setmetatable({}, { __mode = "k" })
-- The order flags of lists and maps read from a bin (ordered list, key-
-- or key-value-ordered map), by collection; weak. A collection written
-- back keeps them (and is put back in order), as the reference keeps them.
local order_flags = raw_setmetatable({}, { __mode = "k" })

List.__len = function(l)
  local n = lengths[l] or 0
  local r = rawlen(l)
  if r > n then return r end
  return n
end

local function new_list(items)
  local l = raw_setmetatable({}, List)
  if items ~= nil then
    local n = #items
    for i = 1, n do rawset(l, i, items[i]) end
    if n > rawlen(l) then lengths[l] = n end
  end
  return l
end

local ListCall = { __call = function(_, items) return new_list(items) end, __metatable = "list" }
list = raw_setmetatable({}, ListCall)

function list.create(_) return new_list(nil) end
function list.size(l) return #l end
-- A removal inside a list with nils shortens its known length.
local function shorten(l) if lengths[l] then lengths[l] = lengths[l] - 1 end end
local function set_length(l, n)
  if n > rawlen(l) then lengths[l] = n else lengths[l] = nil end
end
function list.append(l, v) local n = #l + 1; rawset(l, n, v); set_length(l, n); return l end
function list.prepend(l, v) return list.insert(l, 1, v) end
function list.insert(l, i, v)
  local n = #l
  for j = n, i, -1 do rawset(l, j + 1, rawget(l, j)) end
  rawset(l, i, v)
  set_length(l, n + 1)
  return l
end
function list.remove(l, i)
  local n = #l
  if i < 1 or i > n then return nil end
  local v = l[i]
  for j = i, n - 1 do rawset(l, j, l[j + 1]) end
  rawset(l, n, nil)
  shorten(l)
  return v
end
function list.clone(l) return new_list(l) end

function list.take(l, n)
  local out = new_list(nil)
  for i = 1, math_min(n, #l) do rawset(out, i, rawget(l, i)) end
  set_length(out, math_min(n, #l))
  return out
end

function list.drop(l, n)
  local out = new_list(nil)
  local m = #l
  for i = n + 1, m do rawset(out, i - n, rawget(l, i)) end
  if m > n then set_length(out, m - n) end
  return out
end

function list.trim(l, n)
  for i = #l, n, -1 do rawset(l, i, nil) end
  if lengths[l] and lengths[l] >= n then lengths[l] = n - 1 end
  return l
end

function list.concat(l, other)
  for i = 1, #other do list.append(l, other[i]) end
  return l
end

function list.merge(l, other)
  local out = new_list(l)
  return list.concat(out, other)
end

function list.iterator(l)
  local i = 0
  return function()
    i = i + 1
    if i <= #l then return l[i] end
  end
end

List.__tostring = function(l)
  local parts = {}
  for i = 1, #l do parts[i] = tostring(l[i]) end
  return "List(" .. table_concat(parts, ", ") .. ")"
end

-- map -------------------------------------------------------------------

local function new_map(entries)
  local m = {}
  if entries ~= nil then
    for k, v in next, entries do m[k] = v end
  end
  return raw_setmetatable(m, Map)
end

local MapCall = { __call = function(_, entries) return new_map(entries) end, __metatable = "map" }
map = raw_setmetatable({}, MapCall)

function map.create(_) return new_map(nil) end
function map.pairs(m) return next, m, nil end
function map.clone(m) return new_map(m) end
function map.remove(m, k) m[k] = nil; return m end
function map.has(m, k) return m[k] ~= nil end

function map.size(m)
  local n = 0
  for _ in next, m do n = n + 1 end
  return n
end

function map.keys(m)
  local k = nil
  return function()
    k = next(m, k)
    return k
  end
end

function map.values(m)
  local k = nil
  return function()
    local v
    k, v = next(m, k)
    return v
  end
end

function map.merge(a, b, resolve)
  local out = new_map(a)
  for k, v in next, b do
    if out[k] ~= nil and resolve ~= nil then
      out[k] = resolve(out[k], v)
    else
      out[k] = v
    end
  end
  return out
end

function map.diff(a, b)
  local out = new_map(nil)
  for k, v in next, a do
    if b[k] == nil then out[k] = v end
  end
  for k, v in next, b do
    if a[k] == nil then out[k] = v end
  end
  return out
end

Map.__tostring = function(m)
  local parts = {}
  for k, v in next, m do parts[#parts + 1] = tostring(k) .. "=" .. tostring(v) end
  return "Map(" .. table_concat(parts, ", ") .. ")"
end

-- bytes -----------------------------------------------------------------

local function new_bytes(s, t)
  return raw_setmetatable({ s = s, t = t or 4 }, Bytes)
end

local BytesCall = {
  __call = function(_, n) return new_bytes(string_rep("\0", n or 0), 4) end,
  __metatable = "bytes",
}
bytes = raw_setmetatable({}, BytesCall)

function bytes.size(b) return #b.s end
function bytes.get_byte(b, i) return string_byte(b.s, i) end
function bytes.get_string(b, i, n) return string_sub(b.s, i, i + n - 1) end
function bytes.get_bytes(b, i, n) return new_bytes(string_sub(b.s, i, i + n - 1), b.t) end
function bytes.get_type(b) return b.t end
function bytes.set_type(b, t) b.t = t; return true end
function bytes.tostring(b) return b.s end

function bytes.set_byte(b, i, v)
  if i < 1 or i > #b.s then return false end
  b.s = string_sub(b.s, 1, i - 1) .. string_char(v) .. string_sub(b.s, i + 1)
  return true
end

function bytes.set_string(b, i, s)
  if i < 1 or i - 1 + #s > #b.s then return false end
  b.s = string_sub(b.s, 1, i - 1) .. s .. string_sub(b.s, i + #s)
  return true
end

function bytes.append_string(b, s) b.s = b.s .. s; return true end
function bytes.append_bytes(b, other) b.s = b.s .. other.s; return true end
function bytes.set_size(b, n)
  if n <= #b.s then b.s = string_sub(b.s, 1, n) else b.s = b.s .. string_rep("\0", n - #b.s) end
  return true
end

Bytes.__len = function(b) return #b.s end
Bytes.__index = function(b, i)
  if type(i) == "number" then return string_byte(rawget(b, "s"), i) end
  return nil
end
Bytes.__tostring = function(b)
  return "Bytes(" .. #b.s .. ")"
end

-- GeoJSON ---------------------------------------------------------------

geojson = {}
function geojson.new(text) return raw_setmetatable({ json = text }, GeoJSON) end
function geojson.tostring(g) return g.json end
GeoJSON.__tostring = function(g) return g.json end

-- record ----------------------------------------------------------------

-- Record states by record; weak, so a state goes with its record.
local states = raw_setmetatable({}, { __mode = "k" })

local function state(r)
  local s = states[r]
  if not s then error("not a record", 3) end
  return s
end

-- A record UDF's record holds its bins: reading one, or changing one it
-- has, is a plain table access; a name it does not hold comes here.
Record.__newindex = function(r, name, v)
  -- A name longer than a bin's 15 bytes is ignored with a warning, as the
  -- reference does (its setter refuses it and Lua never hears): the UDF
  -- goes on, and the record is written without it.
  if type(name) == "string" and #name > 15 then
    log(1, "bin name " .. name .. " too long: not set")
    return
  end
  rawset(r, name, v)
end
Record.__tostring = function(_) return "Record()" end

StreamRecord.__index = function(r, name) return states[r][BINS][name] end
StreamRecord.__newindex = function(_, _, _)
  error("the record of a stream UDF is read-only", 2)
end
StreamRecord.__tostring = Record.__tostring

-- A deep copy of a value (lists, maps and blobs copied; depth bounded, a
-- table that holds itself is cut there).
local function copy_value(v, depth)
  if type(v) ~= "table" or depth > 64 then return v end
  -- getmetatable answers a protected metatable's name.
  local tag = raw_getmetatable(v)
  if tag == "Bytes" then return new_bytes(rawget(v, "s"), rawget(v, "t")) end
  local kind = nil
  if tag == "List" then kind = List elseif tag == "Map" then kind = Map
  elseif tag ~= nil then return v end
  local out = {}
  for k, x in next, v do out[k] = copy_value(x, depth + 1) end
  if kind ~= nil then raw_setmetatable(out, kind) end
  if lengths[v] then lengths[out] = lengths[v] end
  if order_flags[v] then order_flags[out] = order_flags[v] end
  return out
end

local function snapshot(bins)
  local copy = {}
  for k, v in next, bins do copy[k] = copy_value(v, 1) end
  return copy
end

record = {}
function record.ttl(r) return state(r)[TTL] end
function record.gen(r) return state(r)[GEN] end
function record.key(r) return state(r)[KEY] end
function record.digest(r)
  local s = state(r)
  if not s[DIGEST] then
    s[DIGEST] = new_bytes(string_pack("<i8i8I4", s[DIGEST_1], s[DIGEST_2], s[DIGEST_3]), 4)
  end
  return s[DIGEST]
end
function record.setname(r) return state(r)[SET] end
function record.last_update_time(r) return state(r)[LAST_UPDATE] end
function record.device_size(r) return state(r)[SIZE] end
function record.memory_size(r) return state(r)[SIZE] end
function record.set_ttl(r, ttl) state(r)[TTL_SET] = ttl end
function record.drop_key(r) state(r)[DROP_KEY] = true end
function record.set_type(r, _) state(r) end
function record.set_bin_type(r, _, _) state(r) end

function record.bin_names(r)
  local names = new_list(nil)
  for k in next, state(r)[BINS] do names[#names + 1] = k end
  return names
end

function record.numbins(r)
  local n = 0
  for _ in next, state(r)[BINS] do n = n + 1 end
  return n
end

-- aerospike -------------------------------------------------------------

aerospike = {}

local function writable(s)
  if s[READONLY] then error("the record of a stream UDF is read-only", 3) end
end

-- (The calls of every record: `state(r)` written out, as `error` level 2.)
function aerospike:exists(r)
  local s = states[r]
  if not s then error("not a record", 2) end
  return s[EXISTS]
end

function aerospike:create(r)
  local s = state(r)
  writable(s)
  if s[EXISTS] then return 1 end
  s[EXISTS] = true
  s[REMOVED] = false
  s[COMMITTED] = snapshot(s[BINS])
  return 0
end

function aerospike:update(r)
  local s = states[r]
  if not s then error("not a record", 2) end
  writable(s)
  s[EXISTS] = true
  s[REMOVED] = false
  s[COMMITTED] = snapshot(s[BINS])
  return 0
end

function aerospike:remove(r)
  local s = state(r)
  writable(s)
  s[EXISTS] = false
  s[REMOVED] = true
  s[COMMITTED] = false
  local bins = s[BINS]
  for k in next, bins do bins[k] = nil end
  return 0
end

-- logging ---------------------------------------------------------------

local function logger(level)
  return function(format, ...)
    local ok, text = raw_pcall(string_format, tostring(format), ...)
    if not ok then text = tostring(format) end
    log(level, text)
  end
end

warn = logger(1)
info = logger(2)
debug = logger(3)
trace = logger(4)
print = function(...)
  local parts = {}
  for i = 1, select("#", ...) do parts[i] = tostring((select(i, ...))) end
  log(2, table_concat(parts, "\t"))
end

-- stream ----------------------------------------------------------------

local Stream = { __name = "Stream", __metatable = "Stream" }
Stream.__index = Stream

-- The server runs a stream's ops up to and including its first reduce;
-- the ops after it are the client's, which runs them over the nodes'
-- results (as the reference's stream ops split server and client scope).
local function add(s, op)
  if s.reduced then return s end
  s.ops[#s.ops + 1] = op
  if op.k == "reduce" then s.reduced = true end
  return s
end

function Stream:filter(f) return add(self, { k = "filter", f = f }) end
function Stream:map(f) return add(self, { k = "map", f = f }) end
function Stream:aggregate(init, f) return add(self, { k = "aggregate", f = f, init = init }) end
function Stream:reduce(f) return add(self, { k = "reduce", f = f }) end

-- Groups the values by `f(value)`: one map from each key to the list of
-- the values that gave it. An aggregate builds each stream's map; the
-- reduce (run again by clients over the partitions' maps) joins the lists
-- of equal keys.
function Stream:groupby(f)
  local function group(groups, v)
    local key = f(v)
    local members = groups[key]
    if members == nil then
      members = list()
      groups[key] = members
    end
    list.append(members, v)
    return groups
  end
  local function join(a, b)
    return map.merge(a, b, list.merge)
  end
  return self:aggregate(map(), group):reduce(join)
end

-- Runs `v` through the ops from `from` on: a filter may drop it, a map
-- replaces it, an aggregate or reduce folds it into its accumulator (and
-- the ops after it run on the accumulator at the end).
local function push_from(s, v, from)
  local ops = s.ops
  for i = from, #ops do
    local op = ops[i]
    if op.k == "filter" then
      if not op.f(v) then return end
    elseif op.k == "map" then
      v = op.f(v)
    elseif op.k == "aggregate" then
      local acc = s.acc[i]
      if acc == nil then acc = op.init end
      s.acc[i] = op.f(acc, v)
      return
    else
      if s.acc[i] == nil then s.acc[i] = v else s.acc[i] = op.f(s.acc[i], v) end
      return
    end
  end
  if v ~= nil then s.out[#s.out + 1] = v end
end

-- The internal table Rust keeps -------------------------------------------

local internal = {
  List = List,
  Map = Map,
  Bytes = Bytes,
  GeoJSON = GeoJSON,
  Record = Record,
  StreamRecord = StreamRecord,
}

-- The ways in that run once per record (entry.lua): `apply(env, name,
-- nargs, nbins, ...)`, a record UDF call, and `push_record(stream, nbins,
-- ...)`, a record into a stream.
internal.apply, internal.push_record =
  entry(states, Record, StreamRecord, raw_setmetatable, table_unpack, type, push_from)

-- The bins of a record (for a UDF that returns its record).
function internal.bins(r)
  return states[r][BINS]
end

-- A list's length, nils included (not its __len, which a module cannot
-- change anyway).
function internal.length(l)
  local n = lengths[l] or 0
  local r = rawlen(l)
  if r > n then return r end
  return n
end

-- Sets the length of a list built from Rust with nils in it.
function internal.set_length(l, n)
  lengths[l] = n
end

-- A list's or map's order flags (nil: none recorded).
function internal.order_flags(t)
  return order_flags[t]
end

-- Records the order flags of a list or map built from Rust.
function internal.set_order_flags(t, flags)
  order_flags[t] = flags
end

function internal.stream()
  return raw_setmetatable({ ops = {}, acc = {}, out = {} }, Stream)
end

-- Ends a stream: each accumulator, in op order, goes through the ops after
-- it. Returns (and clears) the values the stream emitted.
function internal.finish(s)
  for i = 1, #s.ops do
    local k = s.ops[i].k
    if (k == "aggregate" or k == "reduce") and s.acc[i] ~= nil then
      local v = s.acc[i]
      s.acc[i] = nil
      push_from(s, v, i + 1)
    end
  end
  local out = s.out
  s.out = {}
  return out
end

function internal.take(s)
  local out = s.out
  s.out = {}
  return out
end

-- require ---------------------------------------------------------------

-- Another registered module, by name (no `.lua`): run once per state in an
-- environment of its own; its return value, or that environment when it
-- returns nothing (a module that defines global functions).
local sources = {}
local required = {}

function internal.set_sources(t)
  sources = t
end

require = function(name)
  name = tostring(name)
  local done = required[name]
  if done ~= nil then return done end
  local source = sources[name]
  if source == nil then error("module '" .. name .. "' not found", 2) end
  local env = internal.environment()
  local chunk, why = raw_load(source, "@" .. name .. ".lua", "t", env)
  if not chunk then error(why, 2) end
  local result = chunk()
  if result == nil then result = env end
  required[name] = result
  return result
end

-- The globals every module starts from, as they are now.
local base = {}
for k, v in next, _G do base[k] = v end
local callables = { [list] = ListCall, [map] = MapCall, [bytes] = BytesCall }

-- A module's environment: the globals, each library table copied.
function internal.environment()
  local env = {}
  for k, v in next, base do
    if type(v) == "table" and k ~= "_G" then
      local copy = {}
      for k2, v2 in next, v do copy[k2] = v2 end
      if callables[v] then raw_setmetatable(copy, callables[v]) end
      env[k] = copy
    else
      env[k] = v
    end
  end
  env._G = env
  return env
end

return internal
