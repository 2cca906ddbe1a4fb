//! A query's index filter: the INDEX_RANGE field (22; protocol 04 §3.2).
//!
//! Invariants: [`Filter::parse`] reads every length against the field's
//! end and refuses trailing bytes; a string or blob filter is an equality
//! (begin equal to end); an integer range has begin ≤ end.

use crate::def::KeyType;
use crate::key::{bytes_bval, Key};
use citrine_types::ParticleType;

/// What a query selects.
#[derive(Clone, Debug, PartialEq)]
pub enum Range {
    /// Integers from `begin` to `end`, both included.
    Int { begin: i64, end: i64 },
    /// Exactly this string or blob.
    Equal(Vec<u8>),
    /// Points inside this region, or regions holding this point, with the
    /// bval ranges the shape's cells cover ([`crate::geo`]).
    Geo {
        shape: crate::geo::Shape,
        ranges: Vec<(i64, i64)>,
    },
}

/// A parsed INDEX_RANGE.
#[derive(Clone, Debug, PartialEq)]
pub struct Filter {
    /// The indexed bin (empty when the query names its index or
    /// expression instead).
    pub bin: Vec<u8>,
    pub key_type: KeyType,
    pub range: Range,
}

/// Why a filter was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilterError {
    /// Malformed (4).
    Parameter,
    /// Not a query this server runs (16).
    Unsupported,
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> Result<&'a [u8], FilterError> {
        if self.bytes.len() < count {
            return Err(FilterError::Parameter);
        }
        let (head, rest) = self.bytes.split_at(count);
        self.bytes = rest;
        Ok(head)
    }

    fn byte(&mut self) -> Result<u8, FilterError> {
        Ok(self.take(1)?[0])
    }

    fn value(&mut self) -> Result<&'a [u8], FilterError> {
        let mut word = [0u8; 4];
        word.copy_from_slice(self.take(4)?);
        self.take(u32::from_be_bytes(word) as usize)
    }
}

fn int(bytes: &[u8]) -> Result<i64, FilterError> {
    Ok(i64::from_be_bytes(
        bytes.try_into().map_err(|_| FilterError::Parameter)?,
    ))
}

impl Filter {
    /// Parses field 22's payload.
    pub fn parse(bytes: &[u8]) -> Result<Filter, FilterError> {
        let mut reader = Reader { bytes };
        if reader.byte()? != 1 {
            // Clients send one filter; the server supports one.
            return Err(FilterError::Parameter);
        }
        let name_length = usize::from(reader.byte()?);
        let bin = reader.take(name_length)?.to_vec();
        if bin.len() > citrine_types::BIN_NAME_MAX {
            return Err(FilterError::Parameter);
        }
        let particle_type = reader.byte()?;
        let begin = reader.value()?;
        let end = reader.value()?;
        if !reader.bytes.is_empty() {
            return Err(FilterError::Parameter);
        }
        let (key_type, range) = match ParticleType::from_u8(particle_type) {
            Some(ParticleType::Integer) => {
                let (begin, end) = (int(begin)?, int(end)?);
                if begin > end {
                    return Err(FilterError::Parameter);
                }
                (KeyType::Numeric, Range::Int { begin, end })
            }
            Some(ParticleType::String | ParticleType::Blob) => {
                if begin != end {
                    return Err(FilterError::Parameter);
                }
                let key_type = if particle_type == ParticleType::String as u8 {
                    KeyType::String
                } else {
                    KeyType::Blob
                };
                (key_type, Range::Equal(begin.to_vec()))
            }
            Some(ParticleType::GeoJson) => {
                // The region or point, as text (the end repeats it).
                if begin.len() > crate::geo::MAX_QUERY_BYTES {
                    return Err(FilterError::Parameter);
                }
                let shape = crate::geo::Shape::parse(begin).ok_or(FilterError::Parameter)?;
                if shape.vertices() > crate::geo::MAX_QUERY_VERTICES {
                    return Err(FilterError::Parameter);
                }
                let ranges = crate::geo::query_ranges(&shape);
                (KeyType::Geo, Range::Geo { shape, ranges })
            }
            _ => return Err(FilterError::Parameter),
        };
        Ok(Filter {
            bin,
            key_type,
            range,
        })
    }

    /// The bvals the filter's keys can have, as sorted, disjoint ranges
    /// (both ends included).
    pub fn bval_ranges(&self) -> Vec<(i64, i64)> {
        match &self.range {
            Range::Int { begin, end } => vec![(*begin, *end)],
            Range::Equal(bytes) => {
                let bval = bytes_bval(bytes);
                vec![(bval, bval)]
            }
            Range::Geo { ranges, .. } => ranges.clone(),
        }
    }

    /// What checking one candidate costs, in units of a plain one (a geo
    /// query tests the candidate's shape against every vertex of its own).
    pub fn check_cost(&self) -> usize {
        match &self.range {
            Range::Geo { shape, .. } => 1 + shape.vertices() / 64,
            _ => 1,
        }
    }

    /// Whether `key` is one the filter selects.
    pub fn matches(&self, key: &Key) -> bool {
        match (&self.range, key) {
            (Range::Int { begin, end }, Key::Int(value)) => (begin..=end).contains(&value),
            (Range::Equal(wanted), Key::Bytes(bytes)) => wanted == bytes,
            (Range::Geo { ranges, .. }, Key::Int(cell)) => ranges
                .iter()
                .any(|(low, high)| (*low..=*high).contains(cell)),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(bin: &[u8], particle_type: u8, begin: &[u8], end: &[u8]) -> Vec<u8> {
        let mut out = vec![1, bin.len() as u8];
        out.extend_from_slice(bin);
        out.push(particle_type);
        out.extend_from_slice(&(begin.len() as u32).to_be_bytes());
        out.extend_from_slice(begin);
        out.extend_from_slice(&(end.len() as u32).to_be_bytes());
        out.extend_from_slice(end);
        out
    }

    #[test]
    fn integer_ranges_and_equalities_parse() {
        let filter = Filter::parse(&payload(
            b"age",
            1,
            &(-3i64).to_be_bytes(),
            &9i64.to_be_bytes(),
        ))
        .expect("range");
        assert_eq!(filter.bin, b"age");
        assert_eq!(filter.range, Range::Int { begin: -3, end: 9 });
        assert_eq!(filter.bval_ranges(), vec![(-3, 9)]);
        assert!(filter.matches(&Key::Int(9)));
        assert!(!filter.matches(&Key::Int(10)));
        assert!(!filter.matches(&Key::Bytes(vec![])));
        let filter = Filter::parse(&payload(b"s", 3, b"abc", b"abc")).expect("equality");
        assert_eq!(filter.key_type, KeyType::String);
        assert!(filter.matches(&Key::Bytes(b"abc".to_vec())));
        assert!(!filter.matches(&Key::Bytes(b"abd".to_vec())));
        assert_eq!(filter.bval_ranges()[0].0, bytes_bval(b"abc"));
        let filter = Filter::parse(&payload(b"", 4, &[1, 2], &[1, 2])).expect("blob");
        assert_eq!(filter.key_type, KeyType::Blob);
    }

    #[test]
    fn malformed_filters_are_refused() {
        let good = payload(b"age", 1, &1i64.to_be_bytes(), &2i64.to_be_bytes());
        for cut in 0..good.len() {
            assert_eq!(
                Filter::parse(&good[..cut]),
                Err(FilterError::Parameter),
                "cut {cut}"
            );
        }
        let mut trailing = good.clone();
        trailing.push(0);
        assert_eq!(Filter::parse(&trailing), Err(FilterError::Parameter));
        let mut two = good.clone();
        two[0] = 2;
        assert_eq!(Filter::parse(&two), Err(FilterError::Parameter));
        let backwards = payload(b"age", 1, &3i64.to_be_bytes(), &2i64.to_be_bytes());
        assert_eq!(Filter::parse(&backwards), Err(FilterError::Parameter));
        let short_int = payload(b"age", 1, &[1], &[2]);
        assert_eq!(Filter::parse(&short_int), Err(FilterError::Parameter));
        let string_range = payload(b"s", 3, b"a", b"b");
        assert_eq!(Filter::parse(&string_range), Err(FilterError::Parameter));
        let geo = payload(b"g", 23, b"{}", b"{}");
        assert_eq!(Filter::parse(&geo), Err(FilterError::Parameter));
        let point = br#"{"type":"Point","coordinates":[1,2]}"#;
        let geo = Filter::parse(&payload(b"g", 23, point, point)).expect("a point query");
        assert_eq!(geo.key_type, KeyType::Geo);
        assert_eq!(geo.check_cost(), 1);
        // A region past the vertex limit, or too much text: refused.
        let ring: Vec<String> = (0..=crate::geo::MAX_QUERY_VERTICES)
            .map(|i| format!("[{},{}]", (i as f64 * 0.01).sin(), (i as f64 * 0.01).cos()))
            .chain(std::iter::once(format!("[{},{}]", 0f64.sin(), 0f64.cos())))
            .collect();
        let big = format!(
            r#"{{"type":"Polygon","coordinates":[[{}]]}}"#,
            ring.join(",")
        );
        assert_eq!(
            Filter::parse(&payload(b"g", 23, big.as_bytes(), big.as_bytes())),
            Err(FilterError::Parameter)
        );
        let ranges = geo.bval_ranges();
        assert!(!ranges.is_empty() && ranges.len() <= crate::geo::MAX_LEVEL as usize + 1);
        assert!(geo.matches(&Key::Int(ranges[0].0)));
        assert!(!geo.matches(&Key::Int(ranges[0].0 - 1)) || ranges[0].0 == 1);
        let float = payload(b"f", 2, &[0; 8], &[0; 8]);
        assert_eq!(Filter::parse(&float), Err(FilterError::Parameter));
    }
}
