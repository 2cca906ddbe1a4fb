//! The `citrine-xdr` thread: the I/O of shipping. One current-thread
//! tokio runtime; each turn (every few milliseconds, or as soon as a ship
//! ends) it reads the clock once and, per DC and namespace, tells the
//! shipper which partitions this node masters, scans the partitions the
//! shipper asks for (under each partition's read lock, one at a time),
//! starts the ships it returns as tasks on the runtime (each reads the
//! record's current state and sends it with the DC's smart client), feeds
//! back how each ended, and once a second saves the LSTs that moved and
//! sends the other members the LSTs of the partitions it masters.
//!
//! No thread per record or per DC: the number of tasks is the shippers'
//! bound on ships in flight. A DC's client is made (again) when its
//! `node-address-port` list changes or its last connection attempt
//! failed; until it is ready its lanes start no ships (their LSTs stay,
//! so nothing is lost).

use super::{Dc, Lane, State, Xdr};
use citrine_client::xdr::Compression;
use citrine_client::{
    Bin, Client, ClientConfig, Expiration, Key, Policy, UserKey, Value, WritePolicy,
};
use citrine_data::copy::ReplicaWrite;
use citrine_data::filter::Expression;
use citrine_service::migration::MasterClaim;
use citrine_service::replication::call_kind;
use citrine_service::Service;
use citrine_types::{Digest, PartitionId, PARTITIONS};
use citrine_xdr::lst_push::LstPush;
use citrine_xdr::{Candidate, NamespaceSettings, Outcome, Role, Scan, Ship};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

/// How a ship ended, back to the thread's loop.
struct Ack {
    dc: String,
    namespace: String,
    id: u64,
    outcome: Outcome,
    latency_ms: u64,
    wire: Option<WireBytes>,
}

/// A record's write that was sent: whether compressed, and its bytes
/// before and after.
type WireBytes = (bool, usize, usize);

/// A DC's client, by the `nodes_generation` it was made for.
enum Slot {
    Connecting(u64),
    Ready(u64, Arc<Client>),
    Failed(u64, Instant),
}

/// What the loop's tasks report.
enum Event {
    Ack(Ack),
    Connected(String, u64, Result<Client, String>),
}

/// Starts the thread; it saves the LSTs and ends when `stopping` is set.
pub fn start(
    xdr: Arc<Xdr>,
    stopping: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("citrine-xdr".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            match runtime {
                Ok(runtime) => runtime.block_on(run(xdr, stopping)),
                Err(error) => tracing::error!("xdr: cannot start its runtime: {error}"),
            }
        })
}

async fn run(xdr: Arc<Xdr>, stopping: Arc<AtomicBool>) {
    let (events, mut incoming) = unbounded_channel::<Event>();
    let mut slots: HashMap<String, Slot> = HashMap::new();
    let mut last_save = Instant::now();
    let (mut last_masters, mut last_view) = (None::<Instant>, None::<u64>);
    while !stopping.load(Ordering::Relaxed) {
        let started = Instant::now();
        // Every second, and at once when the view changed: a node no
        // longer master must stop shipping before its copy takes the new
        // master's writes (it would ship them too).
        let view = xdr.service().cluster().cluster_key;
        let refresh_masters = last_view != Some(view)
            || last_masters.is_none_or(|at| at.elapsed() >= Duration::from_secs(1));
        if refresh_masters {
            (last_masters, last_view) = (Some(started), Some(view));
        }
        {
            let mut state = xdr.lock();
            turn(&xdr, &mut state, &mut slots, &events, refresh_masters);
            if last_save.elapsed() >= Duration::from_secs(1) {
                xdr.save_lsts(&mut state);
                last_save = Instant::now();
            }
            state.lap_us = started.elapsed().as_micros() as u64;
        }
        let event = tokio::time::timeout(Duration::from_millis(5), incoming.recv()).await;
        if let Ok(Some(event)) = event {
            let mut state = xdr.lock();
            let now_ms = xdr.service().now().unix_ms;
            handle(&mut state, &mut slots, event, now_ms);
            while let Ok(event) = incoming.try_recv() {
                handle(&mut state, &mut slots, event, now_ms);
            }
        }
    }
    xdr.save_lsts(&mut xdr.lock());
}

fn handle(state: &mut State, slots: &mut HashMap<String, Slot>, event: Event, now_ms: u64) {
    match event {
        Event::Ack(ack) => {
            let lane = state
                .dcs
                .get_mut(&ack.dc)
                .and_then(|dc| dc.lanes.get_mut(&ack.namespace));
            if let Some(lane) = lane {
                if matches!(ack.outcome, Outcome::Shipped { .. }) {
                    lane.second_count += 1;
                    lane.second_latency_ms += ack.latency_ms;
                }
                if let Some((compressed, original, sent)) = ack.wire {
                    lane.wire.count(compressed, original, sent);
                }
                lane.shipper.ack(ack.id, ack.outcome, now_ms);
            }
        }
        Event::Connected(dc, generation, result) => {
            let slot = match result {
                Ok(client) => Slot::Ready(generation, Arc::new(client)),
                Err(error) => {
                    tracing::warn!(dc = %dc, "xdr: cannot connect to the DC: {error}");
                    Slot::Failed(generation, Instant::now())
                }
            };
            slots.insert(dc, slot);
        }
    }
}

/// One turn over every DC and namespace.
fn turn(
    xdr: &Xdr,
    state: &mut State,
    slots: &mut HashMap<String, Slot>,
    events: &UnboundedSender<Event>,
    refresh_masters: bool,
) {
    let service = xdr.service();
    let now_ms = service.now().unix_ms;
    slots.retain(|name, _| state.dcs.contains_key(name));
    rewind_for_arrivals(service, state);
    // The filters, after a view change and every few seconds (a change
    // itself went out before its info answer).
    citrine_service::smd::push_to_peers_unanswered(
        service.dist(),
        &xdr.filters_push,
        call_kind::XDR_FILTERS,
        || state.filters.text(),
    );
    for (name, dc) in &mut state.dcs {
        let client = client_of(name, dc, slots, events);
        for (namespace, lane) in &mut dc.lanes {
            if refresh_masters {
                set_masters(service, namespace, lane);
                push_lsts(service, name, namespace, lane);
            }
            count_second(lane, now_ms);
            let Some(client) = &client else {
                continue;
            };
            scan_due(service, namespace, lane, now_ms);
            for ship in lane.shipper.poll(now_ms) {
                let task = ShipTask {
                    service: Arc::clone(service),
                    client: Arc::clone(client),
                    filter: lane.filter.as_ref().map(|(_, filter)| Arc::clone(filter)),
                    compression: compression_of(lane.shipper.settings()),
                    dc: name.clone(),
                    namespace: namespace.clone(),
                    ship,
                };
                tokio::spawn(task.run(events.clone()));
            }
            if !lane.shipper.take_lst_changes().is_empty() {
                lane.dirty = true;
            }
        }
    }
}

/// Takes where writes shipped here landed since the last turn (each
/// namespace's once) and has every lane that forwards scan those
/// partitions again from the oldest such LUT: a shipped write keeps its
/// source's LUT, which its scan may have passed already.
fn rewind_for_arrivals(service: &Service, state: &mut State) {
    let mut taken: HashMap<String, Vec<(u16, u64)>> = HashMap::new();
    for dc in state.dcs.values_mut() {
        for (namespace, lane) in &mut dc.lanes {
            let arrivals = taken.entry(namespace.clone()).or_insert_with(|| {
                service
                    .namespace(namespace.as_bytes())
                    .map(|space| space.xdr_arrivals.take())
                    .unwrap_or_default()
            });
            if lane.shipper.settings().forward {
                for &(partition, lut_ms) in arrivals.iter() {
                    lane.shipper.rewind_partition(partition, lut_ms);
                }
            }
        }
    }
}

/// The DC's ready client; starts a connection when there is none for its
/// current node list (again 1 s after a failure).
fn client_of(
    name: &str,
    dc: &Dc,
    slots: &mut HashMap<String, Slot>,
    events: &UnboundedSender<Event>,
) -> Option<Arc<Client>> {
    let generation = dc.nodes_generation;
    match slots.get(name) {
        Some(Slot::Ready(made_for, client)) if *made_for == generation => {
            return Some(Arc::clone(client))
        }
        Some(Slot::Connecting(made_for)) if *made_for == generation => return None,
        Some(Slot::Failed(made_for, at))
            if *made_for == generation && at.elapsed() < Duration::from_secs(1) =>
        {
            return None
        }
        _ => {}
    }
    if let Some(Slot::Ready(_, old)) = slots.get(name) {
        old.close();
    }
    if dc.config.nodes.is_empty() {
        slots.remove(name);
        return None;
    }
    slots.insert(name.to_owned(), Slot::Connecting(generation));
    let (seeds, events, name) = (dc.config.nodes.clone(), events.clone(), name.to_owned());
    tokio::spawn(async move {
        let result = Client::connect(ClientConfig::new(seeds))
            .await
            .map_err(|error| error.to_string());
        let _ = events.send(Event::Connected(name, generation, result));
    });
    None
}

/// Sets what this node is to each partition for shipping: master (whole),
/// master still filling (ships what it holds, LST untouched), acting
/// master of a filling master (reports its LST), or neither.
fn set_masters(service: &Service, namespace: &str, lane: &mut Lane) {
    let cluster = service.cluster();
    let map = cluster.namespace(namespace);
    let orphan = service.is_orphan();
    let migrations = service.migrations();
    for index in 0..PARTITIONS as u16 {
        let role = match PartitionId::new(index) {
            Some(partition) if !orphan => {
                let master = map.and_then(|map| map.map.master(partition));
                if master == Some(service.node_id) {
                    if migrations.serves_whole(namespace, partition) {
                        Role::Master
                    } else {
                        Role::Filling
                    }
                } else {
                    match migrations.master_claim(namespace, partition, service.node_id) {
                        MasterClaim::Acting | MasterClaim::Releasing => Role::Acting,
                        MasterClaim::Ordinary | MasterClaim::Ceded => Role::Standby,
                    }
                }
            }
            _ => Role::Standby,
        };
        lane.shipper.set_role(index, role);
    }
}

/// Sends the other members the LSTs of the partitions this node masters
/// for this DC and namespace, without awaiting their answers (the next
/// push, a second later, repeats them).
fn push_lsts(service: &Service, dc: &str, namespace: &str, lane: &Lane) {
    let Some(fabric) = service.fabric() else {
        return;
    };
    let push = LstPush {
        dc: dc.to_owned(),
        namespace: namespace.to_owned(),
        lsts: lane.shipper.mastered_lsts(),
    };
    let Some(payload) = push.encode().filter(|_| !push.lsts.is_empty()) else {
        return;
    };
    for peer in service.dist().peers().0 {
        // On its way when `call` returns; the answer is not awaited.
        drop(fabric.call(
            peer,
            call_kind::XDR_LSTS,
            payload.clone(),
            Duration::from_secs(1),
        ));
    }
}

/// Ends the second being counted: its successes become `throughput`.
fn count_second(lane: &mut Lane, now_ms: u64) {
    let elapsed = now_ms.saturating_sub(lane.second_start_ms);
    if elapsed < 1000 {
        return;
    }
    lane.throughput = lane.second_count * 1000 / elapsed;
    lane.latency_ms = lane
        .second_latency_ms
        .checked_div(lane.second_count)
        .unwrap_or(0);
    lane.second_start_ms = now_ms;
    lane.second_count = 0;
    lane.second_latency_ms = 0;
}

fn scan_due(service: &Service, namespace: &str, lane: &mut Lane, now_ms: u64) {
    let Some(space) = service.namespace(namespace.as_bytes()) else {
        return;
    };
    for scan in lane.shipper.scans_due(now_ms) {
        let (records, filtered) = scan_partition(space, scan, lane.shipper.settings());
        lane.shipper.filtered(filtered);
        lane.shipper.offer(scan, records, now_ms);
    }
}

/// The records and tombstones of the scanned window whose sets are
/// shipped, and how many others were filtered out. Records and deletes
/// that arrived by XDR are left out unless the DC forwards.
fn scan_partition(
    namespace: &citrine_data::namespace::Namespace,
    scan: Scan,
    settings: &NamespaceSettings,
) -> (Vec<Candidate>, u64) {
    let Some(partition) = PartitionId::new(scan.partition) else {
        return (Vec::new(), 0);
    };
    let mut admitted: HashMap<u16, bool> = HashMap::new();
    let mut admits = |set_id: u16| {
        *admitted
            .entry(set_id)
            .or_insert_with(|| settings.ships_set(&namespace.sets.name(set_id).unwrap_or_default()))
    };
    let in_window = |lut: u64| lut > scan.after && lut <= scan.up_to;
    let index = namespace.index.partition(partition).read();
    let (mut records, mut filtered) = (Vec::new(), 0);
    let live = index.iter().map(|(digest, entry)| {
        let meta = entry.meta();
        (digest, meta.last_update_ms, meta.set_id, meta.xdr_write)
    });
    let deleted = index.tombstones().map(|(digest, tombstone)| {
        let tombstone = *tombstone;
        (
            *digest,
            tombstone.last_update_ms,
            tombstone.set_id,
            tombstone.xdr_write,
        )
    });
    for (digest, lut_ms, set_id, xdr_write) in live.chain(deleted) {
        // What came here by XDR goes on only where `forward` is on (so
        // active-active sites never ship each other's writes back).
        if !in_window(lut_ms) || (xdr_write && !settings.forward) {
            continue;
        }
        if admits(set_id) {
            records.push(Candidate { digest, lut_ms });
        } else {
            filtered += 1;
        }
    }
    (records, filtered)
}

/// One record's shipment.
struct ShipTask {
    service: Arc<Service>,
    client: Arc<Client>,
    dc: String,
    namespace: String,
    ship: Ship,
    /// The DC's filter expression: a record it rejects is not shipped.
    filter: Option<Arc<Expression>>,
    /// `enable-compression`'s level and threshold, when on.
    compression: Option<Compression>,
}

impl ShipTask {
    async fn run(self, events: UnboundedSender<Event>) {
        let started = Instant::now();
        let (outcome, wire) = self.send().await;
        let _ = events.send(Event::Ack(Ack {
            dc: self.dc,
            namespace: self.namespace,
            id: self.ship.id,
            outcome,
            latency_ms: started.elapsed().as_millis() as u64,
            wire,
        }));
    }

    /// Reads the record's current state and sends it: a replace, or a
    /// durable delete for a tombstone. With the record's write: whether it
    /// went compressed, and its bytes before and after.
    async fn send(&self) -> (Outcome, Option<WireBytes>) {
        let Some(copy) = self.read() else {
            return (Outcome::NotFound, None);
        };
        let now = self.service.now();
        if !self.passes(&copy, now) {
            return (Outcome::Filtered, None);
        }
        let set = String::from_utf8_lossy(&copy.set_name).into_owned();
        let key = Key::from_digest(&self.namespace, set, Digest(copy.digest.0));
        let (result, wire) = match &copy.body {
            None => {
                let policy = ship_policy();
                let delete = self.client.xdr_delete(&policy, &key, copy.last_update_ms);
                (delete.await, None)
            }
            Some(body) => match self.put(&copy, body, key, now).await {
                Ok(sent) => sent,
                Err(outcome) => return (outcome, None),
            },
        };
        (outcome_of(result, copy.last_update_ms), wire)
    }

    /// Sends a record's write, live through its void time and compressed
    /// as the DC asks; `Err` with the outcome of a record not to send (its
    /// body unreadable, or expired since it was read).
    async fn put(
        &self,
        copy: &ReplicaWrite,
        body: &[u8],
        mut key: Key,
        now: citrine_data::Now,
    ) -> Result<(citrine_client::Result<u8>, Option<WireBytes>), Outcome> {
        let (user_key, bins) = decode_body(body).ok_or(Outcome::Abandoned)?;
        if copy.void_time != 0 && copy.void_time < now.citrusleaf_seconds {
            return Err(Outcome::NotFound);
        }
        let mut policy = ship_policy();
        // Live through its void time's second: at least 1 s left (0 would
        // ask for the destination's default TTL).
        policy.expiration = match copy.void_time {
            0 => Expiration::Never,
            void_time => {
                Expiration::Seconds(void_time.saturating_sub(now.citrusleaf_seconds).max(1))
            }
        };
        policy.base.send_key = user_key.is_some();
        key.user_key = user_key;
        let lut_ms = copy.last_update_ms;
        let put = self
            .client
            .xdr_put_with(&policy, &key, &bins, lut_ms, self.compression);
        Ok(match put.await {
            Ok(sent) => {
                let wire = (sent.compressed, sent.original_bytes, sent.sent_bytes);
                (Ok(sent.result_code), Some(wire))
            }
            Err(error) => (Err(error), None),
        })
    }

    /// Whether the DC's filter (if any) lets the record go. A delete has
    /// no bins to judge: it is shipped.
    fn passes(&self, copy: &ReplicaWrite, now: citrine_data::Now) -> bool {
        let (Some(filter), Some(_)) = (&self.filter, &copy.body) else {
            return true;
        };
        self.service
            .namespace(self.namespace.as_bytes())
            .is_some_and(|namespace| {
                citrine_data::filter::copy_passes(namespace, copy, filter, now)
            })
    }

    fn read(&self) -> Option<ReplicaWrite> {
        let namespace = self.service.namespace(self.namespace.as_bytes())?;
        let digest = self.ship.digest;
        let copy = citrine_data::copy::capture(namespace, &digest, self.service.now());
        // A marker without a generation: neither record nor tombstone.
        (copy.body.is_some() || copy.generation != 0).then_some(copy)
    }
}

/// The namespace's `enable-compression` settings, when on.
fn compression_of(settings: &NamespaceSettings) -> Option<Compression> {
    settings.enable_compression.then(|| Compression {
        level: settings.compression_level,
        threshold: usize::try_from(settings.compression_threshold).unwrap_or(usize::MAX),
    })
}

fn ship_policy() -> WritePolicy {
    WritePolicy {
        base: Policy {
            total_timeout: Duration::from_millis(2000),
            socket_timeout: Duration::from_millis(1000),
            max_retries: 1,
            ..Policy::default()
        },
        ..WritePolicy::default()
    }
}

/// The stored body's user key and bins, as the client writes them back.
fn decode_body(body: &[u8]) -> Option<(Option<UserKey>, Vec<Bin>)> {
    let view = citrine_record::BodyView::parse(body).ok()?;
    let user_key = view.key().and_then(|(particle, bytes)| {
        let mut field = Vec::with_capacity(bytes.len() + 1);
        field.push(particle);
        field.extend_from_slice(bytes);
        UserKey::from_field(&field)
    });
    let bins: Vec<Bin> = view
        .bins()
        .map(|bin| {
            let value = Value::Raw {
                particle: bin.particle_type,
                bytes: bin.value.into_owned(),
            };
            Bin::new(String::from_utf8_lossy(&bin.name).into_owned(), value)
        })
        .collect();
    (!bins.is_empty()).then_some((user_key, bins))
}

/// How a shipment's answer counts: 0, 2 (a delete of what the
/// destination lacks) and 28 (its copy is as new) are done; a temporary
/// answer or a broken link is retried by the rescan; any other answer
/// is given up.
fn outcome_of(result: citrine_client::Result<u8>, lut_ms: u64) -> Outcome {
    use citrine_client::Error;
    match result {
        Ok(0 | 2 | 28) => Outcome::Shipped { lut_ms },
        Ok(code) if temporary(code) => Outcome::RetryDestination,
        Ok(_) => Outcome::Abandoned,
        Err(Error::Server { code, .. }) if temporary(code) => Outcome::RetryDestination,
        Err(Error::Server { .. }) => Outcome::Abandoned,
        Err(_) => Outcome::RetryConnection,
    }
}

/// Result codes a later attempt may not get: timeout, key busy, device
/// overload, partition unavailable, server busy, memory.
fn temporary(code: u8) -> bool {
    matches!(code, 8 | 9 | 11 | 14 | 18 | 32)
}
