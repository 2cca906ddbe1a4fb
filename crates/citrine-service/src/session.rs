//! What one client connection carries from request to request: its login
//! (with access control on), when it opened (a connection that has not
//! logged in within `login-timeout-ms` is closed, [`Session::login_overdue`]),
//! the common name of its verified TLS client certificate (for a PKI login)
//! and the user agent its client announced (`user-agent-set`), and the
//! node's tally of the user agents of its open connections (`user-agents`).
//!
//! Owns [`Session`] (one per connection, dropped when the connection
//! closes) and [`UserAgents`] (the tally). Invariant: a user agent counts
//! once for every open connection that set it — an [`AgentSlot`] adds one
//! when set and takes it back when the session drops — and a value whose
//! count reaches 0 is gone from the tally.
//!
//! The reference (CE 8.1.2, asked over the wire): `user-agent-set:value=B64`
//! answers `ok` once per connection (then `ERROR:4:already set`, whatever
//! follows), `ERROR:4:missing 'value'` without the parameter,
//! `ERROR:4:missing 'value' value` with an empty one, `ERROR:4:'value'
//! invalid base64` for a value that is not base64; `user-agents` lists
//! `user-agent=B64:count=N;` per value (empty with none). The reference
//! refreshes that list about once a second; Citrine's is current.

use crate::security::Login;
use base64::Engine as _;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest user-agent value kept (base64 text); a client's is well under.
const AGENT_MAX: usize = 1024;

/// One client connection's state.
#[derive(Debug)]
pub struct Session {
    /// The user it logged in as, with access control on.
    pub login: Login,
    /// When the connection was accepted (a move between service threads
    /// keeps it).
    opened: Instant,
    /// The common name of the client certificate its TLS handshake
    /// verified (for a PKI login).
    pub(crate) certificate: Option<String>,
    agent: Option<AgentSlot>,
}

impl Default for Session {
    /// The state of a connection accepted now.
    fn default() -> Session {
        Session {
            login: Login::default(),
            opened: Instant::now(),
            certificate: None,
            agent: None,
        }
    }
}

impl Session {
    /// Records the common name of the client certificate the connection's
    /// TLS handshake verified.
    pub fn set_certificate(&mut self, common_name: String) {
        self.certificate = Some(common_name);
    }
    /// Whether, at `now`, the connection has been open for `timeout` or
    /// longer without logging in.
    pub fn login_overdue(&self, now: Instant, timeout: Duration) -> bool {
        self.login.user().is_none() && now.saturating_duration_since(self.opened) >= timeout
    }
}

/// The user agents of the node's open connections, counted.
#[derive(Debug, Default)]
pub struct UserAgents {
    counts: Mutex<BTreeMap<String, u64>>,
}

/// One connection's share of the tally, taken back when it drops.
#[derive(Debug)]
struct AgentSlot {
    agents: Arc<UserAgents>,
    value: String,
}

impl Drop for AgentSlot {
    fn drop(&mut self) {
        let mut counts = self.agents.counts.lock();
        if let Some(count) = counts.get_mut(&self.value) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.value);
            }
        }
    }
}

impl UserAgents {
    /// `user-agents`: `user-agent=B64:count=N;` per value, in value order.
    pub fn text(&self) -> String {
        self.counts
            .lock()
            .iter()
            .map(|(value, count)| format!("user-agent={value}:count={count};"))
            .collect()
    }

    /// `user-agent-set:value=B64` on the connection of `session`.
    pub fn set(self: &Arc<Self>, session: &mut Session, value: Option<&str>) -> String {
        if session.agent.is_some() {
            return "ERROR:4:already set".to_owned();
        }
        let value = match value {
            None => return "ERROR:4:missing 'value'".to_owned(),
            Some("") => return "ERROR:4:missing 'value' value".to_owned(),
            Some(value) => value,
        };
        let decodes = base64::engine::general_purpose::STANDARD
            .decode(value)
            .is_ok();
        if !decodes || value.len() > AGENT_MAX {
            return "ERROR:4:'value' invalid base64".to_owned();
        }
        *self.counts.lock().entry(value.to_owned()).or_insert(0) += 1;
        session.agent = Some(AgentSlot {
            agents: Arc::clone(self),
            value: value.to_owned(),
        });
        "ok".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_is_overdue_only_without_a_login_past_the_timeout() {
        let mut session = Session::default();
        let timeout = Duration::from_millis(500);
        let opened = session.opened;
        assert!(!session.login_overdue(opened, timeout));
        assert!(!session.login_overdue(opened + Duration::from_millis(499), timeout));
        assert!(session.login_overdue(opened + timeout, timeout));
        session.login = Login::of("admin");
        assert!(!session.login_overdue(opened + timeout * 100, timeout));
    }

    #[test]
    fn agents_are_counted_per_open_connection_as_the_reference_answers() {
        let agents = Arc::new(UserAgents::default());
        let c = "MSxjLTcuMS4wLG15YXBw"; // "1,c-7.1.0,myapp"
        let rust = "MSxydXN0LTIuMS4wLG90aGVy"; // "1,rust-2.1.0,other"
        let (mut a, mut b, mut d) = (Session::default(), Session::default(), Session::default());
        assert_eq!(agents.set(&mut a, Some(c)), "ok");
        assert_eq!(agents.set(&mut a, Some(c)), "ERROR:4:already set");
        assert_eq!(agents.set(&mut a, None), "ERROR:4:already set");
        assert_eq!(agents.set(&mut b, Some(c)), "ok");
        assert_eq!(agents.set(&mut d, None), "ERROR:4:missing 'value'");
        assert_eq!(
            agents.set(&mut d, Some("")),
            "ERROR:4:missing 'value' value"
        );
        assert_eq!(
            agents.set(&mut d, Some("abc")),
            "ERROR:4:'value' invalid base64"
        );
        assert_eq!(
            agents.set(&mut d, Some("!!!")),
            "ERROR:4:'value' invalid base64"
        );
        assert_eq!(agents.set(&mut d, Some(rust)), "ok");
        assert_eq!(
            agents.text(),
            format!("user-agent={c}:count=2;user-agent={rust}:count=1;")
        );
        drop(b);
        assert_eq!(
            agents.text(),
            format!("user-agent={c}:count=1;user-agent={rust}:count=1;")
        );
        drop(a);
        drop(d);
        assert_eq!(agents.text(), "");
    }
}
