//! Single-record requests as this node runs them: a decoded message made a
//! checked request (and its record UDF, if it names one), routed in a
//! cluster ([`crate::replication::route`]), and run here — a record UDF
//! through `crate::udf::apply`, anything else through the data layer's
//! [`citrine_data::record::perform`]. The record operations themselves are
//! the data layer's, re-exported here.

pub use citrine_data::record::*;

use crate::replication::{self, Hop, Remote, Route, RouteRequest};
use crate::udf::UdfCall;
use crate::Service;
use citrine_data::filter;
use citrine_data::tally::{Outcome, Tally};
use citrine_data::Namespace;
use citrine_types::ResultCode;
use citrine_wire::msg::{field_type, Message};

/// How a single-record request came and where its latency goes.
pub(crate) struct Call<'t> {
    /// How it came here (and its deadline, once a node fixed it).
    pub hop: Hop,
    /// Its duplicate resolution is done.
    pub resolved: bool,
    /// Learns the request's namespace and kind (see [`crate::latency`]).
    pub timed: &'t mut crate::latency::Timed,
}

/// Executes one single-record AS_MSG request (it has a DIGEST field and no
/// `info1 BATCH`; `Service` sends batches and scans elsewhere) and writes
/// exactly one reply frame to `out`.
///
/// In a cluster (more than one member and a fabric installed) the request
/// is routed by [`crate::replication::route`]: `body` (the request's AS_MSG
/// body) is forwarded when another node masters the record, and `hop` says
/// how it came here (and its deadline, once a node fixed it). The returned
/// work, if any, must be completed ([`crate::Service::complete_remote`])
/// before the reply in `out` is final. A node alone returns `None` and
/// allocates nothing.
pub(crate) fn execute(
    service: &Service,
    message: &Message<'_>,
    body: &[u8],
    call: Call<'_>,
    out: &mut Vec<u8>,
) -> Option<Box<Remote>> {
    let Call {
        hop,
        resolved,
        timed,
    } = call;
    let namespace_name = message.field(field_type::NAMESPACE);
    let index = namespace_name.and_then(|name| service.namespace_index(name));
    let namespaces = service.data().namespaces_shared();
    let Some((index, namespace)) = index.and_then(|index| Some((index, namespaces.get(index)?)))
    else {
        write_result(out, ResultCode::Namespace);
        return None;
    };
    let namespace: &Namespace = namespace;
    let sub = timed.is_sub();
    let tally = move |udf: bool| if sub { Tally::sub(udf) } else { Tally::Client };
    // (Looked up only on the refusals that count by it, not per request.)
    let names_udf = || message.field(field_type::UDF_FILENAME).is_some();
    if crate::sc::data_closed(namespace) {
        namespace.stats.count(tally(names_udf()), Outcome::Refused);
        write_result(out, ResultCode::Unavailable);
        return None;
    }
    let Some(digest_bytes) = message.field(field_type::DIGEST) else {
        write_result(out, ResultCode::Parameter);
        return None;
    };
    let refuse = |code: ResultCode, udf: bool, out: &mut Vec<u8>| {
        count_failure(namespace, &message.header, code, (udf, tally(udf)));
        write_result(out, code);
    };
    let filter = match parse_filter(message) {
        Ok(filter) => filter,
        Err(code) => {
            refuse(code, names_udf(), out);
            return None;
        }
    };
    let udf = match crate::udf::call_of(service.udf_registry(), message) {
        Ok(udf) => udf,
        Err(code) => {
            refuse(code, true, out);
            return None;
        }
    };
    let info2 = message.header.info2;
    service
        .latencies()
        .found(timed, index, info2, udf.is_some());
    let prepared = prepare(message, digest_bytes, filter.as_ref()).map(|mut request| {
        request.tally = tally(udf.is_some());
        request
    });
    match prepared {
        Ok(request) if service.routes() => run_routed(
            service,
            namespace,
            &request,
            udf.as_ref(),
            body,
            hop,
            resolved,
            out,
        ),
        Ok(request) if crate::sc::refuses_alone(service.dist(), namespace, &request.digest) => {
            namespace.stats.count(request.tally, Outcome::Refused);
            write_result(out, ResultCode::Unavailable);
            None
        }
        Ok(request) => {
            perform_here(namespace, &request, udf.as_ref(), service.now(), out);
            None
        }
        Err(code) => {
            refuse(code, udf.is_some(), out);
            None
        }
    }
}

/// Runs a request in a cluster where the distribution layer's routing
/// says: forwarded or resolved first (the fabric work is returned), or
/// here — as a read that replicates nothing, or as the master, whose
/// replica writes are returned.
#[allow(clippy::too_many_arguments)]
fn run_routed(
    service: &Service,
    namespace: &Namespace,
    request: &Request<'_>,
    udf: Option<&UdfCall<'_>>,
    body: &[u8],
    hop: Hop,
    resolved: bool,
    out: &mut Vec<u8>,
) -> Option<Box<Remote>> {
    let dist = service.dist();
    let routing = RouteRequest::of(request, udf.is_some());
    let digest = &request.digest;
    match replication::route(dist, namespace, digest, routing, body, hop, resolved, out) {
        Route::Answered => None,
        Route::Remote(remote) => Some(remote),
        Route::Read => {
            perform_here(namespace, request, udf, service.now(), out);
            None
        }
        Route::Master(run) => {
            perform_here(namespace, request, udf, service.now(), out);
            replication::replicate_after(dist, namespace, digest, run, out)
        }
    }
}

/// The filter expression (field 43), parsed once, before routing: a
/// malformed one is refused here, wherever the record lives.
fn parse_filter(message: &Message<'_>) -> Result<Option<citrine_exp::Expression>, ResultCode> {
    match message.field(field_type::FILTER_EXPRESSION) {
        Some(bytes) => filter::parse(bytes).map(Some),
        None => Ok(None),
    }
}

/// Runs one checked request here: its record UDF when it names one, else
/// the read, write or delete its header says (see
/// [`citrine_data::record::perform`]). Writes its one reply to `out`.
pub(crate) fn perform_here(
    namespace: &Namespace,
    request: &Request<'_>,
    udf: Option<&UdfCall<'_>>,
    now: Now,
    out: &mut Vec<u8>,
) {
    let Some(call) = udf else {
        citrine_data::record::perform(namespace, request, now, out);
        return;
    };
    let applied = if crate::txn::refuses_udf(namespace, &request.txn) {
        Err(ResultCode::EnterpriseOnly)
    } else {
        crate::udf::apply(namespace, request, call, now, out)
    };
    if let Err(code) = applied {
        count_failure(namespace, &request.header, code, (true, request.tally));
        write_error(out, code, request.reply);
    }
}
