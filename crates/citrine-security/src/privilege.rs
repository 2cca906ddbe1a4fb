//! Privileges: the codes the wire carries, their scope (global, namespace,
//! namespace + set), and which [`Action`]s each one allows.
//!
//! Invariants: codes below 10 (the admin ones) are global only; a scoped
//! privilege with a set always has a namespace; a privilege scoped to a
//! namespace covers every set in it, a global one every namespace.

use citrine_wire::admin::WirePrivilege;

/// The privilege codes (same numbers as the admin protocol).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PrivilegeCode {
    UserAdmin = 0,
    SysAdmin = 1,
    DataAdmin = 2,
    UdfAdmin = 3,
    SindexAdmin = 4,
    Read = 10,
    ReadWrite = 11,
    ReadWriteUdf = 12,
    Write = 13,
    Truncate = 14,
}

/// Every code, in wire order: also the built-in roles' order.
pub const ALL_CODES: [PrivilegeCode; 10] = [
    PrivilegeCode::UserAdmin,
    PrivilegeCode::SysAdmin,
    PrivilegeCode::DataAdmin,
    PrivilegeCode::UdfAdmin,
    PrivilegeCode::SindexAdmin,
    PrivilegeCode::Read,
    PrivilegeCode::ReadWrite,
    PrivilegeCode::ReadWriteUdf,
    PrivilegeCode::Write,
    PrivilegeCode::Truncate,
];

impl PrivilegeCode {
    /// The code for a wire number.
    pub fn from_code(code: u8) -> Option<PrivilegeCode> {
        ALL_CODES.into_iter().find(|known| *known as u8 == code)
    }

    /// The name, which is also the built-in role granting it.
    pub fn name(self) -> &'static str {
        match self {
            PrivilegeCode::UserAdmin => "user-admin",
            PrivilegeCode::SysAdmin => "sys-admin",
            PrivilegeCode::DataAdmin => "data-admin",
            PrivilegeCode::UdfAdmin => "udf-admin",
            PrivilegeCode::SindexAdmin => "sindex-admin",
            PrivilegeCode::Read => "read",
            PrivilegeCode::ReadWrite => "read-write",
            PrivilegeCode::ReadWriteUdf => "read-write-udf",
            PrivilegeCode::Write => "write",
            PrivilegeCode::Truncate => "truncate",
        }
    }

    /// The code named `name`.
    pub fn from_name(name: &str) -> Option<PrivilegeCode> {
        ALL_CODES.into_iter().find(|code| code.name() == name)
    }

    /// Whether it may be scoped to a namespace or set.
    pub fn scoped(self) -> bool {
        self as u8 >= citrine_wire::admin::FIRST_SCOPED_PRIVILEGE
    }

    /// Whether it allows `action`. sys-admin includes data-admin, which
    /// includes sindex-admin, udf-admin and truncate; read-write-udf
    /// includes read-write, which includes read and write.
    pub fn allows(self, action: Action) -> bool {
        use Action as A;
        use PrivilegeCode as P;
        match self {
            P::UserAdmin => action == A::UserAdmin,
            P::SysAdmin => matches!(
                action,
                A::SysAdmin | A::SindexAdmin | A::UdfAdmin | A::Truncate
            ),
            P::DataAdmin => matches!(action, A::SindexAdmin | A::UdfAdmin | A::Truncate),
            P::UdfAdmin => action == A::UdfAdmin,
            P::SindexAdmin => action == A::SindexAdmin,
            P::Read => action == A::Read,
            P::ReadWrite => matches!(action, A::Read | A::Write),
            P::ReadWriteUdf => matches!(action, A::Read | A::Write | A::UdfApply),
            P::Write => action == A::Write,
            P::Truncate => action == A::Truncate,
        }
    }
}

/// What a request needs to be allowed to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Read records (get, exists, batch reads, scans, queries).
    Read,
    /// Write or delete records.
    Write,
    /// Apply a UDF to records (record UDF, background UDF, aggregation).
    UdfApply,
    Truncate,
    /// Create or drop secondary indexes.
    SindexAdmin,
    /// Register or remove UDF modules.
    UdfAdmin,
    /// Configuration and cluster commands.
    SysAdmin,
    /// Users and roles.
    UserAdmin,
}

impl Action {
    /// Whether it counts against the read quota (else the write quota,
    /// or no quota for administration).
    pub fn quota(self) -> Option<QuotaKind> {
        match self {
            Action::Read => Some(QuotaKind::Read),
            Action::Write | Action::UdfApply => Some(QuotaKind::Write),
            _ => None,
        }
    }
}

/// Which per-role rate limit a request counts against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuotaKind {
    Read,
    Write,
}

/// A privilege with its scope ("" = every namespace / every set).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Privilege {
    pub code: PrivilegeCode,
    pub namespace: String,
    pub set: String,
}

impl Privilege {
    /// A global privilege.
    pub fn global(code: PrivilegeCode) -> Privilege {
        Privilege {
            code,
            namespace: String::new(),
            set: String::new(),
        }
    }

    /// Checks a privilege as the wire carries it: a known code, no scope
    /// on an admin code, no set without a namespace.
    pub fn from_wire(wire: &WirePrivilege) -> Option<Privilege> {
        let code = PrivilegeCode::from_code(wire.code)?;
        let scoped = !wire.namespace.is_empty() || !wire.set.is_empty();
        if (scoped && !code.scoped()) || (wire.namespace.is_empty() && !wire.set.is_empty()) {
            return None;
        }
        Some(Privilege {
            code,
            namespace: wire.namespace.clone(),
            set: wire.set.clone(),
        })
    }

    /// As the wire carries it.
    pub fn to_wire(&self) -> WirePrivilege {
        WirePrivilege {
            code: self.code as u8,
            namespace: self.namespace.clone(),
            set: self.set.clone(),
        }
    }

    /// Whether it allows `action` on namespace `ns` and set `set` (`None`:
    /// the request is not about one namespace / one set, so only a
    /// privilege as wide covers it).
    pub fn covers(&self, action: Action, ns: Option<&str>, set: Option<&str>) -> bool {
        if !self.code.allows(action) {
            return false;
        }
        if self.namespace.is_empty() {
            return true;
        }
        if ns != Some(self.namespace.as_str()) {
            return false;
        }
        self.set.is_empty() || set == Some(self.set.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scoped(code: PrivilegeCode, ns: &str, set: &str) -> Privilege {
        Privilege {
            code,
            namespace: ns.into(),
            set: set.into(),
        }
    }

    #[test]
    fn codes_round_trip_by_number_and_name() {
        for code in ALL_CODES {
            assert_eq!(PrivilegeCode::from_code(code as u8), Some(code));
            assert_eq!(PrivilegeCode::from_name(code.name()), Some(code));
        }
        assert_eq!(PrivilegeCode::from_code(5), None);
        assert_eq!(PrivilegeCode::ReadWriteUdf as u8, 12);
    }

    #[test]
    fn scope_narrows_what_a_privilege_covers() {
        let read_set = scoped(PrivilegeCode::Read, "test", "demo");
        assert!(read_set.covers(Action::Read, Some("test"), Some("demo")));
        assert!(!read_set.covers(Action::Read, Some("test"), Some("other")));
        assert!(!read_set.covers(Action::Read, Some("test"), None));
        assert!(!read_set.covers(Action::Write, Some("test"), Some("demo")));
        let rw_ns = scoped(PrivilegeCode::ReadWrite, "test", "");
        assert!(rw_ns.covers(Action::Write, Some("test"), Some("any")));
        assert!(!rw_ns.covers(Action::Write, Some("bar"), None));
        assert!(!rw_ns.covers(Action::UdfApply, Some("test"), None));
        let sys = Privilege::global(PrivilegeCode::SysAdmin);
        assert!(sys.covers(Action::Truncate, Some("test"), None));
        assert!(!sys.covers(Action::UserAdmin, None, None));
        assert!(!sys.covers(Action::Read, Some("test"), None));
    }

    #[test]
    fn wire_privileges_are_checked() {
        let wire = |code, ns: &str, set: &str| WirePrivilege {
            code,
            namespace: ns.into(),
            set: set.into(),
        };
        assert!(Privilege::from_wire(&wire(10, "test", "demo")).is_some());
        assert!(Privilege::from_wire(&wire(10, "", "demo")).is_none());
        assert!(Privilege::from_wire(&wire(1, "test", "")).is_none());
        assert!(Privilege::from_wire(&wire(9, "", "")).is_none());
    }
}
