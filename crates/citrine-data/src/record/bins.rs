//! One simple op (write, increment, append, prepend) applied to an
//! operate's working bins, and the checks a bin value passes before it is
//! stored. Pure: no lock, no index; the write path calls it under the
//! partition lock on its working copy, so a failing op leaves nothing.

use citrine_record::{float_from_wire, integer_from_wire, normalise_value, Bin};
use citrine_types::{ParticleType, ResultCode};
use citrine_wire::msg::{op_type, Op};
use std::borrow::Cow;

/// The position of bin `name` among the working bins.
pub(crate) fn find_bin(bins: &[Bin<'_>], name: &[u8]) -> Option<usize> {
    bins.iter().position(|bin| bin.name.as_ref() == name)
}

/// Applies one modify op (WRITE, INCR, APPEND, PREPEND) to the working
/// bins; any other op type is 4. An INCR, APPEND or PREPEND of a GeoJSON
/// bin is 1 whatever its operand, where other mismatched types are 12: the
/// reference answers so.
pub(crate) fn apply_modify<'a>(bins: &mut Vec<Bin<'a>>, op: &Op<'a>) -> Result<(), ResultCode> {
    // GeoJSON is parsed as the op applies, after the record-exists and
    // generation checks, as the reference orders them (160 comes after 3).
    check_geojson(op.particle_type, op.value)?;
    let position = find_bin(bins, op.name);
    let geojson = position.is_some_and(|i| bins[i].particle_type == ParticleType::GeoJson as u8);
    let modifies = matches!(
        op.op_type,
        op_type::INCR | op_type::APPEND | op_type::PREPEND
    );
    if geojson && modifies {
        return Err(ResultCode::ServerError);
    }
    match op.op_type {
        op_type::WRITE => write_bin(bins, position, op),
        op_type::INCR => increment_bin(bins, position, op),
        op_type::APPEND | op_type::PREPEND => join_bin(bins, position, op),
        _ => Err(ResultCode::Parameter),
    }
}

/// WRITE: sets the bin to the operand (a nil operand removes the bin).
fn write_bin<'a>(
    bins: &mut Vec<Bin<'a>>,
    position: Option<usize>,
    op: &Op<'a>,
) -> Result<(), ResultCode> {
    if op.particle_type == ParticleType::Null as u8 {
        if let Some(index) = position {
            bins.remove(index);
        }
        return Ok(());
    }
    let value = operand_value(op)?;
    match position {
        Some(index) => {
            bins[index].particle_type = op.particle_type;
            bins[index].value = value;
        }
        None => bins.push(Bin {
            name: Cow::Borrowed(op.name),
            particle_type: op.particle_type,
            value,
        }),
    }
    Ok(())
}

/// INCR: adds an integer to an integer bin or a float to a float bin; as
/// the reference, an op on a missing bin makes the bin from its operand,
/// whatever the operand's type (an add of a string creates a string bin).
fn increment_bin<'a>(
    bins: &mut Vec<Bin<'a>>,
    position: Option<usize>,
    op: &Op<'a>,
) -> Result<(), ResultCode> {
    let integer = ParticleType::Integer as u8;
    let float = ParticleType::Float as u8;
    let Some(index) = position else {
        bins.push(Bin {
            name: Cow::Borrowed(op.name),
            particle_type: op.particle_type,
            value: Cow::Owned(operand_value(op)?.into_owned()),
        });
        return Ok(());
    };
    let bin = &mut bins[index];
    let new_value = match op.particle_type {
        particle if particle == integer && bin.particle_type == integer => {
            let current = integer_from_wire(&bin.value).ok_or(ResultCode::IncompatibleType)?;
            let delta = integer_from_wire(op.value).ok_or(ResultCode::Parameter)?;
            current.wrapping_add(delta).to_be_bytes().to_vec()
        }
        particle if particle == float && bin.particle_type == float => {
            let current = float_from_wire(&bin.value).ok_or(ResultCode::IncompatibleType)?;
            let delta = float_from_wire(op.value).ok_or(ResultCode::Parameter)?;
            (current + delta).to_bits().to_be_bytes().to_vec()
        }
        _ => return Err(ResultCode::IncompatibleType),
    };
    bin.value = Cow::Owned(new_value);
    Ok(())
}

/// APPEND / PREPEND: joins a string to a string bin or blob bytes to a
/// blob bin of the same type; as the reference (and as INCR), an op on a
/// missing bin makes the bin from its operand, whatever its type.
fn join_bin<'a>(
    bins: &mut Vec<Bin<'a>>,
    position: Option<usize>,
    op: &Op<'a>,
) -> Result<(), ResultCode> {
    let Some(index) = position else {
        bins.push(Bin {
            name: Cow::Borrowed(op.name),
            particle_type: op.particle_type,
            value: operand_value(op)?,
        });
        return Ok(());
    };
    let kind = ParticleType::from_u8(op.particle_type);
    let appendable = op.particle_type == ParticleType::String as u8
        || kind.is_some_and(ParticleType::is_blob_like);
    let bin = &mut bins[index];
    if !appendable || bin.particle_type != op.particle_type {
        return Err(ResultCode::IncompatibleType);
    }
    let mut joined = Vec::with_capacity(bin.value.len() + op.value.len());
    if op.op_type == op_type::APPEND {
        joined.extend_from_slice(&bin.value);
        joined.extend_from_slice(op.value);
    } else {
        joined.extend_from_slice(op.value);
        joined.extend_from_slice(&bin.value);
    }
    bin.value = Cow::Owned(joined);
    Ok(())
}

/// The value a WRITE op stores, or that an INCR, APPEND or PREPEND on a
/// missing bin makes the bin from: lists and maps in their stored form,
/// other particles normalised.
fn operand_value<'a>(op: &Op<'a>) -> Result<Cow<'a, [u8]>, ResultCode> {
    if op.particle_type == ParticleType::List as u8 || op.particle_type == ParticleType::Map as u8 {
        collection_value(op.particle_type, op.value)
    } else {
        Ok(normalise_value(op.particle_type, op.value))
    }
}

/// A list or map bin as a WRITE sets it: well-formed msgpack of the
/// particle's kind, nested no deeper than a stored value may be (else 4),
/// with its nested ordered lists and key-ordered maps put in canonical
/// order (the CDT ops rely on it); stored as sent when it already is. The
/// bin's own collection, when it says it is ordered, must be in order (a
/// key-ordered map's keys ascending and unique), else 4, as the reference
/// refuses it (the official C client's suite writes such bins).
fn collection_value(particle_type: u8, bytes: &[u8]) -> Result<Cow<'_, [u8]>, ResultCode> {
    use citrine_cdt::value::{self, Value};
    use std::cmp::Ordering;
    let mut decoded = value::decode_stored(bytes).map_err(|_| ResultCode::Parameter)?;
    let in_order = match &decoded {
        Value::List(list) if particle_type == ParticleType::List as u8 => {
            !list.is_ordered()
                || list
                    .items
                    .windows(2)
                    .all(|pair| value::compare(&pair[0], &pair[1]) != Ordering::Greater)
        }
        Value::Map(map) if particle_type == ParticleType::Map as u8 => {
            !map.is_key_ordered()
                || map
                    .entries
                    .windows(2)
                    .all(|pair| value::compare(&pair[0].0, &pair[1].0) == Ordering::Less)
        }
        // Not the particle's kind.
        _ => false,
    };
    // A map may hold a key once, at any depth (the reference refuses
    // duplicates in a written map, ordered or not).
    if !in_order || value::has_duplicate_keys(&decoded) {
        return Err(ResultCode::Parameter);
    }
    // Every map is stored in key order (see `value::canonicalize`); a
    // key-ordered map is also re-packed at its smallest (a client may send
    // integers wider than they need), as the reference stores it.
    let repack = matches!(&decoded, Value::Map(map) if map.is_key_ordered());
    if value::canonicalize(&mut decoded) || repack {
        Ok(Cow::Owned(value::to_bytes(&decoded)))
    } else {
        Ok(Cow::Borrowed(bytes))
    }
}

/// A GeoJSON bin value must be a shape the server can index and query
/// (`Point`, `Polygon`, `MultiPolygon`, `AeroCircle`, or a `Feature` of
/// one): anything else is refused with `GeoInvalidGeojson`, as the
/// reference refuses it, instead of being stored and never matching.
pub fn check_geojson(particle_type: u8, value: &[u8]) -> Result<(), ResultCode> {
    if particle_type != ParticleType::GeoJson as u8 {
        return Ok(());
    }
    let valid = citrine_record::geojson_text(value)
        .and_then(citrine_geo::Shape::parse)
        .is_some();
    if valid {
        Ok(())
    } else {
        Err(ResultCode::GeoInvalidGeojson)
    }
}
