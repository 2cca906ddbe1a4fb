//! What a check concludes: per key, and for the whole run.
//!
//! Owns [`AnomalyKind`], [`Anomaly`], [`KeyVerdict`] and [`Report`], and
//! the rule that combines key verdicts: any anomaly makes the run
//! [`Status::Anomaly`]; otherwise any key the checker could not decide
//! makes it [`Status::Unknown`]; only a run with every key decided valid
//! is [`Status::Valid`]. Exit codes follow: 0 valid, 1 anomaly, 2 unknown.

use std::fmt;

/// Why a history is not valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnomalyKind {
    /// Register: no order of the operations is legal (a stale read, a
    /// lost write, a read of a value never written...).
    NotLinearizable,
    /// Counter: a read below the sum of increments acknowledged before it
    /// began (an acknowledged increment was lost).
    LostIncrement,
    /// Counter: a read above the sum of every increment that might have
    /// happened before it returned.
    ImpossibleRead,
    /// Set: an acknowledged element missing from the final read.
    LostElement,
    /// Set: an element in the final read that no client ever tried to add.
    UnexpectedElement,
    /// Set: an element present more than once in the final read (each is
    /// appended at most once, by one attempt).
    DuplicateElement,
    /// The history itself breaks the rules (an operation of the wrong kind).
    Malformed,
}

impl AnomalyKind {
    /// The kind as the report writes it.
    pub fn name(self) -> &'static str {
        match self {
            AnomalyKind::NotLinearizable => "not linearizable",
            AnomalyKind::LostIncrement => "lost acknowledged increment",
            AnomalyKind::ImpossibleRead => "read of a value never written",
            AnomalyKind::LostElement => "lost acknowledged element",
            AnomalyKind::UnexpectedElement => "element never added",
            AnomalyKind::DuplicateElement => "duplicated element",
            AnomalyKind::Malformed => "malformed history",
        }
    }
}

/// One anomaly on one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Anomaly {
    pub kind: AnomalyKind,
    pub key: String,
    /// One sentence saying what is wrong.
    pub detail: String,
    /// The operations that show it (for a register: the smallest failing
    /// sub-history), one per line.
    pub witness: Vec<String>,
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key {}: {}: {}", self.key, self.kind.name(), self.detail)?;
        for line in &self.witness {
            write!(f, "\n    {line}")?;
        }
        Ok(())
    }
}

/// The conclusion about one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyVerdict {
    Valid { key: String },
    Anomaly(Anomaly),
    Unknown { key: String, reason: String },
}

impl KeyVerdict {
    /// An anomaly verdict.
    pub fn anomaly(
        key: &str,
        kind: AnomalyKind,
        detail: impl Into<String>,
        witness: Vec<String>,
    ) -> KeyVerdict {
        KeyVerdict::Anomaly(Anomaly {
            kind,
            key: key.to_string(),
            detail: detail.into(),
            witness,
        })
    }
}

/// The run's conclusion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Valid,
    Anomaly,
    Unknown,
}

impl Status {
    /// The process exit code: 0 valid, 1 anomaly, 2 unknown.
    pub fn exit_code(self) -> u8 {
        match self {
            Status::Valid => 0,
            Status::Anomaly => 1,
            Status::Unknown => 2,
        }
    }
}

/// A checker's full answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub status: Status,
    /// Figures worth printing (`name: value` lines).
    pub summary: Vec<String>,
    pub anomalies: Vec<Anomaly>,
    /// Keys that could not be decided, with why.
    pub unknown: Vec<String>,
}

impl Report {
    /// Combines key verdicts with the module's rule (a key may have
    /// several verdicts: one per kind of anomaly).
    pub fn from_verdicts(verdicts: Vec<KeyVerdict>, mut summary: Vec<String>) -> Report {
        let keys: std::collections::BTreeSet<String> = verdicts
            .iter()
            .map(|verdict| match verdict {
                KeyVerdict::Valid { key } | KeyVerdict::Unknown { key, .. } => key.clone(),
                KeyVerdict::Anomaly(anomaly) => anomaly.key.clone(),
            })
            .collect();
        let mut anomalies = Vec::new();
        let mut unknown = Vec::new();
        for verdict in verdicts {
            match verdict {
                KeyVerdict::Valid { .. } => {}
                KeyVerdict::Anomaly(anomaly) => anomalies.push(anomaly),
                KeyVerdict::Unknown { key, reason } => unknown.push(format!("key {key}: {reason}")),
            }
        }
        let status = if !anomalies.is_empty() {
            Status::Anomaly
        } else if !unknown.is_empty() || keys.is_empty() {
            Status::Unknown
        } else {
            Status::Valid
        };
        summary.push(format!(
            "keys checked: {}, anomalies: {}, undecided keys: {}",
            keys.len(),
            anomalies.len(),
            unknown.len()
        ));
        if keys.is_empty() {
            unknown.push("no key had an operation to check".to_string());
        }
        Report {
            status,
            summary,
            anomalies,
            unknown,
        }
    }

    /// True when some anomaly is of this kind.
    pub fn has(&self, kind: AnomalyKind) -> bool {
        self.anomalies.iter().any(|anomaly| anomaly.kind == kind)
    }
}
