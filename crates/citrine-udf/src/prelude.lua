-- The Lua side of Citrine's UDF API: what a module sees besides Lua's own
-- base, string, table and math libraries. Written for Citrine after the
-- documented Aerospike UDF API (list, map, bytes, record, aerospike,
-- stream, logging); Rust (src/runtime.rs) loads it once per Lua state and
-- keeps the table it returns.
--
-- Values: a list is a Lua table (elements 1..n) whose metatable is List, a
-- map a table whose metatable is Map, a blob a table {s = bytes, t =
-- particle subtype} whose metatable is Bytes, GeoJSON a table {json =
-- text} whose metatable is GeoJSON. A list cannot hold nil (Lua's own
-- rule); a map entry set to nil is removed.
--
-- A record is a table whose metatable is Record; its state (bins, metadata
-- and what the UDF asked to be done with it) sits under a private key that
-- module code cannot name.

local log = ...

local STATE = {}

local List = { __name = "List" }
local Map = { __name = "Map" }
local Bytes = { __name = "Bytes" }
local GeoJSON = { __name = "GeoJSON" }
local Record = { __name = "Record" }

-- list ------------------------------------------------------------------

-- The length of lists that hold nils (a Lua sequence cannot say it), by
-- list; weak, so a list's entry goes with it.
local lengths = setmetatable({}, { __mode = "k" })

List.__len = function(l)
  local n = lengths[l] or 0
  local r = rawlen(l)
  if r > n then return r end
  return n
end

local function new_list(items)
  local l = setmetatable({}, List)
  if items ~= nil then
    local n = #items
    for i = 1, n do rawset(l, i, items[i]) end
    if n > rawlen(l) then lengths[l] = n end
  end
  return l
end

list = setmetatable({}, {
  __call = function(_, items) return new_list(items) end,
})

function list.create(_) return new_list(nil) end
function list.size(l) return #l end
-- A removal inside a list with nils shortens its known length.
local function shorten(l) if lengths[l] then lengths[l] = lengths[l] - 1 end end
function list.append(l, v) l[#l + 1] = v; return l end
function list.prepend(l, v) table.insert(l, 1, v); return l end
function list.insert(l, i, v) table.insert(l, i, v); return l end
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
  for i = 1, math.min(n, #l) do out[i] = l[i] end
  return out
end

function list.drop(l, n)
  local out = new_list(nil)
  for i = n + 1, #l do out[#out + 1] = l[i] end
  return out
end

function list.trim(l, n)
  for i = #l, n, -1 do rawset(l, i, nil) end
  if lengths[l] and lengths[l] >= n then lengths[l] = n - 1 end
  return l
end

function list.concat(l, other)
  for i = 1, #other do l[#l + 1] = other[i] end
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
  return "List(" .. table.concat(parts, ", ") .. ")"
end

-- map -------------------------------------------------------------------

local function new_map(entries)
  local m = {}
  if entries ~= nil then
    for k, v in pairs(entries) do m[k] = v end
  end
  return setmetatable(m, Map)
end

map = setmetatable({}, {
  __call = function(_, entries) return new_map(entries) end,
})

function map.create(_) return new_map(nil) end
function map.pairs(m) return pairs(m) end
function map.clone(m) return new_map(m) end
function map.remove(m, k) m[k] = nil; return m end
function map.has(m, k) return m[k] ~= nil end

function map.size(m)
  local n = 0
  for _ in pairs(m) do n = n + 1 end
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
  for k, v in pairs(b) do
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
  for k, v in pairs(a) do
    if b[k] == nil then out[k] = v end
  end
  for k, v in pairs(b) do
    if a[k] == nil then out[k] = v end
  end
  return out
end

Map.__tostring = function(m)
  local parts = {}
  for k, v in pairs(m) do parts[#parts + 1] = tostring(k) .. "=" .. tostring(v) end
  return "Map(" .. table.concat(parts, ", ") .. ")"
end

-- bytes -----------------------------------------------------------------

local function new_bytes(s, t)
  return setmetatable({ s = s, t = t or 4 }, Bytes)
end

bytes = setmetatable({}, {
  __call = function(_, n) return new_bytes(string.rep("\0", n or 0), 4) end,
})

function bytes.size(b) return #b.s end
function bytes.get_byte(b, i) return string.byte(b.s, i) end
function bytes.get_string(b, i, n) return string.sub(b.s, i, i + n - 1) end
function bytes.get_bytes(b, i, n) return new_bytes(string.sub(b.s, i, i + n - 1), b.t) end
function bytes.get_type(b) return b.t end
function bytes.set_type(b, t) b.t = t; return true end
function bytes.tostring(b) return b.s end

function bytes.set_byte(b, i, v)
  if i < 1 or i > #b.s then return false end
  b.s = string.sub(b.s, 1, i - 1) .. string.char(v) .. string.sub(b.s, i + 1)
  return true
end

function bytes.set_string(b, i, s)
  if i < 1 or i - 1 + #s > #b.s then return false end
  b.s = string.sub(b.s, 1, i - 1) .. s .. string.sub(b.s, i + #s)
  return true
end

function bytes.append_string(b, s) b.s = b.s .. s; return true end
function bytes.append_bytes(b, other) b.s = b.s .. other.s; return true end
function bytes.set_size(b, n)
  if n <= #b.s then b.s = string.sub(b.s, 1, n) else b.s = b.s .. string.rep("\0", n - #b.s) end
  return true
end

Bytes.__len = function(b) return #b.s end
Bytes.__index = function(b, i)
  if type(i) == "number" then return string.byte(rawget(b, "s"), i) end
  return nil
end
Bytes.__tostring = function(b)
  return "Bytes(" .. #b.s .. ")"
end

-- GeoJSON ---------------------------------------------------------------

geojson = {}
function geojson.new(text) return setmetatable({ json = text }, GeoJSON) end
function geojson.tostring(g) return g.json end
GeoJSON.__tostring = function(g) return g.json end

-- record ----------------------------------------------------------------

local function state(r)
  local s = type(r) == "table" and rawget(r, STATE)
  if not s then error("not a record", 3) end
  return s
end

Record.__index = function(r, name) return rawget(r, STATE).bins[name] end
Record.__newindex = function(r, name, v)
  local s = rawget(r, STATE)
  if s.readonly then error("the record of a stream UDF is read-only", 2) end
  s.bins[name] = v
end
Record.__tostring = function(_) return "Record()" end

local function snapshot(bins)
  local copy = {}
  for k, v in pairs(bins) do copy[k] = v end
  return copy
end

record = {}
function record.ttl(r) return state(r).ttl end
function record.gen(r) return state(r).gen end
function record.key(r) return state(r).key end
function record.digest(r) return state(r).digest end
function record.setname(r) return state(r).set end
function record.last_update_time(r) return state(r).last_update end
function record.device_size(r) return state(r).size end
function record.memory_size(r) return state(r).size end
function record.set_ttl(r, ttl) state(r).ttl_set = ttl end
function record.drop_key(r) state(r).drop_key = true end
function record.set_type(r, _) state(r) end
function record.set_bin_type(r, _, _) state(r) end

function record.bin_names(r)
  local names = new_list(nil)
  for k in pairs(state(r).bins) do names[#names + 1] = k end
  return names
end

function record.numbins(r)
  local n = 0
  for _ in pairs(state(r).bins) do n = n + 1 end
  return n
end

-- aerospike -------------------------------------------------------------

aerospike = {}

local function writable(s)
  if s.readonly then error("the record of a stream UDF is read-only", 3) end
end

function aerospike:exists(r) return state(r).exists end

function aerospike:create(r)
  local s = state(r)
  writable(s)
  if s.exists then return 1 end
  s.exists = true
  s.removed = false
  s.committed = snapshot(s.bins)
  return 0
end

function aerospike:update(r)
  local s = state(r)
  writable(s)
  s.exists = true
  s.removed = false
  s.committed = snapshot(s.bins)
  return 0
end

function aerospike:remove(r)
  local s = state(r)
  writable(s)
  s.exists = false
  s.removed = true
  s.committed = nil
  s.bins = {}
  return 0
end

-- logging ---------------------------------------------------------------

local function logger(level)
  return function(format, ...)
    local ok, text = pcall(string.format, tostring(format), ...)
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
  log(2, table.concat(parts, "\t"))
end

-- stream ----------------------------------------------------------------

local Stream = { __name = "Stream" }
Stream.__index = Stream

local function add(s, op)
  s.ops[#s.ops + 1] = op
  return s
end

function Stream:filter(f) return add(self, { k = "filter", f = f }) end
function Stream:map(f) return add(self, { k = "map", f = f }) end
function Stream:aggregate(init, f) return add(self, { k = "aggregate", f = f, init = init }) end
function Stream:reduce(f) return add(self, { k = "reduce", f = f }) end

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
}

function internal.record(s)
  return setmetatable({ [STATE] = s }, Record)
end

function internal.state(r)
  return rawget(r, STATE)
end

-- Sets the length of a list built from Rust with nils in it.
function internal.set_length(l, n)
  lengths[l] = n
end

function internal.stream()
  return setmetatable({ ops = {}, acc = {}, out = {} }, Stream)
end

function internal.push(s, v)
  push_from(s, v, 1)
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

return internal
