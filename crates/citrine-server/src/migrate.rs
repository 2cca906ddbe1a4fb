//! The migration thread (`citrine-migrate`): runs the distribution layer's migration
//! driver ([`citrine_service::migration::driver`]: the partition-version
//! exchange after each view change, then the copies this node sends) on
//! its own current-thread event loop, so neither heartbeats (cluster
//! thread) nor client transactions (service threads) wait for it; the
//! receivers apply batches on their `citrine-fabric` thread.

use citrine_service::migration::driver::{self, Pause, Sleep};
use citrine_service::Service;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// Time on the tokio event loop.
struct TokioPause;

impl Pause for TokioPause {
    fn sleep(&self, duration: Duration) -> Sleep {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// Starts the migration thread.
pub fn start(
    service: Arc<Service>,
    stopping: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<()>, String> {
    crate::event_loop::spawn("citrine-migrate", move || {
        driver::run(Arc::clone(service.dist()), Arc::new(TokioPause), stopping)
    })
}
