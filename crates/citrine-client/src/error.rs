//! Typed client errors.
//!
//! Owns [`Error`], the one error type every public call returns, and the
//! classification the retry loop relies on ([`Error::is_retryable`]).
//! Invariant: an error that came from a server answer always carries the
//! server's raw result code (and the matching [`ResultCode`] when the code is
//! one the protocol defines), so callers never lose the number.

use citrine_types::ResultCode;
use std::net::SocketAddr;

/// Everything that can go wrong in a client call.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with a non-zero result code.
    #[error("server {node} answered result code {code} ({}){}", describe_code(*.result), in_doubt_suffix(*.in_doubt))]
    Server {
        /// Raw byte 5 of the AS_MSG answer.
        code: u8,
        /// The code as a known [`ResultCode`], `None` for numbers not in the table.
        result: Option<ResultCode>,
        /// Node that answered (its id, or its address if the id is unknown).
        node: String,
        /// True for a write whose outcome is unknown (an earlier attempt may have applied it).
        in_doubt: bool,
    },
    /// Could not connect, or the connection broke mid-command.
    #[error("network error talking to {address}: {message}{}", in_doubt_suffix(*.in_doubt))]
    Network {
        address: String,
        message: String,
        in_doubt: bool,
    },
    /// A socket or total timeout expired.
    #[error("client timeout after {iterations} attempt(s) ({what}){}", in_doubt_suffix(*.in_doubt))]
    Timeout {
        what: &'static str,
        iterations: u32,
        in_doubt: bool,
    },
    /// The partition has no known owner (cluster still forming, node gone).
    #[error("no node serves namespace {namespace} partition {partition}: the partition map is empty or stale (is the namespace defined on the server?)")]
    NoNode { namespace: String, partition: u16 },
    /// No seed could be reached or validated.
    #[error("could not connect to any seed ({seeds}): {reasons}. Check that the server is running and that host:port is right")]
    NoSeed { seeds: String, reasons: String },
    /// A seed or peer answered, but not like a usable node.
    #[error("node at {address} failed validation: {reason}")]
    InvalidNode { address: SocketAddr, reason: String },
    /// Bytes from the server could not be decoded.
    #[error("protocol error from {address}: {message}")]
    Protocol { address: String, message: String },
    /// An info command answered `ERROR:`/`FAIL:`.
    #[error("info command {command:?} failed on {node}: code {code}: {message}")]
    Info {
        node: String,
        command: String,
        code: u8,
        message: String,
    },
    /// A user-defined function failed on the server: result code 100
    /// (`UDF_EXECUTION`) with the server's text from the `FAILURE` bin
    /// (an error the Lua code raised, a module or function not found, a
    /// time limit...). The record was not changed.
    #[error("UDF failed on {node} (result code 100): {message}")]
    Udf {
        /// Node that answered.
        node: String,
        /// The `FAILURE` bin's text (empty if the server sent none).
        message: String,
    },
    /// A UDF module command (`udf-put`, `udf-get`, `udf-remove`) answered
    /// `error=<reason>[;file=..;line=..;message=..]` (boxed: it is large).
    #[error("{0}")]
    UdfModule(Box<UdfModuleError>),
    /// The caller passed something that cannot be sent (bad name lengths, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The client has been closed.
    #[error("client is closed")]
    Closed,
}

fn in_doubt_suffix(in_doubt: bool) -> &'static str {
    if in_doubt {
        " (write in doubt)"
    } else {
        ""
    }
}

/// A UDF module command's refusal ([`Error::UdfModule`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UdfModuleError {
    /// Node that answered.
    pub node: String,
    /// The module's file name the command named.
    pub filename: String,
    /// The server's reason word, e.g. `compile_error`, `invalid_filename`.
    pub reason: String,
    /// The file the problem is in (compile errors).
    pub file: Option<String>,
    /// The line the problem is on (compile errors).
    pub line: Option<u32>,
    /// The server's explanation (sent base64-encoded; decoded here).
    pub message: Option<String>,
}

impl std::fmt::Display for UdfModuleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "UDF module {:?} refused by {}: {}",
            self.filename, self.node, self.reason
        )?;
        match (&self.file, self.line) {
            (Some(file), Some(line)) => write!(f, " at {file}:{line}")?,
            (Some(file), None) => write!(f, " in {file}")?,
            (None, Some(line)) => write!(f, " at line {line}")?,
            (None, None) => {}
        }
        if let Some(message) = &self.message {
            write!(f, ": {message}")?;
        }
        Ok(())
    }
}

fn describe_code(result: Option<ResultCode>) -> &'static str {
    match result {
        Some(result) => result.describe(),
        None => "not in the protocol's table",
    }
}

/// Maps a wire result code to the known [`ResultCode`], if any.
pub fn result_code_from_u8(code: u8) -> Option<ResultCode> {
    use ResultCode as R;
    Some(match code {
        0 => R::Ok,
        1 => R::ServerError,
        2 => R::NotFound,
        3 => R::Generation,
        4 => R::Parameter,
        5 => R::RecordExists,
        6 => R::BinExists,
        7 => R::ClusterKeyMismatch,
        8 => R::OutOfSpace,
        9 => R::Timeout,
        10 => R::AlwaysForbidden,
        11 => R::Unavailable,
        12 => R::IncompatibleType,
        13 => R::RecordTooBig,
        14 => R::KeyBusy,
        15 => R::QueryAbort,
        16 => R::UnsupportedFeature,
        17 => R::BinNotFound,
        18 => R::DeviceOverload,
        19 => R::KeyMismatch,
        20 => R::Namespace,
        21 => R::BinName,
        22 => R::Forbidden,
        23 => R::ElementNotFound,
        24 => R::ElementExists,
        25 => R::EnterpriseOnly,
        26 => R::OpNotApplicable,
        27 => R::FilteredOut,
        28 => R::LostConflict,
        50 => R::QueryEnd,
        51 => R::SecurityNotSupported,
        52 => R::SecurityNotEnabled,
        53 => R::SecurityScheme,
        54 => R::InvalidCommand,
        55 => R::InvalidField,
        56 => R::IllegalState,
        60 => R::InvalidUser,
        61 => R::UserExists,
        62 => R::InvalidPassword,
        63 => R::ExpiredPassword,
        64 => R::ForbiddenPassword,
        65 => R::InvalidCredential,
        66 => R::ExpiredSession,
        70 => R::InvalidRole,
        71 => R::RoleExists,
        72 => R::InvalidPrivilege,
        73 => R::InvalidWhitelist,
        74 => R::QuotasNotEnabled,
        75 => R::InvalidQuota,
        80 => R::NotAuthenticated,
        81 => R::RoleViolation,
        82 => R::NotWhitelisted,
        83 => R::QuotaExceeded,
        100 => R::UdfExecution,
        150 => R::BatchDisabled,
        151 => R::BatchMaxRequests,
        152 => R::BatchQueuesFull,
        160 => R::GeoInvalidGeojson,
        200 => R::SindexFound,
        201 => R::SindexNotFound,
        203 => R::SindexNotReadable,
        211 => R::QueryQueueFull,
        _ => return None,
    })
}

/// Result codes that mean "the same command may succeed if tried again,
/// possibly elsewhere": 9 timeout, 11 partition unavailable, 14 key busy,
/// 18 device overload.
pub fn is_retryable_code(code: u8) -> bool {
    matches!(code, 9 | 11 | 14 | 18)
}

impl Error {
    /// Builds a server error from a raw code.
    pub fn server(code: u8, node: impl Into<String>) -> Error {
        Error::Server {
            code,
            result: result_code_from_u8(code),
            node: node.into(),
            in_doubt: false,
        }
    }

    /// The server's result code, when the error came from a server answer
    /// ([`Error::Udf`] is 100, `UdfExecution`).
    pub fn result_code(&self) -> Option<ResultCode> {
        match self {
            Error::Server { result, .. } => *result,
            Error::Udf { .. } => Some(ResultCode::UdfExecution),
            _ => None,
        }
    }

    /// The raw server result code, when the error came from a server answer.
    pub fn raw_code(&self) -> Option<u8> {
        match self {
            Error::Server { code, .. } => Some(*code),
            Error::Udf { .. } => Some(ResultCode::UdfExecution.code()),
            _ => None,
        }
    }

    /// Whether the retry loop may try the command again.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Server { code, .. } => is_retryable_code(*code),
            Error::Network { .. } | Error::Timeout { .. } | Error::NoNode { .. } => true,
            _ => false,
        }
    }

    /// Whether this error says the node itself is unhealthy (counts toward
    /// its failure count), as opposed to a per-record answer.
    pub fn counts_against_node(&self) -> bool {
        matches!(
            self,
            Error::Network { .. } | Error::Timeout { .. } | Error::Protocol { .. }
        )
    }

    /// True when a write may or may not have been applied.
    pub fn in_doubt(&self) -> bool {
        match self {
            Error::Server { in_doubt, .. }
            | Error::Network { in_doubt, .. }
            | Error::Timeout { in_doubt, .. } => *in_doubt,
            _ => false,
        }
    }

    pub(crate) fn set_in_doubt(&mut self, value: bool) {
        match self {
            Error::Server { in_doubt, .. }
            | Error::Network { in_doubt, .. }
            | Error::Timeout { in_doubt, .. } => *in_doubt = value,
            _ => {}
        }
    }
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        assert!(Error::server(11, "n").is_retryable());
        assert!(Error::server(9, "n").is_retryable());
        assert!(Error::server(14, "n").is_retryable());
        assert!(Error::server(18, "n").is_retryable());
        assert!(!Error::server(2, "n").is_retryable());
        assert!(!Error::server(3, "n").is_retryable());
        assert_eq!(
            Error::server(3, "n").result_code(),
            Some(ResultCode::Generation)
        );
        assert_eq!(Error::server(250, "n").result_code(), None);
        assert_eq!(Error::server(250, "n").raw_code(), Some(250));
        let network = Error::Network {
            address: "x".into(),
            message: "y".into(),
            in_doubt: false,
        };
        assert!(network.is_retryable() && network.counts_against_node());
        assert!(!Error::server(11, "n").counts_against_node());
        for code in 0..=255u8 {
            if let Some(result) = result_code_from_u8(code) {
                assert_eq!(result.code(), code);
            }
        }
    }

    #[test]
    fn messages_are_readable() {
        let text = Error::server(2, "BB9").to_string();
        assert!(text.contains("record not found"), "{text}");
        let mut error = Error::Timeout {
            what: "total",
            iterations: 3,
            in_doubt: false,
        };
        error.set_in_doubt(true);
        assert!(error.to_string().contains("in doubt"));
    }
}
