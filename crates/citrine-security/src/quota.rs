//! Rate quotas: per user, how many reads and writes it started in the
//! current second.
//!
//! Invariant: a counter counts only requests of the second it is stamped
//! with; the first request of a new second starts it at one.

use crate::QuotaKind;
use citrine_types::ResultCode;
use std::collections::HashMap;

#[derive(Clone, Debug, Default)]
pub(crate) struct Usage {
    /// (user, kind) → (second, requests in it).
    counters: HashMap<(String, bool), (u64, u32)>,
}

impl Usage {
    /// Counts one request of `kind` for `user`; 83 if `limit` (per second,
    /// 0 = none) is already reached this second.
    pub(crate) fn charge(
        &mut self,
        user: &str,
        kind: QuotaKind,
        limit: u32,
        now_ms: u64,
    ) -> Result<(), ResultCode> {
        if limit == 0 {
            return Ok(());
        }
        let second = now_ms / 1000;
        let key = (user.to_string(), kind == QuotaKind::Read);
        let counter = self.counters.entry(key).or_insert((second, 0));
        if counter.0 != second {
            *counter = (second, 0);
        }
        if counter.1 >= limit {
            return Err(ResultCode::QuotaExceeded);
        }
        counter.1 += 1;
        Ok(())
    }

    /// Forgets `user`'s counters (dropped).
    pub(crate) fn forget(&mut self, user: &str) {
        self.counters.retain(|(name, _), _| name != user);
    }
}
