//! Dedicated threads that each run one single-threaded event loop (a tokio
//! current-thread runtime): the cluster runtime and the migration sender.
//!
//! Invariant: the future is built and run on the new thread, so it may hold
//! thread-local (non-`Send`) state; a runtime that cannot be built is logged
//! and the thread ends without running the future.

use std::future::Future;

/// Starts thread `name` running the future `make` returns until it ends.
pub fn spawn<F, Fut>(name: &str, make: F) -> Result<std::thread::JoinHandle<()>, String>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let thread_name = name.to_owned();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime.block_on(make()),
                Err(error) => tracing::error!("cannot start the {thread_name} event loop: {error}"),
            }
        })
        .map_err(|error| format!("cannot start the {name} thread: {error}"))
}
