//! Round trips of every particle type, the escaping of names, files laid
//! out as asbackup lays them out, and the errors of bad files.

use crate::*;

fn digest(seed: u8) -> Digest {
    Digest([seed; 20])
}

fn bin(name: &str, particle: u8, bytes: &[u8]) -> Bin {
    Bin {
        name: name.into(),
        particle,
        bytes: bytes.to_vec(),
    }
}

fn every_particle() -> Vec<Bin> {
    let mut geo = vec![0, 0, 1];
    geo.extend_from_slice(&[7; 8]);
    geo.extend_from_slice(br#"{"type":"Point","coordinates":[1.5,2]}"#);
    vec![
        bin("nil", 0, b""),
        bin("int", 1, &(-42i64).to_be_bytes()),
        bin("max", 1, &i64::MAX.to_be_bytes()),
        bin("float", 2, &0.1f64.to_bits().to_be_bytes()),
        bin("inf", 2, &f64::NEG_INFINITY.to_bits().to_be_bytes()),
        bin("str", 3, b"two words\nand \\ a line\0"),
        bin("notutf8", 3, &[0xff, 0xfe, b' ']),
        bin("blob", 4, &[0, 1, 2, 255]),
        bin("java", 7, b"\xac\xed"),
        bin("csharp", 8, b"c"),
        bin("python", 9, b"p"),
        bin("ruby", 10, b"r"),
        bin("php", 11, b"h"),
        bin("erlang", 12, b"e"),
        bin("yes", 17, &[1]),
        bin("no", 17, &[0]),
        bin("hll", 18, &[0, 4, 8, 1, 2, 3]),
        bin("map", 19, &[0x81, 0xa2, 3, b'k', 1]),
        bin("list", 20, &[0x93, 1, 0xc3, 0xc0]),
        bin("geo", 23, &geo),
        bin("sp ace\\", 1, &1i64.to_be_bytes()),
    ]
}

fn sample_record(key: Option<UserKey>) -> Record {
    Record {
        key,
        namespace: "test".into(),
        digest: digest(9),
        set: "my set".into(),
        generation: 7,
        expiry: 500_000_000,
        bins: every_particle(),
    }
}

fn read_all(bytes: &[u8]) -> Result<Vec<Entry>, ParseError> {
    let mut reader = Reader::new(bytes)?;
    let mut entries = Vec::new();
    while let Some(entry) = reader.next_entry()? {
        entries.push(entry);
    }
    Ok(entries)
}

/// What a bin reads back as: GeoJSON loses its cells (the file keeps the
/// JSON; the server computes the cells again).
fn as_read_back(mut record: Record) -> Record {
    for one in &mut record.bins {
        if one.particle == particle::GEOJSON {
            let json = write::geojson_text(&one.bytes).expect("geo").to_vec();
            one.bytes = vec![0, 0, 0];
            one.bytes.extend_from_slice(&json);
        }
    }
    record
}

#[test]
fn every_particle_type_and_key_round_trips() {
    let keys = [
        None,
        Some(UserKey::Integer(-5)),
        Some(UserKey::Float(2.5)),
        Some(UserKey::String("a key\nwith lines".into())),
        Some(UserKey::Blob(vec![0, 10, 32, 255])),
    ];
    for compact in [false, true] {
        let mut out = Vec::new();
        write::header(&mut out, "test", true);
        let records: Vec<Record> = keys.iter().cloned().map(sample_record).collect();
        for record in &records {
            write::record(&mut out, record, compact).expect("writes");
        }
        let entries = read_all(&out).expect("reads");
        let expected: Vec<Entry> = records
            .into_iter()
            .map(|record| Entry::Record(as_read_back(record)))
            .collect();
        assert_eq!(entries, expected, "compact {compact}");
    }
}

#[test]
fn files_are_laid_out_as_asbackup_lays_them_out() {
    let mut out = Vec::new();
    write::header(&mut out, "test", true);
    write::index(
        &mut out,
        &IndexDef {
            namespace: "test".into(),
            set: "test-set".into(),
            name: "int-index".into(),
            collection: b'N',
            bin: "int-bin".into(),
            key_type: b'N',
            context: None,
        },
    );
    write::udf(
        &mut out,
        &UdfFile {
            name: "test.lua".into(),
            content: b"-- an empty Lua file\n\n".to_vec(),
        },
    );
    let record = Record {
        key: Some(UserKey::String("key1".into())),
        namespace: "test".into(),
        digest: digest(0),
        set: "test-set".into(),
        generation: 1,
        expiry: 0,
        bins: vec![
            bin("int-bin", 1, &12345i64.to_be_bytes()),
            bin("string-bin", 3, b"abcde"),
        ],
    };
    write::record(&mut out, &record, false).expect("writes");
    let expected = "Version 3.1\n# namespace test\n# first-file\n\
                    * i test test-set int-index N 1 int-bin N\n\
                    * u L test.lua 22 -- an empty Lua file\n\n\n\
                    + k S 4 key1\n+ n test\n+ d AAAAAAAAAAAAAAAAAAAAAAAAAAA=\n\
                    + s test-set\n+ g 1\n+ t 0\n+ b 2\n\
                    - I int-bin 12345\n- S string-bin 5 abcde\n";
    assert_eq!(String::from_utf8_lossy(&out), expected);
    let entries = read_all(&out).expect("reads");
    assert_eq!(entries.len(), 3);
    assert_eq!(entries[2], Entry::Record(record));
}

#[test]
fn index_lines_with_and_without_a_context() {
    let mut def = IndexDef {
        namespace: "test".into(),
        set: String::new(),
        name: "by list".into(),
        collection: b'L',
        bin: "b".into(),
        key_type: b'S',
        context: Some("kgEA".into()),
    };
    let mut out = Vec::new();
    write::header(&mut out, "test", false);
    write::index(&mut out, &def);
    assert!(out.ends_with(b"* i test  by\\ list L 1 b S kgEA\n"));
    assert_eq!(read_all(&out).expect("reads"), [Entry::Index(def.clone())]);
    // asbackup before 3.12 ends the line after the type; 3.12 and later
    // with a space and the (possibly empty) context.
    for tail in ["", " "] {
        let text = format!("Version 3.1\n* i test  by\\ list L 1 b S{tail}\n");
        def.context = None;
        assert_eq!(
            read_all(text.as_bytes()).expect("reads"),
            [Entry::Index(def.clone())]
        );
    }
}

#[test]
fn version_3_0_names_are_not_escaped() {
    let text = "Version 3.0\n+ n test\n+ d AAAAAAAAAAAAAAAAAAAAAAAAAAA=\n+ g 1\n+ t 0\n+ b 1\n- I a\\b 1\n";
    let entries = read_all(text.as_bytes()).expect("reads");
    let Entry::Record(record) = &entries[0] else {
        panic!("a record")
    };
    assert_eq!(record.bins[0].name, "a\\b");
}

fn error_of(text: &[u8]) -> ParseError {
    read_all(text).expect_err("an error")
}

const RECORD: &str =
    "+ n test\n+ d AAAAAAAAAAAAAAAAAAAAAAAAAAA=\n+ g 1\n+ t 0\n+ b 2\n- I a 1\n- S b 3 xyz\n";

#[test]
fn a_wrong_version_or_no_header_is_named() {
    let error = error_of(b"Version 4.0\n");
    assert_eq!(error.line, 1);
    assert!(
        error.message.contains("format 4.0 is not supported"),
        "{error}"
    );
    let error = error_of(b"\x28\xb5\x2f\xfd junk");
    assert!(error.message.contains("not an asbackup file"), "{error}");
    assert!(error_of(b"Version 3.").message.contains("truncated"));
    assert!(error_of(b"").message.contains("not an asbackup file"));
}

#[test]
fn a_truncated_record_names_its_line_and_where_it_began() {
    let mut text = format!("Version 3.1\n# namespace test\n{RECORD}{RECORD}");
    let whole = read_all(text.as_bytes()).expect("reads");
    assert_eq!(whole.len(), 2);
    text.truncate(text.len() - 3);
    let error = error_of(text.as_bytes());
    assert_eq!(error.line, 16);
    assert_eq!(error.record_line, Some(10));
    assert!(error.message.contains("truncated"), "{error}");
    assert!(error.to_string().contains("starts on line 10"), "{error}");
    // What came before the damage is read.
    let mut reader = Reader::new(text.as_bytes()).expect("header");
    assert!(matches!(reader.next_entry(), Ok(Some(Entry::Record(_)))));
    assert!(reader.next_entry().is_err());
}

#[test]
fn corrupt_lines_are_named() {
    let cases: [(&str, u64, &str); 8] = [
        ("+ n test\n+ x 1\n", 3, "expected `+ d`"),
        ("+ n test\n+ d !!!\n", 3, "not base64"),
        ("+ n test\n+ d AAAA\n", 3, "3 bytes, not 20"),
        (
            "+ n test\n+ d AAAAAAAAAAAAAAAAAAAAAAAAAAA=\n+ g 70000\n",
            4,
            "larger than 65535",
        ),
        (
            "+ n test\n+ d AAAAAAAAAAAAAAAAAAAAAAAAAAA=\n+ g 1\n+ t 0\n+ b 1\n- Q a 1\n",
            7,
            "type `Q`",
        ),
        (
            "+ n test\n+ d AAAAAAAAAAAAAAAAAAAAAAAAAAA=\n+ g 1\n+ t 0\n+ b 1\n- I a 1x\n",
            7,
            "not a 64-bit integer",
        ),
        (
            "+ n test\n+ d AAAAAAAAAAAAAAAAAAAAAAAAAAA=\n+ g 1\n+ t 0\n+ b 1\n- S a 999999999999 x\n",
            7,
            "larger than the 128 MiB",
        ),
        ("x\n", 2, "expected `+` (a record)"),
    ];
    for (body, line, words) in cases {
        let text = format!("Version 3.1\n{body}");
        let error = error_of(text.as_bytes());
        assert_eq!(error.line, line, "{body:?}: {error}");
        assert!(error.message.contains(words), "{body:?}: {error}");
    }
}

#[test]
fn a_bin_without_a_backup_form_writes_nothing() {
    let mut record = sample_record(None);
    record.bins.push(bin("odd", 99, b"x"));
    let mut out = b"prefix".to_vec();
    let error = write::record(&mut out, &record, false).expect_err("refused");
    assert!(error.contains("particle type 99"), "{error}");
    assert_eq!(out, b"prefix");
}

#[test]
fn the_fuzz_seeds_read_whole() {
    let seeds: [(&[u8], usize); 3] = [
        (
            include_bytes!("../../../fuzz/seeds/backup_file/plain.asb"),
            5,
        ),
        (
            include_bytes!("../../../fuzz/seeds/backup_file/compact.asb"),
            1,
        ),
        (
            include_bytes!("../../../fuzz/seeds/backup_file/legacy.asb"),
            1,
        ),
    ];
    for (seed, entries) in seeds {
        let read = read_all(seed).expect("a seed reads whole");
        assert_eq!(read.len(), entries);
    }
}
