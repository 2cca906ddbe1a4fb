//! An io_uring instance that owns the buffers of the operations it has in
//! flight. This is the only module of the server with `unsafe` code.
//!
//! The kernel writes into a receive buffer (and reads a send buffer) at
//! some later time, so the buffer must neither move, shrink nor be freed
//! before the operation's completion is reaped. The API makes that a
//! matter of ownership instead of care: [`Ring::recv`] and [`Ring::send`]
//! take the `Vec<u8>` by value and [`Ring::reap`] gives it back with the
//! completion. Between the two the ring holds the vector and never touches
//! it. Dropping the ring cancels what is in flight and waits for it; a
//! buffer the kernel still holds after that is leaked, never freed.
//!
//! A multishot receive ([`Ring::recv_multishot`]) stays armed on its socket
//! and completes once for every batch of bytes that arrives, each time in
//! one of the ring's provided buffers ([`Ring::provide_buffers`]): the
//! kernel picks a free one, and the caller reads it
//! ([`Ring::provided`]) and hands it back ([`Ring::give_back`]).
//!
//! Invariants:
//! - every operation's `user_data` is unique among those in flight (slot
//!   index and a per-slot sequence number), so a cancel never hits a
//!   newer operation that reused the slot;
//! - `in_flight` counts the operations whose last completion is not
//!   reaped (a multishot receive's last completion is the one without
//!   `IORING_CQE_F_MORE`);
//! - a provided buffer is either the kernel's (published in the buffer
//!   ring) or the caller's (named by a reaped completion, not yet given
//!   back), never both: `PROVIDED` memory the kernel may write is never
//!   read, and a buffer is published again only once.
//!
//! Set-up: `SINGLE_ISSUER | DEFER_TASKRUN` when the kernel has them
//! (completion work then runs only inside this thread's `io_uring_enter`,
//! batched); plain otherwise. The ring must be created, used and dropped
//! by one thread.
#![allow(unsafe_code)]

use io_uring::{cqueue, opcode, types, IoUring};
use std::alloc::{self, Layout};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

/// Identifies an operation in flight, for [`Ring::cancel`].
pub(super) type OpId = u64;

/// The socket an operation works on.
#[derive(Clone, Copy)]
pub(super) enum Target<'a> {
    Fd(BorrowedFd<'a>),
    /// A slot of the ring's registered file table ([`Ring::install`]):
    /// the kernel skips looking the descriptor up and counting a
    /// reference to its file for every operation.
    Fixed(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OpKind {
    Recv,
    /// A multishot receive into provided buffers.
    RecvMulti,
    Send,
}

/// A reaped completion: its buffer is the caller's again (a multishot
/// receive's completions carry an empty one and name a provided buffer).
pub(super) struct Completion {
    /// What the caller tagged the operation with.
    pub(super) tag: u64,
    pub(super) kind: OpKind,
    /// Bytes moved, or a negated `errno`.
    pub(super) result: i32,
    pub(super) buf: Vec<u8>,
    /// The provided buffer holding the bytes, now the caller's until
    /// [`Ring::give_back`].
    pub(super) provided: Option<u16>,
    /// More completions of the same operation will follow (the multishot
    /// receive is still armed).
    pub(super) more: bool,
}

struct Op {
    tag: u64,
    kind: OpKind,
    sequence: u32,
    /// Owned by the kernel until the completion is reaped: not touched.
    buf: Vec<u8>,
}

/// `user_data` of cancel requests; their completions carry no buffer.
const CANCEL_USER_DATA: u64 = u64::MAX;
/// How long a dropped ring waits for the kernel to give buffers back.
const DROP_GRACE: Duration = Duration::from_secs(1);

/// The buffer group id of the ring's provided buffers.
const BUFFER_GROUP: u16 = 0;

pub(super) struct Ring {
    ring: IoUring,
    /// Slots in the registered file table (0: none could be registered).
    fixed_slots: u32,
    ops: Vec<Option<Op>>,
    free: Vec<u32>,
    sequence: u32,
    in_flight: usize,
    /// Buffers for multishot receives, once registered.
    provided: Option<ProvidedBuffers>,
}

impl Ring {
    /// A ring with room for `entries` submissions at a time (completions
    /// beyond the queue's size are kept by the kernel, not dropped).
    pub(super) fn new(entries: u32, fixed_slots: u32) -> io::Result<Ring> {
        let cq_entries = entries.saturating_mul(4);
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_cqsize(cq_entries)
            .build(entries)
            .or_else(|_| IoUring::builder().setup_cqsize(cq_entries).build(entries))?;
        let params = ring.params();
        if !params.is_feature_ext_arg() || !params.is_feature_nodrop() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the kernel's io_uring lacks EXT_ARG or NODROP (Linux 5.11 or later is needed)",
            ));
        }
        let fixed_slots = match fixed_slots {
            0 => 0,
            wanted => match ring.submitter().register_files_sparse(wanted) {
                Ok(()) => wanted,
                Err(error) => {
                    tracing::debug!("no registered file table ({error}): plain descriptors");
                    0
                }
            },
        };
        Ok(Ring {
            ring,
            fixed_slots,
            ops: Vec::new(),
            free: Vec::new(),
            sequence: 0,
            in_flight: 0,
            provided: None,
        })
    }

    /// Registers `count` buffers of `size` bytes (`count` a power of two)
    /// for multishot receives. Fails where the kernel lacks buffer rings
    /// (before 5.19); the caller then keeps to single receives.
    pub(super) fn provide_buffers(&mut self, count: u16, size: u32) -> io::Result<()> {
        if self.provided.is_some() {
            return Err(io::Error::other("buffers are already provided"));
        }
        let mut buffers = ProvidedBuffers::new(count, size)?;
        // SAFETY: the ring memory stays allocated, at this address, until
        // `Drop` unregisters it (or leaks it when the kernel may still use
        // it).
        let registered = unsafe {
            self.ring.submitter().register_buf_ring_with_flags(
                buffers.ring as u64,
                count,
                BUFFER_GROUP,
                0,
            )
        };
        if let Err(error) = registered {
            buffers.free();
            return Err(error);
        }
        buffers.publish_all();
        self.provided = Some(buffers);
        Ok(())
    }

    /// Whether multishot receives can be started.
    pub(super) fn has_provided_buffers(&self) -> bool {
        self.provided.is_some()
    }

    /// The first `len` bytes of provided buffer `id`, which a reaped
    /// completion handed to the caller. `None` for an id that is not the
    /// caller's or a length past the buffer (a bug: the caller must not
    /// carry on as if the bytes had arrived).
    pub(super) fn provided(&self, id: u16, len: usize) -> Option<&[u8]> {
        self.provided.as_ref()?.bytes(id, len)
    }

    /// Hands provided buffer `id` back to the kernel.
    pub(super) fn give_back(&mut self, id: u16) {
        match &mut self.provided {
            Some(buffers) => buffers.give_back(id),
            None => debug_assert!(false, "no provided buffers"),
        }
    }

    /// Operations whose completion is not reaped yet.
    #[cfg(test)]
    pub(super) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Slots of the registered file table.
    pub(super) fn fixed_slots(&self) -> u32 {
        self.fixed_slots
    }

    /// Puts `fd` in slot `slot` of the registered file table. The table
    /// holds its own reference to the file: the socket stays open until
    /// [`Ring::remove`] (or the ring's end), whatever happens to `fd`.
    pub(super) fn install(&mut self, slot: u32, fd: BorrowedFd<'_>) -> io::Result<()> {
        debug_assert!(slot < self.fixed_slots);
        self.ring
            .submitter()
            .register_files_update(slot, &[fd.as_raw_fd()])
            .map(drop)
    }

    /// Empties slot `slot`. Operations already handed to the kernel keep
    /// the file they started with; queued ones must be submitted first.
    pub(super) fn remove(&mut self, slot: u32) -> io::Result<()> {
        debug_assert!(slot < self.fixed_slots);
        self.ring
            .submitter()
            .register_files_update(slot, &[-1])
            .map(drop)
    }

    /// Receives into `buf[from..]`. On error the buffer comes back.
    pub(super) fn recv(
        &mut self,
        target: Target<'_>,
        tag: u64,
        mut buf: Vec<u8>,
        from: usize,
    ) -> Result<OpId, (io::Error, Vec<u8>)> {
        if from >= buf.len() {
            let error = io::Error::new(io::ErrorKind::InvalidInput, "a receive needs free space");
            return Err((error, buf));
        }
        let len = u32::try_from(buf.len() - from).unwrap_or(u32::MAX);
        let pointer = buf[from..].as_mut_ptr();
        let entry = match target {
            Target::Fd(fd) => opcode::Recv::new(types::Fd(fd.as_raw_fd()), pointer, len).build(),
            Target::Fixed(slot) => opcode::Recv::new(types::Fixed(slot), pointer, len).build(),
        };
        self.start(entry, tag, OpKind::Recv, buf)
    }

    /// Starts a multishot receive: it completes whenever bytes arrive, each
    /// time in a provided buffer, until a completion without `more` (the
    /// peer closed, an error, a cancel, or no free buffer: `-ENOBUFS`).
    pub(super) fn recv_multishot(&mut self, target: Target<'_>, tag: u64) -> io::Result<OpId> {
        if self.provided.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a multishot receive needs provided buffers",
            ));
        }
        let entry = match target {
            Target::Fd(fd) => {
                opcode::RecvMulti::new(types::Fd(fd.as_raw_fd()), BUFFER_GROUP).build()
            }
            Target::Fixed(slot) => opcode::RecvMulti::new(types::Fixed(slot), BUFFER_GROUP).build(),
        };
        self.start(entry, tag, OpKind::RecvMulti, Vec::new())
            .map_err(|(error, _)| error)
    }

    /// Sends `buf[from..]`. On error the buffer comes back.
    pub(super) fn send(
        &mut self,
        target: Target<'_>,
        tag: u64,
        buf: Vec<u8>,
        from: usize,
    ) -> Result<OpId, (io::Error, Vec<u8>)> {
        if from >= buf.len() {
            let error = io::Error::new(io::ErrorKind::InvalidInput, "a send needs bytes");
            return Err((error, buf));
        }
        let len = u32::try_from(buf.len() - from).unwrap_or(u32::MAX);
        let pointer = buf[from..].as_ptr();
        let entry = match target {
            Target::Fd(fd) => opcode::Send::new(types::Fd(fd.as_raw_fd()), pointer, len).build(),
            Target::Fixed(slot) => opcode::Send::new(types::Fixed(slot), pointer, len).build(),
        };
        self.start(entry, tag, OpKind::Send, buf)
    }

    /// Asks the kernel to cancel operation `op` (its completion still
    /// comes, with `-ECANCELED` or with what it did before the cancel).
    pub(super) fn cancel(&mut self, op: OpId) -> io::Result<()> {
        let entry = opcode::AsyncCancel::new(op)
            .build()
            .user_data(CANCEL_USER_DATA);
        self.push(&entry)
    }

    /// Hands the queued submissions to the kernel without waiting.
    pub(super) fn submit(&mut self) -> io::Result<()> {
        self.ring.submit().map(drop)
    }

    /// Submits what is queued and waits until a completion is ready or
    /// `timeout` has passed (zero: only runs what is already done).
    pub(super) fn wait(&mut self, timeout: Duration) -> io::Result<()> {
        let timespec = types::Timespec::from(timeout);
        let args = types::SubmitArgs::new().timespec(&timespec);
        match self.ring.submitter().submit_with_args(1, &args) {
            Ok(_) => Ok(()),
            Err(error)
                if matches!(
                    error.raw_os_error(),
                    Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)
                ) =>
            {
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    /// Moves the completions that are ready to `out`, with their buffers.
    pub(super) fn reap(&mut self, out: &mut Vec<Completion>) {
        let ops = &mut self.ops;
        let free = &mut self.free;
        let in_flight = &mut self.in_flight;
        let mut provided = self.provided.as_mut();
        for entry in self.ring.completion() {
            let user_data = entry.user_data();
            if user_data == CANCEL_USER_DATA {
                continue;
            }
            let flags = entry.flags();
            let buffer = cqueue::buffer_select(flags);
            if let (Some(id), Some(buffers)) = (buffer, provided.as_deref_mut()) {
                buffers.taken(id);
            }
            let index = (user_data & u64::from(u32::MAX)) as usize;
            let sequence = (user_data >> 32) as u32;
            let slot = ops
                .get_mut(index)
                .filter(|slot| matches!(slot, Some(op) if op.sequence == sequence));
            let Some(slot) = slot else {
                debug_assert!(false, "completion for an unknown operation in slot {index}");
                // Its buffer, if it names one, is not lost to the ring.
                if let (Some(id), Some(buffers)) = (buffer, provided.as_deref_mut()) {
                    buffers.give_back(id);
                }
                continue;
            };
            if cqueue::more(flags) {
                // A multishot receive that stays armed keeps its slot.
                if let Some(op) = slot.as_ref() {
                    debug_assert_eq!(op.kind, OpKind::RecvMulti);
                    out.push(Completion {
                        tag: op.tag,
                        kind: op.kind,
                        result: entry.result(),
                        buf: Vec::new(),
                        provided: buffer,
                        more: true,
                    });
                }
                continue;
            }
            if let Some(op) = slot.take() {
                free.push(index as u32);
                *in_flight -= 1;
                out.push(Completion {
                    tag: op.tag,
                    kind: op.kind,
                    result: entry.result(),
                    buf: op.buf,
                    provided: buffer,
                    more: false,
                });
            }
        }
    }

    fn start(
        &mut self,
        entry: io_uring::squeue::Entry,
        tag: u64,
        kind: OpKind,
        buf: Vec<u8>,
    ) -> Result<OpId, (io::Error, Vec<u8>)> {
        let index = match self.free.pop() {
            Some(index) => index,
            None => match u32::try_from(self.ops.len()) {
                Ok(index) if index < u32::MAX => {
                    self.ops.push(None);
                    index
                }
                _ => {
                    let error = io::Error::other("too many operations in flight");
                    return Err((error, buf));
                }
            },
        };
        self.sequence = self.sequence.wrapping_add(1);
        let op_id = u64::from(self.sequence) << 32 | u64::from(index);
        if let Err(error) = self.push(&entry.user_data(op_id)) {
            self.free.push(index);
            return Err((error, buf));
        }
        // The entry points into `buf`'s heap block; moving the vector into
        // its slot moves only the handle, and the slot keeps it untouched
        // until `reap` takes it out with the completion.
        self.ops[index as usize] = Some(Op {
            tag,
            kind,
            sequence: self.sequence,
            buf,
        });
        self.in_flight += 1;
        Ok(op_id)
    }

    fn push(&mut self, entry: &io_uring::squeue::Entry) -> io::Result<()> {
        for _ in 0..2 {
            // SAFETY: the buffers an entry points to are owned by `ops`
            // until the completion is reaped (see `start`), or leaked when
            // the ring is dropped with the operation still in flight.
            let pushed = unsafe { self.ring.submission().push(entry) };
            if pushed.is_ok() {
                return Ok(());
            }
            // The submission queue is full: hand it to the kernel.
            self.ring.submit()?;
        }
        Err(io::Error::other("the io_uring submission queue stays full"))
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        if self.in_flight > 0 {
            let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any())
                .build()
                .user_data(CANCEL_USER_DATA);
            if self.push(&cancel).is_ok() {
                let deadline = Instant::now() + DROP_GRACE;
                let mut done = Vec::new();
                while self.in_flight > 0 && Instant::now() < deadline {
                    if self.wait(Duration::from_millis(50)).is_err() {
                        break;
                    }
                    self.reap(&mut done);
                    done.clear();
                }
            }
        }
        // What the kernel may still write to must outlive it.
        for op in self.ops.drain(..).flatten() {
            std::mem::forget(op.buf);
        }
        if let Some(buffers) = self.provided.take() {
            let unregistered = self.in_flight == 0
                && self
                    .ring
                    .submitter()
                    .unregister_buf_ring(BUFFER_GROUP)
                    .is_ok();
            if unregistered {
                buffers.free();
            }
            // Otherwise the kernel may still write to them: leaked.
        }
    }
}

/// A registered ring of provided buffers: `count` buffers of `size` bytes
/// in one block, and the ring of entries through which they are handed to
/// the kernel (its tail is the only field the kernel reads concurrently).
/// Without `free` its memory is leaked, never freed under the kernel.
struct ProvidedBuffers {
    /// The entries: page-aligned, `count` × 16 bytes.
    ring: *mut types::BufRingEntry,
    ring_layout: Layout,
    memory: *mut u8,
    memory_layout: Layout,
    size: u32,
    mask: u16,
    /// Our copy of the tail the kernel reads.
    tail: u16,
    /// Which buffers a completion has handed to the caller.
    ours: Vec<bool>,
}

impl ProvidedBuffers {
    fn new(count: u16, size: u32) -> io::Result<ProvidedBuffers> {
        if !count.is_power_of_two() || count > 1 << 15 || size == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "provided buffers: a power-of-two count up to 32768 of non-empty buffers",
            ));
        }
        let entries = usize::from(count) * std::mem::size_of::<types::BufRingEntry>();
        let ring_layout = Layout::from_size_align(entries.max(4096), 4096)
            .map_err(|_| io::Error::other("provided buffer ring layout"))?;
        let memory_layout = Layout::from_size_align(usize::from(count) * size as usize, 64)
            .map_err(|_| io::Error::other("provided buffer layout"))?;
        // SAFETY: both layouts have a non-zero size.
        let ring = unsafe { alloc::alloc_zeroed(ring_layout) }.cast::<types::BufRingEntry>();
        if ring.is_null() {
            return Err(io::Error::from(io::ErrorKind::OutOfMemory));
        }
        // SAFETY: as above.
        let memory = unsafe { alloc::alloc_zeroed(memory_layout) };
        if memory.is_null() {
            // SAFETY: allocated just above with this layout.
            unsafe { alloc::dealloc(ring.cast(), ring_layout) };
            return Err(io::Error::from(io::ErrorKind::OutOfMemory));
        }
        Ok(ProvidedBuffers {
            ring,
            ring_layout,
            memory,
            memory_layout,
            size,
            mask: count - 1,
            tail: 0,
            ours: vec![true; usize::from(count)],
        })
    }

    /// Hands every buffer to the kernel (right after registration).
    fn publish_all(&mut self) {
        for id in 0..=self.mask {
            self.give_back(id);
        }
    }

    fn give_back(&mut self, id: u16) {
        let owned = self.ours.get_mut(usize::from(id));
        debug_assert!(
            owned.as_deref() == Some(&true),
            "buffer {id} is not ours to give back"
        );
        let Some(owned) = owned else { return };
        if !std::mem::replace(owned, false) {
            return;
        }
        let slot = usize::from(self.tail & self.mask);
        // SAFETY: `slot` < count: inside the ring's allocation. The kernel
        // reads this entry only once the tail below covers it.
        let entry = unsafe { &mut *self.ring.add(slot) };
        entry.set_addr(self.memory as u64 + u64::from(id) * u64::from(self.size));
        entry.set_len(self.size);
        entry.set_bid(id);
        self.tail = self.tail.wrapping_add(1);
        // SAFETY: the tail is a 2-byte aligned u16 inside entry 0, which
        // the kernel only reads; the release store publishes the entry.
        let tail = unsafe { &*types::BufRingEntry::tail(self.ring).cast::<AtomicU16>() };
        tail.store(self.tail, Ordering::Release);
    }

    /// A completion handed buffer `id` to the caller.
    fn taken(&mut self, id: u16) {
        match self.ours.get_mut(usize::from(id)) {
            Some(owned) => {
                debug_assert!(!*owned, "buffer {id} handed out twice");
                *owned = true;
            }
            None => debug_assert!(false, "the kernel named buffer {id}, past the ring"),
        }
    }

    fn bytes(&self, id: u16, len: usize) -> Option<&[u8]> {
        if self.ours.get(usize::from(id)) != Some(&true) || len > self.size as usize {
            return None;
        }
        // SAFETY: the buffer lies inside `memory`, and it is the caller's
        // (the kernel does not write it) until `give_back`, which needs
        // `&mut self` and so ends this borrow first.
        Some(unsafe {
            std::slice::from_raw_parts(self.memory.add(usize::from(id) * self.size as usize), len)
        })
    }

    /// Frees the memory; only once the kernel has let go of it.
    fn free(self) {
        // SAFETY: allocated in `new` with these layouts, freed once.
        unsafe {
            alloc::dealloc(self.ring.cast(), self.ring_layout);
            alloc::dealloc(self.memory, self.memory_layout);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    /// The ring, or `None` (the test is skipped) where io_uring is not
    /// allowed, unless the run requires it (`CITRINE_REQUIRE_IO_URING=1`).
    fn ring() -> Option<Ring> {
        match Ring::new(8, 4) {
            Ok(ring) => Some(ring),
            Err(error) if std::env::var("CITRINE_REQUIRE_IO_URING").as_deref() != Ok("1") => {
                eprintln!("io_uring unavailable here ({error}); skipping");
                None
            }
            Err(error) => panic!("io_uring is required but unavailable: {error}"),
        }
    }

    fn reap_one(ring: &mut Ring) -> Completion {
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while out.is_empty() {
            assert!(Instant::now() < deadline, "no completion within 5 s");
            ring.wait(Duration::from_millis(100)).expect("wait");
            ring.reap(&mut out);
        }
        assert_eq!(out.len(), 1);
        out.remove(0)
    }

    #[test]
    fn receive_and_send_give_their_buffers_back() {
        let Some(mut ring) = ring() else { return };
        let (mine, mut peer) = UnixStream::pair().expect("pair");
        let mut buf = vec![0u8; 16];
        buf[..3].copy_from_slice(b"xyz");
        ring.recv(Target::Fd(mine.as_fd()), 7, buf, 3)
            .map_err(|e| e.0)
            .expect("recv");
        assert_eq!(ring.in_flight(), 1);
        ring.submit().expect("submit");
        peer.write_all(b"hello").expect("write");
        let done = reap_one(&mut ring);
        assert_eq!((done.tag, done.kind, done.result), (7, OpKind::Recv, 5));
        assert_eq!(&done.buf[..8], b"xyzhello");
        assert_eq!(ring.in_flight(), 0);

        ring.send(Target::Fd(mine.as_fd()), 9, b"..reply".to_vec(), 2)
            .map_err(|e| e.0)
            .expect("send");
        let done = reap_one(&mut ring);
        assert_eq!((done.tag, done.kind, done.result), (9, OpKind::Send, 5));
        let mut got = [0u8; 5];
        peer.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"reply");
    }

    #[test]
    fn a_cancelled_receive_comes_back_and_a_dropped_ring_waits_for_its_buffers() {
        let Some(mut ring) = ring() else { return };
        let (mine, _peer) = UnixStream::pair().expect("pair");
        let op = ring
            .recv(Target::Fd(mine.as_fd()), 1, vec![0u8; 8], 0)
            .map_err(|e| e.0)
            .expect("recv");
        ring.submit().expect("submit");
        ring.cancel(op).expect("cancel");
        let done = reap_one(&mut ring);
        assert_eq!(done.result, -libc::ECANCELED);
        assert_eq!(done.buf.len(), 8);

        // In flight at drop: cancelled and waited for, not freed under the
        // kernel's feet.
        ring.recv(Target::Fd(mine.as_fd()), 2, vec![0u8; 8], 0)
            .map_err(|e| e.0)
            .expect("recv");
        ring.submit().expect("submit");
        let started = Instant::now();
        drop(ring);
        assert!(started.elapsed() < DROP_GRACE);
    }

    #[test]
    fn more_operations_than_queue_entries_are_all_carried_out() {
        let Some(mut ring) = ring() else { return };
        // Eight entries, forty receives: pushing submits when the queue is
        // full, and every receive still completes with its own bytes.
        let pairs: Vec<(UnixStream, UnixStream)> =
            (0..40).map(|_| UnixStream::pair().expect("pair")).collect();
        for (index, (mine, _)) in pairs.iter().enumerate() {
            ring.recv(Target::Fd(mine.as_fd()), index as u64, vec![0u8; 4], 0)
                .map_err(|e| e.0)
                .expect("recv");
        }
        assert_eq!(ring.in_flight(), 40);
        ring.submit().expect("submit");
        for (index, (_, peer)) in pairs.iter().enumerate() {
            (&*peer).write_all(&[index as u8]).expect("write");
        }
        let mut done = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while done.len() < 40 {
            assert!(Instant::now() < deadline, "{} of 40 completed", done.len());
            ring.wait(Duration::from_millis(100)).expect("wait");
            ring.reap(&mut done);
        }
        for completion in &done {
            assert_eq!(completion.result, 1);
            assert_eq!(u64::from(completion.buf[0]), completion.tag);
        }
        assert_eq!(ring.in_flight(), 0);
    }

    #[test]
    fn a_registered_socket_works_by_slot_and_closes_only_when_removed() {
        let Some(mut ring) = ring() else { return };
        assert_eq!(ring.fixed_slots(), 4);
        let (mine, mut peer) = UnixStream::pair().expect("pair");
        ring.install(2, mine.as_fd()).expect("install");
        // The table keeps the socket open after our descriptor is gone.
        drop(mine);
        peer.write_all(b"ping").expect("write");
        ring.recv(Target::Fixed(2), 5, vec![0u8; 8], 0)
            .map_err(|e| e.0)
            .expect("recv");
        let done = reap_one(&mut ring);
        assert_eq!((done.tag, done.result), (5, 4));
        assert_eq!(&done.buf[..4], b"ping");
        ring.send(Target::Fixed(2), 6, b"pong".to_vec(), 0)
            .map_err(|e| e.0)
            .expect("send");
        assert_eq!(reap_one(&mut ring).result, 4);
        let mut got = [0u8; 4];
        peer.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"pong");
        // Removed from the table, the socket closes: the peer reads 0.
        ring.remove(2).expect("remove");
        peer.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        assert_eq!(peer.read(&mut got).expect("read after close"), 0);
    }

    /// Reaps until `want` completions are in, or 5 s have passed.
    fn reap_n(ring: &mut Ring, want: usize) -> Vec<Completion> {
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while out.len() < want {
            assert!(
                Instant::now() < deadline,
                "{} of {want} completions",
                out.len()
            );
            ring.wait(Duration::from_millis(100)).expect("wait");
            ring.reap(&mut out);
        }
        out
    }

    #[test]
    fn a_multishot_receive_completes_once_per_arrival_in_provided_buffers() {
        let Some(mut ring) = ring() else { return };
        assert!(
            ring.recv_multishot(Target::Fixed(0), 1).is_err(),
            "needs buffers"
        );
        ring.provide_buffers(4, 8).expect("provide buffers");
        assert!(ring.has_provided_buffers());
        let (mine, mut peer) = UnixStream::pair().expect("pair");
        ring.recv_multishot(Target::Fd(mine.as_fd()), 3)
            .expect("recv multishot");
        ring.submit().expect("submit");
        // Six arrivals, more than there are buffers: each one's buffer is
        // given back before the next, so the one operation carries them all.
        for round in 0..6u8 {
            peer.write_all(&[b'a' + round; 5]).expect("write");
            let done = reap_n(&mut ring, 1).remove(0);
            assert_eq!(
                (done.tag, done.kind, done.result),
                (3, OpKind::RecvMulti, 5)
            );
            assert!(done.more, "still armed");
            let id = done.provided.expect("a provided buffer");
            assert_eq!(ring.provided(id, 5), Some(&[b'a' + round; 5][..]));
            ring.give_back(id);
            assert_eq!(ring.in_flight(), 1);
        }
        // An arrival longer than a buffer takes several, in order.
        peer.write_all(b"0123456789abcdefghij").expect("write");
        let mut got = Vec::new();
        while got.len() < 20 {
            for done in reap_n(&mut ring, 1) {
                assert!(done.result > 0 && done.more);
                let id = done.provided.expect("buffer");
                got.extend_from_slice(ring.provided(id, done.result as usize).expect("ours"));
                ring.give_back(id);
            }
        }
        assert_eq!(got, b"0123456789abcdefghij");
        // The peer's close ends it: a last completion of 0 bytes.
        drop(peer);
        let done = reap_n(&mut ring, 1).remove(0);
        assert_eq!((done.result, done.more), (0, false));
        assert_eq!(ring.in_flight(), 0);
    }

    #[test]
    fn a_multishot_receive_ends_when_buffers_run_out_and_when_cancelled() {
        let Some(mut ring) = ring() else { return };
        ring.provide_buffers(2, 4).expect("provide buffers");
        let (mine, mut peer) = UnixStream::pair().expect("pair");
        ring.recv_multishot(Target::Fd(mine.as_fd()), 9)
            .expect("recv multishot");
        ring.submit().expect("submit");
        // Twelve bytes, two buffers of four, none given back: the third
        // arrival finds no buffer and the receive ends with -ENOBUFS.
        peer.write_all(b"abcdefghijkl").expect("write");
        let mut done = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while done.last().is_none_or(|last: &Completion| last.more) {
            assert!(Instant::now() < deadline, "the receive did not end");
            ring.wait(Duration::from_millis(100)).expect("wait");
            ring.reap(&mut done);
        }
        let last = done.pop().expect("the last completion");
        assert_eq!((last.result, last.provided), (-libc::ENOBUFS, None));
        assert_eq!(done.len(), 2);
        let mut ids: Vec<u16> = done.iter().filter_map(|d| d.provided).collect();
        ids.sort_unstable();
        assert_eq!(ids, [0, 1]);
        for id in ids {
            ring.give_back(id);
        }
        assert_eq!(ring.in_flight(), 0);

        // Armed again, the rest arrives; then a cancel ends it.
        let op = ring
            .recv_multishot(Target::Fd(mine.as_fd()), 10)
            .expect("recv multishot");
        let first = reap_n(&mut ring, 1).remove(0);
        assert!(first.more);
        let id = first.provided.expect("buffer");
        assert_eq!(ring.provided(id, first.result as usize), Some(&b"ijkl"[..]));
        ring.give_back(id);
        ring.cancel(op).expect("cancel");
        let done = reap_n(&mut ring, 1).remove(0);
        assert_eq!((done.result, done.more), (-libc::ECANCELED, false));
        assert_eq!(ring.in_flight(), 0);

        // A ring dropped with a multishot receive armed waits for it.
        ring.recv_multishot(Target::Fd(mine.as_fd()), 11)
            .expect("recv multishot");
        ring.submit().expect("submit");
        let started = Instant::now();
        drop(ring);
        assert!(started.elapsed() < DROP_GRACE);
    }

    #[test]
    fn a_wait_with_nothing_to_do_returns_after_its_timeout() {
        let Some(mut ring) = ring() else { return };
        let started = Instant::now();
        ring.wait(Duration::from_millis(30)).expect("wait");
        assert!(started.elapsed() >= Duration::from_millis(25));
        let mut out = Vec::new();
        ring.reap(&mut out);
        assert!(out.is_empty());
    }
}
