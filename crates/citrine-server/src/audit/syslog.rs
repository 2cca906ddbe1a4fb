//! Audit lines to the local syslog daemon through the C library's
//! `openlog`/`syslog`, behind a safe wrapper.
//!
//! Invariants: `openlog` is called once, with a `'static` identity (the C
//! library keeps the pointer); every message is passed as the argument of
//! a constant `"%s"` format, never as the format itself, and a message
//! with an interior NUL is cut at it.

#![allow(unsafe_code)]

use std::ffi::CString;

const IDENTITY: &std::ffi::CStr = c"citrined";

/// An open syslog connection with facility local0 to local7.
pub struct Syslog {
    facility: libc::c_int,
}

impl Syslog {
    /// Opens syslog for facility `local` (0 to 7; larger values are
    /// taken as 7).
    pub fn open(local: u8) -> Syslog {
        let facility = facility(local);
        // SAFETY: IDENTITY is a NUL-terminated string that lives for the
        // whole program, as openlog requires; the flags are valid.
        unsafe {
            libc::openlog(
                IDENTITY.as_ptr(),
                libc::LOG_PID | libc::LOG_NDELAY,
                facility,
            )
        };
        Syslog { facility }
    }

    /// Sends one message at INFO.
    pub fn info(&self, text: &str) {
        let text = text.split('\0').next().unwrap_or_default();
        let Ok(message) = CString::new(text) else {
            return;
        };
        // SAFETY: both pointers are valid NUL-terminated strings for the
        // call, and the format "%s" takes exactly the one string given.
        unsafe {
            libc::syslog(
                self.facility | libc::LOG_INFO,
                c"%s".as_ptr(),
                message.as_ptr(),
            )
        };
    }
}

/// The facility code of local`n`.
fn facility(local: u8) -> libc::c_int {
    [
        libc::LOG_LOCAL0,
        libc::LOG_LOCAL1,
        libc::LOG_LOCAL2,
        libc::LOG_LOCAL3,
        libc::LOG_LOCAL4,
        libc::LOG_LOCAL5,
        libc::LOG_LOCAL6,
        libc::LOG_LOCAL7,
    ][usize::from(local.min(7))]
}

#[cfg(test)]
mod tests {
    #[test]
    fn local_n_is_the_c_librarys_facility() {
        assert_eq!(super::facility(0), libc::LOG_LOCAL0);
        assert_eq!(super::facility(5), libc::LOG_LOCAL5);
        assert_eq!(super::facility(200), libc::LOG_LOCAL7);
    }
}
