//! Test support shared by the integration tests of several crates.
//!
//! It owns the choice of ports for the `citrined` processes tests start.
//! Asking the kernel for a free port (`bind` to port 0) hands out a port
//! from the ephemeral range, the same range the kernel draws the source
//! ports of outgoing connections from. Between the test releasing the port
//! and the node binding it, any outgoing connection may take it, including
//! the test's own "is it listening yet?" probe, which can connect to
//! itself (TCP simultaneous open) and then keeps the node from binding.
//! So ports come from below the ephemeral range instead, spread by process
//! id so that test binaries running at once rarely meet, and each is
//! checked free for TCP and UDP before it is handed out.
//!
//! Invariant: a port is handed out at most once per test process.

#![forbid(unsafe_code)]

use std::net::{TcpListener, UdpSocket};
use std::sync::atomic::{AtomicU32, Ordering};

/// First port handed out (below Linux's default ephemeral range,
/// 32768-60999, and above the usual service ports).
const FIRST: u32 = 20_000;
/// How many ports the range holds.
const SPAN: u32 = 12_000;
/// A step coprime with `SPAN`, so a process walks every port once.
const STEP: u32 = 7_919;

/// A port no other test of this process has had, free on 127.0.0.1 for
/// both TCP and UDP when this returns.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let origin = std::process::id().wrapping_mul(2_654_435_761) % SPAN;
    for _ in 0..SPAN {
        let turn = NEXT.fetch_add(1, Ordering::Relaxed);
        let offset = (origin + turn.wrapping_mul(STEP) % SPAN) % SPAN;
        let Ok(port) = u16::try_from(FIRST + offset) else {
            continue;
        };
        let tcp = TcpListener::bind(("127.0.0.1", port));
        let udp = UdpSocket::bind(("127.0.0.1", port));
        if tcp.is_ok() && udp.is_ok() {
            return port;
        }
    }
    panic!("no free port in {FIRST}..{}", FIRST + SPAN);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_bindable_and_outside_the_ephemeral_range() {
        let ports: Vec<u16> = (0..200).map(|_| free_port()).collect();
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ports.len(), "a port was handed out twice");
        for &port in &ports {
            assert!((20_000..32_000).contains(&port), "{port}");
        }
        // Still free: nothing kept them.
        let listener = TcpListener::bind(("127.0.0.1", ports[0]));
        assert!(listener.is_ok());
    }
}
