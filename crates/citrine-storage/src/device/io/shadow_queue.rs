//! The asynchronous side of a shadow device (as the reference writes its
//! shadows): writes are queued and written to the shadow, in order, by one
//! thread of the pair's own, so a write to the pair costs the primary's
//! write and a copy, not the shadow's latency.
//!
//! Owns: [`ShadowQueue`] (the queue, its writer thread and the shadow
//! medium).
//!
//! Invariants:
//! - the shadow receives the writes in the order they were queued (one
//!   writer, first in first out), so it always holds a prefix of the
//!   primary's history: rebuilt from it, a device is what the primary was
//!   at some earlier moment, whole up to the last [`ShadowQueue::sync`];
//! - the queue is bounded by bytes: a write that does not fit waits for
//!   room (never dropped); one larger than the bound goes alone;
//! - [`ShadowQueue::sync`] returns `Ok` only once everything queued before
//!   it is written to the shadow and synced there;
//! - a failed shadow write is logged once and sticks: every later push and
//!   sync answers the error, so the engine stops writing (its failed
//!   state) instead of going on without a shadow; the writes still queued
//!   are dropped from the queue only then (they are on the primary);
//! - dropping the queue writes out what is queued, then ends the thread.

use super::{AlignedBuf, BlockIo, DeviceIo};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::Arc;

/// A shadow written by its own thread from a bounded queue.
pub struct ShadowQueue {
    shared: Arc<Shared>,
    writer: Option<std::thread::JoinHandle<()>>,
}

struct Shared {
    shadow: DeviceIo,
    max_bytes: usize,
    state: Mutex<State>,
    /// Signalled when a write is queued or the queue is to stop.
    queued: Condvar,
    /// Signalled when a write is done (room in the queue, or drained) or
    /// the shadow failed.
    written: Condvar,
}

#[derive(Default)]
struct State {
    writes: VecDeque<(u64, AlignedBuf)>,
    /// Bytes queued or being written.
    bytes: usize,
    /// The first shadow write that failed.
    failed: Option<String>,
    stop: bool,
}

impl ShadowQueue {
    /// Starts the writer of `shadow`; at most `max_bytes` wait in the
    /// queue.
    pub fn start(shadow: DeviceIo, max_bytes: usize) -> std::io::Result<ShadowQueue> {
        let shared = Arc::new(Shared {
            shadow,
            max_bytes: max_bytes.max(1),
            state: Mutex::new(State::default()),
            queued: Condvar::new(),
            written: Condvar::new(),
        });
        let writer_shared = shared.clone();
        let writer = std::thread::Builder::new()
            .name("citrine-shadow".into())
            .spawn(move || writer_shared.run())?;
        Ok(ShadowQueue {
            shared,
            writer: Some(writer),
        })
    }

    /// Queues a copy of `bytes` for `offset`, waiting for room first.
    pub fn push(&self, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
        let shared = &self.shared;
        let mut state = shared.state.lock();
        loop {
            if let Some(why) = &state.failed {
                return Err(failure(why));
            }
            if state.bytes == 0 || state.bytes + bytes.len() <= shared.max_bytes {
                break;
            }
            shared.written.wait(&mut state);
        }
        let mut copy = AlignedBuf::zeroed(bytes.len());
        copy.as_mut_slice().copy_from_slice(bytes);
        state.bytes += bytes.len();
        state.writes.push_back((offset, copy));
        shared.queued.notify_one();
        Ok(())
    }

    /// Waits until every queued write is on the shadow, then syncs it.
    pub fn sync(&self) -> std::io::Result<()> {
        let shared = &self.shared;
        {
            let mut state = shared.state.lock();
            while state.failed.is_none() && state.bytes > 0 {
                shared.written.wait(&mut state);
            }
            if let Some(why) = &state.failed {
                return Err(failure(why));
            }
        }
        shared.shadow.sync()
    }

    /// Bytes queued and not yet written to the shadow.
    pub fn queued_bytes(&self) -> usize {
        self.shared.state.lock().bytes
    }
}

fn failure(why: &str) -> std::io::Error {
    std::io::Error::other(format!("shadow write failed earlier: {why}"))
}

impl Shared {
    /// The writer thread: takes the oldest write, does it outside the lock,
    /// until told to stop with nothing left.
    fn run(&self) {
        loop {
            let (offset, bytes) = {
                let mut state = self.state.lock();
                while state.writes.is_empty() && !state.stop {
                    self.queued.wait(&mut state);
                }
                let Some(next) = state.writes.pop_front() else {
                    return;
                };
                next
            };
            let result = self.shadow.write_at(offset, bytes.as_slice());
            let mut state = self.state.lock();
            state.bytes -= bytes.as_slice().len();
            if let Err(error) = result {
                tracing::error!(offset, %error, "shadow write failed: the device stops taking writes");
                state.failed = Some(error.to_string());
                state.writes.clear();
                state.bytes = 0;
            }
            self.written.notify_all();
        }
    }
}

impl Drop for ShadowQueue {
    fn drop(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.queued.notify_all();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}
