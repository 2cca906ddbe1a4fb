//! What one record UDF call costs in this crate alone: `apply_record` in a
//! loop on one thread, on a record of one integer bin, calling the
//! `citrine bench` module's `get` (return the bin) or `incr` (add 1,
//! `aerospike:update`, return it).
//!
//! ```sh
//! cargo run --release -p citrine-udf --example record_call -- get 200000
//! valgrind --tool=callgrind target/release/examples/record_call get 20000
//! ```
//!
//! Prints the wall-clock time per call; under callgrind, the instruction
//! count divided by the calls (minus a run with 0 calls, which is the
//! state's setup) is the repeatable figure.

use citrine_cdt::value::Value;
use citrine_udf::{apply_record, Call, Module, RecordIn, Registry};
use std::borrow::Cow;
use std::time::{Duration, Instant};

/// The `citrine bench` module (crates/citrine-cli/src/bench/mod.rs).
const SOURCE: &str = "\
function incr(rec, bin)
  local value = (rec[bin] or 0) + 1
  rec[bin] = value
  aerospike:update(rec)
  return value
end

function get(rec, bin)
  if not aerospike:exists(rec) then
    return nil
  end
  return rec[bin]
end
";

fn record(key: i64) -> RecordIn<'static> {
    let mut digest = [0u8; 20];
    digest[..8].copy_from_slice(&key.to_le_bytes());
    RecordIn {
        exists: true,
        bins: vec![(Cow::Borrowed(b"b0".as_slice()), Value::Int(key))],
        generation: 1,
        ttl: -1,
        last_update_ms: 1_700_000_000_000,
        digest,
        set: Cow::Borrowed(b"udfk"),
        key: Some(Value::Int(key)),
        size: 40,
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let function = args.next().unwrap_or_else(|| "get".to_owned());
    let calls: i64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(100_000);
    let registry = Registry::default();
    registry.put(Module::new("citrine_bench.lua", SOURCE.as_bytes().to_vec()));
    let call = Call {
        module: "citrine_bench",
        function: &function,
        args: Cow::Owned(vec![Value::Str(b"b0".to_vec())]),
        time_limit: Duration::from_secs(1),
    };
    // The state is built by the first call: not timed.
    if let Err(error) = apply_record(&registry, &call, record(-1)) {
        eprintln!("the first call failed: {error}");
        std::process::exit(1);
    }
    let start = Instant::now();
    for key in 0..calls {
        if let Err(error) = apply_record(&registry, &call, record(key)) {
            eprintln!("call {key} failed: {error}");
            std::process::exit(1);
        }
    }
    let elapsed = start.elapsed();
    if calls > 0 {
        println!(
            "{function}: {calls} calls, {:.0} ns per call",
            elapsed.as_nanos() as f64 / calls as f64
        );
    }
}
