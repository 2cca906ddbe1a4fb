//! Running a blocking piece of work on a thread of its own and awaiting its
//! result from async code. The fabric's calls are served on one
//! single-threaded runtime that replica writes and migrations wait on, so
//! work that may run for long (a part of an aggregation) must not run
//! there.
//!
//! Owns: the thread and the one-shot slot its result travels through.
//!
//! Invariant: the future always resolves — with the work's result, or
//! `None` when the thread could not start or the work panicked (a guard
//! marks the slot finished as the thread ends, however it ends).

use parking_lot::Mutex;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

struct Slot<T> {
    value: Option<T>,
    finished: bool,
    waker: Option<Waker>,
}

/// The result of [`run`], once its thread is done.
pub(crate) struct Done<T> {
    slot: Arc<Mutex<Slot<T>>>,
}

/// Marks the slot finished and wakes the waiter when the thread ends.
struct Finish<T>(Arc<Mutex<Slot<T>>>);

impl<T> Drop for Finish<T> {
    fn drop(&mut self) {
        let waker = {
            let mut slot = self.0.lock();
            slot.finished = true;
            slot.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// Starts `work` on a thread called `name`.
pub(crate) fn run<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> Done<T> {
    let slot = Arc::new(Mutex::new(Slot {
        value: None,
        finished: false,
        waker: None,
    }));
    let finish = Finish(Arc::clone(&slot));
    let started = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let value = work();
            finish.0.lock().value = Some(value);
            drop(finish);
        });
    if let Err(error) = started {
        // The closure, and with it the guard, is dropped: the slot is
        // finished without a value.
        tracing::warn!("cannot start a {name} thread: {error}");
    }
    Done { slot }
}

impl<T> Future for Done<T> {
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Option<T>> {
        let mut slot = self.slot.lock();
        if slot.finished {
            return Poll::Ready(slot.value.take());
        }
        slot.waker = Some(context.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_result_comes_back_and_a_panic_gives_none() {
        let done = run("offload-test", || 6 * 7);
        assert_eq!(crate::block_on(done), Some(42));
        let done = run("offload-test", || -> u32 { panic!("the work fails") });
        assert_eq!(crate::block_on(done), None);
    }
}
