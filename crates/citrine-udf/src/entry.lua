-- The two ways into Lua that run once per record: `apply` (a record UDF
-- call) and `push_record` (a record into a stream). Rust puts the record
-- state's slot names (runtime.rs, SLOTS) in front of this file's first
-- line, compiles it without debug information and hands the function to
-- the prelude, which calls it with the pieces below and keeps what it
-- returns. Without line information, a UDF's function called from here
-- has a caller that names no place: `error(message, 2)` in it gives the
-- bare message, as the reference's `pcall` does. Nothing here raises an
-- error of its own.
--
-- Rust passes a record's state as the state's slots in order (BINS ..
-- DROP_KEY: the bins slot, the digest's Bytes and the outcome false), then
-- the call's arguments, then the bins as name, value pairs; one table
-- constructor makes the state of all of them (the arguments and bin pairs
-- stay in it past the named slots, unused after the start).

local states, Record, StreamRecord, setmetatable, table_unpack, type, push_from = ...

-- The first slot after the named ones: the call's arguments start there.
local FIRST <const> = DROP_KEY + 1

-- Calls the function `name` of the module environment `env` with the
-- record and the `nargs` arguments. Returns false when there is no such
-- function; else true, what the function returned, and what it asked for:
-- whether it removed the record, the TTL it set (false: none), whether it
-- dropped the key, and the bins committed by its last create or update
-- (false: none).
local function apply(env, name, nargs, nbins, ...)
  local f = env[name]
  if type(f) ~= "function" then return false end
  local s = { ... }
  -- The record holds its bins (set before it has Record's __newindex).
  local r = {}
  local from = FIRST + nargs
  for i = from, from + 2 * nbins - 2, 2 do r[s[i]] = s[i + 1] end
  setmetatable(r, Record)
  s[BINS] = r
  states[r] = s
  local result
  if nargs == 1 then
    result = f(r, s[FIRST])
  elseif nargs == 0 then
    result = f(r)
  else
    result = f(r, table_unpack(s, FIRST, FIRST + nargs - 1))
  end
  return true, result, s[REMOVED], s[TTL_SET], s[DROP_KEY], s[COMMITTED]
end

-- Sends a record (read-only: Rust passes READONLY true) with `nbins`
-- bins through the stream `stream`.
local function push_record(stream, nbins, ...)
  local s = { ... }
  local bins = {}
  for i = FIRST, FIRST + 2 * nbins - 2, 2 do bins[s[i]] = s[i + 1] end
  s[BINS] = bins
  local r = setmetatable({}, StreamRecord)
  states[r] = s
  push_from(stream, r, 1)
end

return apply, push_record
