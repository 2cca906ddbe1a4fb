//! The users and roles as a shared metadata store: kept in the work
//! directory (`security.smd`), pushed to every other member on each change
//! and periodically, and merged from theirs.
//!
//! The store is versioned whole ([`crate::smd::Version`], the later change
//! wins, the node id breaks a tie): a node takes a peer's text only when
//! its version is newer, and then replaces all users and roles with it.
//! Two changes made on two nodes within one push interval keep only the
//! later one (a per-entry merge is not done).
//!
//! Invariants: every change made here gets a version later than the one
//! known here and is saved before the next request is served; a text that
//! does not parse is ignored whole.

use super::Guard;
use crate::replication::call_kind;
use crate::smd::Version;
use crate::Service;
use citrine_security::snapshot;
use std::path::Path;

/// The file in the work directory.
pub const SECURITY_FILE: &str = "security.smd";

/// The store's text: `version=MS.NODE`, then one line per user and role.
pub(crate) fn text_of(guard: &Guard) -> String {
    let version = *guard.version.lock();
    let body = guard.with(|security| snapshot::to_text(security));
    format!("{}\n{body}", version.param())
}

/// Splits a store's text into its version and its users and roles.
fn parse(text: &str) -> Result<(Version, &str), String> {
    let (first, rest) = text.split_once('\n').unwrap_or((text, ""));
    let version = Version::parse(first.strip_prefix("version="))?;
    Ok((version, rest))
}

impl Service {
    /// Keeps users and roles in `directory` from now on, and loads what
    /// the file there holds (none: the node keeps its default user).
    pub fn keep_security(&self, directory: &Path) -> Result<(), String> {
        let Some(guard) = self.security.get() else {
            return Ok(());
        };
        let path = directory.join(SECURITY_FILE);
        let text = crate::smd::read(&path)?;
        if guard.file.set(path.clone()).is_err() {
            return Err("the security store's directory is already set".to_owned());
        }
        if !text.is_empty() {
            let (version, body) = parse(&text)?;
            let (users, roles) = snapshot::from_text(body)?;
            guard.with(|security| security.replace(users, roles));
            *guard.version.lock() = version;
        }
        save(guard)
    }

    /// Records a change made here by an admin command: a new version,
    /// saved, and marked for the next push.
    pub(crate) fn commit_security(&self, guard: &Guard) {
        {
            let mut version = guard.version.lock();
            *version = crate::smd::next_version(Some(*version), self.now().unix_ms, self.node_id);
        }
        if let Err(message) = save(guard) {
            tracing::error!("users and roles not saved: {message}");
        }
        guard.push.mark();
        self.sindex_builds.queue.wake();
    }

    /// Takes a peer's users and roles when its version is newer.
    pub(crate) fn merge_security(&self, text: &str) {
        let Some(guard) = self.security.get() else {
            return;
        };
        let parsed =
            parse(text).and_then(|(version, body)| Ok((version, snapshot::from_text(body)?)));
        let (version, (users, roles)) = match parsed {
            Ok(parsed) => parsed,
            Err(message) => {
                tracing::warn!("a peer's users and roles do not parse: {message}");
                return;
            }
        };
        {
            let mut known = guard.version.lock();
            if version <= *known {
                return;
            }
            *known = version;
            guard.with(|security| security.replace(users, roles));
        }
        tracing::info!("users and roles merged from a peer");
        if let Err(message) = save(guard) {
            tracing::error!("merged users and roles not saved: {message}");
        }
    }

    /// Sends the users and roles to every other member when a push is due
    /// (the `citrine-sindex` thread calls it beside the other stores').
    pub(crate) fn push_security(&self) {
        let Some(guard) = self.security.get() else {
            return;
        };
        crate::smd::push_to_peers(
            self.dist(),
            &guard.push,
            call_kind::SECURITY,
            "users and roles",
            || text_of(guard),
        );
    }
}

/// Writes the store's file, when the node keeps one.
fn save(guard: &Guard) -> Result<(), String> {
    match guard.file.get() {
        Some(path) => crate::smd::save_atomically(path, &text_of(guard)),
        None => Ok(()),
    }
}
