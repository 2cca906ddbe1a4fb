//! Support for the fuzz targets: the wire oracle, and the one node the
//! service targets feed.

#![forbid(unsafe_code)]

pub mod node;
pub mod oracle;
