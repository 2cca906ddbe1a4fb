//! Index definitions: what `sindex-create` names (protocol 03 §4), checked
//! once, and the text forms the info commands and the definitions file use.
//!
//! Both command dialects are accepted: the pre-8.1 `ns=...;indexdata=BIN,TYPE`
//! and the 8.1 `namespace=...;bin=BIN;type=TYPE` / `exp=B64;type=TYPE`.
//!
//! Invariants: a parsed [`SindexDef`] names exactly one source (a bin, an
//! expression, or — a set index — its set's membership), a key type this
//! server indexes, and a context and expression that parse; a set index
//! always names a set; its [`SindexDef::to_command`] form parses back to an
//! equal definition.

use base64::Engine as _;
use citrine_cdt::value::Value;

/// Longest index name (the reference's limit).
pub const INDEX_NAME_MAX: usize = 63;

/// The kind of value an index holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyType {
    /// Integers (`NUMERIC`, also `INTEGER`): range and equality queries.
    Numeric,
    /// Strings: equality queries.
    String,
    /// Blobs: equality queries.
    Blob,
    /// GeoJSON points and regions (`GEO2DSPHERE`): region and point
    /// queries ([`crate::geo`]).
    Geo,
}

impl KeyType {
    /// The name `sindex` listings use.
    pub fn listing_name(self) -> &'static str {
        match self {
            KeyType::Numeric => "numeric",
            KeyType::String => "string",
            KeyType::Blob => "blob",
            KeyType::Geo => "geo2dsphere",
        }
    }

    /// The name the create command uses.
    pub fn command_name(self) -> &'static str {
        match self {
            KeyType::Numeric => "NUMERIC",
            KeyType::String => "STRING",
            KeyType::Blob => "BLOB",
            KeyType::Geo => "GEO2DSPHERE",
        }
    }
}

/// Which values of the source an index holds (INDEX_TYPE, field 26).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CollectionType {
    /// The value itself.
    Default,
    /// Each element of a list.
    List,
    /// Each key of a map.
    MapKeys,
    /// Each value of a map.
    MapValues,
}

impl CollectionType {
    /// From the wire byte of field 26.
    pub fn from_wire(byte: u8) -> Option<CollectionType> {
        Some(match byte {
            0 => CollectionType::Default,
            1 => CollectionType::List,
            2 => CollectionType::MapKeys,
            3 => CollectionType::MapValues,
            _ => return None,
        })
    }

    /// The name `sindex` listings use.
    pub fn listing_name(self) -> &'static str {
        match self {
            CollectionType::Default => "default",
            CollectionType::List => "list",
            CollectionType::MapKeys => "mapkeys",
            CollectionType::MapValues => "mapvalues",
        }
    }

    fn command_name(self) -> &'static str {
        match self {
            CollectionType::Default => "DEFAULT",
            CollectionType::List => "LIST",
            CollectionType::MapKeys => "MAPKEYS",
            CollectionType::MapValues => "MAPVALUES",
        }
    }
}

/// What an index reads from a record.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// A bin, by name.
    Bin(String),
    /// The value of an expression (its msgpack bytes).
    Expression(Vec<u8>),
    /// Membership of the definition's set: a set index (servers 8.1.2+,
    /// `indextype=SET`). Every record of the set has one entry, the
    /// integer 0, so the index lists the set's records and a scan of the
    /// set reads them instead of walking every record of the namespace.
    Set,
}

/// One index's definition.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SindexDef {
    pub namespace: String,
    pub name: String,
    /// Only records of this set are indexed; `None`: every record.
    pub set: Option<String>,
    pub source: Source,
    pub key_type: KeyType,
    pub collection: CollectionType,
    /// A CDT context (msgpack array) applied to the source first.
    pub context: Option<Vec<u8>>,
}

/// Why a definition was refused: the info error code and a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DefError {
    pub code: u16,
    pub message: String,
}

fn parameter(message: impl Into<String>) -> DefError {
    DefError {
        code: 4,
        message: message.into(),
    }
}

fn base64_param(name: &str, text: &str) -> Result<Vec<u8>, DefError> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|_| parameter(format!("{name} is not base64")))
}

fn key_type(text: &str) -> Result<KeyType, DefError> {
    match text.to_ascii_uppercase().as_str() {
        "NUMERIC" | "INTEGER" => Ok(KeyType::Numeric),
        "STRING" => Ok(KeyType::String),
        "BLOB" => Ok(KeyType::Blob),
        "GEO2DSPHERE" => Ok(KeyType::Geo),
        _ => Err(parameter(format!("bad index type {text:?}"))),
    }
}

fn is_name(text: &str, max: usize) -> bool {
    !text.is_empty()
        && text.len() <= max
        && !text
            .bytes()
            .any(|byte| matches!(byte, b';' | b':' | b'=' | b',' | 0) || byte.is_ascii_whitespace())
}

/// Whether an expression can define an index of `key_type` and
/// `collection` (a context walks into a list or map value).
fn expression_fits(
    expression: &citrine_exp::Expression,
    key_type: KeyType,
    collection: CollectionType,
    has_context: bool,
) -> bool {
    use citrine_exp::IndexValue;
    if has_context {
        return expression.indexable_as(IndexValue::List)
            || expression.indexable_as(IndexValue::Map);
    }
    expression.indexable_as(match (collection, key_type) {
        (CollectionType::List, _) => IndexValue::List,
        (CollectionType::MapKeys | CollectionType::MapValues, _) => IndexValue::Map,
        (CollectionType::Default, KeyType::Numeric) => IndexValue::Int,
        (CollectionType::Default, KeyType::String) => IndexValue::Str,
        (CollectionType::Default, KeyType::Blob) => IndexValue::Blob,
        (CollectionType::Default, KeyType::Geo) => IndexValue::Geo,
    })
}

impl SindexDef {
    /// Parses a `sindex-create` command's parameters (`param(name)` answers
    /// a parameter's value).
    pub fn parse<'a>(param: impl Fn(&str) -> Option<&'a str>) -> Result<SindexDef, DefError> {
        let namespace = param("namespace")
            .or_else(|| param("ns"))
            .filter(|name| !name.is_empty())
            .ok_or_else(|| parameter("missing namespace"))?;
        let name = param("indexname").ok_or_else(|| parameter("missing indexname"))?;
        if !is_name(name, INDEX_NAME_MAX) {
            return Err(parameter(format!(
                "bad indexname {name:?} (1 to {INDEX_NAME_MAX} characters, none of ;:=, or space)"
            )));
        }
        let set = match param("set") {
            None | Some("") => None,
            Some(set) if is_name(set, citrine_types::SET_NAME_MAX) => Some(set.to_owned()),
            Some(set) => return Err(parameter(format!("bad set name {set:?}"))),
        };
        let collection = match param("indextype").map(str::to_ascii_uppercase).as_deref() {
            None | Some("DEFAULT") => CollectionType::Default,
            Some("LIST") => CollectionType::List,
            Some("MAPKEYS") => CollectionType::MapKeys,
            Some("MAPVALUES") => CollectionType::MapValues,
            Some("SET") => return set_index(namespace, name, set),
            Some(other) => return Err(parameter(format!("bad indextype {other:?}"))),
        };
        let context = match param("context") {
            None | Some("") => None,
            Some(text) => {
                let bytes = base64_param("context", text)?;
                check_index_context(&bytes)?;
                Some(bytes)
            }
        };
        let (source, key_type) = match (param("indexdata"), param("bin"), param("exp")) {
            (Some(data), None, None) => {
                let (bin, kind) = data
                    .split_once(',')
                    .ok_or_else(|| parameter("indexdata must be BIN,TYPE"))?;
                (Source::Bin(bin.to_owned()), key_type(kind)?)
            }
            (None, Some(bin), None) => (
                Source::Bin(bin.to_owned()),
                key_type(param("type").ok_or_else(|| parameter("missing type"))?)?,
            ),
            (None, None, Some(exp)) => {
                let bytes = base64_param("exp", exp)?;
                let expression =
                    citrine_exp::Expression::parse_value(&bytes).map_err(|error| DefError {
                        code: error.result_code().code() as u16,
                        message: "bad 'exp'".to_owned(),
                    })?;
                let key_type = key_type(param("type").ok_or_else(|| parameter("missing type"))?)?;
                if !expression_fits(&expression, key_type, collection, context.is_some()) {
                    // The reference's words (it adds the two types when they
                    // differ): the type is not the index's, or it reads no
                    // bin, or the key, metadata or a bin's existence.
                    return Err(parameter("bad 'exp'"));
                }
                (Source::Expression(bytes), key_type)
            }
            (None, None, None) => return Err(parameter("missing bin (or indexdata, or exp)")),
            _ => return Err(parameter("name one of bin, indexdata and exp")),
        };
        if let Source::Bin(bin) = &source {
            if bin.is_empty() || bin.len() > citrine_types::BIN_NAME_MAX {
                return Err(parameter(format!("bad bin name {bin:?}")));
            }
        }
        Ok(SindexDef {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            set,
            source,
            key_type,
            collection,
            context,
        })
    }

    /// Whether this is a set index ([`Source::Set`]).
    pub fn is_set_index(&self) -> bool {
        self.source == Source::Set
    }

    /// Whether two definitions index the same thing (all but the name).
    pub fn same_target(&self, other: &SindexDef) -> bool {
        self.namespace == other.namespace
            && self.set == other.set
            && self.source == other.source
            && self.key_type == other.key_type
            && self.collection == other.collection
            && self.context == other.context
    }

    /// The `sindex-create` parameters that make this definition (the
    /// 8.1 dialect), as the definitions file keeps them.
    pub fn to_command(&self) -> String {
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
        let mut text = format!("namespace={};indexname={}", self.namespace, self.name);
        if let Some(set) = &self.set {
            text.push_str(";set=");
            text.push_str(set);
        }
        if self.is_set_index() {
            text.push_str(";indextype=SET");
            return text;
        }
        if self.collection != CollectionType::Default {
            text.push_str(";indextype=");
            text.push_str(self.collection.command_name());
        }
        if let Some(context) = &self.context {
            text.push_str(";context=");
            text.push_str(&b64(context));
        }
        match &self.source {
            Source::Bin(bin) => {
                text.push_str(";bin=");
                text.push_str(bin);
            }
            Source::Expression(bytes) => {
                text.push_str(";exp=");
                text.push_str(&b64(bytes));
            }
            Source::Set => {}
        }
        text.push_str(";type=");
        text.push_str(self.key_type.command_name());
        text
    }

    /// The `sindex` listing entry, without the state, as the reference
    /// (8.1) lists it: absent parts are `null`; the context and the
    /// expression in base64 when `b64` (what `sindex-list:...;b64=true`
    /// asks, and tools that re-create indexes read), else written out
    /// (`[map_key(<string#3>), list_index(1)]`, `add(bin_int("a"), 7)`;
    /// an expression with a part [`citrine_exp::display`] has no form for
    /// stays in base64). A set index lists its set alone.
    pub fn listing(&self, b64: bool) -> String {
        if self.is_set_index() {
            return format!(
                "ns={}:indexname={}:set={}:indextype=set",
                self.namespace,
                self.name,
                self.set.as_deref().unwrap_or("null")
            );
        }
        let base64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
        let (bin, exp) = match &self.source {
            Source::Bin(bin) => (bin.clone(), "null".to_owned()),
            // Written out where every part has a known form (module calls
            // do not yet), else in base64.
            Source::Expression(bytes) if b64 => ("null".to_owned(), base64(bytes)),
            Source::Expression(bytes) => (
                "null".to_owned(),
                citrine_exp::display::text(bytes).unwrap_or_else(|| base64(bytes)),
            ),
            Source::Set => ("null".to_owned(), "null".to_owned()),
        };
        let context = match &self.context {
            None => "null".to_owned(),
            Some(bytes) if b64 => base64(bytes),
            Some(bytes) => context_text(bytes),
        };
        format!(
            "ns={}:indexname={}:set={}:bin={}:type={}:indextype={}:context={}:exp={}",
            self.namespace,
            self.name,
            self.set.as_deref().unwrap_or("null"),
            bin,
            self.key_type.listing_name(),
            self.collection.listing_name(),
            context,
            exp
        )
    }
}

/// An index's context: a CDT context whose steps only select (no create
/// flags), refused as the reference refuses one (4, `'context' invalid cdt
/// context`).
fn check_index_context(context: &[u8]) -> Result<(), DefError> {
    let invalid = || parameter("'context' invalid cdt context");
    citrine_cdt::check_context(context).map_err(|_| invalid())?;
    let Ok(Value::List(list)) = citrine_cdt::value::decode(context) else {
        return Err(invalid());
    };
    let selects = list.items.chunks(2).all(|step| {
        matches!(step.first(), Some(Value::Int(kind)) if matches!(kind, 0x10 | 0x11 | 0x13 | 0x20..=0x23))
    });
    if selects {
        Ok(())
    } else {
        Err(invalid())
    }
}

/// A CDT context written out as the reference lists it: each step's kind
/// and its value, `[map_key(<string#3>), list_index(1)]`. Strings, blobs,
/// GeoJSON, lists and maps show their kind and size, not their content.
fn context_text(context: &[u8]) -> String {
    let Ok(Value::List(list)) = citrine_cdt::value::decode(context) else {
        return "ctx-error-display".to_owned();
    };
    let steps: Vec<String> = list
        .items
        .chunks(2)
        .map(|step| match step {
            [Value::Int(kind), value] => format!("{}({})", step_name(*kind), value_text(value)),
            _ => "ctx-error-display".to_owned(),
        })
        .collect();
    format!("[{}]", steps.join(", "))
}

/// The name of a context step's kind.
fn step_name(kind: i64) -> &'static str {
    match kind {
        0x00 => "index",
        0x01 => "rank",
        0x02 => "key",
        0x03 => "value",
        0x10 => "list_index",
        0x11 => "list_rank",
        0x13 => "list_value",
        0x20 => "map_index",
        0x21 => "map_rank",
        0x22 => "map_key",
        0x23 => "map_value",
        _ => "unknown",
    }
}

/// A context step's value as the reference lists it.
fn value_text(value: &Value) -> String {
    match value {
        Value::Nil => "nil".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Int(i) => i.to_string(),
        // The reference prints the 64 bits as a signed integer.
        Value::UInt(u) => (*u as i64).to_string(),
        Value::Double(f) => format!("{f:.6}"),
        Value::Str(text) => format!("<string#{}>", text.len()),
        Value::Blob(_, bytes) if bytes.is_empty() => "<blob#_>".to_owned(),
        Value::Blob(4, bytes) => format!("<blob#{}>", bytes.len()),
        Value::Blob(subtype, bytes) => format!("<blob{subtype}#{}>", bytes.len()),
        Value::Geo(text) => format!("<geojson#{}>", text.len()),
        Value::List(list) => format!("<list#{}>", list.items.len()),
        Value::Map(map) => format!("<map#{}>", map.entries.len()),
        Value::Wildcard => "*".to_owned(),
        Value::Infinity => "<ext#0>".to_owned(),
        Value::Ext(..) => "ctx-error-display".to_owned(),
    }
}

/// A set index's definition (`indextype=SET`): it needs a set, and
/// nothing else names what it holds (a bin, type or context sent with it
/// is ignored, as the clients that send one expect).
fn set_index(namespace: &str, name: &str, set: Option<String>) -> Result<SindexDef, DefError> {
    let set = set.ok_or_else(|| parameter("a set index needs a set"))?;
    Ok(SindexDef {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        set: Some(set),
        source: Source::Set,
        // Its entries are the integer 0.
        key_type: KeyType::Numeric,
        collection: CollectionType::Default,
        context: None,
    })
}

/// Splits `k=v;k=v` parameter text (the definitions file's lines) into a
/// lookup.
pub fn params<'t>(text: &'t str) -> impl Fn(&str) -> Option<&'t str> + 't {
    move |name| {
        text.split(';').find_map(|pair| {
            let (key, value) = pair.split_once('=')?;
            (key == name).then_some(value)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<SindexDef, DefError> {
        SindexDef::parse(params(text))
    }

    #[test]
    fn both_dialects_give_the_same_definition() {
        let old = parse("ns=test;set=demo;indexname=i1;indexdata=age,NUMERIC").expect("old");
        let new = parse("namespace=test;set=demo;indexname=i1;bin=age;type=numeric").expect("new");
        assert_eq!(old, new);
        assert_eq!(old.source, Source::Bin("age".into()));
        assert_eq!(old.key_type, KeyType::Numeric);
        assert_eq!(old.collection, CollectionType::Default);
        assert_eq!(parse(&old.to_command()).expect("round trip"), old);
    }

    #[test]
    fn a_listing_writes_the_context_out_as_the_reference_does() {
        // Answers of the reference (CE 8.1.2) to `sindex-list` for indexes
        // created with these contexts; `b64=true` keeps the bytes.
        let cases: [(&[u8], &str); 9] = [
            (&[0x92, 0x10, 0x00], "[list_index(0)]"),
            (&[0x92, 0x11, 0xff], "[list_rank(-1)]"),
            (&[0x92, 0x13, 0xcd, 0x12, 0x34], "[list_value(4660)]"),
            (
                &[0x92, 0x22, 0xa4, 0x03, b'k', b'e', b'y'],
                "[map_key(<string#3>)]",
            ),
            (&[0x92, 0x22, 0xa3, 0x04, 0x01, 0x02], "[map_key(<blob#2>)]"),
            (
                &[0x92, 0x23, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0],
                "[map_value(1.500000)]",
            ),
            (&[0x92, 0x23, 0xc3], "[map_value(true)]"),
            (&[0x92, 0x23, 0x92, 0x01, 0x02], "[map_value(<list#2>)]"),
            (
                &[0x94, 0x22, 0xa2, 0x03, b'a', 0x10, 0x01],
                "[map_key(<string#1>), list_index(1)]",
            ),
        ];
        for (context, text) in cases {
            let b64 = base64::engine::general_purpose::STANDARD.encode(context);
            let def = parse(&format!(
                "namespace=test;indexname=c;bin=l;type=numeric;indextype=list;context={b64}"
            ))
            .expect("a context index");
            assert_eq!(
                def.listing(false),
                format!("ns=test:indexname=c:set=null:bin=l:type=numeric:indextype=list:context={text}:exp=null")
            );
            assert!(def.listing(true).contains(&format!(":context={b64}:")));
        }
    }

    #[test]
    fn collection_context_and_expression_round_trip() {
        // ctx [0x10 (list index), 0] = msgpack [16, 0]
        let ctx = base64::engine::general_purpose::STANDARD.encode([0x92, 0x10, 0x00]);
        let def = parse(&format!(
            "namespace=test;indexname=l;indextype=list;context={ctx};bin=b;type=STRING"
        ))
        .expect("list");
        assert_eq!(def.collection, CollectionType::List);
        assert_eq!(def.context.as_deref(), Some(&[0x92, 0x10, 0x00][..]));
        assert_eq!(parse(&def.to_command()).expect("round trip"), def);
        // An integer bin "a": [BIN (81), INT (2), "a"].
        let int_bin = [0x93, 0x51, 0x02, 0xa1, b'a'];
        let exp = base64::engine::general_purpose::STANDARD.encode(int_bin);
        let def = parse(&format!(
            "namespace=test;indexname=e;exp={exp};type=NUMERIC"
        ))
        .expect("exp");
        assert_eq!(def.source, Source::Expression(int_bin.to_vec()));
        assert_eq!(parse(&def.to_command()).expect("round trip"), def);
        assert!(def.listing(true).contains(":bin=null:"));
        assert!(def.listing(false).ends_with(":exp=bin_int(\"a\")"));
        assert!(def.listing(true).ends_with(&format!(":exp={exp}")));
        // As the reference refuses: a type that is not the index's, a
        // literal (reads no bin), the key ([80, INT]), metadata ([66]:
        // last update), a bin's existence (cond(bin_exists("a"),
        // bin_int("a"), 0)), each with "bad 'exp'".
        let exists: &[u8] = &[
            0x94, 0x7b, 0x92, 0x53, 0xa1, b'a', 0x93, 0x51, 0x02, 0xa1, b'a', 0x00,
        ];
        for (bytes, kind) in [
            (&int_bin[..], "STRING"),
            (&[0x07][..], "NUMERIC"),
            (&[0x92, 0x50, 0x02][..], "NUMERIC"),
            (&[0x91, 0x42][..], "NUMERIC"),
            (exists, "NUMERIC"),
        ] {
            let exp = base64::engine::general_purpose::STANDARD.encode(bytes);
            let error = parse(&format!("namespace=test;indexname=e;exp={exp};type={kind}"))
                .expect_err("refused");
            assert_eq!(
                (error.code, error.message.as_str()),
                (4, "bad 'exp'"),
                "{bytes:?} {kind}"
            );
        }
        let list = parse(&format!(
            "namespace=test;indexname=e;exp={exp};type=NUMERIC;indextype=LIST"
        ));
        assert!(
            list.is_err(),
            "an integer expression cannot be a list index"
        );
    }

    #[test]
    fn a_set_index_names_its_set_and_round_trips() {
        // What the official C client sends (servers 8.1.2+).
        let def = parse("namespace=test;set=demo;indexname=s;indextype=SET").expect("set index");
        assert!(def.is_set_index());
        assert_eq!(def.set.as_deref(), Some("demo"));
        assert_eq!(parse(&def.to_command()).expect("round trip"), def);
        assert_eq!(
            def.listing(false),
            "ns=test:indexname=s:set=demo:indextype=set"
        );
        // A bin sent with it changes nothing.
        let with_bin =
            parse("namespace=test;set=demo;indexname=s;indextype=set;bin=unused;type=STRING")
                .expect("set index with a bin");
        assert_eq!(with_bin, def);
        assert!(!parse("namespace=test;indexname=n;bin=b;type=NUMERIC")
            .expect("bin index")
            .same_target(&def));
    }

    #[test]
    fn bad_definitions_are_refused_with_a_reason() {
        for (text, code) in [
            ("indexname=i;bin=b;type=NUMERIC", 4),
            ("ns=test;bin=b;type=NUMERIC", 4),
            ("ns=test;indexname=a:b;bin=b;type=NUMERIC", 4),
            ("ns=test;indexname=i;bin=b", 4),
            ("ns=test;indexname=i;bin=b;type=FLOAT", 4),
            ("ns=test;indexname=i;indexdata=b", 4),
            ("ns=test;indexname=i;bin=b;exp=Bw==;type=NUMERIC", 4),
            ("ns=test;indexname=i;bin=sixteen_chars_xx;type=NUMERIC", 4),
            ("ns=test;indexname=i;indextype=SET", 4),
            ("ns=test;indexname=i;bin=b;type=NUMERIC;indextype=tree", 4),
            ("ns=test;indexname=i;bin=b;type=NUMERIC;context=!!", 4),
            ("ns=test;indexname=i;bin=b;type=NUMERIC;context=kQ==", 4),
            // A list-index step with a create flag, and a kind no context
            // has: the reference refuses both with 4.
            ("ns=test;indexname=i;bin=b;type=NUMERIC;context=klAB", 4),
            ("ns=test;indexname=i;bin=b;type=NUMERIC;context=kgQB", 4),
            ("ns=test;indexname=i;exp=wQ==;type=NUMERIC", 4),
        ] {
            let error = parse(text).expect_err(text);
            assert_eq!(error.code, code, "{text}: {}", error.message);
        }
        let geo = parse("ns=test;indexname=g;bin=b;type=geo2dsphere").expect("a geo index");
        assert_eq!(geo.key_type, KeyType::Geo);
        assert!(
            geo.listing(false).contains("type=geo2dsphere"),
            "{}",
            geo.listing(false)
        );
    }
}
