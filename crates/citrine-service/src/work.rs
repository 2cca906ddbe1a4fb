//! A queue of background work that one server thread serves — or, where no
//! thread serves it (tests, the simulator), the caller runs inline.
//!
//! Owns: the queue, the wake-up, and whether a runner is attached. Used for
//! secondary-index builds ([`crate::sindex`]) and background jobs
//! ([`crate::job`]).
//!
//! Invariant: an item pushed while no runner is attached is left for the
//! caller to run ([`WorkQueue::push`] says so); one pushed while a runner is
//! attached is taken by it within one wake-up.

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long an idle runner sleeps before it looks again (and calls its
/// idle work, see [`WorkQueue::serve`]).
const IDLE_WAIT: Duration = Duration::from_millis(200);

/// Work items of type `T`.
pub(crate) struct WorkQueue<T> {
    queue: Mutex<VecDeque<T>>,
    wake: Condvar,
    attached: AtomicBool,
}

impl<T> Default for WorkQueue<T> {
    fn default() -> WorkQueue<T> {
        WorkQueue {
            queue: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            attached: AtomicBool::new(false),
        }
    }
}

impl<T> WorkQueue<T> {
    /// Queues `item`. True when a runner will take it; false when none is
    /// attached and the caller should run the queue itself ([`WorkQueue::pop`]).
    pub fn push(&self, item: T) -> bool {
        self.queue.lock().push_back(item);
        let attached = self.attached.load(Ordering::Acquire);
        if attached {
            self.wake.notify_one();
        }
        attached
    }

    /// Whether a runner serves the queue now.
    #[cfg(test)]
    pub fn is_attached(&self) -> bool {
        self.attached.load(Ordering::Acquire)
    }

    /// The next item, if any.
    pub fn pop(&self) -> Option<T> {
        self.queue.lock().pop_front()
    }

    /// Wakes the runner (for its idle work).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Serves the queue until `stopping`: each item goes to `each`, and
    /// `idle` runs after every item and every wake-up.
    pub fn serve(&self, stopping: &AtomicBool, mut each: impl FnMut(T), mut idle: impl FnMut()) {
        self.attached.store(true, Ordering::Release);
        while !stopping.load(Ordering::Relaxed) {
            let item = {
                let mut queue = self.queue.lock();
                if queue.is_empty() {
                    self.wake.wait_for(&mut queue, IDLE_WAIT);
                }
                queue.pop_front()
            };
            if let Some(item) = item {
                each(item);
            }
            idle();
        }
        self.attached.store(false, Ordering::Release);
    }

    /// Serves the queue in turns until `stopping`: each turn gets every
    /// item queued since the last one and answers how long the runner may
    /// sleep before the next turn if nothing new comes (`None`: up to the
    /// idle wait; zero: go on at once).
    pub fn serve_turns(
        &self,
        stopping: &AtomicBool,
        mut turn: impl FnMut(Vec<T>) -> Option<Duration>,
    ) {
        self.attached.store(true, Ordering::Release);
        let mut sleep = Some(Duration::ZERO);
        while !stopping.load(Ordering::Relaxed) {
            let items: Vec<T> = {
                let mut queue = self.queue.lock();
                let wait = sleep.unwrap_or(IDLE_WAIT).min(IDLE_WAIT);
                if queue.is_empty() && !wait.is_zero() {
                    self.wake.wait_for(&mut queue, wait);
                }
                queue.drain(..).collect()
            };
            sleep = turn(items);
        }
        self.attached.store(false, Ordering::Release);
    }
}
