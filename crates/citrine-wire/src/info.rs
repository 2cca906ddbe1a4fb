//! The info protocol (proto type 1): newline-terminated text commands, and
//! answers that echo each command line, a tab, the value and a newline.
//!
//! Command syntax: `name`, `name/arg/arg` (positional), or
//! `name:key=value;key=value` (parameters). Clients key answers by the full
//! echoed line, so [`InfoResponse::push`] echoes it byte for byte.

/// One parsed info command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoCommand<'a> {
    /// The whole line as received (without its newline), echoed in the answer.
    pub line: &'a str,
    /// The command name (before any `/` or `:`).
    pub name: &'a str,
    /// Positional arguments after `/`.
    pub positional: Vec<&'a str>,
    /// `key=value` parameters after `:`. An item without `=` (a bare
    /// `key`) is no parameter at all, as the reference reads it:
    /// `query-abort:id` misses its `id`, `udf-remove:filename` its file.
    pub params: Vec<(&'a str, &'a str)>,
}

impl<'a> InfoCommand<'a> {
    /// Parses one command line.
    pub fn parse(line: &'a str) -> InfoCommand<'a> {
        let (head, params_text) = match line.split_once(':') {
            Some((head, rest)) => (head, Some(rest)),
            None => (line, None),
        };
        let mut parts = head.split('/');
        let name = parts.next().unwrap_or_default();
        let positional = parts.collect();
        let params = params_text
            .map(|text| {
                text.split(';')
                    .filter_map(|item| item.split_once('='))
                    .collect()
            })
            .unwrap_or_default();
        InfoCommand {
            line,
            name,
            positional,
            params,
        }
    }

    /// The value of parameter `key`, if given.
    pub fn param(&self, key: &str) -> Option<&'a str> {
        self.params
            .iter()
            .find(|(name, _)| *name == key)
            .map(|(_, value)| *value)
    }

    /// The value of parameter `key`, which must be given and not empty:
    /// otherwise the reference's message for it, `missing 'KEY'` or
    /// `missing 'KEY' value` (the caller adds the `ERROR:CODE:` prefix).
    /// An empty value is never a wildcard.
    pub fn required(&self, key: &str) -> Result<&'a str, String> {
        match self.param(key) {
            None => Err(format!("missing '{key}'")),
            Some("") => Err(format!("missing '{key}' value")),
            Some(value) => Ok(value),
        }
    }
}

/// Splits an info request body into its command lines. Every line ended by
/// `\n` is a command; a final unterminated non-empty line is accepted too.
/// Invalid UTF-8 is replaced, so a garbage body yields garbage commands that
/// are answered as unrecognized, never a panic.
pub fn request_lines(body: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(body);
    text.split('\n')
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Builds an info answer body.
#[derive(Default, Debug)]
pub struct InfoResponse {
    body: Vec<u8>,
}

impl InfoResponse {
    pub fn new() -> InfoResponse {
        InfoResponse::default()
    }

    /// Appends `line\tvalue\n`.
    pub fn push(&mut self, line: &str, value: &str) {
        self.body.extend_from_slice(line.as_bytes());
        self.body.push(b'\t');
        self.body.extend_from_slice(value.as_bytes());
        self.body.push(b'\n');
    }

    /// The body built so far.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// Writes the complete type-1 frame into `out`.
    pub fn write_frame(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&crate::ProtoHeader::encode(
            crate::MessageType::Info,
            self.body.len() as u64,
        ));
        out.extend_from_slice(&self.body);
    }
}

/// Builds a type-1 request frame for the given command names.
pub fn request_frame(commands: &[&str]) -> Vec<u8> {
    let body: String = commands
        .iter()
        .map(|command| format!("{command}\n"))
        .collect();
    let mut out = crate::ProtoHeader::encode(crate::MessageType::Info, body.len() as u64).to_vec();
    out.extend_from_slice(body.as_bytes());
    out
}

/// Parses an info answer body into (command line, value) pairs. A line
/// without a tab yields an empty value.
pub fn parse_response(body: &[u8]) -> Vec<(String, String)> {
    String::from_utf8_lossy(body)
        .split('\n')
        .filter(|line| !line.is_empty())
        .map(|line| match line.split_once('\t') {
            Some((name, value)) => (name.to_owned(), value.to_owned()),
            None => (line.to_owned(), String::new()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_command_shapes() {
        let plain = InfoCommand::parse("namespaces");
        assert_eq!(plain.name, "namespaces");
        assert!(plain.positional.is_empty() && plain.params.is_empty());
        let positional = InfoCommand::parse("namespace/test");
        assert_eq!(positional.name, "namespace");
        assert_eq!(positional.positional, vec!["test"]);
        let params = InfoCommand::parse("get-config:context=namespace;namespace=test");
        assert_eq!(params.name, "get-config");
        assert_eq!(params.param("context"), Some("namespace"));
        assert_eq!(params.param("namespace"), Some("test"));
        assert_eq!(params.param("missing"), None);
        let empty = InfoCommand::parse("cluster-stable:");
        assert_eq!(empty.name, "cluster-stable");
        assert!(empty.params.is_empty());
        // A bare key is no parameter; an empty value is one.
        let bare = InfoCommand::parse("query-abort:id;trid=;x=1=2");
        assert_eq!(bare.param("id"), None);
        assert_eq!(bare.param("trid"), Some(""));
        assert_eq!(bare.param("x"), Some("1=2"));
        assert_eq!(bare.required("id"), Err("missing 'id'".into()));
    }

    #[test]
    fn a_required_parameter_is_neither_missing_nor_empty() {
        let command = InfoCommand::parse("truncate:namespace=test;set=");
        assert_eq!(command.required("namespace"), Ok("test"));
        assert_eq!(command.required("set"), Err("missing 'set' value".into()));
        assert_eq!(command.required("lut"), Err("missing 'lut'".into()));
    }

    #[test]
    fn request_and_response_round_trip() {
        let frame = request_frame(&["node", "build"]);
        assert_eq!(&frame[..8], &[2, 1, 0, 0, 0, 0, 0, 11]);
        assert_eq!(request_lines(&frame[8..]), vec!["node", "build"]);
        let mut response = InfoResponse::new();
        response.push("node", "BB9020011AC4202");
        assert_eq!(response.body(), b"node\tBB9020011AC4202\n");
        assert_eq!(
            parse_response(response.body()),
            vec![("node".to_owned(), "BB9020011AC4202".to_owned())]
        );
        assert_eq!(request_lines(&[0xff, b'\n']).len(), 1);
    }
}
