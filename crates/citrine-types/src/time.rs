//! Citrusleaf-epoch time: the protocol expresses void times as seconds since
//! 2010-01-01T00:00:00Z. This module only converts; it never reads a clock.

/// Unix time (seconds) of the citrusleaf epoch, 2010-01-01T00:00:00Z.
pub const CITRUSLEAF_EPOCH_UNIX_SECONDS: u64 = 1_262_304_000;

/// Unix time (milliseconds) of the citrusleaf epoch.
pub const CITRUSLEAF_EPOCH_UNIX_MS: u64 = CITRUSLEAF_EPOCH_UNIX_SECONDS * 1_000;

/// Converts Unix seconds to citrusleaf-epoch seconds (saturating at 0).
#[inline]
pub fn unix_to_citrusleaf(unix_seconds: u64) -> u32 {
    let since = unix_seconds.saturating_sub(CITRUSLEAF_EPOCH_UNIX_SECONDS);
    u32::try_from(since).unwrap_or(u32::MAX)
}

/// Converts Unix milliseconds to citrusleaf-epoch seconds.
#[inline]
pub fn citrusleaf_epoch_seconds(unix_milliseconds: u64) -> u32 {
    unix_to_citrusleaf(unix_milliseconds / 1000)
}

/// Converts Unix milliseconds to milliseconds since the citrusleaf epoch
/// (saturating at 0), as the reference reports last-update times and
/// truncation times (`truncate_lut`) in its info answers.
#[inline]
pub fn citrusleaf_epoch_ms(unix_milliseconds: u64) -> u64 {
    unix_milliseconds.saturating_sub(CITRUSLEAF_EPOCH_UNIX_SECONDS * 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_conversion() {
        assert_eq!(unix_to_citrusleaf(CITRUSLEAF_EPOCH_UNIX_SECONDS), 0);
        assert_eq!(unix_to_citrusleaf(0), 0);
        assert_eq!(unix_to_citrusleaf(CITRUSLEAF_EPOCH_UNIX_SECONDS + 5), 5);
        assert_eq!(
            citrusleaf_epoch_seconds((CITRUSLEAF_EPOCH_UNIX_SECONDS + 7) * 1000 + 999),
            7
        );
        assert_eq!(citrusleaf_epoch_ms(1_795_950_959_075), 533_646_959_075);
        assert_eq!(citrusleaf_epoch_ms(5), 0);
    }
}
