//! End-to-end tests of `citrine act`: a short run against a temporary file
//! (its reports, histograms and verdict), the refusal of bad input before
//! any I/O, and the help text.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

const CITRINE: &str = env!("CARGO_BIN_EXE_citrine");

/// A fresh directory for one test's device files (on the target's disk,
/// which takes O_DIRECT; /tmp may be a tmpfs that does not).
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("act-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Runs `citrine act ARGS`, through the page cache where the scratch
/// directory's filesystem refuses O_DIRECT (a tmpfs).
fn act(args: &[&str]) -> Output {
    let mut command = Command::new(CITRINE);
    command.arg("act").args(args);
    if !direct_io_works() {
        command.arg("--buffered");
    }
    command.output().expect("run citrine act")
}

fn direct_io_works() -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let probe = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("act-probe-{}", std::process::id()));
    let works = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe)
        .is_ok();
    let _ = std::fs::remove_file(&probe);
    works
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_short_run_reports_intervals_histograms_and_a_verdict() {
    let dir = scratch("run");
    let device = dir.join("device.dat");
    // The rates from an ACT-style file, the rest (and one override) as flags.
    let config = dir.join("act.conf");
    let text_config =
        "# 1x / 10\nread-reqs-per-sec: 200\nwrite-reqs-per-sec: 100\ntest-duration-sec: 9\n";
    std::fs::write(&config, text_config).unwrap();
    let output = act(&[
        "--config",
        config.to_str().unwrap(),
        "--device-names",
        device.to_str().unwrap(),
        "--file-size-mbytes",
        "8",
        "--test-duration-sec",
        "3",
        "--service-threads",
        "2",
    ]);
    let stdout = text(&output.stdout);
    assert!(
        matches!(output.status.code(), Some(0) | Some(2)),
        "exit {:?}\n{stdout}\n{}",
        output.status,
        text(&output.stderr)
    );
    assert_eq!(std::fs::metadata(&device).unwrap().len(), 8 << 20);
    assert!(stdout.contains("salted "), "{stdout}");
    for sec in 1..=3 {
        assert!(
            stdout.contains(&format!("after {sec} sec:\n")),
            "interval {sec}\n{stdout}"
        );
    }
    assert!(!stdout.contains("after 4 sec:"), "{stdout}");
    // The last report counts every read of the schedule: 3 s × 200/s.
    assert!(stdout.contains("\nreads (600 total)\n"), "{stdout}");
    let device_reads = format!("{}-reads (600 total)", device.display());
    assert!(stdout.contains(&device_reads), "{stdout}");
    // 100 writes/s of 1536 B, doubled by defrag: 2.34 large blocks/s → 8 in 3 s.
    assert!(stdout.contains("large-block-reads (8 total)"), "{stdout}");
    assert!(stdout.contains("large-block-writes (8 total)"), "{stdout}");
    assert!(stdout.contains(" (00: "), "bucket lines\n{stdout}");
    assert_eq!(
        stdout.matches("reads %>(ms) in this interval: 1: ").count(),
        3,
        "{stdout}"
    );
    assert!(
        stdout.contains("slice        1      2      4      8     16     32     64"),
        "{stdout}"
    );
    assert!(stdout.contains("  max  "), "{stdout}");
    let verdict = if output.status.code() == Some(0) {
        "VERDICT: PASS"
    } else {
        "VERDICT: FAIL"
    };
    assert!(stdout.contains(verdict), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_input_is_refused_with_a_clear_message() {
    let dir = scratch("bad");
    let device = dir.join("device.dat");
    let device = device.to_str().unwrap();
    let refused = |args: &[&str], expected: &str| {
        let output = act(args);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(expected),
            "{args:?}: expected `{expected}` in: {stderr}"
        );
    };
    refused(&["--test-duration-sec", "1"], "device-names");
    refused(
        &[
            "--device-names",
            "/nonexistent-act-dir/x.dat",
            "--file-size-mbytes",
            "8",
        ],
        "directory /nonexistent-act-dir does not exist",
    );
    refused(&["--device-names", device], "give file-size-mbytes");
    refused(
        &["--device-names", device, "--file-size-mbytes", "0"],
        "give file-size-mbytes",
    );
    refused(
        &[
            "--device-names",
            device,
            "--file-size-mbytes",
            "8",
            "--read-reqs-per-sec",
            "0",
            "--write-reqs-per-sec",
            "0",
        ],
        "both 0",
    );
    // 512 KiB is 4 large blocks of 128 KiB: too small.
    std::fs::write(dir.join("small.dat"), vec![0u8; 512 << 10]).unwrap();
    let small = dir.join("small.dat");
    refused(&["--device-names", small.to_str().unwrap()], "too small");
    refused(
        &["--device-names", dir.to_str().unwrap()],
        "not a regular file or a block device",
    );
    refused(
        &[
            "--device-names",
            device,
            "--file-size-mbytes",
            "8",
            "--large-block-op-kbytes",
            "100",
        ],
        "large-block-op-kbytes",
    );
    let config = dir.join("act.conf");
    std::fs::write(&config, "device-names: /x\nqueue-depth: 4\n").unwrap();
    refused(&["--config", config.to_str().unwrap()], "queue-depth");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn help_names_the_act_settings_and_the_criteria() {
    let output = act(&["--help"]);
    assert!(output.status.success());
    let help = text(&output.stdout);
    for needle in [
        "--device-names",
        "--test-duration-sec",
        "--read-reqs-per-sec",
        "--write-reqs-per-sec",
        "--record-bytes",
        "--large-block-op-kbytes",
        "--defrag-lwm-pct",
        "--ramp",
        "fewer than 5 % of reads over 1 ms",
        "Exit status",
    ] {
        assert!(help.contains(needle), "`{needle}` missing from:\n{help}");
    }
    assert!(
        help.lines().all(|line| line.chars().count() <= 100),
        "{help}"
    );
}

#[test]
fn the_ramp_reports_its_steps_and_the_highest_passing_load() {
    let dir = scratch("ramp");
    let device = dir.join("device.dat");
    let output = act(&[
        "--device-names",
        device.to_str().unwrap(),
        "--file-size-mbytes",
        "8",
        "--test-duration-sec",
        "1",
        "--read-reqs-per-sec",
        "50",
        "--write-reqs-per-sec",
        "20",
        "--ramp",
        "double",
        "--ramp-max",
        "2",
        "--microsecond-histograms",
    ]);
    let stdout = text(&output.stdout);
    assert!(
        stdout.contains("RAMP STEP 1x: read-reqs-per-sec 50, write-reqs-per-sec 20"),
        "{stdout}"
    );
    assert!(stdout.contains("RAMP SUMMARY"), "{stdout}");
    assert!(stdout.contains("microsecond-histograms: yes"), "{stdout}");
    assert!(stdout.contains("        %>(us)\n"), "{stdout}");
    let steps = stdout.matches("RAMP STEP ").count();
    match output.status.code() {
        // 1x passed: 2x ran too, and the result names the highest that passed.
        Some(0) => {
            assert_eq!(steps, 2, "{stdout}");
            assert!(
                stdout.contains("RAMP STEP 2x: read-reqs-per-sec 100"),
                "{stdout}"
            );
            assert!(
                stdout.contains("RAMP RESULT: highest load with p95 of reads within 2 ms: "),
                "{stdout}"
            );
        }
        Some(2) => {
            assert_eq!(steps, 1, "{stdout}");
            assert!(stdout.contains("RAMP RESULT: no load passed"), "{stdout}");
        }
        other => panic!("exit {other:?}: {}", text(&output.stderr)),
    }
    let _ = std::fs::remove_dir_all(&dir);
}
