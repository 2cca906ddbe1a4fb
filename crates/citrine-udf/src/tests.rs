use super::*;
use citrine_cdt::value::{List, Map};
use std::borrow::Cow;
use std::time::Duration;

fn registry(filename: &str, source: &str) -> Registry {
    let registry = Registry::default();
    check(filename, source.as_bytes()).expect("module compiles");
    assert!(registry.put(Module::new(filename, source.as_bytes().to_vec())));
    registry
}

fn call<'a>(module: &'a str, function: &'a str, args: Vec<Value>) -> Call<'a> {
    Call {
        module,
        function,
        args: Cow::Owned(args),
        time_limit: Duration::from_secs(2),
    }
}

fn str(text: &str) -> Value {
    Value::Str(text.as_bytes().to_vec())
}

fn record(bins: Vec<(&'static [u8], Value)>) -> RecordIn<'static> {
    RecordIn {
        exists: true,
        bins: bins
            .into_iter()
            .map(|(name, value)| (Cow::Borrowed(name), value))
            .collect(),
        generation: 3,
        ttl: -1,
        last_update_ms: 1_700_000_000_000,
        digest: [7; 20],
        set: Cow::Borrowed(b"demo"),
        key: Some(Value::Int(-1)),
        size: 40,
    }
}

fn map_get<'v>(value: &'v Value, key: &str) -> Option<&'v Value> {
    let Value::Map(map) = value else {
        return None;
    };
    map.entries
        .iter()
        .find(|(k, _)| matches!(k, Value::Str(s) if s == key.as_bytes()))
        .map(|(_, v)| v)
}

const MODULE: &str = r#"
function test_func(rec, div)
   local ret = map()
   local x = rec['bin1']
   rec['bin2'] = math.floor(x / div)
   aerospike:update(rec)
   ret['status'] = 'OK'
   return ret
end

function echo(rec, param) return param end

function remove(rec) aerospike:remove(rec) end

function create(rec, bins)
   for b, v in map.pairs(bins) do rec[b] = v end
   return aerospike:create(rec)
end

function meta(rec)
   return list{record.gen(rec), record.ttl(rec), record.key(rec), record.setname(rec),
               bytes.size(record.digest(rec)), aerospike:exists(rec), record.numbins(rec)}
end

function change_without_update(rec) rec['bin1'] = 99; return 1 end

function update_then_change(rec)
   rec['a'] = 1
   aerospike:update(rec)
   rec['b'] = 2
end

function with_ttl(rec) rec['x'] = 1; record.set_ttl(rec, 300); aerospike:update(rec) end

function fail(rec) error("1000:Invalid value") end
function forever(rec) while true do end end
function sleeps(rec) sleep(1) end
function returns_function(rec) return print end
function cyclic(rec) local t = {} t[1] = t return t end
function blob(rec) local b = bytes(3); bytes.set_byte(b, 2, 65); return b end
function plain_tables(rec) return {1, 2, {a = 1}} end
function escape(rec) return io end
"#;

#[test]
fn a_record_udf_updates_its_record_and_returns_a_map() {
    let registry = registry("udf1.lua", MODULE);
    let applied = apply_record(
        &registry,
        &call("udf1", "test_func", vec![Value::Int(2)]),
        record(vec![(b"bin1", Value::Int(21))]),
    )
    .expect("runs");
    assert!(matches!(map_get(&applied.result, "status"), Some(Value::Str(s)) if s == b"OK"));
    let Change::Write {
        bins,
        ttl,
        drop_key,
    } = applied.change
    else {
        panic!("expected a write, got {:?}", applied.change);
    };
    assert_eq!(ttl, None);
    assert!(!drop_key);
    assert_eq!(bins.len(), 2);
    assert_eq!(bins[0].0, b"bin1");
    assert!(matches!(bins[1], (ref name, Value::Int(10)) if name == b"bin2"));
}

#[test]
fn values_round_trip_through_lua() {
    let registry = registry("udf1.lua", MODULE);
    let nested = Value::Map(Map {
        flags: 0,
        entries: vec![
            // In key order, as maps come back.
            (Value::Int(7), Value::Bool(true)),
            (
                str("list"),
                Value::List(List {
                    flags: 0,
                    items: vec![Value::Int(1), str("two"), Value::Double(3.5)],
                }),
            ),
        ],
    });
    for value in [
        Value::Int(i64::MIN),
        Value::Int(0),
        Value::Double(-0.25),
        str(""),
        str(&"s".repeat(100_000)),
        str("Hello, 世界"),
        Value::Blob(4, vec![0, 1, 255]),
        Value::Bool(false),
        Value::List(List {
            flags: 0,
            items: vec![Value::Nil, Value::Int(1), Value::Nil],
        }),
        nested,
    ] {
        let applied = apply_record(
            &registry,
            &call("udf1", "echo", vec![value.clone()]),
            record(vec![]),
        )
        .expect("runs");
        assert_eq!(
            citrine_cdt::value::compare(&applied.result, &value),
            std::cmp::Ordering::Equal,
            "{value:?} came back as {:?}",
            applied.result
        );
        assert_eq!(applied.change, Change::None);
    }
    let applied =
        apply_record(&registry, &call("udf1", "echo", vec![]), record(vec![])).expect("runs");
    assert!(matches!(applied.result, Value::Nil));
}

#[test]
fn changes_reach_the_record_only_through_create_update_or_remove() {
    let registry = registry("udf1.lua", MODULE);
    let run = |function: &str, exists: bool| {
        let mut input = record(vec![(b"bin1", Value::Int(1))]);
        input.exists = exists;
        apply_record(&registry, &call("udf1", function, vec![]), input).expect("runs")
    };
    assert_eq!(run("change_without_update", true).change, Change::None);
    assert_eq!(run("remove", true).change, Change::Remove);
    assert_eq!(run("remove", false).change, Change::None);
    // Bins set after the last update are not stored.
    let Change::Write { bins, .. } = run("update_then_change", true).change else {
        panic!("expected a write");
    };
    let names: Vec<&[u8]> = bins.iter().map(|(name, _)| name.as_slice()).collect();
    assert_eq!(names, vec![b"a".as_slice(), b"bin1".as_slice()]);
    let Change::Write { ttl, .. } = run("with_ttl", true).change else {
        panic!("expected a write");
    };
    assert_eq!(ttl, Some(300));
    // create on an existing record returns 1 and changes nothing.
    let args = vec![Value::Map(Map {
        flags: 0,
        entries: vec![(str("x"), Value::Int(5))],
    })];
    let applied = apply_record(
        &registry,
        &call("udf1", "create", args.clone()),
        record(vec![]),
    )
    .expect("runs");
    assert!(matches!(applied.result, Value::Int(1)));
    assert_eq!(applied.change, Change::None);
    let mut absent = record(vec![]);
    absent.exists = false;
    let applied = apply_record(&registry, &call("udf1", "create", args), absent).expect("runs");
    assert!(matches!(applied.result, Value::Int(0)));
    assert!(matches!(applied.change, Change::Write { ref bins, .. } if bins.len() == 1));
}

#[test]
fn a_bin_name_longer_than_fifteen_bytes_is_ignored_and_the_udf_goes_on() {
    // The official C client's key_apply2 `bad_create`: the reference
    // ignores the over-long name and writes the rest.
    let source = r#"
function bad_create(record)
  record.bina = "string a"
  record.iamabinwithlengthgreaterthan16 = "I will fail"
  aerospike:create(record)
  record.binb = "string b"
  record[""] = 1
  return aerospike:update(record)
end
"#;
    let registry = registry("bad.lua", source);
    let mut absent = record(vec![]);
    absent.exists = false;
    let applied =
        apply_record(&registry, &call("bad", "bad_create", vec![]), absent).expect("runs");
    assert!(matches!(applied.result, Value::Int(0)));
    let Change::Write { bins, .. } = applied.change else {
        panic!("expected a write");
    };
    let mut names: Vec<&[u8]> = bins.iter().map(|(name, _)| name.as_slice()).collect();
    names.sort();
    assert_eq!(names, vec![b"".as_slice(), b"bina", b"binb"]);
}

#[test]
fn order_flags_survive_a_udf_and_new_collections_have_none() {
    // The official C client's list and map UDF tests: an ordered list or
    // a key-value-ordered map changed by a UDF keeps its flags. A map made
    // in Lua has none: the official Go client's suite reads one as a plain
    // map (it reads a key-ordered map as ordered pairs).
    let source = r#"
function touch(r)
  list.append(r.l, 0)
  r.l = r.l
  r.m['z'] = 1
  r.m = r.m
  r.fresh = map { b = 2, a = 1 }
  r.plain = list { 3, 1 }
  return aerospike:update(r)
end
"#;
    let registry = registry("flags.lua", source);
    let input = record(vec![
        (
            b"l",
            Value::List(List {
                flags: 1,
                items: vec![Value::Int(1), Value::Int(2)],
            }),
        ),
        (
            b"m",
            Value::Map(Map {
                flags: 3,
                entries: vec![(str("a"), Value::Int(1))],
            }),
        ),
    ]);
    let applied = apply_record(&registry, &call("flags", "touch", vec![]), input).expect("runs");
    let Change::Write { bins, .. } = applied.change else {
        panic!("expected a write");
    };
    let flags = |name: &[u8]| match bins.iter().find(|(bin, _)| bin.as_slice() == name) {
        Some((_, Value::List(list))) => list.flags,
        Some((_, Value::Map(map))) => map.flags,
        other => panic!("{other:?}"),
    };
    assert_eq!(flags(b"l"), 1);
    assert_eq!(flags(b"m"), 3);
    assert_eq!(flags(b"fresh"), 0);
    assert_eq!(flags(b"plain"), 0);
}

#[test]
fn record_metadata_is_visible() {
    let registry = registry("udf1.lua", MODULE);
    let applied = apply_record(
        &registry,
        &call("udf1", "meta", vec![]),
        record(vec![(b"a", Value::Int(1))]),
    )
    .expect("runs");
    let Value::List(list) = applied.result else {
        panic!("expected a list, got {:?}", applied.result);
    };
    let expected = [
        Value::Int(3),
        Value::Int(-1),
        Value::Int(-1),
        str("demo"),
        Value::Int(20),
        Value::Bool(true),
        Value::Int(1),
    ];
    assert_eq!(list.items.len(), expected.len());
    for (got, want) in list.items.iter().zip(expected.iter()) {
        assert_eq!(
            citrine_cdt::value::compare(got, want),
            std::cmp::Ordering::Equal,
            "{got:?} != {want:?}"
        );
    }
}

#[test]
fn failures_are_errors_with_messages_and_change_nothing() {
    let registry = registry("udf1.lua", MODULE);
    let run =
        |function: &str| apply_record(&registry, &call("udf1", function, vec![]), record(vec![]));
    let Err(UdfError::Execution(message)) = run("fail") else {
        panic!("error() must fail the call");
    };
    assert!(
        message.contains("udf1.lua:") && message.ends_with("1000:Invalid value"),
        "{message}"
    );
    assert!(matches!(run("sleeps"), Err(UdfError::Execution(_))));
    assert!(matches!(
        run("returns_function"),
        Err(UdfError::Execution(_))
    ));
    assert!(matches!(run("cyclic"), Err(UdfError::Execution(_))));
    assert!(
        matches!(
            run("escape"),
            Ok(Applied {
                result: Value::Nil,
                ..
            })
        ),
        "no io library"
    );
    assert_eq!(
        run("nope").err(),
        Some(UdfError::FunctionNotFound("nope".to_owned()))
    );
    assert_eq!(
        UdfError::FunctionNotFound("nope".to_owned()).to_string(),
        "function not found",
        "the reference's words, which clients compare against"
    );
    let missing = apply_record(&registry, &call("absent", "f", vec![]), record(vec![]));
    assert_eq!(
        missing.err(),
        Some(UdfError::ModuleNotFound("absent".to_owned()))
    );
    // The state was dropped after the failures; calls still work.
    assert!(run("echo").is_ok());
}

#[test]
fn a_udf_that_never_ends_is_stopped_at_its_time_limit() {
    let registry = registry("udf1.lua", MODULE);
    let mut limited = call("udf1", "forever", vec![]);
    limited.time_limit = Duration::from_millis(50);
    let started = std::time::Instant::now();
    let Err(UdfError::Execution(message)) = apply_record(&registry, &limited, record(vec![]))
    else {
        panic!("a loop without end must fail");
    };
    assert!(message.contains("time limit"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn blobs_and_plain_tables_convert() {
    let registry = registry("udf1.lua", MODULE);
    let applied =
        apply_record(&registry, &call("udf1", "blob", vec![]), record(vec![])).expect("runs");
    assert!(matches!(applied.result, Value::Blob(4, ref b) if b == &[0, 65, 0]));
    let applied = apply_record(
        &registry,
        &call("udf1", "plain_tables", vec![]),
        record(vec![]),
    )
    .expect("runs");
    let Value::List(list) = applied.result else {
        panic!("a sequence is a list");
    };
    assert_eq!(list.items.len(), 3);
    assert!(matches!(list.items[2], Value::Map(_)));
}

#[test]
fn modules_that_do_not_compile_are_refused_with_their_line() {
    let error = check(
        "bad.lua",
        b"function f(rec, div)\n\tasdf\n   returned ret\nend",
    )
    .expect_err("refused");
    assert_eq!(error.line, Some(3), "{error:?}");
    assert!(
        error.message.starts_with("syntax error near 'returned'"),
        "{error:?}"
    );
}

#[test]
fn a_changed_module_is_loaded_again() {
    let registry = registry("m.lua", "function f(rec) return 1 end");
    let run = || {
        apply_record(&registry, &call("m", "f", vec![]), record(vec![]))
            .expect("runs")
            .result
    };
    assert!(matches!(run(), Value::Int(1)));
    registry.put(Module::new(
        "m.lua",
        b"function f(rec) return 2 end".to_vec(),
    ));
    assert!(matches!(run(), Value::Int(2)));
    assert!(registry.remove("m.lua"));
    assert!(apply_record(&registry, &call("m", "f", vec![]), record(vec![])).is_err());
}

#[test]
fn module_hashes_are_sha1() {
    // SHA-1 of "abc".
    assert_eq!(
        Module::new("x.lua", b"abc".to_vec()).hash,
        "a9993e364706816aba3e25717850c26c9cd0d89d"
    );
}

const STREAMS: &str = r#"
local function reducer(a, b) return a + b end
function sum(stream, name)
  local function mapper(rec) return rec[name] end
  return stream : map(mapper) : reduce(reducer)
end

function average(s, name)
  local function mapper(out, rec)
    out['sum'] = (out['sum'] or 0) + (rec[name] or 0)
    out['count'] = (out['count'] or 0) + 1
    return out
  end
  local function merge(a, b)
    local out = map()
    out['sum'] = a['sum'] + b['sum']
    out['count'] = a['count'] + b['count']
    return out
  end
  return s : aggregate(map{sum = 0, count = 0}, mapper) : reduce(merge)
end

function average_value(s, name)
  local function div(a) return a['sum'] / a['count'] end
  return average(s, name) : map(div)
end

function odd_names(stream)
  local function odd(rec) return rec.n % 2 == 1 end
  local function name(rec) return map{n = rec.n} end
  return stream : filter(odd) : map(name)
end

function by_parity(stream)
  local function n(rec) return rec.n end
  return stream : map(n) : groupby(function(v) return v % 2 end)
end

function writes(stream)
  local function w(rec) rec.x = 1; return 1 end
  return stream : map(w)
end

function writes_a_bin_it_has(stream)
  local function w(rec) rec.n = 0; return 1 end
  return stream : map(w)
end
"#;

fn run_stream(function: &str, args: Vec<Value>, count: i64) -> Result<Vec<Value>, UdfError> {
    let registry = registry("streams.lua", STREAMS);
    let mut n = 0;
    let mut next = || {
        n += 1;
        (n <= count).then(|| record(vec![(b"n".as_slice(), Value::Int(n))]))
    };
    let mut out = Vec::new();
    aggregate(
        &registry,
        &call("streams", function, args),
        &mut next,
        &mut |value| {
            out.push(value);
            Ok(())
        },
    )?;
    Ok(out)
}

#[test]
fn streams_map_reduce_aggregate_and_filter() {
    let sum = run_stream("sum", vec![str("n")], 100).expect("runs");
    assert!(matches!(sum.as_slice(), [Value::Int(5050)]), "{sum:?}");
    let average = run_stream("average", vec![str("n")], 10).expect("runs");
    assert_eq!(average.len(), 1);
    assert!(matches!(map_get(&average[0], "sum"), Some(Value::Int(55))));
    assert!(matches!(
        map_get(&average[0], "count"),
        Some(Value::Int(10))
    ));
    // What follows the first reduce is the client's: the server's
    // result is still the reduced map, not the mapped number.
    let average_value = run_stream("average_value", vec![str("n")], 10).expect("runs");
    assert_eq!(average_value.len(), 1);
    assert!(
        matches!(map_get(&average_value[0], "count"), Some(Value::Int(10))),
        "{average_value:?}"
    );
    let odd = run_stream("odd_names", vec![], 9).expect("runs");
    assert_eq!(odd.len(), 5);
    assert!(run_stream("sum", vec![str("n")], 0)
        .expect("runs")
        .is_empty());
    assert!(
        matches!(run_stream("writes", vec![], 3), Err(UdfError::Execution(_))),
        "stream records are read-only"
    );
    let existing = run_stream("writes_a_bin_it_has", vec![], 3);
    assert!(
        matches!(existing, Err(UdfError::Execution(ref m)) if m.contains("read-only")),
        "a stream record's own bins are read-only too: {existing:?}"
    );
    // groupby: a map from each key to the list of values that gave it.
    let groups = run_stream("by_parity", vec![], 6).expect("runs");
    assert_eq!(groups.len(), 1, "{groups:?}");
    let members = |key: i64| -> Vec<i64> {
        let Value::Map(map) = &groups[0] else {
            panic!("{groups:?}")
        };
        let (_, list) = map
            .entries
            .iter()
            .find(|(k, _)| matches!(k, Value::Int(found) if *found == key))
            .unwrap_or_else(|| panic!("no key {key}: {groups:?}"));
        let Value::List(list) = list else {
            panic!("{list:?}")
        };
        let mut values: Vec<i64> = list
            .items
            .iter()
            .map(|value| match value {
                Value::Int(n) => *n,
                other => panic!("{other:?}"),
            })
            .collect();
        values.sort_unstable();
        values
    };
    assert_eq!(members(0), vec![2, 4, 6]);
    assert_eq!(members(1), vec![1, 3, 5]);
}

/// One aggregation run over groups of records (a partition each, on the
/// server): `restart` ends a group's stream, emitting its result, and the
/// next group starts from an empty stream with fresh arguments.
#[test]
fn a_restarted_stream_emits_each_groups_result() {
    let registry = registry(
        "streams.lua",
        &format!(
            "{STREAMS}\nfunction tagged(stream, tags)\n  list.append(tags, 'seen')\n  local function f(rec) return list.size(tags) end\n  return stream : map(f) : reduce(function(a, b) return a + b end)\nend\n"
        ),
    );
    let mut aggregation =
        Aggregation::new(&registry, &call("streams", "sum", vec![str("n")])).expect("a stream");
    let mut out = Vec::new();
    let mut emit = |value| {
        out.push(value);
        Ok(())
    };
    for n in 1..=3 {
        aggregation
            .record(&record(vec![(b"n".as_slice(), Value::Int(n))]))
            .expect("record");
    }
    aggregation.restart(&mut emit).expect("restart");
    for n in [10, 20] {
        aggregation
            .record(&record(vec![(b"n".as_slice(), Value::Int(n))]))
            .expect("record");
    }
    aggregation.restart(&mut emit).expect("restart");
    // A group with no records emits nothing.
    aggregation.end(&mut emit).expect("end");
    assert!(
        matches!(out.as_slice(), [Value::Int(6), Value::Int(30)]),
        "{out:?}"
    );

    // Each stream gets its own copy of a table argument.
    let tags = Value::List(List {
        flags: 0,
        items: Vec::new(),
    });
    let mut aggregation =
        Aggregation::new(&registry, &call("streams", "tagged", vec![tags])).expect("a stream");
    let mut out = Vec::new();
    let mut emit = |value| {
        out.push(value);
        Ok(())
    };
    for _ in 0..2 {
        aggregation
            .record(&record(vec![(b"n".as_slice(), Value::Int(1))]))
            .expect("record");
        aggregation.restart(&mut emit).expect("restart");
    }
    assert!(
        matches!(out.as_slice(), [Value::Int(1), Value::Int(1)]),
        "{out:?}"
    );
}

#[test]
fn bins_convert_to_values_and_back() {
    for value in [
        Value::Int(-5),
        Value::Double(1.5),
        str("text"),
        Value::Blob(4, vec![1, 2]),
        Value::Bool(true),
        Value::Geo(br#"{"type":"Point","coordinates":[1,2]}"#.to_vec()),
        Value::List(List {
            flags: 0,
            items: vec![Value::Int(1)],
        }),
    ] {
        let (particle, bytes) = particle_of(&value).expect("a bin");
        let back = bin_value(particle, &bytes).expect("a value");
        assert_eq!(
            citrine_cdt::value::compare(&back, &value),
            std::cmp::Ordering::Equal,
            "{value:?}"
        );
    }
    assert!(particle_of(&Value::Nil).is_none());
}

const HOSTILE: &str = r#"
function swallow(rec) while true do pcall(function() while true do end end) end end
function nested(rec) pcall(function() while true do pcall(function() while true do end end) end end) return 1 end
function finalizer(rec) setmetatable({}, {__gc = function() while true do end end}) return 1 end
function pattern(rec) return string.find(("a"):rep(40), ("a*"):rep(25) .. "b") end
function method_pattern(rec) return (("a"):rep(40)):find(("a*"):rep(25) .. "b") end
function fine_patterns(rec)
  local words = list()
  for w in string.gmatch("one two three", "%a+") do list.append(words, w) end
  return list{#words, (string.gsub("a-b-c", "-", "+")), string.find(("x"):rep(100000), "x", 1, true)}
end
function peek(rec) return next(rec) == nil end
function long_len(rec) return setmetatable({}, {__len = function() return math.maxinteger end}) end
function huge(rec) local s = ("x"):rep(2^20) local t = {} for i = 1, 200 do t[i] = s end return t end
function cyclic_list(rec) local l = list() list.append(l, l) return l end
function spoil(rec) aerospike.update = function() return 7 end string.upper = nil return 1 end
function nested_after_update(rec)
  local l = list{1}
  rec['l'] = l
  aerospike:update(rec)
  list.append(l, 2)
end
"#;

const VICTIM: &str = r#"
function write(rec) rec['x'] = string.upper('a') return aerospike:update(rec) end
"#;

#[test]
fn bytecode_is_refused() {
    let lua = mlua::Lua::new();
    let dumped = lua
        .load("return 1")
        .into_function()
        .expect("compiles")
        .dump(false);
    assert!(
        check("dumped.lua", &dumped).is_err(),
        "a binary chunk must be refused"
    );
    // Even if one reached the registry, loading it fails.
    let registry = Registry::default();
    registry.put(Module::new("dumped.lua", dumped));
    let result = apply_record(&registry, &call("dumped", "f", vec![]), record(vec![]));
    assert!(matches!(result, Err(UdfError::Execution(_))), "{result:?}");
}

#[test]
fn the_time_limit_cannot_be_caught_or_dodged() {
    let registry = registry("hostile.lua", HOSTILE);
    for function in ["swallow", "nested"] {
        let mut limited = call("hostile", function, vec![]);
        limited.time_limit = Duration::from_millis(50);
        let started = std::time::Instant::now();
        let result = apply_record(&registry, &limited, record(vec![]));
        assert!(
            matches!(result, Err(UdfError::Execution(ref message)) if message.contains("time limit")),
            "{function}: {result:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(5), "{function}");
    }
    for function in ["finalizer", "pattern", "method_pattern"] {
        let result = apply_record(
            &registry,
            &call("hostile", function, vec![]),
            record(vec![]),
        );
        assert!(
            matches!(result, Err(UdfError::Execution(_))),
            "{function}: {result:?}"
        );
    }
    let fine = apply_record(
        &registry,
        &call("hostile", "fine_patterns", vec![]),
        record(vec![]),
    )
    .expect("patterns on short subjects and plain finds work");
    let Value::List(list) = fine.result else {
        panic!("a list");
    };
    assert!(
        matches!(list.items[..], [Value::Int(3), Value::Str(ref s), Value::Int(1), Value::Int(1)] if s == b"a+b+c"),
        "{list:?}"
    );
}

#[test]
fn results_are_bounded_and_records_keep_their_state_private() {
    let registry = registry("hostile.lua", HOSTILE);
    let run = |function: &str| {
        apply_record(
            &registry,
            &call("hostile", function, vec![]),
            record(vec![]),
        )
    };
    assert!(matches!(
        run("peek").expect("runs").result,
        Value::Bool(true)
    ));
    // A table's own __len is not consulted.
    assert!(
        matches!(run("long_len").expect("runs").result, Value::List(ref l) if l.items.is_empty())
    );
    assert!(matches!(run("huge"), Err(UdfError::Execution(ref m)) if m.contains("at most")));
    assert!(matches!(run("cyclic_list"), Err(UdfError::Execution(_))));
    // What a record held at its update is what is stored.
    let Change::Write { bins, .. } = run("nested_after_update").expect("runs").change else {
        panic!("a write");
    };
    assert!(
        matches!(&bins[0].1, Value::List(l) if l.items.len() == 1),
        "{bins:?}"
    );
}

#[test]
fn one_module_cannot_change_what_another_sees() {
    let registry = Registry::default();
    registry.put(Module::new("hostile.lua", HOSTILE.as_bytes().to_vec()));
    registry.put(Module::new("victim.lua", VICTIM.as_bytes().to_vec()));
    apply_record(&registry, &call("hostile", "spoil", vec![]), record(vec![])).expect("runs");
    let applied =
        apply_record(&registry, &call("victim", "write", vec![]), record(vec![])).expect("runs");
    assert!(matches!(applied.result, Value::Int(0)));
    assert!(
        matches!(applied.change, Change::Write { ref bins, .. } if matches!(&bins[0].1, Value::Str(s) if s == b"A"))
    );
}

#[test]
fn modules_require_other_registered_modules() {
    let registry = Registry::default();
    registry.put(Module::new(
        "helper.lua",
        b"function twice(x) return 2 * x end".to_vec(),
    ));
    registry.put(Module::new(
        "table_module.lua",
        b"local M = {} function M.three() return 3 end return M".to_vec(),
    ));
    registry.put(Module::new(
        "user.lua",
        b"local h = require('helper')\nlocal t = require('table_module')\nfunction f(rec, x) return h.twice(x) + t.three() end\nfunction missing(rec) return require('nowhere') end\nfunction no_load(rec) return load == nil and dofile == nil end"
            .to_vec(),
    ));
    let applied = apply_record(
        &registry,
        &call("user", "f", vec![Value::Int(5)]),
        record(vec![]),
    )
    .expect("runs");
    assert!(
        matches!(applied.result, Value::Int(13)),
        "{:?}",
        applied.result
    );
    let missing = apply_record(&registry, &call("user", "missing", vec![]), record(vec![]));
    assert!(
        matches!(missing, Err(UdfError::Execution(ref m)) if m.contains("nowhere")),
        "{missing:?}"
    );
    let hidden =
        apply_record(&registry, &call("user", "no_load", vec![]), record(vec![])).expect("runs");
    assert!(matches!(hidden.result, Value::Bool(true)));
}

const CALLS: &str = r#"
function level_two(rec) error("bare message", 2) end
function digest(rec) return record.digest(rec) end
function private(rec)
  local keys = list()
  for k in next, rec do list.append(keys, k) end
  local hidden = 0
  for i = -2, 40 do if rawget(rec, i) ~= nil then hidden = hidden + 1 end end
  rec['a'] = rec['a'] + 1
  rec['c'] = 3
  aerospike:update(rec)
  return list{keys, hidden, getmetatable(rec), record.numbins(rec)}
end
function copy_all(rec)
  aerospike:update(rec)
  return record.numbins(rec)
end
"#;

#[test]
fn error_level_two_in_the_called_function_names_no_place() {
    // The function's caller (the prelude's entry, loaded without line
    // information) must not add a place, as when Rust called the function.
    let registry = registry("calls.lua", CALLS);
    let result = apply_record(
        &registry,
        &call("calls", "level_two", vec![]),
        record(vec![]),
    );
    assert_eq!(
        result.err(),
        Some(UdfError::Execution("bare message".to_owned()))
    );
}

#[test]
fn the_digest_comes_back_byte_for_byte() {
    // Sent to Lua as three integers: every byte, high bits included.
    let registry = registry("calls.lua", CALLS);
    let mut input = record(vec![]);
    for (index, byte) in input.digest.iter_mut().enumerate() {
        *byte = 0xff - index as u8 * 7;
    }
    let digest = input.digest;
    let applied = apply_record(&registry, &call("calls", "digest", vec![]), input).expect("runs");
    assert!(
        matches!(applied.result, Value::Blob(4, ref bytes) if bytes[..] == digest[..]),
        "{:?}",
        applied.result
    );
}

#[test]
fn a_record_holds_its_bins_and_nothing_of_its_state() {
    let registry = registry("calls.lua", CALLS);
    let input = record(vec![
        (b"a".as_slice(), Value::Int(1)),
        (b"b".as_slice(), str("x")),
    ]);
    let applied = apply_record(&registry, &call("calls", "private", vec![]), input).expect("runs");
    let Value::List(out) = &applied.result else {
        panic!("{:?}", applied.result);
    };
    let Value::List(keys) = &out.items[0] else {
        panic!("{out:?}");
    };
    assert!(
        keys.items
            .iter()
            .all(|key| *key == str("a") || *key == str("b")),
        "at most the bins, by name: {keys:?}"
    );
    assert_eq!(out.items[1], Value::Int(0), "no slot of the state");
    assert_eq!(out.items[2], str("Record"));
    assert_eq!(out.items[3], Value::Int(3));
    let Change::Write { bins, .. } = applied.change else {
        panic!("{:?}", applied.change);
    };
    assert_eq!(
        bins,
        vec![
            (b"a".to_vec(), Value::Int(2)),
            (b"b".to_vec(), str("x")),
            (b"c".to_vec(), Value::Int(3)),
        ]
    );
}

#[test]
fn many_bin_names_each_keep_their_value() {
    // More names than the state keeps Lua strings for: every bin still
    // reaches Lua under its own name, call after call.
    let registry = registry("calls.lua", CALLS);
    let names: Vec<Vec<u8>> = (0..700).map(|i| format!("bin{i}").into_bytes()).collect();
    for round in 0..3i64 {
        let input = RecordIn {
            bins: names
                .iter()
                .enumerate()
                .map(|(i, name)| (Cow::Borrowed(name.as_slice()), Value::Int(i as i64 + round)))
                .collect(),
            ..record(vec![])
        };
        let applied =
            apply_record(&registry, &call("calls", "copy_all", vec![]), input).expect("runs");
        assert_eq!(applied.result, Value::Int(700));
        let Change::Write { bins, .. } = applied.change else {
            panic!("{:?}", applied.change);
        };
        let mut expected: Vec<(Vec<u8>, Value)> = names
            .iter()
            .enumerate()
            .map(|(i, name)| (name.clone(), Value::Int(i as i64 + round)))
            .collect();
        expected.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(bins, expected, "round {round}");
    }
}
