//! The migration thread (`citrine-migrate`): sends the partitions the
//! service planned at the last view change
//! ([`citrine_service::migration`]) to their new replicas.
//!
//! It runs on its own current-thread event loop, so neither heartbeats
//! (cluster thread) nor client transactions (service threads) wait for it;
//! the receivers apply batches on their `citrine-fabric` thread.
//!
//! Invariants:
//! - at most `max_partitions` partitions are in flight at once, each with
//!   one batch awaiting its ack per target (flow control: a batch is sent
//!   only when the previous one was acknowledged);
//! - a partition is marked finished only when every target acknowledged
//!   its last batch under the plan's epoch; a newer plan (view change)
//!   makes every running partition stop at its next batch, and the loop
//!   starts over from the new plan;
//! - a batch that is not acknowledged is sent again (after
//!   [`RETRY_PAUSE_MS`]) until it is or the plan changes: a target that
//!   died leaves the view, which makes a new plan.

use citrine_service::migration::{MigrateTask, FLAG_FIRST, FLAG_LAST};
use citrine_service::replication::{call_kind, Fabric};
use citrine_service::Service;
use citrine_types::ResultCode;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long one batch may wait for its ack before it is sent again.
pub const BATCH_TIMEOUT_MS: u64 = 2_000;
/// Pause before a batch that was not acknowledged is sent again.
pub const RETRY_PAUSE_MS: u64 = 100;
/// How often an idle migration thread looks for a new plan.
pub const IDLE_POLL_MS: u64 = 20;
/// How often the other members are asked which partitions they still send
/// while some partition is incoming here (duplicate resolution).
pub const INCOMING_POLL_MS: u64 = 200;

/// Starts the migration thread.
pub fn start(
    service: Arc<Service>,
    stopping: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<()>, String> {
    crate::event_loop::spawn("citrine-migrate", move || run(service, stopping))
}

async fn run(service: Arc<Service>, stopping: Arc<AtomicBool>) {
    let mut last_sweep = Instant::now();
    while !stopping.load(Ordering::Relaxed) {
        let Some(fabric) = service.fabric() else {
            tokio::time::sleep(Duration::from_millis(IDLE_POLL_MS)).await;
            continue;
        };
        let (epoch, cluster_key, tasks) = service.migrations.take_tasks();
        if tasks.is_empty() {
            if last_sweep.elapsed() >= Duration::from_millis(INCOMING_POLL_MS) {
                last_sweep = Instant::now();
                sweep_incoming(&service, &fabric).await;
            }
            tokio::time::sleep(Duration::from_millis(IDLE_POLL_MS)).await;
            continue;
        }
        let started = Instant::now();
        let partitions = tasks.len();
        let sent_before = service.migrations.records_sent.load(Ordering::Relaxed);
        run_plan(&service, &fabric, epoch, cluster_key, tasks, &stopping).await;
        let records = service.migrations.records_sent.load(Ordering::Relaxed) - sent_before;
        let seconds = started.elapsed().as_secs_f64();
        tracing::info!(
            partitions,
            records,
            seconds,
            records_per_second = (records as f64 / seconds.max(1e-6)) as u64,
            complete = service.migrations.epoch() == epoch,
            "migration plan done"
        );
    }
}

/// Asks every other member which partitions it still has to migrate
/// ([`call_kind::PENDING`]) and ends duplicate resolution for the incoming
/// partitions none of them still sends (a partition with no records
/// anywhere gets no batch, so its LAST never arrives). A member that does
/// not answer, or answers for another cluster key, keeps every incoming
/// partition incoming.
async fn sweep_incoming(service: &Arc<Service>, fabric: &Arc<dyn Fabric>) {
    let Some((cluster_key, namespaces)) = service.migrations.incoming_namespaces() else {
        return;
    };
    let cluster = service.cluster();
    if cluster.cluster_key != cluster_key {
        return;
    }
    for namespace in namespaces {
        let mut payload = cluster_key.to_be_bytes().to_vec();
        payload.extend_from_slice(namespace.as_bytes());
        let mut still = HashSet::new();
        for member in cluster
            .members
            .iter()
            .filter(|m| m.node_id != service.node_id)
        {
            let answer = fabric
                .call(
                    member.node_id,
                    call_kind::PENDING,
                    payload.clone(),
                    Duration::from_millis(INCOMING_POLL_MS),
                )
                .await;
            let Ok(answer) = answer else {
                return;
            };
            let Some((&1, partitions)) = answer.split_first() else {
                return;
            };
            still.extend(
                partitions
                    .chunks_exact(2)
                    .map(|pair| u16::from_be_bytes([pair[0], pair[1]])),
            );
        }
        service
            .migrations
            .incoming_retain(cluster_key, &namespace, &still);
    }
}

/// Runs one plan: up to `max_partitions` partitions at once, smallest first.
async fn run_plan(
    service: &Arc<Service>,
    fabric: &Arc<dyn Fabric>,
    epoch: u64,
    cluster_key: u64,
    tasks: Vec<MigrateTask>,
    stopping: &Arc<AtomicBool>,
) {
    let mut queue = tasks.into_iter();
    let mut running = tokio::task::JoinSet::new();
    loop {
        let current = service.migrations.epoch() == epoch && !stopping.load(Ordering::Relaxed);
        let limit = service
            .migrations
            .max_partitions
            .load(Ordering::Relaxed)
            .max(1) as usize;
        while current && running.len() < limit {
            let Some(task) = queue.next() else {
                break;
            };
            running.spawn(migrate_partition(
                service.clone(),
                fabric.clone(),
                epoch,
                cluster_key,
                task,
            ));
        }
        if running.join_next().await.is_none() {
            return;
        }
    }
}

/// Sends every record of one partition to its targets, batch by batch.
async fn migrate_partition(
    service: Arc<Service>,
    fabric: Arc<dyn Fabric>,
    epoch: u64,
    cluster_key: u64,
    task: MigrateTask,
) {
    let migrations = &service.migrations;
    let digests = service.migration_digests(&task.namespace, task.partition);
    let mut at = 0;
    let mut flags = FLAG_FIRST;
    loop {
        let (batch, consumed) = service.migration_batch(
            cluster_key,
            &task.namespace,
            task.partition,
            digests.get(at..).unwrap_or_default(),
            flags,
        );
        at += consumed;
        flags = 0;
        let payload = batch.encode();
        for target in &task.targets {
            loop {
                if migrations.epoch() != epoch {
                    return;
                }
                let answer = fabric
                    .call(
                        *target,
                        call_kind::MIGRATE,
                        payload.clone(),
                        Duration::from_millis(BATCH_TIMEOUT_MS),
                    )
                    .await;
                match answer.as_deref() {
                    Ok([code]) if *code == ResultCode::Ok.code() => break,
                    other => {
                        tracing::debug!(
                            target = %target,
                            partition = task.partition.index(),
                            answer = ?other,
                            "migration batch not acknowledged; sending it again"
                        );
                        tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await;
                    }
                }
            }
        }
        migrations
            .records_sent
            .fetch_add(batch.records.len() as u64, Ordering::Relaxed);
        if batch.flags & FLAG_LAST != 0 {
            break;
        }
        match migrations.sleep_us.load(Ordering::Relaxed) {
            0 => tokio::task::yield_now().await,
            micros => tokio::time::sleep(Duration::from_micros(u64::from(micros))).await,
        }
    }
    migrations.finished(epoch, &task.namespace, task.partition);
}
