//! Lua UDFs (`citrine_udf`): arbitrary arguments through a record UDF, and
//! arbitrary module source through the compile check and a call.
//!
//! Input: byte 0 picks the mode. Even: the rest, decoded as one msgpack
//! value (when it decodes), is the argument of functions that echo it,
//! store it in a bin, and put it in a list and a map. Odd: the rest is a
//! module's source; when it compiles, its function `f` is called on a
//! record with a 20 ms time limit.
//!
//! Oracle: no panic; every value a call returns, and every bin it stores,
//! encodes to msgpack that decodes again; a call never runs long past its
//! time limit (the instruction hook stops it).
#![no_main]

use citrine_cdt::value::{self, Value};
use citrine_udf::{apply_record, check, Call, Change, Module, RecordIn, Registry};
use libfuzzer_sys::fuzz_target;
use std::borrow::Cow;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const ECHO: &str = r#"
function echo(rec, v) return v end
function store(rec, v) rec['v'] = v; aerospike:update(rec); return rec['v'] end
function wrap(rec, v) local l = list{v, v}; local m = map(); m['k'] = v; m[1] = l; return m end
function text(rec, v) return tostring(v) end
"#;

fn echo_registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let registry = Registry::default();
        registry.put(Module::new("echo.lua", ECHO.as_bytes().to_vec()));
        registry
    })
}

fn record() -> RecordIn<'static> {
    RecordIn {
        exists: true,
        bins: vec![(Cow::Borrowed(b"n".as_slice()), Value::Int(1))],
        generation: 1,
        ttl: -1,
        last_update_ms: 0,
        digest: [1; 20],
        set: Cow::Borrowed(b"s"),
        key: None,
        size: 10,
    }
}

fn assert_encodes(value: &Value) {
    let bytes = value::to_bytes(value);
    assert!(
        value::decode_stored(&bytes).is_ok(),
        "{value:?} does not decode again"
    );
}

fn call<'a>(module: &'a str, function: &'a str, args: Vec<Value>, limit: Duration) -> Call<'a> {
    Call {
        module,
        function,
        args: Cow::Owned(args),
        time_limit: limit,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        let Ok(argument) = value::decode(rest) else {
            return;
        };
        for function in ["echo", "store", "wrap", "text"] {
            let limit = Duration::from_millis(200);
            let call = call("echo", function, vec![argument.clone()], limit);
            if let Ok(applied) = apply_record(echo_registry(), &call, record()) {
                assert_encodes(&applied.result);
                if let Change::Write { bins, .. } = &applied.change {
                    for (_, value) in bins {
                        assert_encodes(value);
                    }
                }
            }
        }
        return;
    }
    if check("f.lua", rest).is_err() {
        return;
    }
    let registry = Registry::default();
    registry.put(Module::new("f.lua", rest.to_vec()));
    let started = Instant::now();
    let call = call("f", "f", vec![Value::Int(1)], Duration::from_millis(20));
    if let Ok(applied) = apply_record(&registry, &call, record()) {
        assert_encodes(&applied.result);
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a call ran {:?} past a 20 ms limit",
        started.elapsed()
    );
});
