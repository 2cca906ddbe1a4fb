//! The audit trail of access control: which events are reported (the
//! reference's `security.log` and `security.syslog` `report-*` switches),
//! the text of an audit line, and the count of failed logins.
//!
//! Invariants:
//! - nothing here touches the disk: a line goes to the [`AuditSink`] the
//!   server gave (a bounded channel to its writer thread), which never
//!   blocks and counts what it had to drop;
//! - an event is sent only if the log's or the syslog's reports want it,
//!   and says which of the two want it;
//! - data operations are looked at only when some `report-data-op*`
//!   switch is on ([`Audit::wants_data_ops`], one atomic load);
//! - the per user-and-address count of failed logins holds at most
//!   [`MAX_TRACKED_FAILURES`] entries (it starts over when full), so a
//!   flood of made-up names cannot grow it without bound.

use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};

/// Most (user, address) pairs whose failed logins are counted at once.
pub const MAX_TRACKED_FAILURES: usize = 10_000;

/// One sink's `report-*` switches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reports {
    /// `report-authentication`: logins and session authentications.
    pub authentication: bool,
    /// `report-data-op NS [SET]`: data operations in these namespaces
    /// (every set when the set is `None`).
    pub data_op: Vec<(String, Option<String>)>,
    /// `report-data-op-role ROLE`: data operations of users with a role.
    pub data_op_role: Vec<String>,
    /// `report-data-op-user USER`: data operations of these users.
    pub data_op_user: Vec<String>,
    /// `report-sys-admin`: privileged info commands that ran.
    pub sys_admin: bool,
    /// `report-user-admin`: user and role changes.
    pub user_admin: bool,
    /// `report-violation`: requests refused 81, 82 or 83.
    pub violation: bool,
}

/// The `security.log` and `security.syslog` switches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditSettings {
    pub log: Reports,
    pub syslog: Reports,
}

/// How access control decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Permitted,
    NotAuthorized,
    AuthenticationFailed,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Verdict::Permitted => "permitted",
            Verdict::NotAuthorized => "not authorized",
            Verdict::AuthenticationFailed => "authentication failed",
        }
    }
}

/// Which switch an event falls under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Report {
    Authentication,
    UserAdmin,
    SysAdmin,
    Violation,
    DataOp,
}

impl Report {
    fn as_str(self) -> &'static str {
        match self {
            Report::Authentication => "authentication",
            Report::UserAdmin => "user-admin",
            Report::SysAdmin => "sys-admin",
            Report::Violation => "violation",
            Report::DataOp => "data-op",
        }
    }
}

/// One thing access control did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub verdict: Verdict,
    pub report: Report,
    /// The user it was for (the logged-in one, or the one a login named).
    pub user: Option<String>,
    /// The user's roles (for `report-data-op-role`).
    pub roles: Vec<String>,
    pub client: Option<SocketAddr>,
    /// What was asked: `login`, `create user`, `set-config`, `write`…
    pub action: String,
    /// Its arguments and result, `name=value` pairs joined by `;`.
    pub detail: String,
    /// The namespace and set a data operation touched.
    pub scope: Option<(String, Option<String>)>,
}

impl Reports {
    /// Whether this sink reports `event`.
    pub fn wants(&self, event: &Event) -> bool {
        match event.report {
            Report::Authentication => self.authentication,
            Report::UserAdmin => self.user_admin,
            Report::SysAdmin => self.sys_admin,
            Report::Violation => self.violation,
            Report::DataOp => self.wants_data_op(event),
        }
    }

    fn wants_data_op(&self, event: &Event) -> bool {
        let by_scope = event.scope.as_ref().is_some_and(|(ns, set)| {
            self.data_op
                .iter()
                .any(|(want_ns, want_set)| want_ns == ns && (want_set.is_none() || want_set == set))
        });
        let by_user = event
            .user
            .as_ref()
            .is_some_and(|user| self.data_op_user.contains(user));
        let by_role = event
            .roles
            .iter()
            .any(|role| self.data_op_role.contains(role));
        by_scope || by_user || by_role
    }

    fn any_data_op(&self) -> bool {
        !(self.data_op.is_empty() && self.data_op_role.is_empty() && self.data_op_user.is_empty())
    }
}

/// An audit line for the sinks: when, the text after the timestamp, and
/// which sinks want it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub unix_ms: u64,
    pub text: String,
    pub to_log: bool,
    pub to_syslog: bool,
}

/// Where audit lines go: the server's writer. `send` must not block.
pub trait AuditSink: Send + Sync {
    /// Hands one line over (or drops and counts it when the writer lags).
    fn send(&self, line: Line);
    /// Lines dropped so far because the writer lagged.
    fn dropped(&self) -> u64;
}

/// The event's text: `VERDICT | type: T | client: IP:PORT | user: U |
/// action: A | detail: D`.
pub fn event_text(event: &Event) -> String {
    let client = event
        .client
        .map_or_else(|| "none".to_owned(), |client| client.to_string());
    format!(
        "{} | type: {} | client: {} | user: {} | action: {} | detail: {}",
        event.verdict.as_str(),
        event.report.as_str(),
        client,
        event.user.as_deref().unwrap_or("none"),
        event.action,
        event.detail
    )
}

/// The line as the log file holds it: `Mon DD YYYY HH:MM:SS GMT: INFO
/// (audit): TEXT`, the reference's log-line layout.
pub fn file_line(line: &Line) -> String {
    format!("{}: INFO (audit): {}", timestamp(line.unix_ms), line.text)
}

/// `Nov 29 2026 16:20:27 GMT` for a unix time in milliseconds (UTC).
pub fn timestamp(unix_ms: u64) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let seconds = unix_ms / 1000;
    let (year, month, day) = civil_date((seconds / 86_400) as i64);
    let of_day = seconds % 86_400;
    format!(
        "{} {:02} {} {:02}:{:02}:{:02} GMT",
        MONTHS[(month - 1) as usize],
        day,
        year,
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    )
}

/// The (year, month 1-12, day 1-31) of a count of days since 1970-01-01
/// (the proleptic Gregorian calendar's era arithmetic).
fn civil_date(days: i64) -> (i64, u32, u32) {
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The node's audit trail: its switches, its sink and its failed-login
/// counts.
pub struct Audit {
    settings: RwLock<AuditSettings>,
    data_ops: AtomicBool,
    sink: Box<dyn AuditSink>,
}

impl std::fmt::Debug for Audit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Audit")
            .field("settings", &*self.settings.read())
            .finish_non_exhaustive()
    }
}

impl Audit {
    pub fn new(settings: AuditSettings, sink: Box<dyn AuditSink>) -> Audit {
        let data_ops = settings.log.any_data_op() || settings.syslog.any_data_op();
        Audit {
            settings: RwLock::new(settings),
            data_ops: AtomicBool::new(data_ops),
            sink,
        }
    }

    /// Sends `event` to the sinks that want it (nothing if none does).
    pub fn record(&self, event: &Event, unix_ms: u64) {
        let (to_log, to_syslog) = {
            let settings = self.settings.read();
            (settings.log.wants(event), settings.syslog.wants(event))
        };
        if to_log || to_syslog {
            self.sink.send(Line {
                unix_ms,
                text: event_text(event),
                to_log,
                to_syslog,
            });
        }
    }

    /// Whether any data operation may be reported.
    pub fn wants_data_ops(&self) -> bool {
        self.data_ops.load(Ordering::Relaxed)
    }

    /// Lines the sink dropped.
    pub fn dropped(&self) -> u64 {
        self.sink.dropped()
    }

    /// The switches now.
    pub fn settings(&self) -> AuditSettings {
        self.settings.read().clone()
    }

    /// `set-config:context=security;log.report-violation=true` and the
    /// like: `NAME` is `log.` or `syslog.` and a boolean switch
    /// (`report-authentication`, `report-sys-admin`, `report-user-admin`,
    /// `report-violation`), or `report-data-op` with `namespace` (and
    /// optionally `set`) naming the scope turned on or off.
    pub fn set(&self, params: &[(&str, &str)]) -> Result<(), String> {
        let param = |key: &str| params.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        let mut settings = self.settings.read().clone();
        let mut changed = false;
        for (name, value) in params {
            let Some((sink, switch)) = name.split_once('.') else {
                continue;
            };
            let reports = match sink {
                "log" => &mut settings.log,
                "syslog" => &mut settings.syslog,
                _ => return Err(format!("{name} cannot be set")),
            };
            let on = match *value {
                "true" => true,
                "false" => false,
                _ => return Err(format!("{name} must be true or false")),
            };
            set_switch(reports, switch, on, param("namespace"), param("set"))
                .map_err(|()| format!("{name} cannot be set"))?;
            changed = true;
        }
        if !changed {
            return Err("nothing to set".to_owned());
        }
        let data_ops = settings.log.any_data_op() || settings.syslog.any_data_op();
        *self.settings.write() = settings;
        self.data_ops.store(data_ops, Ordering::Relaxed);
        Ok(())
    }
}

fn set_switch(
    reports: &mut Reports,
    switch: &str,
    on: bool,
    namespace: Option<&str>,
    set: Option<&str>,
) -> Result<(), ()> {
    let flag = match switch {
        "report-authentication" => &mut reports.authentication,
        "report-sys-admin" => &mut reports.sys_admin,
        "report-user-admin" => &mut reports.user_admin,
        "report-violation" => &mut reports.violation,
        "report-data-op" => {
            let scope = (namespace.ok_or(())?.to_owned(), set.map(str::to_owned));
            reports.data_op.retain(|existing| *existing != scope);
            if on {
                reports.data_op.push(scope);
            }
            return Ok(());
        }
        _ => return Err(()),
    };
    *flag = on;
    Ok(())
}

/// Failed logins: the total (statistic `login_failures`), per user and
/// address, and the warnings about them in the node's log (at most one a
/// second; the ones left out are counted in the next).
#[derive(Debug, Default)]
pub struct LoginFailures {
    pub total: std::sync::atomic::AtomicU64,
    failures: Mutex<HashMap<(String, Option<IpAddr>), u64>>,
    warned_s: std::sync::atomic::AtomicU64,
    unwarned: std::sync::atomic::AtomicU64,
}

impl LoginFailures {
    /// Counts a failed login of `user` from `from`; the pair's count.
    pub fn login_failed(&self, user: &str, from: Option<IpAddr>) -> u64 {
        self.total.fetch_add(1, Ordering::Relaxed);
        let mut failures = self.failures.lock();
        if failures.len() >= MAX_TRACKED_FAILURES {
            failures.clear();
        }
        let count = failures.entry((user.to_owned(), from)).or_insert(0);
        *count += 1;
        *count
    }

    /// Forgets the failed logins of `user` from `from` (it got in).
    pub fn login_succeeded(&self, user: &str, from: Option<IpAddr>) {
        let mut failures = self.failures.lock();
        if !failures.is_empty() {
            failures.remove(&(user.to_owned(), from));
        }
    }

    /// Whether a warning may be written at `unix_s`, and how many were
    /// left out since the last one.
    pub fn may_warn(&self, unix_s: u64) -> Option<u64> {
        let last = self.warned_s.load(Ordering::Relaxed);
        if last != unix_s
            && self
                .warned_s
                .compare_exchange(last, unix_s, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.unwarned.swap(0, Ordering::Relaxed));
        }
        self.unwarned.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// The settings as `get-config:context=security` lists them.
pub fn config_pairs(settings: &AuditSettings) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    for (sink, reports) in [("log", &settings.log), ("syslog", &settings.syslog)] {
        let scopes: Vec<String> = reports
            .data_op
            .iter()
            .map(|(ns, set)| match set {
                Some(set) => format!("{ns}|{set}"),
                None => ns.clone(),
            })
            .collect();
        for (name, value) in [
            ("report-authentication", reports.authentication.to_string()),
            ("report-data-op", scopes.join(",")),
            ("report-data-op-role", reports.data_op_role.join(",")),
            ("report-data-op-user", reports.data_op_user.join(",")),
            ("report-sys-admin", reports.sys_admin.to_string()),
            ("report-user-admin", reports.user_admin.to_string()),
            ("report-violation", reports.violation.to_string()),
        ] {
            pairs.push((format!("{sink}.{name}"), value));
        }
    }
    pairs
}

#[cfg(test)]
#[path = "audit_tests.rs"]
mod tests;
