//! Parsing of the benchmark's object spec (`-o`) and workload (`-w`), and
//! generation of bin values from the spec.
//!
//! Object spec grammar (asbench-like): comma-separated items, each
//! `[COUNT*]TYPE`, with TYPE one of `I` (8-byte integer), `S:N` (string of N
//! bytes), `B:N` (blob of N bytes), `D` (double), `G:N` (the group of the
//! key: its index modulo N, an integer the `query` workload selects by).
//! Bins are named `b0`, `b1`, ... in order. Invariant: a parsed spec has
//! 1..=1000 bins and every size and group count is ≥ 1 and ≤ 1 Mi.

use super::zipf::SplitMix64;
use citrine_client::{Bin, Value};

/// Type of one bin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinType {
    Int,
    Double,
    String(usize),
    Blob(usize),
    /// The key's index modulo this count.
    Group(u64),
}

/// A parsed object spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectSpec {
    pub bins: Vec<BinType>,
    pub text: String,
}

impl ObjectSpec {
    pub fn parse(text: &str) -> Result<ObjectSpec, String> {
        let mut bins = Vec::new();
        for item in text.split(',').map(str::trim) {
            if item.is_empty() {
                return Err(format!("empty item in object spec {text:?}"));
            }
            let (count, kind) = match item.split_once('*') {
                Some((count, kind)) => (
                    count
                        .trim()
                        .parse::<usize>()
                        .map_err(|_| format!("bad repeat count in {item:?}: write e.g. 10*S:10"))?,
                    kind.trim(),
                ),
                None => (1, item),
            };
            let size = |n: &str| -> Result<usize, String> {
                let size = n
                    .parse::<usize>()
                    .map_err(|_| format!("bad size in {item:?}: write e.g. S:10 or B:1024"))?;
                if size == 0 || size > 1 << 20 {
                    return Err(format!("size in {item:?} must be 1..=1048576"));
                }
                Ok(size)
            };
            let bin = match kind.split_once(':') {
                None if kind.eq_ignore_ascii_case("I") => BinType::Int,
                None if kind.eq_ignore_ascii_case("D") => BinType::Double,
                Some((t, n)) if t.eq_ignore_ascii_case("S") => BinType::String(size(n)?),
                Some((t, n)) if t.eq_ignore_ascii_case("B") => BinType::Blob(size(n)?),
                Some((t, n)) if t.eq_ignore_ascii_case("G") => BinType::Group(size(n)? as u64),
                _ => {
                    return Err(format!(
                        "unknown bin type {kind:?}: use I, D, S:<len>, B:<len> or G:<groups> (e.g. -o 10*S:10)"
                    ))
                }
            };
            bins.extend(std::iter::repeat_n(bin, count));
        }
        if bins.is_empty() || bins.len() > 1000 {
            return Err(format!("object spec {text:?} must describe 1..=1000 bins"));
        }
        Ok(ObjectSpec {
            bins,
            text: text.to_owned(),
        })
    }

    /// Bytes of payload per record (for reports).
    pub fn payload_bytes(&self) -> usize {
        self.bins
            .iter()
            .map(|bin| match bin {
                BinType::Int | BinType::Double | BinType::Group(_) => 8,
                BinType::String(n) | BinType::Blob(n) => *n,
            })
            .sum()
    }

    /// Bin names b0, b1, ...
    pub fn names(&self) -> Vec<String> {
        (0..self.bins.len()).map(|i| format!("b{i}")).collect()
    }

    /// The first group bin: its position and group count.
    pub fn group_bin(&self) -> Option<(usize, u64)> {
        self.bins
            .iter()
            .enumerate()
            .find_map(|(at, kind)| match kind {
                BinType::Group(groups) => Some((at, *groups)),
                _ => None,
            })
    }

    /// The position of the first integer bin (`I`), the bin the `udf`
    /// workload adds 1 to.
    pub fn int_bin(&self) -> Option<usize> {
        self.bins.iter().position(|kind| *kind == BinType::Int)
    }

    /// A fresh set of bins with random contents for the key of index `index`.
    pub fn generate(&self, names: &[String], index: u64, rng: &mut SplitMix64) -> Vec<Bin> {
        self.bins
            .iter()
            .zip(names)
            .map(|(kind, name)| {
                let value = match kind {
                    BinType::Int => Value::Int((rng.next_u64() >> 1) as i64),
                    BinType::Double => Value::Float(rng.next_f64() * 1e6),
                    BinType::String(n) => Value::String(random_text(*n, rng)),
                    BinType::Blob(n) => Value::Blob(random_bytes(*n, rng)),
                    // Groups are at most 1 Mi: the remainder fits an i64.
                    BinType::Group(groups) => Value::Int((index % groups) as i64),
                };
                Bin {
                    name: name.clone(),
                    value,
                }
            })
            .collect()
    }
}

fn random_text(len: usize, rng: &mut SplitMix64) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(len);
    let mut word = 0u64;
    for i in 0..len {
        if i % 10 == 0 {
            word = rng.next_u64();
        }
        out.push(char::from(ALPHABET[(word & 63) as usize]));
        word >>= 6;
    }
    out
}

fn random_bytes(len: usize, rng: &mut SplitMix64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    out.truncate(len);
    out
}

/// What the benchmark does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Workload {
    /// Reads with this percentage, updates (full puts) otherwise.
    ReadUpdate { read_pct: u32 },
    /// Writes every key of the range once, in order.
    Insert,
    /// Read, then write back with a generation-equal check.
    ReadModifyWrite,
    /// Secondary-index queries: every record of one group (`G:N` bin).
    Query,
    /// A record UDF of the bench's own Lua module on each key: with
    /// `read_only` one that returns an integer bin's value (`udf-read`),
    /// else one that adds 1 to it and updates the record (`udf`).
    Udf { read_only: bool },
}

impl Workload {
    pub fn parse(text: &str) -> Result<Workload, String> {
        let lower = text.trim().to_ascii_lowercase();
        match lower.as_str() {
            "insert" | "i" => Ok(Workload::Insert),
            "rmw" => Ok(Workload::ReadModifyWrite),
            "query" => Ok(Workload::Query),
            "udf" => Ok(Workload::Udf { read_only: false }),
            "udf-read" => Ok(Workload::Udf { read_only: true }),
            _ => {
                let pct = lower.strip_prefix("ru,").ok_or_else(|| {
                    format!(
                        "unknown workload {text:?}: use ru,READ_PCT (e.g. ru,95), insert, rmw, query, udf or udf-read"
                    )
                })?;
                let read_pct = pct
                    .trim()
                    .parse::<u32>()
                    .map_err(|_| format!("bad read percentage in {text:?}"))?;
                if read_pct > 100 {
                    return Err(format!("read percentage {read_pct} is over 100"));
                }
                Ok(Workload::ReadUpdate { read_pct })
            }
        }
    }

    pub fn label(&self) -> String {
        match self {
            Workload::ReadUpdate { read_pct } => format!("ru,{read_pct}"),
            Workload::Insert => "insert".into(),
            Workload::ReadModifyWrite => "rmw".into(),
            Workload::Query => "query".into(),
            Workload::Udf { read_only: false } => "udf".into(),
            Workload::Udf { read_only: true } => "udf-read".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_specs() {
        assert_eq!(
            ObjectSpec::parse("I").map(|s| s.bins),
            Ok(vec![BinType::Int])
        );
        let ten = ObjectSpec::parse("10*S:10").expect("ten strings");
        assert_eq!(ten.bins, vec![BinType::String(10); 10]);
        assert_eq!(ten.payload_bytes(), 100);
        let mixed = ObjectSpec::parse("I, B:1024,2*d").expect("mixed");
        assert_eq!(
            mixed.bins,
            vec![
                BinType::Int,
                BinType::Blob(1024),
                BinType::Double,
                BinType::Double
            ]
        );
        for bad in [
            "",
            "X",
            "S",
            "S:0",
            "S:x",
            "x*I",
            "I,,I",
            "B:99999999",
            "1001*I",
        ] {
            assert!(ObjectSpec::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn generated_bins_follow_the_spec() {
        let spec = ObjectSpec::parse("I,S:10,B:33").expect("spec");
        let mut rng = SplitMix64::new(9);
        let bins = spec.generate(&spec.names(), 5, &mut rng);
        assert_eq!(bins.len(), 3);
        assert_eq!(bins[0].name, "b0");
        assert!(matches!(&bins[1].value, Value::String(s) if s.len() == 10));
        assert!(matches!(&bins[2].value, Value::Blob(b) if b.len() == 33));
        let grouped = ObjectSpec::parse("S:4,G:100").expect("spec");
        assert_eq!(grouped.group_bin(), Some((1, 100)));
        assert_eq!(spec.group_bin(), None);
        let bins = grouped.generate(&grouped.names(), 1234, &mut rng);
        assert_eq!(bins[1].value, Value::Int(34));
        assert!(ObjectSpec::parse("G:0").is_err());
    }

    #[test]
    fn workloads() {
        assert_eq!(
            Workload::parse("ru,95"),
            Ok(Workload::ReadUpdate { read_pct: 95 })
        );
        assert_eq!(
            Workload::parse("RU,50"),
            Ok(Workload::ReadUpdate { read_pct: 50 })
        );
        assert_eq!(Workload::parse("insert"), Ok(Workload::Insert));
        assert_eq!(Workload::parse("rmw"), Ok(Workload::ReadModifyWrite));
        assert_eq!(Workload::parse("query"), Ok(Workload::Query));
        assert!(Workload::parse("ru,101").is_err());
        assert!(Workload::parse("ru").is_err());
        assert!(Workload::parse("scan").is_err());
        assert_eq!(
            Workload::parse("udf"),
            Ok(Workload::Udf { read_only: false })
        );
        assert_eq!(
            Workload::parse(" UDF-Read "),
            Ok(Workload::Udf { read_only: true })
        );
        for bad in ["udf,read", "udf-write", "udfread", "udf-"] {
            assert!(Workload::parse(bad).is_err(), "{bad:?}");
        }
        // Every workload prints back as text that parses to itself.
        for text in ["ru,95", "ru,0", "insert", "rmw", "query", "udf", "udf-read"] {
            let workload = Workload::parse(text).expect("parses");
            assert_eq!(workload.label(), text);
            assert_eq!(Workload::parse(&workload.label()), Ok(workload));
        }
    }

    #[test]
    fn the_udf_workload_uses_the_first_integer_bin() {
        let spec = ObjectSpec::parse("S:10,2*I").expect("spec");
        assert_eq!(spec.int_bin(), Some(1));
        assert_eq!(ObjectSpec::parse("I").expect("spec").int_bin(), Some(0));
        assert_eq!(
            ObjectSpec::parse("10*S:10,G:5").expect("spec").int_bin(),
            None
        );
    }
}
