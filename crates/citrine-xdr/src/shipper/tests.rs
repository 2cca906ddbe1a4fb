//! The shipper's rules, driven by hand: LSTs advance only over
//! acknowledged prefixes, failures leave them for the rescan, hot keys
//! are shipped once, throughput and in-flight bounds hold, and a
//! restart from saved LSTs ships what was not acknowledged.

#![allow(clippy::unwrap_used)]

use super::*;

fn digest(n: u16, partition: u16) -> Digest {
    let mut bytes = [0u8; 20];
    bytes[..2].copy_from_slice(&partition.to_le_bytes());
    bytes[2..4].copy_from_slice(&n.to_le_bytes());
    Digest(bytes)
}

fn shipper(limits: Limits) -> Shipper {
    let mut shipper = Shipper::new(NamespaceSettings::default(), limits, 1000);
    shipper.set_mastered(7, true);
    shipper
}

fn candidates(luts: &[u64]) -> Vec<Candidate> {
    luts.iter()
        .enumerate()
        .map(|(n, lut)| Candidate {
            digest: digest(n as u16, 7),
            lut_ms: *lut,
        })
        .collect()
}

/// Scans partition 7 at `now` and offers records with `luts`.
fn open(shipper: &mut Shipper, now: u64, luts: &[u64]) -> Scan {
    let scans = shipper.scans_due(now);
    assert_eq!(scans.len(), 1, "only partition 7 is mastered");
    let scan = scans[0];
    shipper.offer(scan, candidates(luts), now);
    scan
}

#[test]
fn lst_advances_only_over_contiguous_acks() {
    let mut shipper = shipper(Limits::default());
    open(&mut shipper, 5000, &[1100, 1200, 1300]);
    let ships = shipper.poll(5000);
    assert_eq!(ships.len(), 3);
    // The second and third acknowledged first: the first is outstanding.
    shipper.ack(ships[2].id, Outcome::Shipped { lut_ms: 1300 }, 5001);
    shipper.ack(ships[1].id, Outcome::Shipped { lut_ms: 1200 }, 5001);
    assert_eq!(
        shipper.lst(7),
        1099,
        "just below the outstanding first record"
    );
    assert_eq!(shipper.take_lst_changes(), vec![(7, 1099)]);
    shipper.ack(ships[0].id, Outcome::Shipped { lut_ms: 1100 }, 5002);
    let horizon = 5000 - Limits::default().settle_ms;
    assert_eq!(
        shipper.lst(7),
        horizon,
        "all acknowledged: up to the horizon"
    );
    assert_eq!(shipper.take_lst_changes(), vec![(7, horizon)]);
    assert_eq!(shipper.counters().success, 3);
}

#[test]
fn partial_prefix_then_failure_leaves_the_rest_for_the_rescan() {
    let mut shipper = shipper(Limits::default());
    open(&mut shipper, 5000, &[1100, 1200, 1200, 1300]);
    let ships = shipper.poll(5000);
    shipper.ack(ships[0].id, Outcome::Shipped { lut_ms: 1100 }, 5001);
    assert_eq!(
        shipper.lst(7),
        1199,
        "just below the first unacknowledged LUT"
    );
    shipper.ack(ships[1].id, Outcome::Shipped { lut_ms: 1200 }, 5001);
    assert_eq!(
        shipper.lst(7),
        1199,
        "a tie with an outstanding record holds"
    );
    shipper.ack(ships[2].id, Outcome::RetryConnection, 5002);
    shipper.ack(ships[3].id, Outcome::Shipped { lut_ms: 1300 }, 5002);
    assert_eq!(shipper.lst(7), 1199, "the failed record bounds the LST");
    assert_eq!(shipper.recoveries_pending(), 1);
    assert!(
        shipper.scans_due(5100).is_empty(),
        "rescan waits for retry_ms"
    );
    let scans = shipper.scans_due(5002 + Limits::default().retry_ms);
    assert_eq!(scans.len(), 1);
    assert_eq!(scans[0].after, 1199);
    assert_eq!(shipper.counters().recoveries, 1);
    assert_eq!(shipper.counters().retry_conn_reset, 1);
}

#[test]
fn hot_key_ships_once() {
    let limits = Limits::default();
    let mut shipper = shipper(limits);
    open(&mut shipper, 5000, &[1100]);
    let ships = shipper.poll(5000);
    // The ship read a newer version (updated after the scan).
    shipper.ack(ships[0].id, Outcome::Shipped { lut_ms: 4990 }, 5001);
    // The next scan finds the same record at the version already shipped.
    open(&mut shipper, 5100, &[4990]);
    assert!(shipper.poll(5100).is_empty(), "already shipped at that LUT");
    assert_eq!(shipper.counters().hot_keys, 1);
    assert_eq!(shipper.lst(7), 5100 - limits.settle_ms);
    // Updated again within hot-key-ms: held until hot-key-ms passed.
    open(&mut shipper, 5050 + 100, &[5095]);
    assert!(
        shipper.poll(5090).is_empty(),
        "within hot-key-ms of the last ship"
    );
    assert_eq!(shipper.in_queue(), 1);
    assert_eq!(
        shipper.poll(5101).len(),
        1,
        "hot-key-ms after the last ship"
    );
}

#[test]
fn in_flight_and_throughput_are_bounded() {
    let limits = Limits {
        max_in_flight: 4,
        ..Limits::default()
    };
    let mut shipper = shipper(limits);
    let luts: Vec<u64> = (1..=20).map(|n| 1000 + n).collect();
    open(&mut shipper, 5000, &luts);
    let first = shipper.poll(5000);
    assert_eq!(first.len(), 4);
    assert!(shipper.poll(5000).is_empty());
    assert_eq!(shipper.in_progress(), 4);
    assert_eq!(shipper.in_queue(), 16);
    for ship in first {
        shipper.ack(ship.id, Outcome::Shipped { lut_ms: 1 }, 5001);
    }
    assert_eq!(shipper.poll(5001).len(), 4);

    let settings = NamespaceSettings {
        max_throughput: 100,
        ..NamespaceSettings::default()
    };
    let mut slow = Shipper::new(settings, Limits::default(), 1000);
    slow.set_mastered(7, true);
    open(&mut slow, 5000, &luts);
    assert_eq!(slow.poll(5000).len(), 10, "a tenth of a second's burst");
    assert!(slow.poll(5000).is_empty());
    assert_eq!(slow.poll(5050).len(), 5, "100/s refills 5 in 50 ms");
}

#[test]
fn window_is_bounded_without_splitting_a_lut() {
    let limits = Limits {
        window_limit: 2,
        ..Limits::default()
    };
    let mut shipper = shipper(limits);
    open(&mut shipper, 5000, &[1300, 1100, 1200, 1200, 1400]);
    let ships = shipper.poll(5000);
    assert_eq!(ships.len(), 3, "the tie at 1200 stays whole");
    for ship in &ships {
        shipper.ack(ship.id, Outcome::Shipped { lut_ms: 0 }, 5001);
    }
    assert_eq!(shipper.lst(7), 1200, "the cut window ends at its last LUT");
    let scans = shipper.scans_due(5001);
    assert_eq!(scans[0].after, 1200, "rescanned at once for the rest");
}

#[test]
fn restart_from_saved_lsts_reships_the_unacknowledged() {
    let mut shipper = shipper(Limits::default());
    open(&mut shipper, 5000, &[1100, 1200]);
    let ships = shipper.poll(5000);
    shipper.ack(ships[0].id, Outcome::Shipped { lut_ms: 1100 }, 5001);
    let saved = crate::lst_file::encode(&shipper.lsts());
    drop(shipper); // the process dies with the second ship outstanding

    let mut restarted = Shipper::new(NamespaceSettings::default(), Limits::default(), 0);
    for (partition, lst) in crate::lst_file::decode(&saved)
        .unwrap()
        .into_iter()
        .enumerate()
    {
        restarted.restore_lst(partition as u16, lst);
    }
    restarted.set_mastered(7, true);
    let scan = restarted.scans_due(6000)[0];
    assert_eq!(scan.after, 1199);
    restarted.offer(scan, candidates(&[1100, 1200]), 6000);
    let ships = restarted.poll(6000);
    assert_eq!(ships.len(), 1, "only the unacknowledged record");
    assert_eq!(ships[0].digest, digest(1, 7));
}

#[test]
fn delay_ms_holds_the_horizon_back_and_unmastered_partitions_never_scan() {
    let settings = NamespaceSettings {
        delay_ms: 500,
        ..NamespaceSettings::default()
    };
    let mut shipper = Shipper::new(settings, Limits::default(), 1000);
    assert!(shipper.scans_due(9000).is_empty());
    shipper.set_mastered(3, true);
    let scans = shipper.scans_due(9000);
    assert_eq!(
        scans,
        vec![Scan {
            partition: 3,
            after: 999,
            up_to: 8500
        }]
    );
    assert_eq!(shipper.lag_ms(9000), 8001);
}

#[test]
fn every_partition_gets_its_scan_however_many_are_due() {
    let limits = Limits {
        open_windows: 32,
        ..Limits::default()
    };
    let mut shipper = Shipper::new(NamespaceSettings::default(), limits, 1000);
    for partition in 0..PARTITIONS as u16 {
        shipper.set_mastered(partition, true);
    }
    let mut scanned = vec![false; PARTITIONS];
    // Idle partitions come due again every idle_rescan_ms: a scan order
    // that always starts at partition 0 never reaches the last ones.
    for turn in 0..PARTITIONS as u64 / 32 {
        let now = 5000 + turn * limits.idle_rescan_ms;
        for scan in shipper.scans_due(now) {
            scanned[usize::from(scan.partition)] = true;
            shipper.offer(scan, Vec::new(), now);
        }
    }
    assert!(scanned.iter().all(|scanned| *scanned));
}

#[test]
fn a_new_shipper_ships_a_write_of_its_first_millisecond() {
    // The namespace is added to the DC at 1000 and the first client write
    // lands in that same millisecond: it was written after the add, so it
    // ships (the window after a new lane's LST must take LUT 1000 in).
    let mut shipper = Shipper::new(NamespaceSettings::default(), Limits::default(), 1000);
    shipper.set_mastered(7, true);
    let scan = open(&mut shipper, 5000, &[1000, 1001]);
    assert!(
        scan.after < 1000,
        "the window takes the first millisecond in"
    );
    assert_eq!(shipper.poll(5000).len(), 2, "both writes since the add");
}

/// A rewind asked while a window is open waits for it to settle, then
/// moves the LST back so the next scan sees a record whose (source's) LUT
/// is behind the LST; what was shipped since is de-duplicated.
#[test]
fn a_rewind_rescans_from_the_arrived_lut_after_the_open_window() {
    let mut shipper = shipper(Limits::default());
    open(&mut shipper, 5000, &[1100]);
    let ships = shipper.poll(5000);
    shipper.rewind_partition(7, 1050);
    shipper.ack(ships[0].id, Outcome::Shipped { lut_ms: 1100 }, 5001);
    let horizon = 5000 - Limits::default().settle_ms;
    assert_eq!(shipper.lst(7), horizon, "the open window settled first");
    let scans = shipper.scans_due(5002);
    assert_eq!(scans.len(), 1);
    assert_eq!(scans[0].after, 1049, "scanned again from the rewind");
    let arrived = Candidate {
        digest: digest(9, 7),
        lut_ms: 1050,
    };
    let mut found = candidates(&[1100]);
    found.push(arrived);
    shipper.offer(scans[0], found, 5002);
    let ships = shipper.poll(5002);
    assert_eq!(ships.len(), 1, "the record shipped before is a hot key");
    assert_eq!(ships[0].digest, arrived.digest);
    assert_eq!(shipper.counters().hot_keys, 1);
    shipper.ack(ships[0].id, Outcome::Filtered, 5003);
    assert_eq!(shipper.counters().filtered_out, 1);
    assert_eq!(shipper.lst(7), 5002 - Limits::default().settle_ms);
}

#[test]
fn a_non_master_takes_its_masters_lsts_and_resumes_from_them() {
    // This node's lane was added at 1000; the master reports 600 for
    // partition 7 (writes from 601 on unshipped) and 5000 for partition 8.
    let mut shipper = Shipper::new(NamespaceSettings::default(), Limits::default(), 1000);
    assert!(shipper.adopt_lst(7, 600), "earlier than its own: taken");
    assert!(shipper.adopt_lst(8, 5000), "later than its own: taken");
    assert_eq!((shipper.lst(7), shipper.lst(8)), (600, 5000));
    assert_eq!(shipper.take_lst_changes(), vec![(7, 600), (8, 5000)]);
    // Mastering partition 7 now, it scans from the master's LST.
    shipper.set_mastered(7, true);
    let scans = shipper.scans_due(9000);
    assert_eq!(scans.len(), 1);
    assert_eq!(scans[0].after, 600, "the old master's unshipped writes");
    assert_eq!(shipper.mastered_lsts(), vec![(7, 600)]);
    // A master's own LST is its own: a report for it is ignored.
    assert!(!shipper.adopt_lst(7, 100));
    shipper.offer(scans[0], candidates(&[700]), 9000);
    shipper.set_mastered(7, false);
    assert!(
        !shipper.adopt_lst(7, 100),
        "nor while its window is still open"
    );
    assert_eq!(shipper.lst(7), 600);
}

/// A master filling its copy ships the writes it holds without moving
/// the LST (a record a migration has not brought yet may be older); its
/// lag follows what it shipped. Whole at last, it scans again from the
/// LST: what it shipped while filling is not shipped again, and what the
/// migration brought meanwhile (older than the fill's shadow) is.
#[test]
fn a_filling_master_ships_without_moving_the_lst_and_resumes_whole() {
    let mut shipper = Shipper::new(NamespaceSettings::default(), Limits::default(), 1000);
    shipper.set_role(7, Role::Filling);
    assert_eq!(
        shipper.mastered_lsts(),
        vec![],
        "a filling master reports nothing"
    );
    let scan = shipper.scans_due(5000)[0];
    assert_eq!(scan.after, 999);
    let written = candidates(&[4000, 4100]);
    shipper.offer(scan, written.clone(), 5000);
    let ships = shipper.poll(5000);
    assert_eq!(ships.len(), 2, "the fill's writes ship at once");
    for (ship, record) in ships.iter().zip(&written) {
        shipper.ack(
            ship.id,
            Outcome::Shipped {
                lut_ms: record.lut_ms,
            },
            5001,
        );
    }
    assert_eq!(shipper.lst(7), 999, "the LST stays while filling");
    assert!(shipper.take_lst_changes().is_empty());
    let horizon = 5000 - Limits::default().settle_ms;
    assert_eq!(
        shipper.lag_ms(5001),
        5001 - horizon,
        "the lag follows the shadow"
    );
    // The acting master reports 1500; a filling master takes it.
    assert!(shipper.adopt_lst(7, 1500));
    // The next fill scan goes on from the shadow.
    assert_eq!(shipper.scans_due(5100)[0].after, horizon);
    shipper.offer(
        Scan {
            partition: 7,
            after: horizon,
            up_to: 5080,
        },
        vec![],
        5100,
    );
    // Whole: from the LST again; a record the migration brought (LUT 2000)
    // ships, the fill's two do not ship again.
    shipper.set_role(7, Role::Master);
    let scan = shipper.scans_due(6000)[0];
    assert_eq!(scan.after, 1500);
    let mut found = written.clone();
    found.push(Candidate {
        digest: digest(9, 7),
        lut_ms: 2000,
    });
    shipper.offer(scan, found, 6000);
    let ships = shipper.poll(6000);
    assert_eq!(ships.len(), 1, "only the migrated record: {ships:?}");
    assert_eq!(ships[0].digest, digest(9, 7));
    assert_eq!(shipper.counters().hot_keys, 2);
    shipper.ack(ships[0].id, Outcome::Shipped { lut_ms: 2000 }, 6001);
    assert_eq!(shipper.lst(7), 6000 - Limits::default().settle_ms);
    assert_eq!(shipper.counters().success, 3, "three records, three ships");
}

/// The acting master ships nothing but reports its LST; a filling
/// master's window does not keep it from taking one.
#[test]
fn the_acting_master_reports_its_lst_and_ships_nothing() {
    let mut shipper = Shipper::new(NamespaceSettings::default(), Limits::default(), 1000);
    shipper.set_role(7, Role::Acting);
    assert!(shipper.scans_due(5000).is_empty());
    assert_eq!(shipper.mastered_lsts(), vec![(7, 999)]);
    assert!(!shipper.adopt_lst(7, 400), "its own LST is its own");
}
