//! Support for the fuzz targets: the wire oracle, and the one node the
//! service targets feed.
//!
//! The targets (`fuzz/fuzz_targets/`; `scripts/fuzz-ci.sh` runs each for
//! 30 s in CI): the wire decoders (`wire_frame`, `wire_message`), CDT ops
//! (`cdt_operate`), expressions (`exp_parse_eval`), index keys
//! (`sindex_keys`), UDF values (`udf_values`), a node's fabric calls
//! (`fabric_calls`), and whole client requests into a node through
//! `Service::handle` (`service_requests`, seeded with frames the official
//! Python client sent, recorded by `fuzz/record_frames.py`), and the admin
//! protocol with security on (`admin_parse`).

#![forbid(unsafe_code)]

pub mod node;
pub mod oracle;
