//! What a message from the client is, read so that nothing the upstream could take for a
//! `tools/call` passes unseen ([design §8](docs/design.md#8-mcp)): [`read`] classifies one
//! message, and both transports act on its answer alone.
//!
//! The proxy relays what it does not interpret as the bytes it came in, so the upstream reads
//! those bytes with its own parser. Wherever that parser could read them differently from the
//! proxy, a relayed message could be a tool call the proxy never saw: a duplicated member
//! (`"method":"tools/list","method":"tools/call"`, first-wins against last-wins), a number
//! or a string escape one parser refuses and another accepts (`1e400`, a lone `\ud800`), a
//! batch, text after the message, or a carriage return (Python's stdio servers read one as a
//! line end, so one line here can be two messages there). So the rule is fail-closed:
//!
//! - a message is relayed only if it is one JSON value that reads one way in every parser:
//!   valid UTF-8, no duplicate member name at any depth, every number a finite double, every
//!   escape a character, nothing after it, and no raw carriage return;
//! - anything else is refused with a JSON-RPC error ([`Refusal`]) and never forwarded;
//! - a request's `id` must be a string or a number, and a `tools/call` must have one (a
//!   notification cannot be answered, so a `tools/call` without an id is refused too), with
//!   `params` an object whose `name` is a string and whose `arguments` and `_meta`, when
//!   present, are objects;
//! - a batch (a JSON array) is handed back member by member ([`Inbound::Batch`]), each to go
//!   through this same reading, where the negotiated protocol has batches
//!   ([`BATCH_VERSION`]); elsewhere the transport refuses it ([`refuse_batch`]).

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::rpc::{self, Envelope, IdScan};

/// The only protocol version whose messages may be batches (2025-03-26 added JSON-RPC
/// batching; 2025-06-18 removed it).
pub const BATCH_VERSION: &str = "2025-03-26";

/// JSON-RPC's parse error code.
pub const PARSE_ERROR: i64 = -32700;
/// JSON-RPC's invalid request code.
pub const INVALID_REQUEST: i64 = -32600;
/// JSON-RPC's invalid params code.
pub const INVALID_PARAMS: i64 = -32602;

/// A method the proxy interprets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interpreted {
    /// `initialize`: only protocol versions this code knows are negotiated.
    Initialize,
    /// `tools/list`: its result is rewritten.
    ToolsList,
    /// `server/discover`: its result is rewritten.
    ServerDiscover,
}

impl Interpreted {
    /// The method's name.
    pub const fn method(self) -> &'static str {
        match self {
            Interpreted::Initialize => "initialize",
            Interpreted::ToolsList => "tools/list",
            Interpreted::ServerDiscover => "server/discover",
        }
    }
}

/// What one client message is.
#[derive(Debug)]
pub enum Inbound<'a> {
    /// Read, and not interpreted: relayed as the bytes it came in.
    Relay,
    /// A request the proxy reads or rewrites the answer of.
    Request {
        /// Its id, as raw JSON text.
        id: String,
        /// Which.
        method: Interpreted,
        /// Its params, raw.
        params: Option<&'a RawValue>,
    },
    /// A `tools/call`, to be classified and, for an effect tool, run through the engine.
    Call {
        /// Its id, as raw JSON text.
        id: String,
        /// Its params.
        params: Map<String, Value>,
    },
    /// A batch: its members, each to be read with [`read`] in turn.
    Batch(Vec<&'a RawValue>),
    /// Not forwarded: answered with this error.
    Refused(Refusal),
}

/// A message the proxy does not forward, and the JSON-RPC error it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The id to answer, as raw JSON text (a string or a number); `None` answers `null`.
    pub id: Option<String>,
    /// The JSON-RPC error code.
    pub code: i64,
    /// What was wrong and what to do.
    pub message: String,
}

impl Refusal {
    fn new(id: Option<String>, code: i64, why: impl fmt::Display) -> Self {
        Refusal {
            id,
            code,
            message: format!(
                "the idempotency proxy did not forward this message: {why}. Send it again as \
                 plain JSON (UTF-8, each member once, finite numbers), one message at a time"
            ),
        }
    }

    /// The error response, as a message to the client.
    pub fn answer(&self) -> Vec<u8> {
        rpc::error_response(
            self.id.as_deref().unwrap_or("null"),
            &rpc::error_object(self.code, &self.message),
        )
    }
}

/// Reads one client message (see the module's rules).
pub fn read(bytes: &[u8]) -> Inbound<'_> {
    if let Err(why) = check(bytes) {
        return Inbound::Refused(Refusal::new(scanned_id(bytes), PARSE_ERROR, why));
    }
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'[') {
        return match serde_json::from_slice::<Vec<&RawValue>>(bytes) {
            Ok(members) if !members.is_empty() => Inbound::Batch(members),
            Ok(_) => Inbound::Refused(Refusal::new(None, INVALID_REQUEST, "an empty batch")),
            Err(e) => Inbound::Refused(Refusal::new(None, PARSE_ERROR, e)),
        };
    }
    if first != Some(&b'{') {
        return Inbound::Refused(Refusal::new(
            None,
            INVALID_REQUEST,
            "a message must be a JSON object",
        ));
    }
    let env = match serde_json::from_slice::<Envelope<'_>>(bytes) {
        Ok(env) => env,
        // `method` that is not a string, say.
        Err(e) => return Inbound::Refused(Refusal::new(scanned_id(bytes), INVALID_REQUEST, e)),
    };
    let id = match env.id.map(id_text) {
        None => None,
        Some(Some(id)) => Some(id),
        Some(None) if env.method.is_none() => {
            // A response with a null id (an error about an unreadable request): relayed.
            return Inbound::Relay;
        }
        Some(None) => {
            return Inbound::Refused(Refusal::new(
                None,
                INVALID_REQUEST,
                "a request's id must be a string or a number",
            ));
        }
    };
    let Some(method) = env.method.as_deref() else {
        return Inbound::Relay;
    };
    let interpreted = match method {
        "initialize" => Interpreted::Initialize,
        "tools/list" => Interpreted::ToolsList,
        "server/discover" => Interpreted::ServerDiscover,
        "tools/call" => {
            let Some(id) = id else {
                return Inbound::Refused(Refusal::new(
                    None,
                    INVALID_REQUEST,
                    "a tools/call must have an id (a notification cannot be answered)",
                ));
            };
            return match call_params(env.params) {
                Ok(params) => Inbound::Call { id, params },
                Err(why) => Inbound::Refused(Refusal::new(Some(id), INVALID_PARAMS, why)),
            };
        }
        _ => return Inbound::Relay,
    };
    match id {
        Some(id) => Inbound::Request {
            id,
            method: interpreted,
            params: env.params,
        },
        // A notification named like a request is nobody's business here.
        None => Inbound::Relay,
    }
}

/// The answer to a batch the negotiated protocol has no batches in: an error for each
/// member that is a request (one with a usable id), as a batch; one error with a null id
/// when none is.
pub fn refuse_batch(members: &[&RawValue], version: Option<&str>) -> Vec<u8> {
    let why = format!(
        "JSON-RPC batches are part of MCP {BATCH_VERSION} only, and this session speaks {}",
        version.unwrap_or("no version yet (batches cannot come before initialize)")
    );
    let errors: Vec<Vec<u8>> = members
        .iter()
        .filter_map(|m| serde_json::from_str::<Envelope<'_>>(m.get()).ok())
        .filter(|env| env.method.is_some())
        .filter_map(|env| env.id.and_then(id_text))
        .map(|id| Refusal::new(Some(id), INVALID_REQUEST, &why).answer())
        .collect();
    if errors.is_empty() {
        return Refusal::new(None, INVALID_REQUEST, &why).answer();
    }
    let mut out = b"[".to_vec();
    out.extend(errors.join(&b","[..]));
    out.push(b']');
    out
}

/// The refusal of a batch inside a batch, which JSON-RPC has no meaning for.
pub fn nested_batch() -> Refusal {
    Refusal::new(None, INVALID_REQUEST, "a batch inside a batch")
}

/// A `tools/call`'s params, checked: an object, `name` a string, `arguments` and `_meta`
/// objects when present.
fn call_params(params: Option<&RawValue>) -> Result<Map<String, Value>, &'static str> {
    let Some(raw) = params else {
        return Err("a tools/call needs params naming the tool");
    };
    let Ok(Value::Object(params)) = serde_json::from_str::<Value>(raw.get()) else {
        return Err("a tools/call's params must be an object");
    };
    if !params.get("name").is_some_and(Value::is_string) {
        return Err("a tools/call's params.name must be a string");
    }
    if params.get("arguments").is_some_and(|a| !a.is_object()) {
        return Err("a tools/call's params.arguments must be an object");
    }
    if params.get("_meta").is_some_and(|m| !m.is_object()) {
        return Err("a tools/call's params._meta must be an object");
    }
    Ok(params)
}

/// A JSON-RPC id's text when it is a string or a number.
fn id_text(id: &RawValue) -> Option<String> {
    let text = id.get();
    matches!(text.as_bytes().first(), Some(b'"' | b'-' | b'0'..=b'9')).then(|| text.to_owned())
}

/// The top-level `id` of a message that did not read, if it is a well-formed string or
/// number, so the client can tell which of its requests was refused.
fn scanned_id(bytes: &[u8]) -> Option<String> {
    let mut scan = IdScan::default();
    scan.feed(bytes);
    let found = scan.found?;
    let value: Value = serde_json::from_str(&found).ok()?;
    (value.is_string() || value.is_number()).then_some(found)
}

/// Whether `bytes` is one JSON value that every parser reads alike (see the module's rules).
pub fn check(bytes: &[u8]) -> Result<(), String> {
    if bytes.contains(&b'\r') {
        return Err(
            "it holds a carriage return, which some servers read as the end of a line".into(),
        );
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    de.deserialize_any(Unambiguous)
        .and_then(|Unambiguous| de.end())
        .map_err(|e| format!("it is not JSON that reads one way in every parser ({e})"))
}

/// Walks a JSON value, refusing a duplicate member name anywhere. serde_json itself refuses
/// invalid UTF-8, lone surrogates and numbers out of a double's range on the way.
struct Unambiguous;

impl<'de> de::Deserialize<'de> for Unambiguous {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Unambiguous)
    }
}

impl<'de> Visitor<'de> for Unambiguous {
    type Value = Unambiguous;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Unambiguous)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Unambiguous)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Unambiguous)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        if v.is_finite() {
            Ok(Unambiguous)
        } else {
            Err(E::custom("a number out of range"))
        }
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Unambiguous)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Unambiguous)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<Unambiguous>()?.is_some() {}
        Ok(Unambiguous)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut names = HashSet::new();
        while let Some(name) = map.next_key::<String>()? {
            map.next_value::<Unambiguous>()?;
            if !names.insert(name) {
                return Err(de::Error::custom("a member name appears twice"));
            }
        }
        Ok(Unambiguous)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(msg: &str) -> Refusal {
        match read(msg.as_bytes()) {
            Inbound::Refused(r) => r,
            other => panic!("{msg}: read as {other:?}"),
        }
    }

    const CALL: &str =
        r#""method":"tools/call","params":{"name":"charge_card","arguments":{"customer":"cus_1"}}"#;

    #[test]
    fn every_reading_a_lenient_parser_could_take_for_a_call_is_refused() {
        for msg in [
            // Duplicated members: first-wins and last-wins parsers disagree.
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list",{CALL}}}"#),
            format!(r#"{{"jsonrpc":"2.0","id":12,"id":12,{CALL}}}"#),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_balance","name":"charge_card"}}"#.to_owned(),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge_card","arguments":{"a":1,"a":2}}}"#.to_owned(),
            // What one parser refuses and another reads.
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge_card","arguments":{"x":1e400}}}"#.to_owned(),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge_card","arguments":{"customer":"cus_\ud800"}}}"#.to_owned(),
            format!("\u{feff}{{\"jsonrpc\":\"2.0\",\"id\":1,{CALL}}}"),
            // Two messages in one line, however they are joined.
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"ping"}}{{"jsonrpc":"2.0","id":2,{CALL}}}"#),
            format!("{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}}\r{{\"jsonrpc\":\"2.0\",\"id\":2,{CALL}}}"),
            format!("{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":{{\"x\":\r{{\"jsonrpc\":\"2.0\",\"id\":2,{CALL}}}\r}}}}"),
            // A call that cannot be answered or read.
            format!(r#"{{"jsonrpc":"2.0",{CALL}}}"#),
            format!(r#"{{"jsonrpc":"2.0","id":null,{CALL}}}"#),
            format!(r#"{{"jsonrpc":"2.0","id":{{"a":1}},{CALL}}}"#),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":["charge_card"]}"#.to_owned(),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge_card","arguments":[1]}}"#.to_owned(),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{}}}"#.to_owned(),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#.to_owned(),
            r#"{"jsonrpc":"2.0","id":1,"method":7}"#.to_owned(),
            "[]".to_owned(),
            "7".to_owned(),
        ] {
            let r = refused(&msg);
            assert!(r.message.contains("did not forward"), "{msg}: {r:?}");
            let answer: Value = serde_json::from_slice(&r.answer()).expect("an answer is JSON");
            assert!(answer["error"]["code"].is_i64(), "{answer}");
        }
    }

    #[test]
    fn the_refusal_names_the_request_when_its_id_reads() {
        let dup = format!(r#"{{"jsonrpc":"2.0","id":"c-1","method":"ping",{CALL}}}"#);
        assert_eq!(refused(&dup).id.as_deref(), Some(r#""c-1""#));
        assert_eq!(refused(r#"{"id":7,"x":1e400}"#).id.as_deref(), Some("7"));
        assert_eq!(refused(r#"{"id":{"a":1},"x":1e400}"#).id, None);
        assert_eq!(refused("garbage").id, None);
    }

    #[test]
    fn plain_messages_read_as_before() {
        let call = format!(r#"{{"jsonrpc":"2.0","id":"a",{CALL}}}"#);
        assert!(
            matches!(read(call.as_bytes()), Inbound::Call { id, params } if id == r#""a""# && params["name"] == "charge_card")
        );
        assert!(matches!(
            read(br#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{}}"#),
            Inbound::Request {
                method: Interpreted::ToolsList,
                ..
            }
        ));
        assert!(matches!(
            read(b"  {\"jsonrpc\":\"2.0\",\"id\":-1.5,\"method\":\"initialize\"}\t"),
            Inbound::Request {
                method: Interpreted::Initialize,
                ..
            }
        ));
        for relayed in [
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":4,"method":"prompts/get","params":{"name":"x","x-new":[1,{"a":null}]}}"#,
            r#"{"jsonrpc":"2.0","id":"s-1","result":{"action":"accept"}}"#,
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}"#,
            r#"{"jsonrpc":"2.0","method":"tools/list"}"#,
        ] {
            assert!(
                matches!(read(relayed.as_bytes()), Inbound::Relay),
                "{relayed}"
            );
        }
        let batch =
            format!(r#"[{{"jsonrpc":"2.0","id":1,{CALL}}}, {{"jsonrpc":"2.0","method":"x"}}]"#);
        assert!(matches!(read(batch.as_bytes()), Inbound::Batch(m) if m.len() == 2));
    }

    #[test]
    fn a_batch_outside_its_protocol_is_answered_member_by_member() {
        let batch = format!(
            r#"[{{"jsonrpc":"2.0","id":10,{CALL}}},{{"jsonrpc":"2.0","method":"n"}},{{"jsonrpc":"2.0","id":"b","method":"ping"}}]"#
        );
        let Inbound::Batch(members) = read(batch.as_bytes()) else {
            panic!()
        };
        let answer: Value =
            serde_json::from_slice(&refuse_batch(&members, Some("2025-06-18"))).expect("json");
        let ids: Vec<&Value> = answer
            .as_array()
            .expect("a batch answer")
            .iter()
            .map(|e| &e["id"])
            .collect();
        assert_eq!(ids, [&Value::from(10), &Value::from("b")]);
        assert!(
            answer[0]["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("2025-06-18"))
        );
        let notes = read(br#"[{"jsonrpc":"2.0","method":"n"}]"#);
        let Inbound::Batch(members) = notes else {
            panic!()
        };
        let answer: Value = serde_json::from_slice(&refuse_batch(&members, None)).expect("json");
        assert_eq!(answer["id"], Value::Null);
    }
}
