//! The backup-file parser (`citrine_backup::Reader`): a whole file, as
//! `citrine restore` reads it, from arbitrary bytes.
//!
//! Input: the file's bytes. Each entry is read until the end or the first
//! error (at most 10 000 entries).
//!
//! Oracle: no panic, no allocation past the input's size (a value's
//! announced length is not trusted); an error names a line within the
//! input; every record read writes back (plain and compact) to text that
//! reads to a record which writes to the same text again (writing is a
//! fixpoint of reading).
#![no_main]

use citrine_backup::{write, Entry, Reader};
use libfuzzer_sys::fuzz_target;

fn rewrite(record: &citrine_backup::Record, compact: bool) -> Vec<u8> {
    let mut text = Vec::new();
    write::header(&mut text, &record.namespace, false);
    write::record(&mut text, record, compact).expect("a record read writes back");
    text
}

fn check_round_trip(record: &citrine_backup::Record) {
    for compact in [false, true] {
        let first = rewrite(record, compact);
        let mut reader = Reader::new(&first[..]).expect("the header reads back");
        let again = match reader.next_entry() {
            Ok(Some(Entry::Record(again))) => again,
            other => panic!("a written record reads back as {other:?}"),
        };
        assert_eq!(rewrite(&again, compact), first, "writing is a fixpoint");
    }
}

fuzz_target!(|data: &[u8]| {
    let lines = data.iter().filter(|b| **b == b'\n').count() as u64 + 1;
    let mut reader = match Reader::new(data) {
        Ok(reader) => reader,
        Err(error) => {
            assert!(error.line <= lines, "{error}");
            return;
        }
    };
    for _ in 0..10_000 {
        match reader.next_entry() {
            Ok(Some(Entry::Record(record))) => check_round_trip(&record),
            Ok(Some(_)) => {}
            Ok(None) => return,
            Err(error) => {
                assert!(error.line <= lines, "{error}");
                return;
            }
        }
    }
});
