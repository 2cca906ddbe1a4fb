//! Data mode on a strong-consistency namespace ([`DataConfig::sc`]): the
//! roster, the harsher faults SC must survive, and the history checks of
//! linearizable reads.
//!
//! Owns: the namespace's SC settings ([`World::namespace_config`]), the
//! roster set to the initial nodes before the clients start
//! ([`World::set_roster`]), the SC events ([`World::sc_event`]: crashes
//! without waiting for the copies — one, or every node at once —,
//! restarts, freezes, network partitions of the live nodes into two
//! sides, wall-clock steps of up to 60 s either way; restarts on a blank
//! device, its work directory kept or wiped too, of one node at a time
//! until every partition is available again: two such nodes at once are
//! two replicas' drives lost, which replication factor 2 does not
//! survive), the end of a run (heal, restart every node, read every key back
//! through the clients' path: [`World::sc_check`]) and the read checks.
//!
//! Invariants checked (a failure names the seed and the history):
//! - a linearizable read of a counter sees at least the increments
//!   acknowledged before it was sent, and at most those sent
//!   ([`World::check_counter_read`]);
//! - a linearizable read of a put key shows the effect of an attempt not
//!   older than the last one acknowledged before the read was sent, and
//!   never a value no attempt wrote ([`World::check_put_read`]);
//! - at the end, every key read back (11 is retried for a while; a key
//!   still unavailable is counted, not judged) holds what the AP checks
//!   demand: counters between their acknowledged and acknowledged + in
//!   doubt increments, put keys their last acknowledged attempt or a later
//!   one.
//!
//! Clients reach every side of a partition (they are not cut); fabric
//! answers are never cut (a late answer is a legal delay).

use super::*;

/// The client index of the final reader (not one of the clients).
pub(super) const FINAL_READER: usize = usize::MAX;
/// How long a key unavailable at the end is retried (once every partition
/// that can be is available), ms.
const READ_BACK_MS: u64 = 600;
/// Bound on every partition becoming available (after the roster is set,
/// and at the end), ms.
const AVAILABLE_BOUND_MS: u64 = 20_000;

impl World {
    /// Namespace `test` on `storage_engine`: strong consistency with its
    /// data path on in SC runs.
    pub(super) fn namespace_config(&self, storage_engine: StorageEngineConfig) -> NamespaceConfig {
        let mut namespace = NamespaceConfig {
            storage_engine,
            ..NamespaceConfig::in_memory(NAMESPACE)
        };
        if self.cfg.sc {
            namespace.sc.strong_consistency = true;
            namespace.sc.serve_data = true;
        }
        namespace
    }

    /// A read's header: linearizable on an SC namespace.
    pub(super) fn read_header(&self) -> MsgHeader {
        MsgHeader {
            info1: info1::READ | info1::GET_ALL,
            info3: if self.cfg.sc {
                citrine_wire::msg::info3::SC_READ_TYPE
            } else {
                0
            },
            transaction_ttl: self.cfg.client_timeout_ms as u32,
            ..MsgHeader::default()
        }
    }

    /// The last acknowledged attempt on put key `key`.
    pub(super) fn last_acked(&self, key: usize) -> Option<usize> {
        self.puts[key]
            .iter()
            .rposition(|a| a.outcome == Outcome::Acked)
    }

    /// A linearizable read of `counter` answered `value`; `floor`
    /// increments were acknowledged before it was sent.
    pub(super) fn check_counter_read(
        &mut self,
        counter: usize,
        floor: u64,
        value: i64,
    ) -> Result<(), Failure> {
        self.reads_checked += 1;
        if u64::try_from(value).unwrap_or(0) < floor {
            return Err(self.fail(
                Invariant::StaleRead,
                format!(
                    "counter {counter} read {value} after {floor} increments were acknowledged"
                ),
            ));
        }
        Ok(())
    }

    /// A linearizable read of put key `key` answered `seen` (`None`:
    /// absent); its attempt `floor` was the last acknowledged before the
    /// read was sent.
    pub(super) fn check_put_read(
        &mut self,
        key: usize,
        floor: Option<usize>,
        seen: Option<i64>,
    ) -> Result<(), Failure> {
        self.reads_checked += 1;
        let attempts = &self.puts[key];
        let found = attempts
            .iter()
            .rposition(|a| a.value == seen && a.outcome != Outcome::Failed);
        let (ok, invariant) = match (seen, found) {
            (None, None) => (floor.is_none(), Invariant::StaleRead),
            (Some(_), None) => (false, Invariant::PhantomWrite),
            (_, Some(j)) => (floor.is_none_or(|f| j >= f), Invariant::StaleRead),
        };
        if ok {
            return Ok(());
        }
        let history: Vec<(Option<i64>, Outcome)> =
            attempts.iter().map(|a| (a.value, a.outcome)).collect();
        Err(self.fail(
            invariant,
            format!(
                "put key {key} read {seen:?} (attempt {found:?}) after attempt {floor:?} was \
                 acknowledged; attempts {history:?}"
            ),
        ))
    }

    /// Node `i`'s answer to the info command `command`.
    fn ask(&self, i: usize, command: &str) -> String {
        let Some(up) = &self.nodes[i].up else {
            return String::new();
        };
        let frame = citrine_wire::info::request_frame(&[command]);
        let mut out = Vec::new();
        citrine_service::info::handle(
            &up.service,
            frame.get(PROTO_HEADER_SIZE..).unwrap_or_default(),
            &mut out,
        );
        out.get(PROTO_HEADER_SIZE..)
            .map(citrine_wire::info::parse_response)
            .unwrap_or_default()
            .into_iter()
            .next()
            .map(|(_, value)| value)
            .unwrap_or_default()
    }

    /// Every live node serves every partition of the namespace.
    fn all_available(&self) -> bool {
        let command = format!("namespace/{NAMESPACE}");
        self.live().iter().all(|i| {
            self.ask(*i, &command)
                .split(';')
                .any(|pair| pair == "unavailable_partitions=0")
        })
    }

    /// The roster becomes the live nodes (`roster-set:` and `recluster:`
    /// at their principal, as an operator does), and the run waits until
    /// every partition is available.
    pub(super) fn set_roster(&mut self) -> Result<(), Failure> {
        let live = self.live();
        let ids: Vec<String> = live.iter().map(|i| self.nodes[*i].id.to_string()).collect();
        // At the principal (the highest id): elsewhere `recluster:` is
        // ignored.
        let Some(&at) = live.iter().max_by_key(|i| self.nodes[**i].id) else {
            return Ok(());
        };
        let staged = format!("roster-set:namespace={NAMESPACE};nodes={}", ids.join(","));
        for command in [staged.as_str(), "recluster:"] {
            let answer = self.ask(at, command);
            self.note(format!("#{at} {command} -> {answer}"));
            if answer != "ok" {
                return Err(self.fail(
                    Invariant::NodeStart,
                    format!("{command} at #{at} answered {answer}"),
                ));
            }
        }
        self.wait_until(
            AVAILABLE_BOUND_MS,
            "every partition available",
            false,
            |w| w.settled() && w.all_available(),
        )
    }

    /// One SC event (drawn): a spare joins, a node crashes (whatever the
    /// copies), every node crashes at once, a crashed node restarts, a
    /// node freezes, the network splits in two for 1–6 s, or (with
    /// [`DataConfig::clock_jumps`]) a node's wall clock is stepped.
    pub(super) fn sc_event(&mut self) -> Result<(), Failure> {
        if self.rebuilt_unsettled && self.settled() && self.all_available() {
            self.rebuilt_unsettled = false;
        }
        let never: Vec<usize> = (0..self.nodes.len())
            .filter(|i| self.nodes[*i].boots == 0)
            .collect();
        let down: Vec<usize> = (0..self.nodes.len())
            .filter(|i| self.nodes[*i].boots > 0 && self.nodes[*i].up.is_none())
            .collect();
        let live = self.live();
        let frozen = self
            .nodes
            .iter()
            .any(|n| n.up.as_ref().is_some_and(|up| up.frozen_until.is_some()));
        let mut options = Vec::new();
        if !never.is_empty() {
            options.push(0);
        }
        if live.len() >= 2 {
            options.extend([1, 1, 4, 5, 5]);
        }
        if !down.is_empty() {
            options.extend([2, 2, 2]);
        }
        if live.len() >= 2 && !frozen {
            options.push(3);
        }
        if self.cfg.clock_jumps && !live.is_empty() {
            options.push(6);
        }
        if options.is_empty() {
            return Ok(());
        }
        match options[self.rng.index(options.len())] {
            0 => {
                let i = never[self.rng.index(never.len())];
                self.events.push(format!("add #{i}"));
                self.boot(i)?;
            }
            1 => {
                let i = live[self.rng.index(live.len())];
                self.events.push(format!("crash #{i}"));
                self.crash(i);
            }
            2 => self.restart_one(&down)?,
            3 => {
                let i = live[self.rng.index(live.len())];
                let ms = self.rng.range(500, 4_000);
                self.events.push(format!("freeze #{i} for {ms} ms"));
                self.freeze(i, ms);
            }
            4 => {
                self.events.push("crash all".into());
                for i in live {
                    self.crash(i);
                }
            }
            6 => self.jump_clock(&live),
            _ => self.split_network(),
        }
        Ok(())
    }

    /// Steps one live node's wall clock: to 1–60 s ahead of or behind
    /// true time, or (one time in three, when it is off) back to it.
    fn jump_clock(&mut self, live: &[usize]) {
        let i = live[self.rng.index(live.len())];
        let jump = &self.nodes[i].jump_ms;
        let to = if jump.load(Ordering::Relaxed) != 0 && self.rng.chance(1.0 / 3.0) {
            0
        } else {
            let ms = self.rng.range(1, 60_000) as i64;
            if self.rng.chance(0.5) {
                ms
            } else {
                -ms
            }
        };
        jump.store(to, Ordering::Relaxed);
        self.hash = mix(self.hash, 0xC10C ^ (i as u64) ^ (to as u64) << 8);
        let what = format!("clock #{i} stepped to {to:+} ms");
        self.note(what.clone());
        self.events.push(what);
    }

    /// Splits the network in two sides (each with a live node) for 1–6 s.
    fn split_network(&mut self) {
        let live = self.live();
        let mut side: Vec<bool> = (0..self.nodes.len())
            .map(|_| self.rng.chance(0.5))
            .collect();
        // Both sides hold a live node.
        side[live[0]] = false;
        side[live[1 + self.rng.index(live.len() - 1)]] = true;
        let ms = self.rng.range(1_000, 6_000);
        let text = |want: bool| {
            (0..side.len())
                .filter(|i| side[*i] == want)
                .map(|i| format!("#{i}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let what = format!("split {{{}}} | {{{}}} for {ms} ms", text(false), text(true));
        self.hash = mix(self.hash, 0x5B17 ^ ms);
        self.events.push(what.clone());
        self.note(what);
        self.core.lock().split = Some(side);
        self.split_until = Some(self.now() + ms);
    }

    /// Ends the network partition in force.
    pub(super) fn heal(&mut self) {
        if self.core.lock().split.take().is_some() {
            self.note("network healed".into());
        }
        self.split_until = None;
    }

    /// The end of an SC run: the network heals, every crashed node
    /// restarts, and the run waits (bounded) for every partition to be
    /// available again.
    pub(super) fn heal_and_restart_all(&mut self) -> Result<(), Failure> {
        self.heal();
        loop {
            let down: Vec<usize> = (0..self.nodes.len())
                .filter(|i| self.nodes[*i].boots > 0 && self.nodes[*i].up.is_none())
                .collect();
            let Some(&i) = down.first() else { break };
            self.restart_one(&[i])?;
        }
        let start = self.now();
        while !(self.settled() && self.all_available()) {
            if self.now() > start + AVAILABLE_BOUND_MS {
                self.note("not every partition available at the end".into());
                break;
            }
            self.step()?;
        }
        Ok(())
    }

    /// Reads `key` back through the clients' path (routed as a smart
    /// client does, proxied if need be, linearizable), retrying 9, 11 and
    /// lost answers for [`READ_BACK_MS`]: the value read (`None`: absent),
    /// or `None` if the key stayed unavailable.
    fn read_back(&mut self, key: &str) -> Result<Option<Option<i64>>, Failure> {
        let digest = digest_in(SET, key);
        let deadline = self.now() + READ_BACK_MS;
        loop {
            let req = self.next_req;
            self.next_req += 1;
            let frame = request_frame_in(SET, key, self.read_header(), None);
            self.final_reply = None;
            if let Some(to) = self.route(&digest) {
                self.core.lock().send(Packet::ClientRequest {
                    client: FINAL_READER,
                    req,
                    to,
                    frame,
                });
            }
            let sent = self.now();
            let mut reply = None;
            while reply.is_none() && self.now() < sent + self.cfg.client_timeout_ms + 500 {
                self.step()?;
                if let Some((r, frame)) = self.final_reply.take() {
                    if r == req {
                        reply = Some(parse_reply(&frame));
                    }
                }
            }
            match reply.flatten() {
                Some((0, value)) => return Ok(Some(value)),
                Some((2, _)) => return Ok(Some(None)),
                Some((9 | 11, _)) | None => {}
                Some((other, _)) => {
                    return Err(self.fail(
                        Invariant::ClientResult,
                        format!("final read of {key} answered {other}"),
                    ))
                }
            }
            if self.now() >= deadline {
                return Ok(None);
            }
            self.run_for(50, true)?;
        }
    }

    /// The SC checks at the end: every key read back and judged (see the
    /// module's invariants). Returns the records held.
    pub(super) fn sc_check(&mut self) -> Result<usize, Failure> {
        self.tend();
        for counter in 0..self.counters.len() {
            match self.read_back(&counter_key(counter))? {
                Some(value) => {
                    self.reads_checked += 1;
                    self.judge_counter(counter, value.unwrap_or(0))?;
                }
                None => self.unavailable_at_end += 1,
            }
        }
        for key in 0..self.puts.len() {
            match self.read_back(&put_key(key))? {
                Some(value) => {
                    self.reads_checked += 1;
                    self.judge_put(key, value)?;
                }
                None => self.unavailable_at_end += 1,
            }
        }
        Ok(self.live().iter().map(|i| self.records_held(*i)).sum())
    }
}
