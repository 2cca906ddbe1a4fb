//! Access control on the request path, when the node runs with a
//! `[security]` section: the node's [`Security`] state behind a lock, each
//! connection's [`Login`], and the check every request passes before the
//! service runs it ([`Service::handle_guarded`]).
//!
//! Invariants:
//! - with security off (the default) nothing here runs: requests go
//!   straight to [`Service::handle_streaming_from`], and admin requests
//!   are answered 52;
//! - with it on, a connection that has not logged in (LOGIN or
//!   AUTHENTICATE) gets 80 for every data request and `ERROR:80:not
//!   authenticated` for every info request, and nothing runs; it stays
//!   open (as the reference keeps it) until `login-timeout-ms` after it
//!   opened, when its service thread closes it ([`Service::login_overdue`]);
//! - a logged-in request runs only if every privilege it needs is
//!   granted (81), its user is still allowed from its address (82) and
//!   within its roles' quotas (83); in a batch each row is checked: a
//!   refused row answers its code, the others run;
//! - session tokens and password salts come from the OS's random source;
//! - a change of users or roles is saved and shared with the cluster
//!   ([`store`], each user and role versioned on its own) before its
//!   answer goes out;
//! - logins, user and role changes, privileged info commands, refusals
//!   and (when switched on) data operations are told to the audit trail
//!   ([`audit`]) when the server set one; failed logins are counted
//!   (`login_failures`) either way.

use crate::{batch, scan, udf, Arrival, CloseConnection, Continuation, Service};
use citrine_security::admin::{self, Context};
use citrine_security::{Action, Entropy, Security, SecurityConfig};
use citrine_types::ResultCode;
use citrine_wire::frame::{MessageType, ProtoHeader};
use citrine_wire::info::InfoCommand;
use citrine_wire::msg::{field_type, info1, info2, Message};
use parking_lot::Mutex;
use std::net::SocketAddr;

pub mod audit;
mod events;
pub(crate) mod external;
mod store;
pub use store::SECURITY_FILE;
#[cfg(test)]
mod tests;

/// The node's access-control state (present only with security on), and
/// its shared metadata store (see [`store`]).
pub struct Guard {
    state: Mutex<Security>,
    /// Every user and role with its version (see [`store`]); taken before
    /// `state` whenever both are.
    entries: Mutex<store::Entries>,
    file: std::sync::OnceLock<std::path::PathBuf>,
    push: crate::smd::PushClock,
    audit: std::sync::OnceLock<audit::Audit>,
    /// Failed logins and session authentications (statistic
    /// `login_failures`), per user and address.
    pub login_failures: audit::LoginFailures,
    /// How long a connection may stay open without logging in
    /// (`login-timeout-ms`).
    login_timeout: std::time::Duration,
    /// The LDAP directory external users log in against, when
    /// `[security.ldap]` is given (see [`external`]).
    ldap: std::sync::OnceLock<citrine_ldap::Directory>,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("entries", &self.entries.lock().len())
            .finish_non_exhaustive()
    }
}

impl Guard {
    /// The audit trail, when the server started one.
    pub fn audit(&self) -> Option<&audit::Audit> {
        self.audit.get()
    }

    /// Runs `f` on the state.
    pub fn with<T>(&self, f: impl FnOnce(&mut Security) -> T) -> T {
        f(&mut self.state.lock())
    }
}

/// What one connection's login is: the user it logged in as, if any.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Login {
    user: Option<String>,
    /// An LDAP login under way (see [`external`]).
    pending: external::PendingLogin,
}

impl Login {
    /// The logged-in user.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// A login as `user` (tests of what depends on one).
    #[cfg(test)]
    pub(crate) fn of(user: &str) -> Login {
        Login {
            user: Some(user.to_owned()),
            pending: Default::default(),
        }
    }
}

/// Random bytes from the OS (all zero only if the OS has none to give,
/// which is logged).
fn entropy() -> Entropy {
    let mut bytes = [0u8; 48];
    if getrandom::fill(&mut bytes).is_err() {
        tracing::error!("no random bytes from the OS for a session token");
    }
    let mut salt = [0u8; 16];
    let mut token = [0u8; 32];
    salt.copy_from_slice(&bytes[..16]);
    token.copy_from_slice(&bytes[16..]);
    Entropy { salt, token }
}

impl Service {
    /// Turns security on (once, before the node serves): the node starts
    /// with only the default user `admin`.
    pub fn enable_security(&self, config: SecurityConfig) {
        let login_timeout = std::time::Duration::from_millis(config.login_timeout_ms);
        let security = Security::new(config, entropy().salt);
        let entries = Mutex::new(store::initial(&security));
        let _ = self.security.set(Guard {
            state: Mutex::new(security),
            entries,
            file: std::sync::OnceLock::new(),
            push: crate::smd::PushClock::default(),
            audit: std::sync::OnceLock::new(),
            login_failures: audit::LoginFailures::default(),
            login_timeout,
            ldap: std::sync::OnceLock::new(),
        });
    }

    /// Starts the audit trail (once, after [`Service::enable_security`]):
    /// events go to `sink` as `settings` say.
    pub fn set_audit(&self, settings: audit::AuditSettings, sink: Box<dyn audit::AuditSink>) {
        if let Some(guard) = self.security.get() {
            let _ = guard.audit.set(audit::Audit::new(settings, sink));
        }
    }

    /// The access-control state, when security is on.
    pub fn security(&self) -> Option<&Guard> {
        self.security.get()
    }

    /// Whether the connection of `session` must be closed at `now` because
    /// it has not logged in within `login-timeout-ms` (security on only).
    /// The reference answers such a connection's requests 80 and keeps it
    /// open; this bound keeps one that never logs in from holding a slot
    /// (and a descriptor) for as long as it keeps sending.
    pub fn login_overdue(
        &self,
        session: &crate::session::Session,
        now: std::time::Instant,
    ) -> bool {
        self.security
            .get()
            .is_some_and(|guard| session.login_overdue(now, guard.login_timeout))
    }

    /// [`Service::handle_streaming_from`] for a connection whose state is
    /// `session` (its login, its user agent), after the access checks when
    /// security is on.
    pub fn handle_guarded(
        &self,
        header: ProtoHeader,
        body: &[u8],
        out: &mut Vec<u8>,
        arrival: Arrival,
        session: &mut crate::session::Session,
    ) -> Result<Option<Continuation>, CloseConnection> {
        let Some(guard) = self.security.get() else {
            if header.message_type == MessageType::Info {
                return Ok(self.handle_info(body, out, Some(session)));
            }
            return self.handle_streaming_from(header, body, out, arrival);
        };
        session.login.settle();
        let login = &mut session.login;
        let certificate = session.certificate.as_deref();
        let from = arrival.from.map(|peer| peer.ip());
        match header.message_type {
            MessageType::Admin => {
                self.stats
                    .admin_requests
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if let Some(ldap) = self.ldap_login(guard, body, login, arrival.from) {
                    return Ok(Some(ldap));
                }
                let context = Context {
                    from,
                    now_ms: self.now().unix_ms,
                    entropy: entropy(),
                    certificate,
                };
                let actor = login.user.clone();
                // Run and committed under the entries' lock, so a merge
                // cannot come between the change and its versions.
                let mut entries = guard.entries.lock();
                let outcome = guard
                    .with(|security| admin::execute(security, body, &mut login.user, context, out));
                if outcome.changed {
                    self.commit_security(guard, &mut entries);
                }
                drop(entries);
                let who = (actor.as_deref(), certificate);
                self.audit_admin(guard, body, who, outcome.result, arrival.from);
                if !outcome.changed {
                    return Ok(None);
                }
                // Answered once the other members have the change.
                let peers = self.routes() && !self.dist.peers().0.is_empty();
                Ok(peers.then(|| {
                    Continuation(crate::Pending::SyncStores(vec![
                        crate::smd::Store::Security,
                    ]))
                }))
            }
            MessageType::Info => match self.info_refusal(guard, body, login, arrival.from) {
                Some(code) => {
                    write_info_refusal(out, code);
                    Ok(None)
                }
                None => Ok(self.handle_info(body, out, Some(session))),
            },
            MessageType::Message => match self.message_verdict(guard, body, login, arrival.from) {
                Verdict::Run => self.handle_streaming_from(header, body, out, arrival),
                Verdict::Refuse(code) => {
                    write_message_refusal(out, body, code);
                    Ok(None)
                }
                Verdict::RefuseRows(rows) => self.handle_message(body, out, arrival, &rows),
            },
            // A compressed request is checked as the message inside it (one
            // that does not inflate is the service's to refuse).
            MessageType::Compressed => {
                let Ok((_, inner)) = citrine_wire::frame::inflate(body) else {
                    return self.handle_streaming_from(header, body, out, arrival);
                };
                match self.message_verdict(guard, &inner, login, arrival.from) {
                    Verdict::Run => self.handle_streaming_from(header, body, out, arrival),
                    Verdict::Refuse(code) => {
                        write_message_refusal(out, &inner, code);
                        Ok(None)
                    }
                    Verdict::RefuseRows(rows) => {
                        self.stats
                            .compressed_requests
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        self.handle_message(&inner, out, arrival, &rows)
                    }
                }
            }
            MessageType::InternalXdr => self.handle_streaming_from(header, body, out, arrival),
        }
    }

    /// Why the info request `body` may not run, if it may not; its
    /// privileged commands are told to the audit trail.
    fn info_refusal(
        &self,
        guard: &Guard,
        body: &[u8],
        login: &Login,
        client: Option<SocketAddr>,
    ) -> Option<ResultCode> {
        let Some(user) = login.user() else {
            return Some(ResultCode::NotAuthenticated);
        };
        let from = client.map(|peer| peer.ip());
        let now_ms = self.now().unix_ms;
        let text = String::from_utf8_lossy(body);
        let mut checked: Vec<(&str, Option<ResultCode>)> = Vec::new();
        guard.with(|security| {
            let privileged = text.split('\n').map(str::trim).filter_map(|line| {
                let command = InfoCommand::parse(line);
                Some((line, info_action(&command)?))
            });
            for (line, (action, ns, set)) in privileged {
                let refusal = security
                    .check_allowed(user, from)
                    .and_then(|()| security.admit(user, action, (ns, set), now_ms))
                    .err();
                checked.push((line, refusal));
                if refusal.is_some() {
                    break;
                }
            }
        });
        if let Some(audit) = guard.audit.get() {
            for (line, refusal) in &checked {
                audit.record(&events::info_event(line, user, *refusal, client), now_ms);
            }
        }
        checked.last().and_then(|(_, refusal)| *refusal)
    }

    /// Whether the AS_MSG request `body` may run: whole, not at all, or (a
    /// batch) without some of its rows.
    fn message_verdict(
        &self,
        guard: &Guard,
        body: &[u8],
        login: &Login,
        client: Option<SocketAddr>,
    ) -> Verdict {
        let Some(user) = login.user() else {
            return Verdict::Refuse(ResultCode::NotAuthenticated);
        };
        // A malformed message is refused by the service itself.
        let Ok(message) = Message::decode(body) else {
            return Verdict::Run;
        };
        let from = client.map(|peer| peer.ip());
        let now_ms = self.now().unix_ms;
        let audit = guard.audit.get();
        let report = |needs: &[Need], refusal: Option<ResultCode>, roles: &[String]| {
            let Some(audit) = audit else { return };
            if refusal.is_none() && !audit.wants_data_ops() {
                return;
            }
            for (action, ns, set) in needs {
                let scope = (ns.as_deref(), set.as_deref());
                let event =
                    events::data_event(*action, scope, user, roles.to_vec(), refusal, client);
                audit.record(&event, now_ms);
            }
        };
        let refusal = |security: &mut Security, needs: &[Need]| {
            let refused = needs.iter().find_map(|(action, ns, set)| {
                let scope = (ns.as_deref(), set.as_deref());
                security.admit(user, *action, scope, now_ms).err()
            });
            report(needs, refused, &roles_of(security, user, audit));
            refused
        };
        guard.with(|security| {
            if let Err(code) = security.check_allowed(user, from) {
                report(&needs_of(&message), Some(code), &[]);
                return Verdict::Refuse(code);
            }
            if message.header.info1 & info1::BATCH == 0 {
                return refusal(security, &needs_of(&message))
                    .map_or(Verdict::Run, Verdict::Refuse);
            }
            let mut refused: Vec<(u32, ResultCode)> = batch_rows(&message)
                .into_iter()
                .filter_map(|(index, needs)| Some((index, refusal(security, &needs)?)))
                .collect();
            refused.sort_by_key(|(index, _)| *index);
            if refused.is_empty() {
                Verdict::Run
            } else {
                Verdict::RefuseRows(refused)
            }
        })
    }

    /// Tells the audit trail about an admin request that got `result`
    /// from a connection logged in as `actor` with a verified client
    /// `certificate` (its common name), and counts a failed login.
    fn audit_admin(
        &self,
        guard: &Guard,
        body: &[u8],
        (actor, certificate): (Option<&str>, Option<&str>),
        result: u8,
        client: Option<SocketAddr>,
    ) {
        let Some(event) = events::admin_event(body, actor, certificate, result, client) else {
            return;
        };
        let now_ms = self.now().unix_ms;
        let user = event.user.clone().unwrap_or_default();
        let from = client.map(|peer| peer.ip());
        let failures = &guard.login_failures;
        let event = if event.verdict == audit::Verdict::AuthenticationFailed {
            let count = failures.login_failed(&user, from);
            if let Some(left_out) = failures.may_warn(now_ms / 1000) {
                warn_failed_login(&user, client, count, left_out);
            }
            events::with_failures(event, count)
        } else {
            if event.report == audit::Report::Authentication {
                failures.login_succeeded(&user, from);
            }
            event
        };
        if let Some(audit) = guard.audit.get() {
            audit.record(&event, now_ms);
        }
    }
}

/// The node-log warning about a failed login (at most one a second).
fn warn_failed_login(user: &str, client: Option<SocketAddr>, count: u64, left_out: u64) {
    let client = client.map_or_else(|| "unknown".to_owned(), |client| client.to_string());
    tracing::warn!(
        "failed login of user {user:?} from {client} ({count} in a row from there; {left_out} more failed logins since the last warning)"
    );
}

/// The user's roles, when data operations may be reported (else none:
/// only `report-data-op-role` looks at them).
fn roles_of(security: &Security, user: &str, audit: Option<&audit::Audit>) -> Vec<String> {
    if !audit.is_some_and(audit::Audit::wants_data_ops) {
        return Vec::new();
    }
    security
        .users()
        .get(user)
        .map(|user| user.roles.iter().cloned().collect())
        .unwrap_or_default()
}

/// What access control lets of an AS_MSG run.
enum Verdict {
    Run,
    Refuse(ResultCode),
    /// A batch whose rows with these indexes answer these codes instead.
    RefuseRows(Vec<(u32, ResultCode)>),
}

/// Answers a refused AS_MSG in the form its reader waits for: a stream
/// end for a batch, scan or query (no digest), else a plain reply.
fn write_message_refusal(out: &mut Vec<u8>, body: &[u8], code: ResultCode) {
    let stream = Message::decode(body).is_ok_and(|message| {
        message.header.info1 & info1::BATCH != 0 || message.field(field_type::DIGEST).is_none()
    });
    if stream {
        crate::transaction::write_stream_end(out, code);
    } else {
        crate::transaction::write_result(out, code);
    }
}

/// An info reply `ERROR:<code>:<what>` (info framing).
fn write_info_refusal(out: &mut Vec<u8>, code: ResultCode) {
    let text = format!("ERROR:{}:{}\n", code.code(), code.describe());
    out.extend_from_slice(&ProtoHeader::encode(MessageType::Info, text.len() as u64));
    out.extend_from_slice(text.as_bytes());
}

/// The privilege an info command needs beyond being logged in, with its
/// namespace and set; `None`: any logged-in user may run it.
fn info_action<'a>(
    command: &InfoCommand<'a>,
) -> Option<(Action, Option<&'a str>, Option<&'a str>)> {
    let ns = command.param("namespace").or_else(|| command.param("ns"));
    let set = command.param("set");
    let action = match command.name {
        "truncate" | "truncate-namespace" | "truncate-undo" | "truncate-namespace-undo" => {
            return Some((Action::Truncate, ns, set))
        }
        "sindex-create" | "sindex-delete" => Action::SindexAdmin,
        "udf-put" | "udf-remove" => Action::UdfAdmin,
        "set-config"
        | "config-set"
        | "services-alumni-reset"
        | "query-abort"
        | "query-abort-all"
        | "scan-abort"
        | "scan-abort-all"
        | "jobs"
        | "roster-set"
        | "recluster"
        | "quiesce"
        | "quiesce-undo"
        | "revive"
        | "log-set"
        | "set-log"
        | "xdr-set-filter"
        | "dump-cluster"
        | "dump-fabric"
        | "dump-hb"
        | "dump-migrates"
        | "dump-smd" => Action::SysAdmin,
        _ => return None,
    };
    Some((action, None, None))
}

type Need = (Action, Option<String>, Option<String>);

fn text_of(data: Option<&[u8]>) -> Option<String> {
    data.map(|bytes| String::from_utf8_lossy(bytes).into_owned())
}

/// Every (privilege, namespace, set) the message needs: one or two for a
/// single-record request or a scan/query, one per row for a batch.
fn needs_of(message: &Message<'_>) -> Vec<Need> {
    let ns = text_of(message.field(field_type::NAMESPACE));
    let set = text_of(message.field(field_type::SET));
    let digest = message.field(field_type::DIGEST).is_some();
    let actions: Vec<Action> = if !digest && udf::is_aggregation(message) {
        vec![Action::Read]
    } else if !digest && scan::is_background(message) {
        match message.field(field_type::UDF_FILENAME) {
            Some(_) => vec![Action::UdfApply],
            None => vec![Action::Write],
        }
    } else if !digest {
        vec![Action::Read]
    } else {
        record_actions(
            message.header.info1,
            message.header.info2,
            message.field(field_type::UDF_FILENAME).is_some(),
        )
    };
    actions
        .into_iter()
        .map(|action| (action, ns.clone(), set.clone()))
        .collect()
}

/// What a single-record request (or batch row) with these header bits does.
fn record_actions(info1_bits: u8, info2_bits: u8, udf: bool) -> Vec<Action> {
    if udf {
        return vec![Action::UdfApply];
    }
    let mut actions = Vec::with_capacity(2);
    if info1_bits & info1::READ != 0 || info2_bits & (info2::WRITE | info2::DELETE) == 0 {
        actions.push(Action::Read);
    }
    if info2_bits & (info2::WRITE | info2::DELETE) != 0 {
        actions.push(Action::Write);
    }
    actions
}

/// Each batch row's index and needs (rows the parser cannot read need
/// nothing here: the batch refuses them as malformed).
fn batch_rows(message: &Message<'_>) -> Vec<(u32, Vec<Need>)> {
    let payload = message
        .field(field_type::BATCH_INDEX)
        .or_else(|| message.field(field_type::BATCH_INDEX_WITH_SET));
    let Some(payload) = payload else {
        return Vec::new();
    };
    let mut reader = batch::RowReader::new(payload, batch::Parent::default());
    let mut rows = Vec::new();
    while !reader.at_end() {
        let Ok(row) = reader.next_row() else {
            break;
        };
        let body = row.body;
        let ns = text_of(body.field(field_type::NAMESPACE));
        let set = text_of(body.field(field_type::SET));
        let udf = body.field(field_type::UDF_FILENAME).is_some();
        let actions = record_actions(body.header.info1, body.header.info2, udf);
        let needs = actions
            .into_iter()
            .map(|action| (action, ns.clone(), set.clone()));
        rows.push((row.index, needs.collect()));
    }
    rows
}

/// The users-and-roles store's text, as a push carries it.
pub(crate) fn store_text(guard: &Guard) -> String {
    store::text_of(guard)
}
