//! The `truncate`, `truncate-namespace`, `truncate-undo` and
//! `truncate-namespace-undo` info commands: their parameters checked as
//! the reference checks them (an empty or missing value is never taken as
//! "everything"), then the truncation put into effect, or undone,
//! cluster-wide by the distribution layer
//! ([`citrine_distribution::truncations`]: thresholds, pushes, the
//! exchange's sync, the file).
//!
//! A command without a lut takes the millisecond after now (or after the
//! namespace's latest threshold, if later), so it covers every record
//! acknowledged before it, even in the same millisecond; a version written
//! after it gets a last-update time at or past it
//! (`Namespace::version_lut_ms`), so a write acknowledged after the
//! command is never covered.

use crate::Service;
use citrine_types::CITRUSLEAF_EPOCH_UNIX_SECONDS;
use citrine_wire::info::InfoCommand;

/// A truncation command's parameters, checked as the reference checks
/// them, before the namespace is looked up.
struct TruncateRequest<'a> {
    namespace: &'a str,
    /// `None` for `truncate-namespace`.
    set: Option<&'a str>,
    /// The lut given, in Unix milliseconds; `None` means "now".
    lut_ms: Option<u64>,
}

impl<'a> TruncateRequest<'a> {
    /// Checks the parameters in the reference's order: the namespace
    /// (`namespace=` only: missing or empty → 20), the set (`truncate`:
    /// missing, empty or too long → 4; `truncate-namespace`: present → 4),
    /// then the lut (empty, at or before the citrusleaf epoch, or in the
    /// future → 4; an undo takes no lut and ignores one). An empty or
    /// missing value is never taken as "everything".
    fn parse(
        command: &InfoCommand<'a>,
        whole_namespace: bool,
        undo: bool,
        now_ms: u64,
    ) -> Result<Self, String> {
        let namespace = crate::info::namespace_under(command, "namespace")?;
        let set = match whole_namespace {
            true if command.param("set").is_some() => {
                return Err("ERROR:4:unexpected set name".to_owned())
            }
            true => None,
            false => Some(crate::info::set_name(command)?),
        };
        let lut_ms = match command.param("lut") {
            Some(text) if !undo => Some(parse_lut_ms(text, now_ms)?),
            _ => None,
        };
        Ok(TruncateRequest {
            namespace,
            set,
            lut_ms,
        })
    }
}

/// A `lut` parameter (nanoseconds since the Unix epoch) in Unix
/// milliseconds. As the reference reads it, the digits up to the first
/// other character count (none → 0); a lut that would truncate to or
/// before the citrusleaf epoch, or one past now, is refused.
fn parse_lut_ms(text: &str, now_ms: u64) -> Result<u64, String> {
    if text.is_empty() {
        return Err("ERROR:4:missing 'lut' value".to_owned());
    }
    if text.starts_with('-') {
        return Err("ERROR:4:would truncate in the future".to_owned());
    }
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let nanoseconds = match text[..digits].parse::<u64>() {
        Ok(value) => value,
        Err(_) if digits == 0 => 0,
        // More digits than a u64 holds: far in the future.
        Err(_) => return Err("ERROR:4:would truncate in the future".to_owned()),
    };
    let unix_ms = nanoseconds / 1_000_000;
    if unix_ms <= CITRUSLEAF_EPOCH_UNIX_SECONDS * 1_000 {
        return Err("ERROR:4:would truncate to 0".to_owned());
    }
    if unix_ms > now_ms {
        return Err("ERROR:4:would truncate in the future".to_owned());
    }
    Ok(unix_ms)
}

impl Service {
    /// `truncate:namespace=NS;set=SET[;lut=NANOS]` and
    /// `truncate-namespace:namespace=NS[;lut=NANOS]`: records last updated
    /// before the lut (nanoseconds since the Unix epoch; when absent, every
    /// record last updated up to now, this millisecond included) are
    /// removed here at once and on every other member after the push. A
    /// namespace this node does not have answers `ok` and changes nothing,
    /// as in the reference.
    pub(crate) fn truncate_command(
        &self,
        command: &InfoCommand<'_>,
        whole_namespace: bool,
    ) -> String {
        let now_ms = self.now().unix_ms;
        let request = match TruncateRequest::parse(command, whole_namespace, false, now_ms) {
            Ok(request) => request,
            Err(answer) => return answer,
        };
        let Some(namespace) = self.namespace_shared(request.namespace.as_bytes()) else {
            return "ok".to_owned();
        };
        // Without a lut every record acknowledged before the command is
        // covered, even one written in this same millisecond: a version's
        // lut is at most now or an earlier threshold
        // (Namespace::version_lut_ms, which puts a version written after
        // this command at or past the new threshold).
        let lut_ms = request
            .lut_ms
            .unwrap_or_else(|| now_ms.max(namespace.latest_truncation_ms()) + 1);
        match self.dist().truncate(namespace, request.set, lut_ms) {
            Ok(()) => "ok".to_owned(),
            Err(message) => format!("ERROR:1:{message}"),
        }
    }
}

impl Service {
    /// `truncate-undo:namespace=NS;set=SET` and
    /// `truncate-namespace-undo:namespace=NS`: the truncation in effect is
    /// removed here at once and on every other member after the push;
    /// what it removed stays removed (see
    /// [`citrine_distribution::truncations`]). `ok` also when there is no
    /// truncation to undo, or no such namespace here, as in the reference.
    pub(crate) fn truncate_undo_command(
        &self,
        command: &InfoCommand<'_>,
        whole_namespace: bool,
    ) -> String {
        let now_ms = self.now().unix_ms;
        let request = match TruncateRequest::parse(command, whole_namespace, true, now_ms) {
            Ok(request) => request,
            Err(answer) => return answer,
        };
        let Some(namespace) = self.namespace_shared(request.namespace.as_bytes()) else {
            return "ok".to_owned();
        };
        match self.dist().undo_truncation(namespace, request.set) {
            Ok(()) => "ok".to_owned(),
            Err(message) => format!("ERROR:1:{message}"),
        }
    }
}

#[cfg(test)]
mod tests;
