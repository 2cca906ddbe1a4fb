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
//!
//! [`slapd`] starts a throwaway OpenLDAP server for the LDAP tests.
//!
//! It also answers "is the process listening on this port the one the test
//! started?" ([`listener_is`]): a readiness probe that only connects can
//! be answered by some other process that holds the port, and the test
//! then talks to a stranger while its own node fails to start.

#![forbid(unsafe_code)]

pub mod slapd;

use std::net::{TcpListener, TcpStream, UdpSocket};
use std::process::Child;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

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

/// The bytes of a pseudo-random, well-spread record digest made from
/// `seed` (xorshift), the same for the same seed: for tests and benchmarks
/// that need many distinct digests without hashing keys.
pub fn digest_bytes(seed: u64) -> [u8; 20] {
    let mut bytes = [0u8; 20];
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for byte in bytes.iter_mut() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        *byte = state as u8;
    }
    bytes
}

/// True when `pid` holds the TCP socket listening on 127.0.0.1:`port` (or
/// on any address at that port): the socket inode from `/proc/net/tcp`
/// is among the process's open descriptors. False when nothing listens or
/// another process does.
pub fn listener_is(port: u16, pid: u32) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return false;
    };
    let wanted = format!(":{port:04X}");
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address, state (0A: LISTEN), inode.
            let (local, state, inode) = (fields.get(1)?, fields.get(3)?, fields.get(9)?);
            (local.ends_with(&wanted) && *state == "0A").then(|| format!("socket:[{inode}]"))
        })
        .collect();
    if inodes.is_empty() {
        return false;
    }
    let Ok(descriptors) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    descriptors.flatten().any(|entry| {
        std::fs::read_link(entry.path()).is_ok_and(|target| {
            inodes
                .iter()
                .any(|inode| target.as_os_str() == inode.as_str())
        })
    })
}

/// Waits until `child` itself listens on 127.0.0.1:`port` and accepts a
/// connection there. Panics, naming the port, when the child exits first
/// (with its status) or `within` passes (the child is then killed).
pub fn wait_until_serving(child: &mut Child, port: u16, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the process meant to serve on port {port} exited early with {status}");
        }
        // Ours, not another process holding the port: a probe that only
        // connects can be answered by a stranger while ours failed.
        if listener_is(port, child.id()) && TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("nothing of ours listened on port {port} within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
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

    #[test]
    fn listener_is_tells_our_listener_from_none_and_from_another_process() {
        let port = free_port();
        let me = std::process::id();
        assert!(!listener_is(port, me), "nothing listens yet");
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("the port was free");
        assert!(listener_is(port, me));
        // pid 1 (init) does not hold our socket.
        assert!(!listener_is(port, 1));
        drop(listener);
        assert!(!listener_is(port, me));
    }
}
