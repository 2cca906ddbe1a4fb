//! [`Location`]: where one record body is stored, in 8 bytes with no
//! alignment, so that a primary-index slot (digest, metadata, location)
//! stays small with the table's spare room counted.
//!
//! A location is one word: either an in-memory body, owned through a thin
//! pointer to one allocation laid out as `[length: u32][body bytes]` (the
//! layout of a `Vec<u8>` of that size, alignment 1), or a [`DeviceAddress`].
//! The pointer is thin (the length lives in the allocation, in the same
//! cache line as the body's first bytes, which a read touches anyway), and
//! the kind is the word's top bit: a user-space pointer never has it set,
//! and a device address is held in the 63 bits below it (its rblock count
//! in 23 bits: [`DeviceAddress::MAX_RBLOCKS`]). Against 16 bytes for a
//! `Box<[u8]>` or an enum holding one, and 9 with a separate kind byte.
//!
//! Invariants (this module is the only `unsafe` in the crate; each block
//! relies on them):
//! - top bit clear (a memory location): `word` is null (an empty body: no
//!   allocation) or points to an allocation of the global allocator with
//!   layout `body_layout(len)` (made by [`Location::memory`], or a
//!   `Vec<u8>`'s taken over by [`Location::memory_from_vec`]), whose first
//!   4 bytes hold `len` (native endian, unaligned) and whose next `len`
//!   bytes are the body; this location is its only owner and frees it on
//!   drop. [`Location::adopt`] refuses (panics on) a pointer with the top
//!   bit set, so no allocation is ever read as a device address.
//! - top bit set (a device location): the low 63 bits are the address's
//!   `u64` form less one always-clear bit ([`pack_device`]) as a pointer
//!   without provenance; it is never dereferenced or freed.
//! - Nothing else constructs a `Location` (the field is private), so the
//!   two cases above are the only ones.

#![allow(unsafe_code)]

use crate::DeviceAddress;
use std::alloc::Layout;
use std::fmt;

// A device address (63 bits and the kind bit) is held in a pointer-sized word.
const _: () = assert!(usize::BITS == 64, "Location needs 64-bit pointers");

/// The word's top bit: set for a device location.
const DEVICE_BIT: usize = 1 << 63;
/// Bits of a [`DeviceAddress`]'s rblock-count field; the count uses one
/// fewer ([`DeviceAddress::MAX_RBLOCKS`]), so the field's top bit is always
/// clear and dropping it frees the word's top bit for the kind.
const COUNT_FIELD_BITS: u32 = DeviceAddress::MAX_RBLOCKS.count_ones() + 1;

/// A device address as the low 63 bits of a word: its `u64` form without
/// the rblock-count field's always-clear top bit; the top bit marks the
/// kind.
#[inline]
fn pack_device(address: DeviceAddress) -> usize {
    let rblocks = address.rblocks();
    assert!(
        rblocks <= DeviceAddress::MAX_RBLOCKS,
        "device address {address:?} past the rblock count a location holds"
    );
    let above = address.0 >> COUNT_FIELD_BITS;
    DEVICE_BIT | (above << (COUNT_FIELD_BITS - 1) | u64::from(rblocks)) as usize
}

/// The address [`pack_device`] packed into `word`.
#[inline]
fn unpack_device(word: usize) -> DeviceAddress {
    let bits = (word & !DEVICE_BIT) as u64;
    let rblocks = bits & u64::from(DeviceAddress::MAX_RBLOCKS);
    let above = bits >> (COUNT_FIELD_BITS - 1);
    DeviceAddress(above << COUNT_FIELD_BITS | rblocks)
}

/// Bytes of the length prefix of an in-memory body's allocation: the spare
/// capacity a body's `Vec` needs for [`Location::memory_from_vec`] to keep
/// it without a copy.
pub const MEMORY_BODY_SPARE: usize = std::mem::size_of::<u32>();
const PREFIX: usize = MEMORY_BODY_SPARE;

/// Where one record body is stored. Owned by the index entry that points
/// to it; 8 bytes, alignment 1.
#[repr(C, packed)]
pub struct Location {
    word: *mut u8,
}

// SAFETY: a Location owns its allocation exclusively (like a Box<[u8]>)
// and gives out only shared borrows of it through `&self`, so moving it to
// another thread or sharing `&Location` between threads is as sound as for
// a Box<[u8]>.
unsafe impl Send for Location {}
// SAFETY: see `Send`: `&Location` only reads immutable bytes.
unsafe impl Sync for Location {}

/// A borrowed view of a [`Location`], to match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored<'a> {
    /// The body itself, in process memory.
    Memory(&'a [u8]),
    /// A record on a device.
    Device(DeviceAddress),
}

/// The allocation of an in-memory body of `len` bytes: a `Vec<u8>`'s of
/// `PREFIX + len` bytes (`None` past `u32::MAX` bytes or what a layout can
/// describe).
fn body_layout(len: usize) -> Option<Layout> {
    if u32::try_from(len).is_err() {
        return None;
    }
    Layout::array::<u8>(len.checked_add(PREFIX)?).ok()
}

impl Location {
    /// An in-memory body holding a copy of `body`. `None` when the body is
    /// longer than `u32::MAX` bytes (no record can be: frames are smaller).
    pub fn memory(body: &[u8]) -> Option<Location> {
        let layout = body_layout(body.len())?;
        if body.is_empty() {
            return Some(Location::default());
        }
        let len = u32::try_from(body.len()).ok()?;
        // SAFETY: `layout` has a non-zero size (PREFIX + len > 0).
        let word = unsafe { std::alloc::alloc(layout) };
        if word.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        // SAFETY: `word` is a fresh allocation of PREFIX + len bytes; the
        // prefix and the body are written within it and `body` cannot
        // overlap a fresh allocation.
        unsafe {
            word.cast::<u32>().write_unaligned(len);
            std::ptr::copy_nonoverlapping(body.as_ptr(), word.add(PREFIX), body.len());
        }
        Some(Location::adopt(word))
    }

    /// A memory location owning `word` (see the module's invariants).
    /// Panics on a pointer with the top bit set: it would read as a device
    /// address (no user-space allocation has one).
    #[inline]
    fn adopt(word: *mut u8) -> Location {
        assert!(word.addr() & DEVICE_BIT == 0, "allocation above 2^63");
        Location { word }
    }

    /// An in-memory body holding `body`. When the vector has exactly
    /// [`MEMORY_BODY_SPARE`] bytes of capacity beyond its length, its
    /// allocation becomes the stored body (the bytes move up by the prefix,
    /// nothing is allocated); otherwise the body is copied. `None` as for
    /// [`Location::memory`].
    pub fn memory_from_vec(mut body: Vec<u8>) -> Option<Location> {
        let len = u32::try_from(body.len()).ok()?;
        if body.is_empty() || body.capacity() != body.len() + PREFIX {
            return Location::memory(&body);
        }
        // A u32 length plus the prefix always has a layout on 64 bits.
        debug_assert!(body_layout(body.len()).is_some());
        let end = body.len();
        body.resize(end + PREFIX, 0);
        body.copy_within(0..end, PREFIX);
        body[..PREFIX].copy_from_slice(&len.to_ne_bytes());
        debug_assert_eq!(
            body.capacity(),
            body.len(),
            "the prefix filled the spare room"
        );
        let mut body = std::mem::ManuallyDrop::new(body);
        let word = body.as_mut_ptr();
        // The vector's allocation has the layout `body_layout(len)`: a
        // `Vec<u8>` of capacity PREFIX + len allocates `[u8; PREFIX + len]`
        // from the global allocator, and its first PREFIX bytes now hold
        // `len`. Ownership passes to the location (the vector is never
        // dropped).
        Some(Location::adopt(word))
    }

    /// A record on a device. Panics on an address whose rblock count is
    /// past [`DeviceAddress::MAX_RBLOCKS`] (every address
    /// [`DeviceAddress::new`] or [`DeviceAddress::from_bits`] makes fits).
    pub fn device(address: DeviceAddress) -> Location {
        Location {
            word: std::ptr::without_provenance_mut(pack_device(address)),
        }
    }

    /// What this location holds.
    #[inline]
    pub fn get(&self) -> Stored<'_> {
        // Copies out of the packed struct (no reference to a field).
        let word = self.word;
        if word.addr() & DEVICE_BIT != 0 {
            return Stored::Device(unpack_device(word.addr()));
        }
        if word.is_null() {
            return Stored::Memory(&[]);
        }
        // SAFETY: by the module's invariant, a non-null memory word points
        // to a live allocation this location owns, whose prefix holds the
        // body's length and is followed by that many initialised bytes;
        // the borrow of `self` keeps it alive and unmodified.
        unsafe {
            let len = word.cast::<u32>().read_unaligned() as usize;
            Stored::Memory(std::slice::from_raw_parts(word.add(PREFIX), len))
        }
    }

    /// The device address, for a device location.
    #[inline]
    pub fn device_address(&self) -> Option<DeviceAddress> {
        match self.get() {
            Stored::Device(address) => Some(address),
            Stored::Memory(_) => None,
        }
    }

    /// The address of an in-memory body's allocation (its first cache
    /// line holds the length and the body's first bytes), for prefetching;
    /// `None` for a device record or an empty body.
    #[inline]
    pub fn memory_address(&self) -> Option<usize> {
        let word = self.word;
        (word.addr() & DEVICE_BIT == 0 && !word.is_null()).then(|| word.addr())
    }

    /// The stored size of the body, in bytes (for a device record: the
    /// whole rblocks it occupies, header included).
    pub fn size(&self) -> usize {
        match self.get() {
            Stored::Memory(body) => body.len(),
            Stored::Device(address) => address.bytes() as usize,
        }
    }
}

impl Default for Location {
    /// An empty in-memory body (no allocation): what an empty index slot
    /// holds.
    fn default() -> Location {
        Location {
            word: std::ptr::null_mut(),
        }
    }
}

impl Drop for Location {
    fn drop(&mut self) {
        let word = self.word;
        if word.addr() & DEVICE_BIT != 0 || word.is_null() {
            return;
        }
        // SAFETY: by the module's invariant `word` is this location's own
        // allocation, made with `body_layout` of the length in its prefix
        // (which `memory` accepted, so the layout exists again); it is
        // freed once, here.
        unsafe {
            let len = word.cast::<u32>().read_unaligned() as usize;
            let layout = body_layout(len);
            debug_assert!(layout.is_some(), "a stored body's length has a layout");
            if let Some(layout) = layout {
                std::alloc::dealloc(word, layout);
            }
        }
    }
}

impl PartialEq for Location {
    /// Same kind and same contents (bodies compared byte by byte).
    fn eq(&self, other: &Location) -> bool {
        self.get() == other.get()
    }
}

impl Eq for Location {}

impl fmt::Debug for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.get() {
            Stored::Memory(body) => write!(f, "Location::Memory({} bytes)", body.len()),
            Stored::Device(address) => write!(f, "Location::Device({address:?})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eight_bytes_no_alignment() {
        assert_eq!(std::mem::size_of::<Location>(), 8);
        assert_eq!(std::mem::align_of::<Location>(), 1);
    }

    #[test]
    fn memory_bodies_round_trip() {
        for len in [0usize, 1, 3, 4, 5, 63, 64, 65, 1000, 70_000] {
            let body: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            let location = Location::memory(&body).expect("fits");
            assert_eq!(location.get(), Stored::Memory(&body[..]), "len {len}");
            assert_eq!(location.size(), len);
            assert_eq!(location.device_address(), None);
            assert_eq!(location.memory_address().is_some(), len > 0);
        }
    }

    #[test]
    fn vectors_with_room_for_the_prefix_are_kept_others_copied() {
        for (len, spare) in [(1usize, 4usize), (100, 4), (100, 0), (100, 9), (0, 4)] {
            let mut body = Vec::with_capacity(len + spare);
            body.extend((0..len).map(|i| i as u8));
            let expected = body.clone();
            let kept = body.capacity() == len + MEMORY_BODY_SPARE && len > 0;
            let before = body.as_ptr() as usize;
            let location = Location::memory_from_vec(body).expect("fits");
            assert_eq!(location.get(), Stored::Memory(&expected[..]));
            assert_eq!(
                location.memory_address() == Some(before),
                kept,
                "len {len} spare {spare}"
            );
        }
    }

    #[test]
    fn device_addresses_round_trip_every_bit() {
        for (device, rblock, rblocks) in [
            (0, 0, 1),
            (63, DeviceAddress::MAX_RBLOCK, DeviceAddress::MAX_RBLOCKS),
            (1, 12_345, 7),
        ] {
            let address = DeviceAddress::new(device, rblock, rblocks).expect("fits");
            let location = Location::device(address);
            assert_eq!(location.get(), Stored::Device(address));
            assert_eq!(location.device_address(), Some(address));
            assert_eq!(location.memory_address(), None);
            assert_eq!(location.size(), address.bytes() as usize);
        }
    }

    /// A location holds an address in 63 bits: a saved address whose
    /// rblock count needs the 24th bit (or is 0) is refused when read back,
    /// so it never reaches [`Location::device`]; every other field at its
    /// largest survives the packing beside the kind bit.
    #[test]
    fn saved_addresses_past_what_a_location_holds_are_refused() {
        let largest = DeviceAddress::new(63, DeviceAddress::MAX_RBLOCK, DeviceAddress::MAX_RBLOCKS)
            .expect("fits");
        assert_eq!(DeviceAddress::from_bits(largest.0), Some(largest));
        assert_eq!(Location::device(largest).device_address(), Some(largest));
        assert_eq!(DeviceAddress::new(0, 0, 1 << 23), None);
        assert_eq!(DeviceAddress::from_bits(1 << 23), None);
        assert_eq!(DeviceAddress::from_bits(largest.0 | (1 << 23)), None);
        assert_eq!(DeviceAddress::from_bits(5 << 24), None, "no rblocks");
        let smallest = DeviceAddress::new(0, 0, 1).expect("fits");
        assert_eq!(Location::device(smallest).memory_address(), None);
        assert_eq!(Location::device(smallest).get(), Stored::Device(smallest));
    }

    #[test]
    fn moves_keep_the_body_and_drops_free_it_once() {
        // Many moves through unaligned places (a Vec of 9-byte values) and
        // drops; run under Miri this also checks the allocation handling.
        let mut held: Vec<Location> = (0..50u8)
            .map(|i| Location::memory(&vec![i; usize::from(i) + 1]).expect("fits"))
            .collect();
        held.push(Location::device(DeviceAddress::new(2, 9, 3).expect("fits")));
        held.swap(3, 40);
        let taken = held.remove(10);
        assert_eq!(taken.get(), Stored::Memory(&[10u8; 11][..]));
        assert_eq!(held[3].get(), Stored::Memory(&[40u8; 41][..]));
        let replaced = std::mem::take(&mut held[0]);
        assert_eq!(replaced.size(), 1);
        assert_eq!(held[0].size(), 0);
        assert_ne!(held[1], held[2]);
        assert_eq!(held[1], Location::memory(&[1, 1]).expect("fits"));
    }
}
