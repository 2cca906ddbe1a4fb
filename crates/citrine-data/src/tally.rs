//! Whose statistics a single-record request's outcome counts in: a
//! client's (`client_*`), or a background job's sub-transaction — a UDF
//! job's record UDF (`udf_sub_*`) or an ops job's record write
//! (`ops_sub_*`) — as the reference (8.1.2, asked side by side with the
//! same jobs) counts them: a job's record writes count in no `client_*`
//! statistic; a record its filter expression turns away counts as the
//! sub-transaction's `filtered_out` (whether the job's walk or the write
//! itself turned it away); a record UDF that completed counts by what it
//! did (`*_lang_read_success` when it changed nothing, `_write_` when it
//! created or updated, `_delete_` when it removed), one whose function
//! failed as `*_udf_error` and `*_lang_error`.
//!
//! A sub-transaction refused before it ran (the node out of a cluster, an
//! SC namespace closed to data) is a `*_tsvc_error`; none waits in a queue
//! here, so `*_tsvc_timeout` stays 0. One forwarded to another node (its
//! partition moved while the job ran) counts there as a client's.
//!
//! Owns [`Tally`], [`Outcome`], the sub-transactions' statistics
//! ([`SubStats`]) and [`NamespaceStats::count`], the one place an
//! outcome picks its counters.
//!
//! Invariants: an outcome counts in one tally's statistics only; a
//! client's outcomes count exactly as before sub-transactions were told
//! apart (its timeouts among its errors; Citrine has no `client_*_timeout`).

use crate::namespace::NamespaceStats;
use citrine_types::ResultCode;
use citrine_wire::msg::info2;
use std::sync::atomic::{AtomicU64, Ordering};

/// Who a request's outcome counts for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Tally {
    /// A client's request, or a batch row (`client_*`).
    #[default]
    Client,
    /// A background UDF job's record UDF (`udf_sub_*`).
    UdfSub,
    /// A background ops job's record write (`ops_sub_*`).
    OpsSub,
}

impl Tally {
    /// A background job's sub-transaction: `udf` when it calls a record
    /// UDF.
    pub fn sub(udf: bool) -> Tally {
        if udf {
            Tally::UdfSub
        } else {
            Tally::OpsSub
        }
    }
}

/// What a record UDF that completed did to its record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lang {
    /// Changed nothing (a read, or a remove of a missing record).
    Read,
    /// Created or updated it.
    Write,
    /// Removed it.
    Delete,
}

/// A single-record request's outcome, as the statistics count it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    WriteSuccess,
    DeleteSuccess,
    DeleteNotFound,
    /// A record UDF completed, doing this.
    UdfComplete(Lang),
    /// A record UDF's function failed (answered 100, `FAILURE`).
    UdfFailed,
    /// Failed with `code` before or instead of its work; `info2` is its
    /// header's, `udf` whether it calls a record UDF (counted as the UDF's
    /// error whatever stopped it).
    Failed {
        code: ResultCode,
        info2: u8,
        udf: bool,
    },
    /// Refused before it ran (the reference's `tsvc` errors).
    Refused,
}

/// The background jobs' sub-transaction statistics, by the reference's
/// names. Plain atomics: a node runs its jobs' writes on one thread.
#[derive(Debug, Default)]
pub struct SubStats {
    pub udf_sub_tsvc_error: AtomicU64,
    pub udf_sub_tsvc_timeout: AtomicU64,
    pub udf_sub_udf_complete: AtomicU64,
    pub udf_sub_udf_error: AtomicU64,
    pub udf_sub_udf_timeout: AtomicU64,
    pub udf_sub_udf_filtered_out: AtomicU64,
    pub udf_sub_lang_read_success: AtomicU64,
    pub udf_sub_lang_write_success: AtomicU64,
    pub udf_sub_lang_delete_success: AtomicU64,
    pub udf_sub_lang_error: AtomicU64,
    pub ops_sub_tsvc_error: AtomicU64,
    pub ops_sub_tsvc_timeout: AtomicU64,
    pub ops_sub_write_success: AtomicU64,
    pub ops_sub_write_error: AtomicU64,
    pub ops_sub_write_timeout: AtomicU64,
    pub ops_sub_write_filtered_out: AtomicU64,
}

impl SubStats {
    /// Every statistic by name, in the reference's order.
    pub fn pairs(&self) -> [(&'static str, u64); 16] {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        [
            ("udf_sub_tsvc_error", read(&self.udf_sub_tsvc_error)),
            ("udf_sub_tsvc_timeout", read(&self.udf_sub_tsvc_timeout)),
            ("udf_sub_udf_complete", read(&self.udf_sub_udf_complete)),
            ("udf_sub_udf_error", read(&self.udf_sub_udf_error)),
            ("udf_sub_udf_timeout", read(&self.udf_sub_udf_timeout)),
            (
                "udf_sub_udf_filtered_out",
                read(&self.udf_sub_udf_filtered_out),
            ),
            (
                "udf_sub_lang_read_success",
                read(&self.udf_sub_lang_read_success),
            ),
            (
                "udf_sub_lang_write_success",
                read(&self.udf_sub_lang_write_success),
            ),
            (
                "udf_sub_lang_delete_success",
                read(&self.udf_sub_lang_delete_success),
            ),
            ("udf_sub_lang_error", read(&self.udf_sub_lang_error)),
            ("ops_sub_tsvc_error", read(&self.ops_sub_tsvc_error)),
            ("ops_sub_tsvc_timeout", read(&self.ops_sub_tsvc_timeout)),
            ("ops_sub_write_success", read(&self.ops_sub_write_success)),
            ("ops_sub_write_error", read(&self.ops_sub_write_error)),
            ("ops_sub_write_timeout", read(&self.ops_sub_write_timeout)),
            (
                "ops_sub_write_filtered_out",
                read(&self.ops_sub_write_filtered_out),
            ),
        ]
    }

    /// `n` records a job's walk turned away by its filter expression
    /// (`udf`: a UDF job).
    pub fn count_filtered(&self, udf: bool, n: u64) {
        let counter = if udf {
            &self.udf_sub_udf_filtered_out
        } else {
            &self.ops_sub_write_filtered_out
        };
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn udf(&self, outcome: Outcome) {
        let lang = match outcome {
            Outcome::UdfComplete(Lang::Read) => Some(&self.udf_sub_lang_read_success),
            Outcome::UdfComplete(Lang::Write) => Some(&self.udf_sub_lang_write_success),
            Outcome::UdfComplete(Lang::Delete) => Some(&self.udf_sub_lang_delete_success),
            Outcome::UdfFailed => Some(&self.udf_sub_lang_error),
            _ => None,
        };
        let counter = match outcome {
            Outcome::UdfComplete(_) => Some(&self.udf_sub_udf_complete),
            Outcome::Refused => Some(&self.udf_sub_tsvc_error),
            Outcome::Failed { code, .. } => sub_failure(
                code,
                &self.udf_sub_udf_filtered_out,
                &self.udf_sub_udf_timeout,
                &self.udf_sub_udf_error,
            ),
            // A UDF job's record writes are UDF calls: the rest cannot
            // happen; a failed function is an error like any other.
            _ => Some(&self.udf_sub_udf_error),
        };
        for counter in [lang, counter].into_iter().flatten() {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn ops(&self, outcome: Outcome) {
        let counter = match outcome {
            Outcome::WriteSuccess | Outcome::DeleteSuccess => Some(&self.ops_sub_write_success),
            Outcome::Refused => Some(&self.ops_sub_tsvc_error),
            Outcome::Failed { code, .. } => sub_failure(
                code,
                &self.ops_sub_write_filtered_out,
                &self.ops_sub_write_timeout,
                &self.ops_sub_write_error,
            ),
            Outcome::DeleteNotFound => None,
            Outcome::UdfComplete(_) | Outcome::UdfFailed => Some(&self.ops_sub_write_error),
        };
        if let Some(counter) = counter {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A sub-transaction's failure: filtered out, timed out, or an error; a
/// record deleted since the job selected it (2) counts nowhere.
fn sub_failure<'s>(
    code: ResultCode,
    filtered_out: &'s AtomicU64,
    timeout: &'s AtomicU64,
    error: &'s AtomicU64,
) -> Option<&'s AtomicU64> {
    match code {
        ResultCode::NotFound => None,
        ResultCode::FilteredOut => Some(filtered_out),
        ResultCode::Timeout => Some(timeout),
        _ => Some(error),
    }
}

impl NamespaceStats {
    /// Counts one request's `outcome` in `tally`'s statistics (a refused
    /// generation check and a busy key count in `fail_*` whoever sent it).
    pub fn count(&self, tally: Tally, outcome: Outcome) {
        if let Outcome::Failed {
            code: ResultCode::Generation,
            ..
        } = outcome
        {
            self.fail_generation.fetch_add(1, Ordering::Relaxed);
            return;
        }
        match tally {
            Tally::Client => self.count_client(outcome),
            Tally::UdfSub => self.sub.udf(outcome),
            Tally::OpsSub => self.sub.ops(outcome),
        }
    }

    fn count_client(&self, outcome: Outcome) {
        let lang = match outcome {
            Outcome::UdfComplete(Lang::Read) => Some(&self.client_lang_read_success),
            Outcome::UdfComplete(Lang::Write) => Some(&self.client_lang_write_success),
            Outcome::UdfComplete(Lang::Delete) => Some(&self.client_lang_delete_success),
            Outcome::UdfFailed => Some(&self.client_lang_error),
            _ => None,
        };
        let counter = match outcome {
            Outcome::WriteSuccess => Some(&self.client_write_success),
            Outcome::DeleteSuccess => Some(&self.client_delete_success),
            Outcome::DeleteNotFound => Some(&self.client_delete_not_found),
            Outcome::UdfComplete(_) => Some(&self.client_udf_complete),
            Outcome::UdfFailed => Some(&self.client_udf_error),
            Outcome::Failed { code, info2, udf } => self.client_failure(code, info2, udf),
            Outcome::Refused => None,
        };
        for counter in [lang, counter].into_iter().flatten() {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn client_failure(
        &self,
        code: ResultCode,
        info2: u8,
        udf: bool,
    ) -> Option<&citrine_types::stripes::Counter> {
        let write = info2 & info2::WRITE != 0;
        match code {
            ResultCode::NotFound => None,
            ResultCode::FilteredOut if !write => Some(&self.client_read_filtered_out),
            ResultCode::FilteredOut if info2 & info2::DELETE != 0 => {
                Some(&self.client_delete_filtered_out)
            }
            ResultCode::FilteredOut => Some(&self.client_write_filtered_out),
            _ if udf => Some(&self.client_udf_error),
            _ if write => Some(&self.client_write_error),
            _ => Some(&self.client_read_error),
        }
    }
}
