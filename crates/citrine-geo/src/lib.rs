//! Geospatial shapes for `GEO2DSPHERE` indexes and geo expressions:
//! GeoJSON shapes, the cells they are indexed under, and the exact test a
//! query or an expression's geo compare makes on each candidate.
//!
//! Owns the shapes the reference accepts in bins and queries — `Point`,
//! `Polygon` (outer ring and holes), `MultiPolygon` and the reference's
//! `AeroCircle` (`[[lng, lat], radius in metres]`) — and a quadtree over
//! longitude and latitude: the plane `[-180, 180) × [-90, 90)` split in
//! four, [`MAX_LEVEL`] times. A cell's id keeps its path (two bits a
//! level) followed by a marker bit, so every cell inside a cell of level
//! `l` has an id within `[id - lsb + 1, id + lsb - 1]` (`lsb` = the
//! marker), a contiguous range of bvals. A point is indexed under its leaf
//! cell; a region under the (at most four) cells of the coarsest level
//! whose cells are as large as its bounding box.
//!
//! A query for a region (polygon, circle) reads the leaf ranges of the
//! cells covering its bounding box and keeps the points inside the region;
//! a query for a point reads the point's cell at every level (the regions
//! indexed there) and keeps the regions containing it. Containment is
//! planar in degrees for polygons (edges are straight in longitude and
//! latitude, not great circles: the reference's S2 edges differ from these
//! for large polygons) and great-circle distance for circles. Like a great
//! circle, an edge takes the short way in longitude: a ring is unwrapped
//! so that a polygon crossing the antimeridian has longitudes past ±180
//! (its boxes split at ±180, a point tested also 360° over), instead of
//! selecting the band the other way round.
//! Which cells serve as the bvals is Citrine's own choice (the reference
//! uses S2 cells): clients treat a bval as an opaque resume point.
//!
//! Parsing follows the reference's rules: a position is exactly two
//! numbers in range, a ring drops repeated positions in a row and must
//! then close around at least a triangle, a polygon may have no ring and a
//! multipolygon no polygon (an empty region), a circle's radius may be
//! negative (a circle containing nothing).
//!
//! Invariants: ids are positive and below 2^61; ranges from
//! [`query_ranges`] are sorted and disjoint; a shape that does not parse,
//! or an empty region, is indexed under nothing and matches nothing.

use serde_json::Value as Json;

/// Levels of the quadtree below the whole plane.
pub const MAX_LEVEL: u32 = 30;

/// Mean Earth radius in metres (the great-circle distance of circles).
const EARTH_RADIUS_M: f64 = 6_371_000.0;

/// Cells a region query reads at most (more precise coverings need more).
const MAX_QUERY_CELLS: usize = 16;

/// The largest GeoJSON text a query may send, and the most vertices its
/// region may have: the exact test runs on every candidate under a
/// partition's lock, so its cost is bounded.
pub const MAX_QUERY_BYTES: usize = 1 << 20;
pub const MAX_QUERY_VERTICES: usize = 10_000;

/// A GeoJSON shape.
#[derive(Clone, Debug, PartialEq)]
pub enum Shape {
    Point {
        lng: f64,
        lat: f64,
    },
    /// Polygons, each an outer ring and its holes, as (lng, lat) rings.
    Polygons(Vec<Vec<Vec<(f64, f64)>>>),
    Circle {
        lng: f64,
        lat: f64,
        radius_m: f64,
    },
}

/// A position: exactly two numbers, longitude and latitude, in range.
fn position(value: &Json) -> Option<(f64, f64)> {
    let pair = value.as_array()?;
    if pair.len() != 2 {
        return None;
    }
    let (lng, lat) = (pair[0].as_f64()?, pair[1].as_f64()?);
    ((-180.0..=180.0).contains(&lng) && (-90.0..=90.0).contains(&lat)).then_some((lng, lat))
}

/// `ring` with each edge taking the short way in longitude, as a great
/// circle between its ends does: a vertex more than 180° (and less than
/// 360°) of longitude from the one before is moved by 360°, so a ring
/// meant to cross the antimeridian gets longitudes past ±180 instead of
/// spanning the globe the other way round. Its first vertex is moved to
/// within 180° of `near` (the outer ring's first, for a hole). A ring
/// that does not close once unwrapped (it circles a pole) is kept as it
/// was. An edge of exactly 360° joins -180 and 180: it stays.
fn unwrapped(ring: &[(f64, f64)], near: f64) -> Vec<(f64, f64)> {
    let Some(&(first, _)) = ring.first() else {
        return Vec::new();
    };
    let mut offset = ((near - first) / 360.0).round() * 360.0;
    let mut out: Vec<(f64, f64)> = Vec::with_capacity(ring.len());
    for &(lng, lat) in ring {
        let mut x = lng + offset;
        if let Some(&(previous, _)) = out.last() {
            let step = x - previous;
            if step.abs() > 180.0 && step.abs() < 360.0 {
                let turn = -360.0 * step.signum();
                x += turn;
                offset += turn;
            }
        }
        out.push((x, lat));
    }
    match (out.first(), out.last()) {
        (Some(start), Some(end)) if (start.0 - end.0).abs() < 1e-9 => out,
        _ => ring.to_vec(),
    }
}

/// A ring: its positions with repeats in a row dropped, closed (last =
/// first) around at least a triangle, as the reference takes it.
fn ring(value: &Json) -> Option<Vec<(f64, f64)>> {
    let mut points = value
        .as_array()?
        .iter()
        .map(position)
        .collect::<Option<Vec<_>>>()?;
    points.dedup();
    (points.len() >= 4 && points.first() == points.last()).then_some(points)
}

/// A polygon's rings (outer ring first); it may have none (the reference
/// takes an empty polygon, which contains nothing).
fn polygon(value: &Json) -> Option<Vec<Vec<(f64, f64)>>> {
    let rings = value
        .as_array()?
        .iter()
        .map(ring)
        .collect::<Option<Vec<Vec<(f64, f64)>>>>()?;
    let Some(near) = rings.first().and_then(|ring| ring.first()).map(|p| p.0) else {
        return Some(Vec::new());
    };
    Some(rings.iter().map(|ring| unwrapped(ring, near)).collect())
}

/// Polygons without the empty ones (they contain nothing).
fn regions(polygons: Vec<Vec<Vec<(f64, f64)>>>) -> Shape {
    Shape::Polygons(polygons.into_iter().filter(|p| !p.is_empty()).collect())
}

impl Shape {
    /// Parses GeoJSON text; `None` for anything else (or out of range). A
    /// `Feature` is its geometry, as the reference takes it; type names
    /// are case-sensitive, and other geometries (`MultiPoint`,
    /// `LineString`, ...) are refused.
    pub fn parse(text: &[u8]) -> Option<Shape> {
        let json: Json = serde_json::from_slice(text).ok()?;
        Shape::of_json(&json)
    }

    fn of_json(json: &Json) -> Option<Shape> {
        if json.get("type")?.as_str()? == "Feature" {
            let geometry = json.get("geometry")?;
            if geometry.get("type")?.as_str()? == "Feature" {
                return None;
            }
            return Shape::of_json(geometry);
        }
        let coordinates = json.get("coordinates")?;
        match json.get("type")?.as_str()? {
            "Point" => {
                let (lng, lat) = position(coordinates)?;
                Some(Shape::Point { lng, lat })
            }
            "Polygon" => Some(regions(vec![polygon(coordinates)?])),
            "MultiPolygon" => Some(regions(
                coordinates
                    .as_array()?
                    .iter()
                    .map(polygon)
                    .collect::<Option<Vec<_>>>()?,
            )),
            "AeroCircle" => {
                // A negative radius is taken: the circle contains nothing.
                let parts = coordinates.as_array()?;
                if parts.len() != 2 {
                    return None;
                }
                let (lng, lat) = position(&parts[0])?;
                let radius_m = parts[1].as_f64()?;
                radius_m
                    .is_finite()
                    .then_some(Shape::Circle { lng, lat, radius_m })
            }
            _ => None,
        }
    }

    /// Parses a stored GeoJSON particle: a flags byte, a u16 count of
    /// cells, the cells (8 bytes each), then the text.
    pub fn from_particle(bytes: &[u8]) -> Option<Shape> {
        let cells = usize::from(u16::from_be_bytes([*bytes.get(1)?, *bytes.get(2)?]));
        Shape::parse(bytes.get(3 + cells * 8..)?)
    }

    /// Vertices of a region's rings (1 for a point or circle): what an
    /// exact test costs.
    pub fn vertices(&self) -> usize {
        match self {
            Shape::Polygons(polygons) => polygons.iter().flatten().map(Vec::len).sum(),
            _ => 1,
        }
    }

    /// Bounding boxes `(min_lng, min_lat, max_lng, max_lat)` (two for a
    /// region across the antimeridian; none for a region containing
    /// nothing).
    fn boxes(&self) -> Vec<(f64, f64, f64, f64)> {
        match self {
            Shape::Point { lng, lat } => vec![(*lng, *lat, *lng, *lat)],
            Shape::Polygons(polygons) if polygons.is_empty() => Vec::new(),
            Shape::Circle { radius_m, .. } if *radius_m < 0.0 => Vec::new(),
            Shape::Polygons(polygons) => {
                let mut bounds = (f64::MAX, f64::MAX, f64::MIN, f64::MIN);
                for (lng, lat) in polygons.iter().flat_map(|rings| rings[0].iter()) {
                    bounds = (
                        bounds.0.min(*lng),
                        bounds.1.min(*lat),
                        bounds.2.max(*lng),
                        bounds.3.max(*lat),
                    );
                }
                wrapped(bounds)
            }
            Shape::Circle { lng, lat, radius_m } => {
                let dlat = (radius_m / EARTH_RADIUS_M).to_degrees();
                let (min_lat, max_lat) = (lat - dlat, lat + dlat);
                if min_lat <= -90.0 || max_lat >= 90.0 {
                    // Around a pole: every longitude.
                    return vec![(-180.0, min_lat.max(-90.0), 180.0, max_lat.min(90.0))];
                }
                let widest = lat.abs() + dlat;
                let dlng = dlat / widest.to_radians().cos();
                if dlng >= 180.0 {
                    return vec![(-180.0, min_lat, 180.0, max_lat)];
                }
                wrapped((lng - dlng, min_lat, lng + dlng, max_lat))
            }
        }
    }

    /// Whether the region contains the point (`false` when `self` is a
    /// point).
    pub fn contains(&self, lng: f64, lat: f64) -> bool {
        match self {
            Shape::Point { .. } => false,
            Shape::Circle {
                lng: center_lng,
                lat: center_lat,
                radius_m,
            } => distance_m(*center_lng, *center_lat, lng, lat) <= *radius_m,
            // A ring across the antimeridian has longitudes past ±180:
            // the point is tried where it falls in the ring's longitudes.
            Shape::Polygons(polygons) => polygons.iter().any(|rings| {
                [lng, lng + 360.0, lng - 360.0].into_iter().any(|lng| {
                    inside_ring(&rings[0], lng, lat)
                        && !rings[1..].iter().any(|hole| inside_ring(hole, lng, lat))
                })
            }),
        }
    }
}

/// A box whose longitudes may pass ±180 (a region across the
/// antimeridian) as boxes within `[-180, 180]`.
fn wrapped(bounds: (f64, f64, f64, f64)) -> Vec<(f64, f64, f64, f64)> {
    let (west, south, east, north) = bounds;
    if east - west >= 360.0 {
        vec![(-180.0, south, 180.0, north)]
    } else if west < -180.0 {
        vec![
            (-180.0, south, east, north),
            (west + 360.0, south, 180.0, north),
        ]
    } else if east > 180.0 {
        vec![
            (west, south, 180.0, north),
            (-180.0, south, east - 360.0, north),
        ]
    } else {
        vec![bounds]
    }
}

/// Great-circle distance in metres (haversine).
fn distance_m(lng1: f64, lat1: f64, lng2: f64, lat2: f64) -> f64 {
    let (phi1, phi2) = (lat1.to_radians(), lat2.to_radians());
    let dphi = phi2 - phi1;
    let dlambda = (lng2 - lng1).to_radians();
    let a = (dphi / 2.0).sin().powi(2) + phi1.cos() * phi2.cos() * (dlambda / 2.0).sin().powi(2);
    2.0 * EARTH_RADIUS_M * a.sqrt().min(1.0).asin()
}

/// Even-odd ray casting; a point on an edge counts as inside.
fn inside_ring(ring: &[(f64, f64)], lng: f64, lat: f64) -> bool {
    let mut inside = false;
    for window in ring.windows(2) {
        let ((x1, y1), (x2, y2)) = (window[0], window[1]);
        // On the edge (collinear and between the ends).
        let cross = (x2 - x1) * (lat - y1) - (y2 - y1) * (lng - x1);
        if cross.abs() < 1e-12
            && lng >= x1.min(x2)
            && lng <= x1.max(x2)
            && lat >= y1.min(y2)
            && lat <= y1.max(y2)
        {
            return true;
        }
        if (y1 > lat) != (y2 > lat) {
            let x = x1 + (lat - y1) / (y2 - y1) * (x2 - x1);
            if lng < x {
                inside = !inside;
            }
        }
    }
    inside
}

/// The quadtree coordinates of a position at the leaf level.
fn leaf_xy(lng: f64, lat: f64) -> (u64, u64) {
    let scale = f64::from(1u32 << MAX_LEVEL);
    let max = (1u64 << MAX_LEVEL) - 1;
    let x = (((lng + 180.0) / 360.0) * scale)
        .floor()
        .clamp(0.0, max as f64) as u64;
    let y = (((lat + 90.0) / 180.0) * scale)
        .floor()
        .clamp(0.0, max as f64) as u64;
    (x, y)
}

/// Interleaves the low `bits` bits of x and y (x in the higher of each pair).
fn interleave(x: u64, y: u64, bits: u32) -> u64 {
    (0..bits).fold(0, |path, bit| {
        path | (((x >> bit) & 1) << (2 * bit + 1)) | (((y >> bit) & 1) << (2 * bit))
    })
}

/// The id of the cell at `level` holding leaf coordinates (x, y).
fn cell_id(x: u64, y: u64, level: u32) -> i64 {
    debug_assert!(level <= MAX_LEVEL);
    let shift = MAX_LEVEL - level;
    let path = interleave(x >> shift, y >> shift, level);
    let marker = 1u64 << (2 * shift);
    // Below 2^(2 * MAX_LEVEL + 1) = 2^61: positive as an i64.
    ((path * 2 + 1) * marker) as i64
}

/// The leaf ids inside a cell, both included.
fn leaf_range(cell: i64) -> (i64, i64) {
    let marker = cell & cell.wrapping_neg();
    (cell - marker + 1, cell + marker - 1)
}

/// The level whose cells are as large as a box `width` × `height` degrees.
fn level_for(width: f64, height: f64) -> u32 {
    let fraction = (width / 360.0).max(height / 180.0);
    if fraction <= 0.0 {
        return MAX_LEVEL;
    }
    let level = (-fraction.log2()).floor();
    level.clamp(0.0, f64::from(MAX_LEVEL)) as u32
}

/// The cells of `level` a box touches.
fn cells_of_box(bounds: (f64, f64, f64, f64), level: u32, out: &mut Vec<i64>) {
    let shift = MAX_LEVEL - level;
    let (x0, y0) = leaf_xy(bounds.0, bounds.1);
    let (x1, y1) = leaf_xy(bounds.2, bounds.3);
    for x in (x0 >> shift)..=(x1 >> shift) {
        for y in (y0 >> shift)..=(y1 >> shift) {
            out.push(cell_id(x << shift, y << shift, level));
        }
    }
}

/// The cells a shape in a bin is indexed under: a point's leaf, a
/// region's (at most four) cells of the level matching its box.
pub fn index_cells(shape: &Shape) -> Vec<i64> {
    let mut cells = Vec::new();
    match shape {
        Shape::Point { lng, lat } => {
            let (x, y) = leaf_xy(*lng, *lat);
            cells.push(cell_id(x, y, MAX_LEVEL));
        }
        region => {
            for bounds in region.boxes() {
                let level = level_for(bounds.2 - bounds.0, bounds.3 - bounds.1);
                cells_of_box(bounds, level, &mut cells);
            }
        }
    }
    cells.sort_unstable();
    cells.dedup();
    cells
}

/// The bval ranges a query for `shape` reads, sorted and disjoint: for a
/// point, its cell at every level (where regions are indexed); for a
/// region, the leaves of the cells covering its box.
pub fn query_ranges(shape: &Shape) -> Vec<(i64, i64)> {
    let mut ranges: Vec<(i64, i64)> = match shape {
        Shape::Point { lng, lat } => {
            let (x, y) = leaf_xy(*lng, *lat);
            (0..=MAX_LEVEL)
                .map(|level| {
                    let cell = cell_id(x, y, level);
                    (cell, cell)
                })
                .collect()
        }
        region => {
            let mut cells = Vec::new();
            for bounds in region.boxes() {
                let coarse = level_for(bounds.2 - bounds.0, bounds.3 - bounds.1);
                // As fine a covering as stays within the cell budget.
                let mut level = coarse;
                loop {
                    let mut finer = Vec::new();
                    if level < MAX_LEVEL {
                        cells_of_box(bounds, level + 1, &mut finer);
                    }
                    if level == MAX_LEVEL || finer.len() + cells.len() > MAX_QUERY_CELLS {
                        cells_of_box(bounds, level, &mut cells);
                        break;
                    }
                    level += 1;
                }
            }
            cells.into_iter().map(leaf_range).collect()
        }
    };
    ranges.sort_unstable();
    // Merge overlaps (a finer cell inside a coarser one, or neighbours).
    let mut merged: Vec<(i64, i64)> = Vec::with_capacity(ranges.len());
    for (low, high) in ranges {
        match merged.last_mut() {
            Some(last) if low <= last.1.saturating_add(1) => last.1 = last.1.max(high),
            _ => merged.push((low, high)),
        }
    }
    merged
}

/// Whether a query for `query` selects a record whose bin holds `stored`:
/// a point inside a queried region, or a region containing a queried point.
pub fn selects(query: &Shape, stored: &Shape) -> bool {
    match (query, stored) {
        (Shape::Point { lng, lat }, region) => region.contains(*lng, *lat),
        (region, Shape::Point { lng, lat }) => region.contains(*lng, *lat),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(text: &str) -> Shape {
        Shape::parse(text.as_bytes()).expect("valid GeoJSON")
    }

    const BAY: &str = r#"{"type":"Polygon","coordinates":[[[-122.5,37.0],[-121.0,37.0],[-121.0,38.08],[-122.5,38.08],[-122.5,37.0]]]}"#;

    #[test]
    fn empty_regions_parse_and_contain_nothing() {
        // The reference stores these (and evaluates them in expressions).
        for empty in [
            r#"{"type":"Polygon","coordinates":[]}"#,
            r#"{"type":"MultiPolygon","coordinates":[]}"#,
            r#"{"type":"MultiPolygon","coordinates":[[]]}"#,
            r#"{"type":"Polygon","coordinates":[],"extra":1}"#,
        ] {
            let region = shape(empty);
            assert_eq!(region, Shape::Polygons(Vec::new()), "{empty}");
            assert!(!region.contains(0.0, 0.0));
            assert!(index_cells(&region).is_empty());
            assert!(query_ranges(&region).is_empty());
        }
        let circle = shape(r#"{"type":"AeroCircle","coordinates":[[0,0],-1.0]}"#);
        assert!(!circle.contains(0.0, 0.0));
        assert!(index_cells(&circle).is_empty());
        // Repeated positions in a row are dropped before a ring is judged.
        let ring = r#"{"type":"Polygon","coordinates":[[[0,0],[0,0],[2,0],[2,2],[0,0]]]}"#;
        assert!(matches!(shape(ring), Shape::Polygons(p) if p[0][0].len() == 4));
        assert!(shape(ring).contains(1.5, 0.5));
    }

    #[test]
    fn shapes_parse_and_refuse() {
        assert_eq!(
            shape(r#"{"type":"Point","coordinates":[-122.0,37.5]}"#),
            Shape::Point {
                lng: -122.0,
                lat: 37.5
            }
        );
        assert!(matches!(shape(BAY), Shape::Polygons(p) if p.len() == 1 && p[0][0].len() == 5));
        assert!(matches!(
            shape(r#"{"type":"AeroCircle","coordinates":[[-122.0,37.5],50000]}"#),
            Shape::Circle { radius_m, .. } if radius_m == 50000.0
        ));
        for bad in [
            "{}",
            "not json",
            r#"{"type":"Point","coordinates":[200,0]}"#,
            r#"{"type":"Point","coordinates":[1]}"#,
            r#"{"type":"Polygon","coordinates":[[[0,0],[1,1],[0,0]]]}"#,
            r#"{"type":"Polygon","coordinates":[[[0,0],[1,0],[1,1],[0,1]]]}"#,
            r#"{"type":"Point","coordinates":[1,2,3]}"#,
            r#"{"type":"Polygon","coordinates":[[]]}"#,
            r#"{"type":"Polygon","coordinates":[[[0,0],[1,0],[1,0],[0,0]]]}"#,
            r#"{"type":"AeroCircle","coordinates":[[0,0]]}"#,
            r#"{"type":"AeroCircle","coordinates":[[0,0],5,1]}"#,
            r#"{"type":"LineString","coordinates":[[0,0],[1,1]]}"#,
            r#"{"type":"point","coordinates":[0,0]}"#,
            r#"{"type":"MultiPoint","coordinates":[[0,0],[0,0]]}"#,
            r#"{"type":"Feature","geometry":{"type":"LineString","coordinates":[[0,0],[1,1]]}}"#,
            r#"{"type":"Feature"}"#,
        ] {
            assert_eq!(Shape::parse(bad.as_bytes()), None, "{bad}");
        }
        // A Feature is its geometry.
        assert!(matches!(
            shape(&format!(r#"{{"type":"Feature","properties":{{}},"geometry":{BAY}}}"#)),
            Shape::Polygons(p) if p.len() == 1
        ));
        let mut particle = vec![0, 0, 1];
        particle.extend_from_slice(&[9; 8]);
        particle.extend_from_slice(br#"{"type":"Point","coordinates":[1,2]}"#);
        assert_eq!(
            Shape::from_particle(&particle),
            Some(Shape::Point { lng: 1.0, lat: 2.0 })
        );
    }

    #[test]
    fn containment() {
        let bay = shape(BAY);
        assert!(bay.contains(-122.0, 37.5));
        assert!(bay.contains(-121.0, 37.5), "on an edge");
        assert!(!bay.contains(-120.9, 37.5));
        let holed = shape(
            r#"{"type":"Polygon","coordinates":[[[0,0],[10,0],[10,10],[0,10],[0,0]],[[4,4],[6,4],[6,6],[4,6],[4,4]]]}"#,
        );
        assert!(holed.contains(2.0, 2.0));
        assert!(!holed.contains(5.0, 5.0), "in the hole");
        let circle = shape(r#"{"type":"AeroCircle","coordinates":[[-122.0,37.5],50000]}"#);
        // The Go client's radius spec: points 0.1 degree apart diagonally.
        let inside: Vec<usize> = (0..20)
            .filter(|i| circle.contains(-122.0 + 0.1 * *i as f64, 37.5 + 0.1 * *i as f64))
            .collect();
        assert_eq!(inside, vec![0, 1, 2, 3]);
        assert!((distance_m(0.0, 0.0, 1.0, 0.0) - 111_195.0).abs() < 10.0);
    }

    /// Fiji's area: 2° on each side of the antimeridian.
    const ACROSS: &str = r#"{"type":"Polygon","coordinates":[[[178,-20],[-178,-20],[-178,-16],[178,-16],[178,-20]]]}"#;

    #[test]
    fn a_polygon_across_the_antimeridian_takes_the_short_way() {
        let fiji = shape(ACROSS);
        for (lng, lat) in [
            (179.0, -18.0),
            (-179.0, -18.0),
            (180.0, -18.0),
            (-180.0, -18.0),
        ] {
            assert!(fiji.contains(lng, lat), "({lng}, {lat})");
        }
        for (lng, lat) in [
            (0.0, -18.0),
            (177.0, -18.0),
            (-177.0, -18.0),
            (179.0, -21.0),
        ] {
            assert!(!fiji.contains(lng, lat), "({lng}, {lat}) is not in Fiji");
        }
        // A hole across it, given on the other side of the line.
        let holed = shape(
            r#"{"type":"Polygon","coordinates":[[[178,-20],[-178,-20],[-178,-16],[178,-16],[178,-20]],[[-179.5,-18.5],[179.5,-18.5],[179.5,-17.5],[-179.5,-17.5],[-179.5,-18.5]]]}"#,
        );
        assert!(!holed.contains(180.0, -18.0), "in the hole");
        assert!(!holed.contains(-179.8, -18.0), "in the hole");
        assert!(holed.contains(-178.5, -18.0));
        // Its boxes split at ±180; the cells it is indexed under are on
        // both sides.
        let boxes = fiji.boxes();
        assert_eq!(boxes.len(), 2, "{boxes:?}");
        assert!(boxes
            .iter()
            .all(|(west, _, east, _)| *west >= -180.0 && *east <= 180.0 && east - west <= 2.0));
        // Rings that close only the long way round stay as given: the
        // whole world, and a band around a pole.
        let world = shape(
            r#"{"type":"Polygon","coordinates":[[[-180,-90],[180,-90],[180,90],[-180,90],[-180,-90]]]}"#,
        );
        assert!(world.contains(0.0, 0.0) && world.contains(179.0, 10.0));
        let ring = vec![(0.0, 80.0), (120.0, 80.0), (-120.0, 80.0), (0.0, 80.0)];
        assert_eq!(unwrapped(&ring, 0.0).len(), 4);
        assert_eq!(
            wrapped((-10.0, 0.0, 400.0, 1.0)),
            vec![(-180.0, 0.0, 180.0, 1.0)]
        );
    }

    #[test]
    fn cells_nest_in_their_ancestors_ranges() {
        let (x, y) = leaf_xy(-122.0, 37.5);
        let leaf = cell_id(x, y, MAX_LEVEL);
        assert!(leaf > 0 && leaf < 1 << 61);
        for level in 0..MAX_LEVEL {
            let (low, high) = leaf_range(cell_id(x, y, level));
            assert!(low <= leaf && leaf <= high, "level {level}");
        }
        assert_eq!(leaf_range(leaf), (leaf, leaf));
        // The root holds every leaf.
        let (low, high) = leaf_range(cell_id(0, 0, 0));
        assert_eq!((low, high), (1, (1i64 << 61) - 1));
    }

    #[test]
    fn a_region_query_reads_every_point_inside_it() {
        for query in [
            shape(BAY),
            shape(r#"{"type":"AeroCircle","coordinates":[[-122.0,37.5],50000]}"#),
            shape(r#"{"type":"AeroCircle","coordinates":[[179.9,10],40000]}"#),
            shape(ACROSS),
        ] {
            let ranges = query_ranges(&query);
            assert!(!ranges.is_empty() && ranges.len() <= MAX_QUERY_CELLS * 2);
            assert!(ranges.windows(2).all(|pair| pair[0].1 < pair[1].0));
            // Every point of a grid that the region contains is in a range.
            for i in 0..400 {
                for j in 0..400 {
                    let lng = -180.0 + 0.9 * f64::from(i);
                    let lat = -90.0 + 0.45 * f64::from(j);
                    let fine = (-123.0 + 0.01 * f64::from(i), 36.5 + 0.01 * f64::from(j));
                    let line = (179.95 - 0.001 * f64::from(i), 10.0);
                    let fiji = (-179.99 + 0.005 * f64::from(i), -20.0 + 0.01 * f64::from(j));
                    let fiji_west = (fiji.0 + 360.0 - 2.0, fiji.1);
                    for (lng, lat) in [(lng, lat), fine, line, fiji, fiji_west] {
                        if query.contains(lng, lat) {
                            let [bval] = index_cells(&Shape::Point { lng, lat })[..] else {
                                panic!("a point has one cell")
                            };
                            assert!(
                                ranges
                                    .iter()
                                    .any(|(low, high)| (*low..=*high).contains(&bval)),
                                "({lng}, {lat}) is inside but in no range"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_point_query_across_the_antimeridian_reads_the_polygon() {
        let fiji = shape(ACROSS);
        let cells = index_cells(&fiji);
        for lng in [179.5, -179.5] {
            let point = Shape::Point { lng, lat: -18.0 };
            let ranges = query_ranges(&point);
            assert!(
                cells.iter().any(|cell| ranges
                    .iter()
                    .any(|(low, high)| (*low..=*high).contains(cell))),
                "({lng}, -18) does not reach the polygon's cells {cells:?}"
            );
            assert!(selects(&point, &fiji) && selects(&fiji, &point));
        }
    }

    #[test]
    fn a_point_query_reads_every_region_holding_it() {
        let point = Shape::Point {
            lng: -121.7,
            lat: 37.8,
        };
        let ranges = query_ranges(&point);
        for region in [
            shape(BAY),
            shape(r#"{"type":"AeroCircle","coordinates":[[-121.7,37.8],1]}"#),
            shape(
                r#"{"type":"Polygon","coordinates":[[[-180,-90],[180,-90],[180,90],[-180,90],[-180,-90]]]}"#,
            ),
        ] {
            assert!(region.contains(-121.7, 37.8));
            let cells = index_cells(&region);
            assert!(!cells.is_empty() && cells.len() <= 4, "{cells:?}");
            assert!(
                cells.iter().any(|cell| ranges
                    .iter()
                    .any(|(low, high)| (*low..=*high).contains(cell))),
                "{region:?} is indexed where the point's query does not look"
            );
            assert!(selects(&point, &region) && selects(&region, &point));
        }
        assert!(!selects(&point, &point));
    }
}
