//! Result codes, numbered exactly as the Aerospike protocol numbers them
//! (`shared/protocol/06-result-codes.md`). The server answers every failure
//! with one of these; clients key their behaviour (retry, keep the socket) on
//! the number, so a number never changes meaning.

/// A server result code as carried in byte 5 of an AS_MSG header or byte 1 of
/// a security header.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum ResultCode {
    Ok = 0,
    ServerError = 1,
    NotFound = 2,
    Generation = 3,
    Parameter = 4,
    RecordExists = 5,
    BinExists = 6,
    ClusterKeyMismatch = 7,
    OutOfSpace = 8,
    Timeout = 9,
    AlwaysForbidden = 10,
    Unavailable = 11,
    IncompatibleType = 12,
    RecordTooBig = 13,
    KeyBusy = 14,
    QueryAbort = 15,
    UnsupportedFeature = 16,
    BinNotFound = 17,
    DeviceOverload = 18,
    KeyMismatch = 19,
    Namespace = 20,
    BinName = 21,
    Forbidden = 22,
    ElementNotFound = 23,
    ElementExists = 24,
    EnterpriseOnly = 25,
    OpNotApplicable = 26,
    FilteredOut = 27,
    LostConflict = 28,
    QueryEnd = 50,
    SecurityNotSupported = 51,
    SecurityNotEnabled = 52,
    SecurityScheme = 53,
    InvalidCommand = 54,
    InvalidField = 55,
    IllegalState = 56,
    InvalidUser = 60,
    UserExists = 61,
    InvalidPassword = 62,
    ExpiredPassword = 63,
    ForbiddenPassword = 64,
    InvalidCredential = 65,
    ExpiredSession = 66,
    InvalidRole = 70,
    RoleExists = 71,
    InvalidPrivilege = 72,
    InvalidWhitelist = 73,
    QuotasNotEnabled = 74,
    InvalidQuota = 75,
    NotAuthenticated = 80,
    RoleViolation = 81,
    NotWhitelisted = 82,
    QuotaExceeded = 83,
    UdfExecution = 100,
    /// A transaction's write (or any write) met a record another
    /// transaction has locked.
    MrtBlocked = 120,
    /// A transaction's verify read found the record changed.
    MrtVersionMismatch = 121,
    /// The transaction's deadline has passed.
    MrtExpired = 122,
    /// The transaction's monitor record is full.
    MrtTooManyWrites = 123,
    /// The transaction was already marked to roll forward.
    MrtCommitted = 124,
    /// The transaction was already rolled back.
    MrtAborted = 125,
    /// A write that must lock its record found it locked by its own
    /// transaction already.
    MrtAlreadyLocked = 126,
    /// The transaction's monitor record exists already.
    MrtMonitorExists = 127,
    BatchDisabled = 150,
    BatchMaxRequests = 151,
    BatchQueuesFull = 152,
    /// A GeoJSON bin value that is not a shape the server supports.
    GeoInvalidGeojson = 160,
    SindexFound = 200,
    SindexNotFound = 201,
    SindexNotReadable = 203,
    /// Too many background jobs active (the older servers' name for it).
    QueryQueueFull = 211,
}

impl ResultCode {
    /// The number on the wire.
    #[inline]
    pub fn code(self) -> u8 {
        self as u8
    }

    /// A short human-readable description, used in info `ERROR:` answers and logs.
    pub fn describe(self) -> &'static str {
        match self {
            ResultCode::Ok => "ok",
            ResultCode::ServerError => "server error",
            ResultCode::NotFound => "record not found",
            ResultCode::Generation => "generation mismatch",
            ResultCode::Parameter => "parameter error",
            ResultCode::RecordExists => "record exists",
            ResultCode::BinExists => "bin exists",
            ResultCode::ClusterKeyMismatch => "cluster key mismatch",
            ResultCode::OutOfSpace => "out of space (stop-writes)",
            ResultCode::Timeout => "timeout",
            ResultCode::AlwaysForbidden => "always forbidden",
            ResultCode::Unavailable => "partition unavailable",
            ResultCode::IncompatibleType => "incompatible bin type",
            ResultCode::RecordTooBig => "record too big",
            ResultCode::KeyBusy => "key busy",
            ResultCode::QueryAbort => "query aborted",
            ResultCode::UnsupportedFeature => "unsupported feature",
            ResultCode::BinNotFound => "bin not found",
            ResultCode::DeviceOverload => "device overload",
            ResultCode::KeyMismatch => "key mismatch",
            ResultCode::Namespace => "namespace not found",
            ResultCode::BinName => "bin name invalid or too long",
            ResultCode::Forbidden => "forbidden",
            ResultCode::ElementNotFound => "element not found",
            ResultCode::ElementExists => "element exists",
            ResultCode::EnterpriseOnly => "enterprise only",
            ResultCode::OpNotApplicable => "op not applicable",
            ResultCode::FilteredOut => "filtered out",
            ResultCode::LostConflict => "lost conflict",
            ResultCode::SecurityNotSupported => "security not supported",
            ResultCode::SecurityNotEnabled => "security not enabled",
            ResultCode::InvalidCommand => "invalid command",
            ResultCode::NotAuthenticated => "not authenticated",
            ResultCode::QueryEnd => "end of a user or role query",
            ResultCode::SecurityScheme => "security scheme not supported",
            ResultCode::InvalidField => "invalid admin field",
            ResultCode::IllegalState => "security protocol state error",
            ResultCode::InvalidUser => "invalid user",
            ResultCode::UserExists => "user already exists",
            ResultCode::InvalidPassword => "invalid password",
            ResultCode::ExpiredPassword => "expired password",
            ResultCode::ForbiddenPassword => "forbidden password",
            ResultCode::InvalidCredential => "invalid credential",
            ResultCode::ExpiredSession => "expired session",
            ResultCode::InvalidRole => "invalid role",
            ResultCode::RoleExists => "role already exists",
            ResultCode::InvalidPrivilege => "invalid privilege",
            ResultCode::InvalidWhitelist => "invalid allow-list",
            ResultCode::QuotasNotEnabled => "quotas not enabled",
            ResultCode::InvalidQuota => "invalid quota",
            ResultCode::RoleViolation => "role violation",
            ResultCode::NotWhitelisted => "not allow-listed",
            ResultCode::QuotaExceeded => "quota exceeded",
            ResultCode::UdfExecution => "udf execution error",
            ResultCode::MrtBlocked => "record blocked by a transaction",
            ResultCode::MrtVersionMismatch => "transaction record version mismatch",
            ResultCode::MrtExpired => "transaction expired",
            ResultCode::MrtTooManyWrites => "transaction has too many writes",
            ResultCode::MrtCommitted => "transaction already committed",
            ResultCode::MrtAborted => "transaction already aborted",
            ResultCode::MrtAlreadyLocked => "record already locked by this transaction",
            ResultCode::MrtMonitorExists => "transaction monitor exists",
            ResultCode::BatchDisabled => "batch disabled",
            ResultCode::BatchMaxRequests => "batch max requests exceeded",
            ResultCode::BatchQueuesFull => "batch queues full",
            ResultCode::GeoInvalidGeojson => "invalid or unsupported GeoJSON",
            ResultCode::SindexFound => "index already exists",
            ResultCode::SindexNotFound => "index not found",
            ResultCode::SindexNotReadable => "index not readable (still being built)",
            ResultCode::QueryQueueFull => "query queue full (too many background jobs)",
        }
    }
}

impl std::fmt::Display for ResultCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.describe(), self.code())
    }
}

#[cfg(test)]
mod tests {
    use super::ResultCode;

    #[test]
    fn numbers_match_the_protocol() {
        assert_eq!(ResultCode::NotFound.code(), 2);
        assert_eq!(ResultCode::Generation.code(), 3);
        assert_eq!(ResultCode::RecordTooBig.code(), 13);
        assert_eq!(ResultCode::GeoInvalidGeojson.code(), 160);
        assert_eq!(ResultCode::Namespace.code(), 20);
        assert_eq!(ResultCode::BinName.code(), 21);
        assert_eq!(ResultCode::SecurityNotEnabled.code(), 52);
        assert_eq!(ResultCode::QueryEnd.code(), 50);
        assert_eq!(ResultCode::InvalidCredential.code(), 65);
        assert_eq!(ResultCode::RoleViolation.code(), 81);
        assert_eq!(ResultCode::QuotaExceeded.code(), 83);
        assert_eq!(ResultCode::MrtBlocked.code(), 120);
        assert_eq!(ResultCode::MrtVersionMismatch.code(), 121);
        assert_eq!(ResultCode::MrtMonitorExists.code(), 127);
    }
}
