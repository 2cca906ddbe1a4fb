//! XDR on this node: the destinations (DCs) configured in `[xdr]` and by
//! `set-config:context=xdr;…`, their shippers, their statistics
//! (`get-stats:context=xdr;dc=…[;namespace=…]`) and the last-ship times
//! kept in the work directory.
//!
//! The shipping decisions are `citrine_xdr::Shipper`'s (one per DC and
//! namespace); the I/O — scanning the index, reading records, sending
//! them with the smart client, persisting LSTs — is [`run`]'s, on the
//! `citrine-xdr` thread. This module holds the state both share under one
//! mutex, taken briefly by the info commands and by each turn of the
//! thread.
//!
//! Invariants: a DC's shippers exist exactly for the namespaces added to
//! it that this node has; a persisted LST file is only ever written from
//! a shipper's LSTs (acknowledged points), so a restart repeats at most
//! what was in flight.
//!
//! LSTs travel with mastership: once a second each node sends the other
//! members the LSTs of the partitions it masters (`run`), and a node takes
//! them for the partitions it does not master, so a new master — after a
//! node's death or a migration — resumes where the old one stood (its own
//! LST only for a partition no master reported to it). While a migration
//! fills a master's copy, it ships the records it holds as they come (the
//! writes it accepts) but moves only a shadow of the LST; whole at last, it
//! scans again from the LST, its hot keys keeping what it shipped from
//! going twice. Its acting master (the old master) ships nothing and
//! reports its LST, which the filling master takes
//! (`citrine_xdr::Role`).
//!
//! The mark of a record that arrived by XDR (`xdr_write`, which keeps it
//! from being shipped back) travels with replica writes, migrations and
//! duplicate resolution, and device restarts (a record's and a delete
//! tombstone's, with the tombstone's LUT: `citrine_data::device`).
//!
//! Not yet: an idle partition is rescanned every 200 ms per DC and namespace, a
//! walk of its whole index. Bin convergence: the reference keeps, with
//! `conflict-resolve-writes` on the receiving namespace, a LUT (6 bytes)
//! and a source id (1 byte, the sender's `src-id`) per bin, and keeps
//! deleted bins as "cemetery" bins; a sender with `ship-bin-luts` puts
//! each bin's LUT after its name (op flag bit 0, which `citrine_wire`
//! already decodes into `Op::lut`), and `bin-policy only-changed` ships
//! the bins changed since the LST as an update. It needs per-bin metadata
//! in the stored body (replication, migrations, device): not started.
//!
//! The filter expressions (`xdr-set-filter`) are the cluster's, kept and
//! shared as system metadata ([`filters`]); a lane takes its DC and
//! namespace's when it is added and whenever the store changes.

pub mod config;
pub mod filters;
pub mod run;

use base64::Engine as _;
use citrine_data::filter::Expression;
use citrine_service::smd::PushClock;
use citrine_service::{Service, XdrInfo};
use citrine_xdr::config::{Command, DcConfig, NamespaceSettings, Rewind};
use citrine_xdr::lst_push::LstPush;
use citrine_xdr::{lst_file, Limits, Shipper};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

/// One DC and namespace's shipper and its measured rates.
pub struct Lane {
    pub shipper: Shipper,
    /// Successes and latency sum of the second being counted.
    pub second_start_ms: u64,
    pub second_count: u64,
    pub second_latency_ms: u64,
    /// The last whole second's figures.
    pub throughput: u64,
    pub latency_ms: u64,
    /// LSTs changed since the last save.
    pub dirty: bool,
    /// The filter expression (`xdr-set-filter`): its base64 text and the
    /// parsed form every shipped record must pass.
    pub filter: Option<(String, Arc<Expression>)>,
    /// Records' writes sent, compressed or not.
    pub wire: Wire,
}

/// What the records' writes of a lane cost on the wire
/// (`uncompressed_pct`, `compression_ratio`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Wire {
    pub uncompressed: u64,
    pub compressed: u64,
    /// Bytes of the compressed ones, before and after compression.
    pub original_bytes: u64,
    pub sent_bytes: u64,
}

impl Wire {
    pub fn count(&mut self, compressed: bool, original: usize, sent: usize) {
        if compressed {
            self.compressed += 1;
            self.original_bytes += original as u64;
            self.sent_bytes += sent as u64;
        } else {
            self.uncompressed += 1;
        }
    }

    fn add(&mut self, other: &Wire) {
        self.uncompressed += other.uncompressed;
        self.compressed += other.compressed;
        self.original_bytes += other.original_bytes;
        self.sent_bytes += other.sent_bytes;
    }

    /// Percentage of the writes sent uncompressed (100 before any).
    fn uncompressed_pct(&self) -> f64 {
        match self.uncompressed + self.compressed {
            0 => 100.0,
            all => self.uncompressed as f64 * 100.0 / all as f64,
        }
    }

    /// Bytes sent over bytes before compression, of the compressed ones
    /// (1 before any).
    fn compression_ratio(&self) -> f64 {
        match self.original_bytes {
            0 => 1.0,
            original => self.sent_bytes as f64 / original as f64,
        }
    }
}

/// A destination: its configuration and one lane per namespace.
#[derive(Default)]
pub struct Dc {
    pub config: DcConfig,
    pub lanes: BTreeMap<String, Lane>,
    /// Bumped when `node-address-port` changes: the client is remade.
    pub nodes_generation: u64,
}

/// Everything [`Xdr`] guards.
#[derive(Default)]
pub struct State {
    pub dcs: BTreeMap<String, Dc>,
    /// The filter expressions the cluster shares.
    pub filters: filters::Filters,
    /// Microseconds the shipping thread's last turn took.
    pub lap_us: u64,
}

/// XDR's state on this node, shared by the info commands and the thread.
pub struct Xdr {
    state: Mutex<State>,
    /// When the filters were last pushed to the other members.
    pub filters_push: PushClock,
    service: Arc<Service>,
    directory: Option<PathBuf>,
}

impl Xdr {
    /// XDR with the DCs of `[xdr]`; LSTs restored from `directory`.
    pub fn new(
        service: Arc<Service>,
        directory: Option<PathBuf>,
        dcs: &BTreeMap<String, DcConfig>,
    ) -> Arc<Xdr> {
        let filters = filters::Filters::load(
            directory
                .as_ref()
                .map(|directory| directory.join("xdr-filters.smd")),
        );
        let xdr = Arc::new(Xdr {
            state: Mutex::new(State {
                filters,
                ..State::default()
            }),
            filters_push: PushClock::default(),
            service,
            directory,
        });
        {
            let mut state = xdr.lock();
            for (name, config) in dcs {
                let mut dc = Dc {
                    config: DcConfig {
                        nodes: config.nodes.clone(),
                        namespaces: BTreeMap::new(),
                    },
                    ..Dc::default()
                };
                for (namespace, settings) in &config.namespaces {
                    xdr.add_lane(&mut dc, name, namespace, settings.clone(), Rewind::None);
                    apply_filter(&mut dc, &state.filters, name, namespace);
                }
                state.dcs.insert(name.clone(), dc);
            }
        }
        xdr
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn service(&self) -> &Arc<Service> {
        &self.service
    }

    fn lst_path(&self, dc: &str, namespace: &str) -> Option<PathBuf> {
        Some(self.directory.as_ref()?.join(lst_file::name(dc, namespace)))
    }

    /// Adds a namespace's lane: its LSTs from the file when one is kept
    /// and no rewind is asked, else it ships every write from the rewind
    /// point on (without one: from this millisecond on, so a client's write
    /// answered in the same millisecond as the add is shipped).
    fn add_lane(
        &self,
        dc: &mut Dc,
        dc_name: &str,
        namespace: &str,
        settings: NamespaceSettings,
        rewind: Rewind,
    ) {
        let now_ms = self.service.now().unix_ms;
        let ship_from = match rewind {
            Rewind::None => now_ms,
            Rewind::All => 0,
            Rewind::Seconds(seconds) => now_ms.saturating_sub(seconds.saturating_mul(1000)),
        };
        let saved = match rewind {
            Rewind::None => self
                .lst_path(dc_name, namespace)
                .and_then(|path| std::fs::read(path).ok())
                .and_then(|bytes| lst_file::decode(&bytes)),
            _ => None,
        };
        let mut shipper = Shipper::new(settings.clone(), Limits::default(), ship_from);
        if let Some(lsts) = saved {
            shipper = Shipper::new(settings.clone(), Limits::default(), 0);
            for (partition, lst) in lsts.into_iter().enumerate() {
                shipper.restore_lst(partition as u16, lst);
            }
            tracing::info!(dc = dc_name, namespace, "xdr: last-ship times restored");
        }
        dc.config.namespaces.insert(namespace.to_owned(), settings);
        dc.lanes.insert(
            namespace.to_owned(),
            Lane {
                shipper,
                second_start_ms: now_ms,
                second_count: 0,
                second_latency_ms: 0,
                throughput: 0,
                latency_ms: 0,
                dirty: true,
                filter: None,
                wire: Wire::default(),
            },
        );
    }

    /// Writes the LST files of the lanes whose LSTs moved.
    pub fn save_lsts(&self, state: &mut State) {
        for (dc_name, dc) in &mut state.dcs {
            for (namespace, lane) in &mut dc.lanes {
                if !lane.dirty {
                    continue;
                }
                lane.dirty = false;
                let Some(path) = self.lst_path(dc_name, namespace) else {
                    continue;
                };
                let bytes = lst_file::encode(&lane.shipper.lsts());
                let temporary = path.with_extension("tmp");
                let written = std::fs::write(&temporary, bytes)
                    .and_then(|()| std::fs::rename(&temporary, &path));
                if let Err(error) = written {
                    tracing::warn!(dc = %dc_name, namespace = %namespace, "xdr: cannot save last-ship times: {error}");
                    lane.dirty = true;
                }
            }
        }
    }

    fn apply(&self, command: Command) -> Result<(), String> {
        let mut state = self.lock();
        match command {
            Command::CreateDc(name) => {
                if state.dcs.contains_key(&name) {
                    return Err(format!("DC {name} already exists"));
                }
                state.dcs.insert(name, Dc::default());
            }
            Command::DeleteDc(name) => {
                let dc = state.dcs.get(&name).ok_or(format!("DC {name} not found"))?;
                if !dc.lanes.is_empty() {
                    return Err(format!("DC {name} still has namespaces"));
                }
                state.dcs.remove(&name);
            }
            Command::AddNode(name, address) => {
                let dc = dc_mut(&mut state, &name)?;
                if !dc.config.nodes.contains(&address) {
                    dc.config.nodes.push(address);
                    dc.nodes_generation += 1;
                }
            }
            Command::RemoveNode(name, address) => {
                let dc = dc_mut(&mut state, &name)?;
                let before = dc.config.nodes.len();
                dc.config.nodes.retain(|node| *node != address);
                if dc.config.nodes.len() == before {
                    return Err(format!("{address} is not a node of DC {name}"));
                }
                dc.nodes_generation += 1;
            }
            Command::AddNamespace(name, namespace, rewind) => {
                if self.service.namespace(namespace.as_bytes()).is_none() {
                    return Err(format!("namespace {namespace} not found"));
                }
                let State { dcs, filters, .. } = &mut *state;
                let dc = dcs
                    .get_mut(&name)
                    .ok_or_else(|| format!("DC {name} not found"))?;
                if dc.lanes.contains_key(&namespace) {
                    return Err(format!(
                        "namespace {namespace} is already shipped to DC {name}"
                    ));
                }
                self.add_lane(dc, &name, &namespace, NamespaceSettings::default(), rewind);
                apply_filter(dc, filters, &name, &namespace);
            }
            Command::RemoveNamespace(name, namespace) => {
                let dc = dc_mut(&mut state, &name)?;
                dc.lanes
                    .remove(&namespace)
                    .ok_or(format!("namespace {namespace} is not shipped to DC {name}"))?;
                dc.config.namespaces.remove(&namespace);
            }
            Command::Set(name, namespace, setting, value, add) => {
                let dc = dc_mut(&mut state, &name)?;
                let lane = dc
                    .lanes
                    .get_mut(&namespace)
                    .ok_or(format!("namespace {namespace} is not shipped to DC {name}"))?;
                let mut settings = lane.shipper.settings().clone();
                settings.apply(&setting, &value, add)?;
                lane.shipper.set_settings(settings.clone());
                dc.config.namespaces.insert(namespace, settings);
            }
        }
        Ok(())
    }
}

impl Xdr {
    /// `xdr-set-filter`: parses `exp` (base64 of the expression's msgpack,
    /// as the clients' `setXDRFilter` sends it; `null` removes the filter)
    /// and sets it in the shared store, which the other members get before
    /// the answer (`Store::XdrFilters`). As the reference's, it needs no
    /// DC or namespace configured here; the errors are the reference's.
    fn set_filter_of(&self, params: &[(&str, &str)]) -> Result<(), &'static str> {
        let get = |key: &str| params.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        let dc = get("dc").filter(|dc| !dc.is_empty()).ok_or("DC-name")?;
        let namespace = get("namespace")
            .filter(|namespace| !namespace.is_empty())
            .ok_or("namespace-name")?;
        let exp = get("exp")
            .filter(|exp| !exp.is_empty())
            .ok_or("expression")?;
        if exp != "null" {
            parse_filter(exp).map_err(|_| "build-expression")?;
        }
        let now_ms = self.service.now().unix_ms;
        let mut state = self.lock();
        let known = state
            .filters
            .entries
            .get(&(dc.to_owned(), namespace.to_owned()))
            .map(|entry| entry.version);
        let version = citrine_service::smd::next_version(known, now_ms, self.service.node_id);
        let entry = filters::Entry {
            version,
            exp: (exp != "null").then(|| exp.to_owned()),
        };
        state.filters.set(dc, namespace, entry);
        state.filters.save();
        self.filters_push.mark();
        let State { dcs, filters, .. } = &mut *state;
        if let Some(dc_state) = dcs.get_mut(dc) {
            apply_filter(dc_state, filters, dc, namespace);
        }
        Ok(())
    }

    /// `xdr-get-filter`: `namespace=NS:exp=BASE64` for the namespace asked
    /// (`exp=null` without a filter) or for every namespace of the DC
    /// that has one, `;`-separated.
    fn get_filter_of(&self, params: &[(&str, &str)]) -> Result<String, &'static str> {
        let get = |key: &str| params.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        let dc = get("dc").filter(|dc| !dc.is_empty()).ok_or("DC-name")?;
        match get("b64") {
            None | Some("true" | "false" | "yes" | "no") => {}
            Some(_) => return Err("b64-param"),
        }
        let state = self.lock();
        let line = |namespace: &str, exp: Option<&str>| {
            format!("namespace={namespace}:exp={}", exp.unwrap_or("null"))
        };
        if let Some(namespace) = get("namespace") {
            if self.service.namespace(namespace.as_bytes()).is_none() {
                return Err("bad-namespace");
            }
            return Ok(line(namespace, state.filters.get(dc, namespace)));
        }
        let lines: Vec<String> = state
            .filters
            .entries
            .iter()
            .filter(|((of, _), entry)| of == dc && entry.exp.is_some())
            .map(|((_, namespace), entry)| line(namespace, entry.exp.as_deref()))
            .collect();
        Ok(lines.join(";"))
    }
}

/// A filter's base64 text parsed as a filter expression.
pub fn parse_filter(text: &str) -> Result<Arc<Expression>, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|_| "exp is not base64".to_owned())?;
    citrine_data::filter::parse(&bytes)
        .map(Arc::new)
        .map_err(|code| format!("exp is not a filter expression ({code:?})"))
}

/// Sets a lane's filter from the shared store (none when the DC does not
/// ship the namespace).
fn apply_filter(dc: &mut Dc, filters: &filters::Filters, dc_name: &str, namespace: &str) {
    let Some(lane) = dc.lanes.get_mut(namespace) else {
        return;
    };
    lane.filter = filters.get(dc_name, namespace).and_then(|text| {
        let parsed = parse_filter(text).ok()?;
        Some((text.to_owned(), parsed))
    });
}

fn dc_mut<'s>(state: &'s mut State, name: &str) -> Result<&'s mut Dc, String> {
    state
        .dcs
        .get_mut(name)
        .ok_or_else(|| format!("DC {name} not found"))
}

impl XdrInfo for Xdr {
    fn set_config(&self, params: &[(&str, &str)]) -> String {
        match Command::parse(params).and_then(|command| self.apply(command)) {
            Ok(()) => "ok".to_owned(),
            Err(error) => format!("ERROR:4:{error}"),
        }
    }

    fn get_config(&self, params: &[(&str, &str)]) -> String {
        let state = self.lock();
        let get = |key: &str| params.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        let Some(name) = get("dc") else {
            let names: Vec<&str> = state.dcs.keys().map(String::as_str).collect();
            return format!("dcs={}", names.join(","));
        };
        let Some(dc) = state.dcs.get(name) else {
            return format!("ERROR:4:DC {name} not found");
        };
        match get("namespace") {
            None => format!(
                "node-address-ports={};namespaces={}",
                dc.config.nodes.join(","),
                dc.lanes.keys().cloned().collect::<Vec<_>>().join(",")
            ),
            Some(namespace) => match dc.lanes.get(namespace) {
                Some(lane) => settings_pairs(lane.shipper.settings()),
                None => format!("ERROR:4:namespace {namespace} is not shipped to DC {name}"),
            },
        }
    }

    fn receive_lsts(&self, payload: &[u8]) -> bool {
        let Some(push) = LstPush::decode(payload) else {
            return false;
        };
        let mut state = self.lock();
        let lane = state
            .dcs
            .get_mut(&push.dc)
            .and_then(|dc| dc.lanes.get_mut(&push.namespace));
        if let Some(lane) = lane {
            for (partition, lst) in push.lsts {
                lane.dirty |= lane.shipper.adopt_lst(partition, lst);
            }
        }
        true
    }

    fn set_filter(&self, params: &[(&str, &str)]) -> String {
        match self.set_filter_of(params) {
            Ok(()) => "ok".to_owned(),
            Err(error) => format!("ERROR::{error}"),
        }
    }

    fn get_filter(&self, params: &[(&str, &str)]) -> String {
        self.get_filter_of(params)
            .unwrap_or_else(|error| format!("ERROR::{error}"))
    }

    fn filters_text(&self) -> String {
        self.lock().filters.text()
    }

    fn merge_filters(&self, text: &str) {
        let mut state = self.lock();
        let changed = state.filters.merge(text);
        if changed.is_empty() {
            return;
        }
        state.filters.save();
        let State { dcs, filters, .. } = &mut *state;
        for (dc_name, namespace) in changed {
            if let Some(dc) = dcs.get_mut(&dc_name) {
                apply_filter(dc, filters, &dc_name, &namespace);
            }
        }
    }

    fn get_stats(&self, params: &[(&str, &str)]) -> String {
        let state = self.lock();
        let get = |key: &str| params.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        let Some(name) = get("dc") else {
            return "ERROR:4:missing dc".to_owned();
        };
        let Some(dc) = state.dcs.get(name) else {
            return format!("ERROR:4:DC {name} not found");
        };
        let lanes: Vec<&Lane> = match get("namespace") {
            None => dc.lanes.values().collect(),
            Some(namespace) => match dc.lanes.get(namespace) {
                Some(lane) => vec![lane],
                None => {
                    return format!("ERROR:4:namespace {namespace} is not shipped to DC {name}")
                }
            },
        };
        stats_answer(&lanes, self.service.now().unix_ms, state.lap_us)
    }
}

fn settings_pairs(settings: &NamespaceSettings) -> String {
    let sets = |sets: &std::collections::BTreeSet<Vec<u8>>| {
        sets.iter()
            .map(|set| String::from_utf8_lossy(set).into_owned())
            .collect::<Vec<_>>()
            .join(",")
    };
    format!(
        "compression-level={};compression-threshold={};delay-ms={};enable-compression={};forward={};hot-key-ms={};ignore-set={};max-throughput={};ship-only-specified-sets={};ship-set={}",
        settings.compression_level,
        settings.compression_threshold,
        settings.delay_ms,
        settings.enable_compression,
        settings.forward,
        settings.hot_key_ms,
        sets(&settings.ignore_sets),
        settings.max_throughput,
        settings.ship_only_specified_sets,
        sets(&settings.ship_sets),
    )
}

/// The reference's statistic names, summed over `lanes` (lag: the worst).
fn stats_answer(lanes: &[&Lane], now_ms: u64, lap_us: u64) -> String {
    let mut sum = citrine_xdr::Counters::default();
    let (mut lag_ms, mut in_queue, mut in_progress, mut pending) = (0, 0, 0, 0);
    let (mut throughput, mut latency_weighted) = (0, 0);
    let mut wire = Wire::default();
    for lane in lanes {
        wire.add(&lane.wire);
        let shipper = &lane.shipper;
        let counters = shipper.counters();
        sum.success += counters.success;
        sum.abandoned += counters.abandoned;
        sum.not_found += counters.not_found;
        sum.filtered_out += counters.filtered_out;
        sum.retry_conn_reset += counters.retry_conn_reset;
        sum.retry_dest += counters.retry_dest;
        sum.recoveries += counters.recoveries;
        sum.hot_keys += counters.hot_keys;
        lag_ms = shipper.lag_ms(now_ms).max(lag_ms);
        in_queue += shipper.in_queue();
        in_progress += shipper.in_progress();
        pending += shipper.recoveries_pending();
        throughput += lane.throughput;
        latency_weighted += lane.latency_ms * lane.throughput;
    }
    let latency_ms = latency_weighted.checked_div(throughput).unwrap_or(0);
    let mut out = String::new();
    let _ = write!(
        out,
        "lag={};in_queue={in_queue};in_progress={in_progress};success={};abandoned={};not_found={};filtered_out={};retry_conn_reset={};retry_dest={};recoveries={};recoveries_pending={pending};hot_keys={};uncompressed_pct={:.3};compression_ratio={:.3};throughput={throughput};latency_ms={latency_ms};lap_us={lap_us}",
        lag_ms / 1000,
        sum.success,
        sum.abandoned,
        sum.not_found,
        sum.filtered_out,
        sum.retry_conn_reset,
        sum.retry_dest,
        sum.recoveries,
        sum.hot_keys,
        wire.uncompressed_pct(),
        wire.compression_ratio(),
    );
    out
}
