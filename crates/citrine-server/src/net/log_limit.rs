//! Rate limiting of repeated log lines: a burst of bad connections (every
//! one closed with a warning) must not turn into thousands of lines.
//!
//! A [`LogLimit`] guards one log site (or a family of similar ones). Its
//! lines are counted in windows of [`WINDOW`]: the first [`BURST`] lines of
//! a window are written, the rest are suppressed and counted. The first
//! line written after a window with suppressed lines says how many
//! ([`Suppressed`]'s `Display`: " (N similar suppressed in the last S s)",
//! S counted from the first line suppressed); if no further line comes,
//! [`report_quiet`] (called from the service threads' periodic sweep)
//! writes the count on its own once the window is over.
//!
//! Invariants: every line a site asks for is either written or counted in
//! exactly one report; a site that logs less than [`BURST`] lines per
//! window is never suppressed; the state is a short mutex section per
//! line, so any thread may log through the same limit.

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The span over which a site's lines are counted.
pub(super) const WINDOW: Duration = Duration::from_secs(10);
/// Lines of one site written per window before the rest are suppressed.
pub(super) const BURST: u32 = 5;

/// Bad frames (headers that cannot be trusted, refused requests).
pub(super) static BAD_FRAME: LogLimit = LogLimit::new("closing connections: bad frames");
/// Peers that hung up inside a frame.
pub(super) static CLOSED_MID_FRAME: LogLimit =
    LogLimit::new("closing connections: peer closed inside a frame");
/// Failed socket reads and writes.
pub(super) static IO_ERROR: LogLimit = LogLimit::new("closing connections after I/O errors");
/// Connections refused at accept (`proto-fd-max`) or accepts that failed.
pub(super) static REFUSED: LogLimit = LogLimit::new("refusing or failing to accept connections");

/// Every limit of the connection code, for [`report_quiet`].
const ALL: [&LogLimit; 4] = [&BAD_FRAME, &CLOSED_MID_FRAME, &IO_ERROR, &REFUSED];

/// One log site's window.
pub(super) struct LogLimit {
    /// What the site logs, for a count reported on its own.
    what: &'static str,
    state: Mutex<Window>,
}

#[derive(Default)]
struct Window {
    /// When the current window began (its first line).
    began: Option<Instant>,
    /// Lines written in the current window.
    written: u32,
    /// Lines suppressed since the last report, and when the first was.
    suppressed: u64,
    first_suppressed: Option<Instant>,
}

/// What a written line adds about the lines suppressed before it.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Suppressed {
    pub(super) count: u64,
    /// Whole seconds (rounded up) since the first of them.
    pub(super) seconds: u64,
}

impl fmt::Display for Suppressed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.count == 0 {
            return Ok(());
        }
        write!(
            f,
            " ({} similar suppressed in the last {} s)",
            self.count, self.seconds
        )
    }
}

impl LogLimit {
    pub(super) const fn new(what: &'static str) -> LogLimit {
        LogLimit {
            what,
            state: Mutex::new(Window {
                began: None,
                written: 0,
                suppressed: 0,
                first_suppressed: None,
            }),
        }
    }

    /// Whether to write a line now: `Some` (to append to it) when it is
    /// written, `None` when it is suppressed and counted.
    pub(super) fn admit(&self) -> Option<Suppressed> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<Suppressed> {
        let mut window = super::lock(&self.state);
        let over = window
            .began
            .is_none_or(|began| now.saturating_duration_since(began) >= WINDOW);
        if over {
            window.began = Some(now);
            window.written = 0;
        }
        if window.written >= BURST {
            window.suppressed += 1;
            window.first_suppressed.get_or_insert(now);
            return None;
        }
        window.written += 1;
        Some(window.take_report(now))
    }

    /// The lines suppressed in a window that is over, if any, to report on
    /// their own (no line came since to carry the count).
    fn quiet_report_at(&self, now: Instant) -> Option<Suppressed> {
        let mut window = super::lock(&self.state);
        let over = window
            .began
            .is_some_and(|began| now.saturating_duration_since(began) >= WINDOW);
        (over && window.suppressed > 0).then(|| window.take_report(now))
    }
}

impl Window {
    /// The count of suppressed lines to report at `now`, reset.
    fn take_report(&mut self, now: Instant) -> Suppressed {
        let since = self.first_suppressed.take().unwrap_or(now);
        let elapsed = now.saturating_duration_since(since);
        let seconds = elapsed.as_secs() + u64::from(elapsed.subsec_nanos() > 0);
        Suppressed {
            count: std::mem::take(&mut self.suppressed),
            seconds,
        }
    }
}

/// Writes the counts of the connection code's suppressed lines that no
/// later line carried, once their window is over.
pub(super) fn report_quiet(now: Instant) {
    for limit in ALL {
        if let Some(suppressed) = limit.quiet_report_at(now) {
            tracing::warn!(
                "{}: {} similar lines suppressed in the last {} s",
                limit.what,
                suppressed.count,
                suppressed.seconds
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_written_up_to_the_limit_then_counted() {
        let limit = LogLimit::new("test");
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        // 1000 lines within one second: BURST written, the rest counted.
        let written: Vec<Suppressed> = (0..1000).filter_map(|i| limit.admit_at(at(i))).collect();
        assert_eq!(written.len(), BURST as usize);
        assert!(written.iter().all(|note| note.count == 0));
        assert_eq!(written[0].to_string(), "");
        // Before the window ends: still suppressed.
        assert_eq!(limit.admit_at(at(9_999)), None);
        assert_eq!(limit.quiet_report_at(at(9_999)), None);
        // The next line after it carries the count, since the first
        // suppressed line (at 5 ms).
        let note = limit.admit_at(at(10_000)).expect("a new window");
        assert_eq!(
            note,
            Suppressed {
                count: 1000 - u64::from(BURST) + 1,
                seconds: 10
            }
        );
        assert_eq!(
            note.to_string(),
            " (996 similar suppressed in the last 10 s)"
        );
        // Counted once: the next line reports nothing more.
        assert_eq!(limit.admit_at(at(10_001)).map(|note| note.count), Some(0));
    }

    #[test]
    fn a_site_below_the_limit_is_never_suppressed() {
        let limit = LogLimit::new("test");
        let start = Instant::now();
        // Four lines per window, for 100 s.
        for line in 0..40u64 {
            let note = limit.admit_at(start + Duration::from_millis(2_500 * line));
            assert_eq!(note.map(|note| note.count), Some(0), "line {line}");
        }
    }

    #[test]
    fn suppressed_lines_no_later_line_carries_are_reported_after_the_window() {
        let limit = LogLimit::new("test");
        let start = Instant::now();
        for i in 0..20 {
            limit.admit_at(start + Duration::from_millis(i));
        }
        assert_eq!(limit.quiet_report_at(start + Duration::from_secs(5)), None);
        let report = limit.quiet_report_at(start + Duration::from_secs(12));
        assert_eq!(report.map(|note| note.count), Some(15));
        // Reported once.
        assert_eq!(limit.quiet_report_at(start + Duration::from_secs(13)), None);
        assert_eq!(
            limit
                .admit_at(start + Duration::from_secs(14))
                .map(|note| note.count),
            Some(0)
        );
    }
}
