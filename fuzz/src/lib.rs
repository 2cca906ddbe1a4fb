//! Support for the citrine-wire fuzz targets: the shared oracle and seeds.

#![forbid(unsafe_code)]

pub mod oracle;
