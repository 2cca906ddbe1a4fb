//! The message a node sends the other members of its cluster with the
//! last-ship times of the partitions it masters, one DC and namespace a
//! message: `u8 dc len | dc | u8 ns len | ns | u16 count | count × (u16
//! partition | u64 LST)`, big-endian. A receiver takes them for the
//! partitions it does not master (`Shipper::adopt_lst`), so that a new
//! master resumes where the old one stood. Pure codec.
//!
//! Invariant: [`decode`] accepts only what [`encode`] writes (lengths,
//! partition ids below `PARTITIONS`, no trailing bytes); anything else is
//! `None`, input from a peer refused whole.

use citrine_types::PARTITIONS;

/// One DC and namespace's LSTs as a master reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LstPush {
    pub dc: String,
    pub namespace: String,
    pub lsts: Vec<(u16, u64)>,
}

impl LstPush {
    /// The message; `None` for a name longer than 255 bytes (no DC or
    /// namespace has one) or more LSTs than partitions.
    pub fn encode(&self) -> Option<Vec<u8>> {
        let (dc, namespace) = (self.dc.as_bytes(), self.namespace.as_bytes());
        let count = u16::try_from(self.lsts.len())
            .ok()
            .filter(|count| usize::from(*count) <= PARTITIONS)?;
        let mut out = Vec::with_capacity(4 + dc.len() + namespace.len() + 10 * self.lsts.len());
        for name in [dc, namespace] {
            out.push(u8::try_from(name.len()).ok()?);
            out.extend_from_slice(name);
        }
        out.extend_from_slice(&count.to_be_bytes());
        for (partition, lst) in &self.lsts {
            out.extend_from_slice(&partition.to_be_bytes());
            out.extend_from_slice(&lst.to_be_bytes());
        }
        Some(out)
    }

    pub fn decode(bytes: &[u8]) -> Option<LstPush> {
        let (dc, rest) = name(bytes)?;
        let (namespace, rest) = name(rest)?;
        let (count, mut rest) = rest.split_first_chunk::<2>()?;
        let count = usize::from(u16::from_be_bytes(*count));
        if count > PARTITIONS || rest.len() != 10 * count {
            return None;
        }
        let mut lsts = Vec::with_capacity(count);
        while let Some((entry, tail)) = rest.split_first_chunk::<10>() {
            let (partition, lst) = entry.split_at(2);
            let partition = u16::from_be_bytes(partition.try_into().ok()?);
            if usize::from(partition) >= PARTITIONS {
                return None;
            }
            lsts.push((partition, u64::from_be_bytes(lst.try_into().ok()?)));
            rest = tail;
        }
        Some(LstPush {
            dc,
            namespace,
            lsts,
        })
    }
}

/// A length-prefixed UTF-8 name and what follows it.
fn name(bytes: &[u8]) -> Option<(String, &[u8])> {
    let (length, rest) = bytes.split_first()?;
    let (text, rest) = rest.split_at_checked(usize::from(*length))?;
    Some((std::str::from_utf8(text).ok()?.to_owned(), rest))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn round_trip_and_malformed_input() {
        let push = LstPush {
            dc: "dcb".into(),
            namespace: "test".into(),
            lsts: vec![(0, 1), (4095, u64::MAX), (7, 1_700_000_000_000)],
        };
        let bytes = push.encode().unwrap();
        assert_eq!(LstPush::decode(&bytes), Some(push.clone()));
        for cut in 0..bytes.len() {
            assert_eq!(LstPush::decode(&bytes[..cut]), None, "cut at {cut}");
        }
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert_eq!(LstPush::decode(&trailing), None);
        let mut out_of_range = bytes;
        let at = out_of_range.len() - 10;
        out_of_range[at..at + 2].copy_from_slice(&4096u16.to_be_bytes());
        assert_eq!(LstPush::decode(&out_of_range), None);
        let long = LstPush {
            dc: "d".repeat(256),
            ..push
        };
        assert_eq!(long.encode(), None);
    }
}
