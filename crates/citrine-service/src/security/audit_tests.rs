//! The audit line's text and the `report-*` filters.

#![allow(clippy::unwrap_used)]

use super::*;
use std::sync::Arc;

fn event(report: Report) -> Event {
    Event {
        verdict: Verdict::Permitted,
        report,
        user: Some("alice".to_owned()),
        roles: vec!["app".to_owned()],
        client: Some("10.1.2.3:4567".parse().unwrap()),
        action: "create user".to_owned(),
        detail: "user=bob;roles=read".to_owned(),
        scope: None,
    }
}

fn data_op(ns: &str, set: Option<&str>) -> Event {
    Event {
        scope: Some((ns.to_owned(), set.map(str::to_owned))),
        action: "write".to_owned(),
        ..event(Report::DataOp)
    }
}

#[test]
fn the_line_has_the_reference_layout() {
    let text = event_text(&event(Report::UserAdmin));
    assert_eq!(
        text,
        "permitted | type: user-admin | client: 10.1.2.3:4567 | user: alice | action: create user | detail: user=bob;roles=read"
    );
    let failed = Event {
        verdict: Verdict::AuthenticationFailed,
        user: None,
        client: None,
        ..event(Report::Authentication)
    };
    assert!(event_text(&failed)
        .starts_with("authentication failed | type: authentication | client: none | user: none"));
    let line = Line {
        unix_ms: 1_795_969_227_000,
        text: "x".to_owned(),
        to_log: true,
        to_syslog: false,
    };
    assert_eq!(
        file_line(&line),
        "Nov 29 2026 16:20:27 GMT: INFO (audit): x"
    );
}

#[test]
fn timestamps_are_utc_calendar_dates() {
    assert_eq!(timestamp(0), "Jan 01 1970 00:00:00 GMT");
    assert_eq!(timestamp(951_868_799_000), "Feb 29 2000 23:59:59 GMT");
    assert_eq!(timestamp(951_868_800_000), "Mar 01 2000 00:00:00 GMT");
    assert_eq!(timestamp(1_795_969_227_999), "Nov 29 2026 16:20:27 GMT");
}

#[test]
fn each_switch_lets_its_events_through() {
    let none = Reports::default();
    for report in [
        Report::Authentication,
        Report::UserAdmin,
        Report::SysAdmin,
        Report::Violation,
        Report::DataOp,
    ] {
        assert!(!none.wants(&event(report)), "{report:?}");
    }
    let violations = Reports {
        violation: true,
        ..Reports::default()
    };
    assert!(violations.wants(&event(Report::Violation)));
    assert!(!violations.wants(&event(Report::Authentication)));
    let auth = Reports {
        authentication: true,
        sys_admin: true,
        user_admin: true,
        ..Reports::default()
    };
    assert!(auth.wants(&event(Report::Authentication)));
    assert!(auth.wants(&event(Report::SysAdmin)));
    assert!(auth.wants(&event(Report::UserAdmin)));
    assert!(!auth.wants(&event(Report::Violation)));
}

#[test]
fn data_ops_are_reported_by_scope_role_or_user() {
    let by_ns = Reports {
        data_op: vec![("test".to_owned(), None)],
        ..Reports::default()
    };
    assert!(by_ns.wants(&data_op("test", Some("any"))));
    assert!(!by_ns.wants(&data_op("bar", None)));
    let by_set = Reports {
        data_op: vec![("test".to_owned(), Some("cards".to_owned()))],
        ..Reports::default()
    };
    assert!(by_set.wants(&data_op("test", Some("cards"))));
    assert!(!by_set.wants(&data_op("test", Some("other"))));
    assert!(!by_set.wants(&data_op("test", None)));
    let by_role = Reports {
        data_op_role: vec!["app".to_owned()],
        ..Reports::default()
    };
    assert!(by_role.wants(&data_op("bar", None)));
    let by_user = Reports {
        data_op_user: vec!["bob".to_owned()],
        ..Reports::default()
    };
    assert!(!by_user.wants(&data_op("bar", None)));
    assert!(by_user.wants(&Event {
        user: Some("bob".to_owned()),
        ..data_op("bar", None)
    }));
}

/// Keeps what it is sent.
#[derive(Default)]
struct Keep(parking_lot::Mutex<Vec<Line>>);

impl AuditSink for Arc<Keep> {
    fn send(&self, line: Line) {
        self.0.lock().push(line);
    }
    fn dropped(&self) -> u64 {
        7
    }
}

#[test]
fn events_go_to_the_sinks_that_want_them_and_set_config_switches() {
    let keep = Arc::new(Keep::default());
    let settings = AuditSettings {
        log: Reports {
            violation: true,
            ..Reports::default()
        },
        syslog: Reports::default(),
    };
    let audit = Audit::new(settings, Box::new(keep.clone()));
    audit.record(&event(Report::Authentication), 1);
    assert!(keep.0.lock().is_empty());
    audit.record(&event(Report::Violation), 2);
    let sent = keep.0.lock().clone();
    assert_eq!(sent.len(), 1);
    assert!(sent[0].to_log && !sent[0].to_syslog);
    assert_eq!(audit.dropped(), 7);

    audit
        .set(&[("syslog.report-authentication", "true")])
        .unwrap();
    audit.record(&event(Report::Authentication), 3);
    let last = keep.0.lock().last().cloned().unwrap();
    assert!(!last.to_log && last.to_syslog);

    assert!(!audit.wants_data_ops());
    audit
        .set(&[
            ("log.report-data-op", "true"),
            ("namespace", "test"),
            ("set", "s"),
        ])
        .unwrap();
    assert!(audit.wants_data_ops());
    assert_eq!(
        audit.settings().log.data_op,
        vec![("test".to_owned(), Some("s".to_owned()))]
    );
    audit
        .set(&[
            ("log.report-data-op", "false"),
            ("namespace", "test"),
            ("set", "s"),
        ])
        .unwrap();
    assert!(!audit.wants_data_ops());

    assert!(audit.set(&[("log.report-violation", "maybe")]).is_err());
    assert!(audit.set(&[("log.report-nothing", "true")]).is_err());
    assert!(audit.set(&[("log.report-data-op", "true")]).is_err());
    assert!(audit.set(&[]).is_err());
    let pairs = config_pairs(&audit.settings());
    assert!(pairs.contains(&("log.report-violation".to_owned(), "true".to_owned())));
    assert!(pairs.contains(&("syslog.report-authentication".to_owned(), "true".to_owned())));
}

#[test]
fn failed_logins_are_counted_per_user_and_address() {
    let audit = LoginFailures::default();
    let here = Some("10.0.0.1".parse().unwrap());
    let there = Some("10.0.0.2".parse().unwrap());
    assert_eq!(audit.login_failed("admin", here), 1);
    assert_eq!(audit.login_failed("admin", here), 2);
    assert_eq!(audit.login_failed("admin", there), 1);
    assert_eq!(audit.login_failed("bob", here), 1);
    audit.login_succeeded("admin", here);
    assert_eq!(audit.login_failed("admin", here), 1);
    for index in 0..MAX_TRACKED_FAILURES + 5 {
        audit.login_failed(&format!("made-up-{index}"), here);
    }
    assert!(audit.failures.lock().len() <= MAX_TRACKED_FAILURES);
    assert_eq!(
        audit.total.load(Ordering::Relaxed),
        5 + MAX_TRACKED_FAILURES as u64 + 5
    );
}

#[test]
fn failed_login_warnings_are_one_a_second_with_the_rest_counted() {
    let failures = LoginFailures::default();
    assert_eq!(failures.may_warn(100), Some(0));
    assert_eq!(failures.may_warn(100), None);
    assert_eq!(failures.may_warn(100), None);
    assert_eq!(failures.may_warn(101), Some(2));
    assert_eq!(failures.may_warn(101), None);
    assert_eq!(failures.may_warn(105), Some(1));
}
