//! A cache-line prefetch hint: the one `unsafe` line of this crate.
//!
//! Owns nothing. Invariant: [`prefetch`] never reads or writes memory as the
//! program sees it: it is a hint to the CPU to start loading a line into
//! the cache, which cannot fault, even for an address that is stale or was
//! never mapped. Callers use it to overlap the cache misses of several
//! lookups (see [`crate::PartitionTable::prefetch_record`]); a wrong
//! address costs a wasted load, never correctness.
#![allow(unsafe_code)]

/// Asks the CPU to bring the cache line holding `address` into the cache.
#[inline(always)]
pub fn prefetch(address: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: PREFETCHT0 is a hint; it does not access memory
        // architecturally and does not fault on any address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(address as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = address;
    }
}

#[cfg(test)]
mod tests {
    use super::prefetch;

    #[test]
    fn any_address_is_harmless() {
        let data = vec![7u8; 256];
        prefetch(data.as_ptr() as usize);
        prefetch(0);
        prefetch(usize::MAX);
        assert_eq!(data[255], 7);
    }
}
