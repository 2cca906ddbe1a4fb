//! The migration driver: the async loop that runs each view's exchange and
//! then sends this node's copies ([`super`] has the rules). It depends on
//! no runtime: time passes through a [`Pause`], messages through the
//! [`Fabric`], so the server runs it on a tokio thread (`citrine-migrate`)
//! and the simulator on its fake network and clock.
//!
//! Invariants:
//! - at most `migrate-max-partitions` copies are sent at once, each with
//!   one batch awaiting its ack per target (flow control: a batch goes only
//!   when the previous one was acknowledged);
//! - a copy is marked sent only when every target acknowledged its last
//!   batch under the plan's epoch and its retirement (DROP to the copies it
//!   covers, resent until acknowledged; this node's own copy when it is not
//!   a replica) is done — the retirement runs beside the sending, outside
//!   the partition limit; a newer plan (view change) stops every running
//!   copy at its next batch, and the loop starts over;
//! - a batch that is not acknowledged is sent again (after
//!   [`RETRY_PAUSE_MS`]) until it is or the plan changes: a target that
//!   died leaves the view, which makes a new plan;
//! - client transactions never wait for the driver: it runs on its own
//!   thread and holds a partition lock only while it copies one batch.

use super::{exchange_status, Handover, MigrateTask, Work, FLAG_FIRST, FLAG_LAST};
use crate::replication::{call_kind, join_all, DupResAnswer, DupResRequest, Fabric, FabricError};
use crate::Distribution;
use citrine_types::{NodeId, ResultCode};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

/// How long one batch may wait for its ack before it is sent again.
pub const BATCH_TIMEOUT_MS: u64 = 2_000;
/// Pause before a batch or exchange call that failed is sent again.
pub const RETRY_PAUSE_MS: u64 = 100;
/// Pause before asking again a member that has not published the view.
pub const EXCHANGE_RETRY_MS: u64 = 20;
/// How often an idle driver looks for new work.
pub const IDLE_POLL_MS: u64 = 20;

/// A boxed future the driver awaits.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Time for the driver: the server sleeps on tokio, the simulator on its
/// fake clock.
pub trait Pause: Send + Sync + 'static {
    /// Resolves once `duration` has passed.
    fn sleep(&self, duration: Duration) -> Sleep;
}

/// Runs until `stopping` is set.
pub async fn run(dist: Arc<Distribution>, pause: Arc<dyn Pause>, stopping: Arc<AtomicBool>) {
    while !stopping.load(Ordering::Relaxed) {
        if !step(&dist, &pause).await {
            pause.sleep(Duration::from_millis(IDLE_POLL_MS)).await;
        }
    }
}

/// Does the next piece of work, if any; false when there was none.
///
/// A new view's exchange comes first: until it resolves, every request on
/// a partition with records runs a duplicate resolution against every
/// member. Otherwise the truncations go out when a push is due (see
/// [`Distribution::push_truncations`]; no answer awaited) and the writes some
/// replica missed are sent again ([`Distribution::reconcile_pending`]; at most
/// one attempt's timeout) before the work.
pub async fn step(dist: &Arc<Distribution>, pause: &Arc<dyn Pause>) -> bool {
    let Some(fabric) = dist.fabric() else {
        return false;
    };
    match dist.migrations.next_work() {
        Work::Exchange {
            epoch,
            cluster_key,
            peers,
        } => {
            exchange(dist, &fabric, pause, epoch, cluster_key, peers).await;
            true
        }
        Work::Idle => upkeep(dist, fabric.as_ref()).await,
        Work::Send {
            epoch,
            cluster_key,
            tasks,
        } => {
            upkeep(dist, fabric.as_ref()).await;
            let partitions = tasks.len();
            let sent_before = dist.migrations.records_sent.load(Ordering::Relaxed);
            let started = dist.now().unix_ms;
            run_plan(dist, &fabric, pause, epoch, cluster_key, tasks).await;
            let records = dist.migrations.records_sent.load(Ordering::Relaxed) - sent_before;
            let seconds = dist.now().unix_ms.saturating_sub(started) as f64 / 1000.0;
            tracing::info!(
                partitions,
                records,
                seconds,
                records_per_second = (records as f64 / seconds.max(1e-3)) as u64,
                complete = dist.migrations.epoch() == epoch,
                "migration plan done"
            );
            true
        }
    }
}

/// The SC versions saved when changed, the truncations' and rosters'
/// pushes, when due, and the resend of writes some replica missed; true
/// when a push went out.
async fn upkeep(dist: &Distribution, fabric: &dyn Fabric) -> bool {
    dist.save_sc_versions_if_dirty();
    let pushed = dist.push_truncations() | dist.push_rosters();
    // Paced by the idle poll: a replica of another view refuses at once.
    dist.reconcile_pending(fabric).await;
    pushed
}

/// Fetches every peer's snapshot for `cluster_key` and resolves the
/// exchange; gives up when the plan moves on.
async fn exchange(
    dist: &Arc<Distribution>,
    fabric: &Arc<dyn Fabric>,
    pause: &Arc<dyn Pause>,
    epoch: u64,
    cluster_key: u64,
    peers: Vec<NodeId>,
) {
    let fetch = |peer: NodeId| async move {
        loop {
            if dist.migrations.epoch() != epoch {
                return None;
            }
            let answer = fabric
                .call(
                    peer,
                    call_kind::EXCHANGE,
                    cluster_key.to_be_bytes().to_vec(),
                    Duration::from_millis(BATCH_TIMEOUT_MS),
                )
                .await;
            match answer.as_deref() {
                Ok([exchange_status::READY, ..]) => {
                    // Truncations first: a node that missed one must know
                    // it before its exchange resolves and it serves copies.
                    if dist.sync_truncations(fabric.as_ref(), peer).await {
                        return answer.ok().map(|bytes| (peer, bytes));
                    }
                    pause.sleep(Duration::from_millis(RETRY_PAUSE_MS)).await
                }
                Ok([exchange_status::NOT_YET]) => {
                    pause.sleep(Duration::from_millis(EXCHANGE_RETRY_MS)).await
                }
                _ => pause.sleep(Duration::from_millis(RETRY_PAUSE_MS)).await,
            }
        }
    };
    let answers = join_all(peers.iter().map(|peer| fetch(*peer)).collect()).await;
    let Some(answers) = answers.into_iter().collect::<Option<Vec<_>>>() else {
        return;
    };
    if !dist.finish_exchange(epoch, answers) && dist.migrations.epoch() == epoch {
        tracing::warn!(
            "partition-version exchange could not be resolved; waiting for the next view"
        );
    }
}

/// Runs one plan: up to `migrate-max-partitions` copies at once, the
/// hottest first, then the smallest.
async fn run_plan(
    dist: &Arc<Distribution>,
    fabric: &Arc<dyn Fabric>,
    pause: &Arc<dyn Pause>,
    epoch: u64,
    cluster_key: u64,
    mut queue: Vec<MigrateTask>,
) {
    let mut sending: Vec<Sending> = Vec::new();
    let mut retiring: Vec<Sleep> = Vec::new();
    loop {
        let current = dist.migrations.epoch() == epoch;
        let limit = dist
            .migrations
            .max_partitions
            .load(Ordering::Relaxed)
            .max(1) as usize;
        while current && sending.len() < limit && !queue.is_empty() {
            // Hottest first, then the plan's order (smallest first).
            let task = queue.remove(dist.migrations.hottest(&queue));
            sending.push(Box::pin(migrate_partition(
                dist.clone(),
                fabric.clone(),
                pause.clone(),
                epoch,
                cluster_key,
                task,
            )));
        }
        if sending.is_empty() && retiring.is_empty() {
            return;
        }
        for task in next_done(&mut sending, &mut retiring).await {
            retiring.push(Box::pin(retire_partition(
                dist.clone(),
                fabric.clone(),
                pause.clone(),
                epoch,
                cluster_key,
                task,
            )));
        }
    }
}

/// A copy being sent: resolves to its task once delivered.
type Sending = Pin<Box<dyn Future<Output = Option<MigrateTask>> + Send>>;

/// Sends one copy to each of its targets, batch by batch; the task back
/// once every target acknowledged its last batch under `epoch` (`None`:
/// the plan moved on).
async fn migrate_partition(
    dist: Arc<Distribution>,
    fabric: Arc<dyn Fabric>,
    pause: Arc<dyn Pause>,
    epoch: u64,
    cluster_key: u64,
    task: MigrateTask,
) -> Option<MigrateTask> {
    let link = Link {
        dist: &dist,
        fabric: &fabric,
        pause: &pause,
        epoch,
        cluster_key,
    };
    // Strong consistency: a target's untrusted copy is emptied first.
    for target in &task.clear {
        let payload = super::encode_clear(cluster_key, &task.namespace, task.partition);
        call_until(
            &dist,
            &fabric,
            &pause,
            epoch,
            (*target, call_kind::CLEAR, &payload),
            |answer| acknowledged(&answer).then_some(()),
        )
        .await?;
    }
    let digests = dist.migration_digests(&task.namespace, task.partition);
    // A target with some copy gets the delta only: its manifest first.
    let mut manifests = Vec::with_capacity(task.targets.len());
    for (target, version) in &task.targets {
        let manifest = if version.is_zero() || digests.is_empty() {
            None
        } else {
            Some(link.manifest_and_pulls(&task, *target).await?)
        };
        manifests.push(manifest);
    }
    for ((target, _), manifest) in task.targets.iter().zip(&manifests) {
        let to_send = match manifest {
            None => digests.clone(),
            Some(manifest) => dist
                .migration_delta(&task.namespace, task.partition, &digests, manifest)
                .unwrap_or_else(|| digests.clone()),
        };
        link.send_copy(&task, *target, &to_send).await?;
    }
    Some(task)
}

/// What one migration talks over: the distribution layer, the fabric, the
/// pause, and the epoch and cluster key it runs under.
struct Link<'a> {
    dist: &'a Arc<Distribution>,
    fabric: &'a Arc<dyn Fabric>,
    pause: &'a Arc<dyn Pause>,
    epoch: u64,
    cluster_key: u64,
}

impl Link<'_> {
    /// The target's manifest; when its copy is one this copy contains
    /// (`pull_from`), the records it holds newer (writes that reached only
    /// it) are fetched from it and applied here first, so every target gets
    /// them.
    async fn manifest_and_pulls(
        &self,
        task: &MigrateTask,
        target: NodeId,
    ) -> Option<super::Manifest> {
        let dist = self.dist;
        let request = super::encode_partition_ref(&task.namespace, task.partition);
        let pulls_too = task.pull_from.contains(&target);
        let (manifest, pulls) = call_until(
            dist,
            self.fabric,
            self.pause,
            self.epoch,
            (target, call_kind::MANIFEST, &request),
            |answer| {
                let manifest = super::parse_manifest(&answer.ok()?)?;
                let pulls = if pulls_too {
                    dist.migration_pulls(&task.namespace, task.partition, &manifest)?
                } else {
                    Vec::new()
                };
                Some((manifest, pulls))
            },
        )
        .await?;
        for digest in pulls {
            let request = DupResRequest {
                cluster_key: self.cluster_key,
                namespace: task.namespace.clone(),
                digest,
            }
            .encode();
            let answer = call_until(
                dist,
                self.fabric,
                self.pause,
                self.epoch,
                (target, call_kind::DUPRES, &request),
                |answer| answer.ok().and_then(|bytes| DupResAnswer::decode(&bytes)),
            )
            .await?;
            dist.apply_pulled(&task.namespace, &digest, answer);
        }
        Some(manifest)
    }

    /// Sends the records of `to_send` to `target`, batch by batch, until
    /// its LAST batch is acknowledged.
    async fn send_copy(
        &self,
        task: &MigrateTask,
        target: NodeId,
        to_send: &[citrine_types::Digest],
    ) -> Option<()> {
        let migrations = &self.dist.migrations;
        let mut at = 0;
        let mut flags = FLAG_FIRST;
        loop {
            let (batch, consumed) = self.dist.migration_batch(
                self.cluster_key,
                &task.namespace,
                task.partition,
                to_send.get(at..).unwrap_or_default(),
                flags,
            );
            at += consumed;
            flags = 0;
            let records = batch.records.len() as u64;
            // Every batch counts against `migrate-max-records-per-sec`, a
            // partition's only (LAST) batch included: the wait is for the
            // batches sent before this one, of any partition.
            let now_us = self.dist.now().unix_ms.saturating_mul(1000);
            let owed = migrations.throttle(records, now_us);
            if !owed.is_zero() {
                self.pause.sleep(owed).await;
            }
            let last = batch.flags & FLAG_LAST != 0;
            self.deliver_batch(task, target, batch, last).await?;
            migrations
                .records_sent
                .fetch_add(records, Ordering::Relaxed);
            // `migrate-sleep` after every batch that carried records (the
            // last one too: the task holds its place meanwhile); an empty
            // partition's lone LAST costs no sleep.
            let sleep = match records {
                0 => Duration::ZERO,
                _ => Duration::from_micros(u64::from(migrations.sleep_us.load(Ordering::Relaxed))),
            };
            if !sleep.is_zero() {
                self.pause.sleep(sleep).await;
            } else if !last {
                yield_now().await;
            }
            if last {
                return Some(());
            }
        }
    }

    /// Sends one batch until `target` acknowledges it. The LAST batch to
    /// the master hands an acting master's claim back around it (see
    /// `Handover`).
    async fn deliver_batch(
        &self,
        task: &MigrateTask,
        target: NodeId,
        mut batch: super::MigrateBatch,
        last: bool,
    ) -> Option<()> {
        let dist = self.dist;
        let to_master = last && is_master(dist, task, target);
        let hand_over = |to: Handover| {
            let (ns, partition) = (&task.namespace, task.partition);
            dist.migrations
                .hand_over(self.epoch, ns, partition, dist.node_id, to);
        };
        if to_master {
            // An acting master gives its claim back before the master can
            // be whole.
            hand_over(Handover::Releasing);
        }
        let mut resend = false;
        call_until_with(
            dist,
            self.fabric,
            self.pause,
            self.epoch,
            (target, call_kind::MIGRATE),
            || {
                // A resend carries the truncations made since.
                if resend {
                    dist.refresh_truncations(&mut batch);
                }
                resend = true;
                batch.encode()
            },
            |answer| {
                let acknowledged = acknowledged(&answer);
                if !acknowledged {
                    tracing::debug!(
                        target = %target,
                        partition = task.partition.index(),
                        answer = ?answer,
                        "migration batch not acknowledged; sending it again"
                    );
                }
                acknowledged.then_some(())
            },
        )
        .await?;
        if to_master {
            hand_over(Handover::Released);
        }
        Some(())
    }
}

/// True when `target` is the master of the task's partition in the
/// current view.
fn is_master(dist: &Distribution, task: &MigrateTask, target: NodeId) -> bool {
    dist.cluster()
        .namespace(&task.namespace)
        .is_some_and(|map| map.map.replicas(task.partition).first() == Some(&target))
}

/// After a copy was delivered: tells the copies it covers outside the
/// replica list to drop, drops this node's copy when it is not a replica,
/// and only then marks the copy sent (so `cluster-stable` counts it until
/// its drops are done). Runs beside the sending, outside the
/// `migrate-max-partitions` limit.
async fn retire_partition(
    dist: Arc<Distribution>,
    fabric: Arc<dyn Fabric>,
    pause: Arc<dyn Pause>,
    epoch: u64,
    cluster_key: u64,
    task: MigrateTask,
) {
    let migrations = &dist.migrations;
    // The targets hold this copy now: the copies it covers outside the
    // replica list may go. Each retiree is told until it acknowledges or
    // the plan moves on (a retiree that died leaves the view).
    let notice = super::encode_drop(cluster_key, dist.node_id, &task.namespace, task.partition);
    let tell = |node: NodeId| {
        call_until(
            &dist,
            &fabric,
            &pause,
            epoch,
            (node, call_kind::DROP, &notice),
            |answer| acknowledged(&answer).then_some(()),
        )
    };
    join_all(task.retire.iter().map(|node| tell(*node)).collect()).await;
    if task.drop_after && migrations.epoch() == epoch {
        dist.drop_copy(&task.namespace, task.partition);
    }
    // Last: `cluster-stable` counts the copy until its drops are done.
    migrations.finished(epoch, &task.namespace, task.partition);
}

/// Calls `to` (`kind`, `payload`) until `accept` takes an answer, pausing
/// [`RETRY_PAUSE_MS`] between tries; `None` once the plan `epoch` is over.
async fn call_until<T>(
    dist: &Distribution,
    fabric: &Arc<dyn Fabric>,
    pause: &Arc<dyn Pause>,
    epoch: u64,
    (to, kind, payload): (NodeId, u8, &[u8]),
    accept: impl FnMut(Result<Vec<u8>, FabricError>) -> Option<T>,
) -> Option<T> {
    call_until_with(
        dist,
        fabric,
        pause,
        epoch,
        (to, kind),
        || payload.to_vec(),
        accept,
    )
    .await
}

/// [`call_until`] with the payload of each try from `payload`.
async fn call_until_with<T>(
    dist: &Distribution,
    fabric: &Arc<dyn Fabric>,
    pause: &Arc<dyn Pause>,
    epoch: u64,
    (to, kind): (NodeId, u8),
    mut payload: impl FnMut() -> Vec<u8>,
    mut accept: impl FnMut(Result<Vec<u8>, FabricError>) -> Option<T>,
) -> Option<T> {
    while dist.migrations.epoch() == epoch {
        let answer = fabric
            .call(to, kind, payload(), Duration::from_millis(BATCH_TIMEOUT_MS))
            .await;
        if let Some(value) = accept(answer) {
            return Some(value);
        }
        pause.sleep(Duration::from_millis(RETRY_PAUSE_MS)).await;
    }
    None
}

/// True for a one-byte OK answer.
fn acknowledged(answer: &Result<Vec<u8>, FabricError>) -> bool {
    matches!(answer.as_deref(), Ok([code]) if *code == ResultCode::Ok.code())
}

/// Waits until some of `sending` or `retiring` complete, removes them, and
/// returns the tasks delivered.
async fn next_done(sending: &mut Vec<Sending>, retiring: &mut Vec<Sleep>) -> Vec<MigrateTask> {
    std::future::poll_fn(|context| {
        let mut delivered = Vec::new();
        let before = sending.len() + retiring.len();
        sending.retain_mut(|future| match future.as_mut().poll(context) {
            Poll::Ready(task) => {
                delivered.extend(task);
                false
            }
            Poll::Pending => true,
        });
        retiring.retain_mut(|future| future.as_mut().poll(context).is_pending());
        if sending.len() + retiring.len() < before {
            Poll::Ready(std::mem::take(&mut delivered))
        } else {
            Poll::Pending
        }
    })
    .await
}

/// Lets other tasks of the event loop run once.
async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|context| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            context.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}
