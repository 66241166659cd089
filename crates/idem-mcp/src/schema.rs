//! The key of an effect tool's call: where the model is asked for it (the `idempotency_key`
//! property added to the tool's input schema on `tools/list`), and where a call's key is read
//! from ([design §8](docs/design.md#8-mcp)).
//!
//! A key from the runtime, in the request's `_meta.idempotency_key` or in SEP-3182's
//! `params.idempotencyKey`, wins over the argument a model wrote: the runtime's key is the one
//! that stays the same when the model retries with a key of its own invention. Per tool, a
//! [`KeySource`] says whether the model is asked for the key at all. The upstream never sees
//! a property it did not declare; one that declares `idempotency_key` itself (it dedups on its
//! own) gets the key however it came.
//!
//! Everything is edited on the raw JSON: members the proxy does not know stay as they are.

use serde_json::{Map, Value, json};

use crate::policy::KeySource;

/// The argument's name ([design §1](docs/design.md#1-words)).
pub const KEY_ARG: &str = "idempotency_key";

/// SEP-3182's request parameter carrying a key.
pub const SEP_KEY_PARAM: &str = "idempotencyKey";

/// The sentence appended to an effect tool's description when the model supplies the key.
pub const KEY_SENTENCE: &str = "This tool has side effects: pass `idempotency_key`, a string \
naming this one intent (e.g. a turn id plus the tool name), and when retrying the same intent \
(after a timeout, an error or a restart) pass the same key again, so it runs at most once; use \
a new key for a new intent.";

/// Whether the upstream's tool (raw `tools/list` entry) declares `idempotency_key` itself.
pub fn declares_key(tool: &Value) -> bool {
    tool.get("inputSchema")
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object)
        .is_some_and(|p| p.contains_key(KEY_ARG))
}

/// Rewrites an effect tool's `tools/list` entry for the client. With keys from the model the
/// schema gets a required string property `idempotency_key` (1..=255 bytes of visible ASCII)
/// and the description a sentence on how to use it; with keys from the runtime or derived by
/// the proxy the property is taken out, so the model is never asked. Every other member is
/// left as it is.
pub fn present(tool: &mut Value, source: KeySource) {
    let Some(tool) = tool.as_object_mut() else {
        return;
    };
    match source {
        KeySource::Model => ask_model(tool),
        KeySource::Runtime | KeySource::Derived => hide(tool),
    }
}

fn ask_model(tool: &mut Map<String, Value>) {
    let schema = tool
        .entry("inputSchema")
        .or_insert_with(|| json!({"type": "object"}));
    let Some(schema) = schema.as_object_mut() else {
        return;
    };
    schema.entry("type").or_insert_with(|| json!("object"));
    let properties = schema
        .entry("properties")
        .or_insert_with(|| Value::Object(Map::new()));
    if !properties.is_object() {
        *properties = Value::Object(Map::new());
    }
    if let Value::Object(props) = properties {
        props.entry(KEY_ARG).or_insert_with(|| {
            json!({
                "type": "string",
                "minLength": 1,
                "maxLength": 255,
                "pattern": "^[!-~]+$",
                "description": "Names this intent. Pass the same value when retrying the same \
                    intent; a new value for a new one. A repeated key returns the first \
                    call's result without running the tool again.",
            })
        });
    }
    let required = schema
        .entry("required")
        .or_insert_with(|| Value::Array(Vec::new()));
    if !required.is_array() {
        *required = Value::Array(Vec::new());
    }
    if let Value::Array(req) = required
        && !req.iter().any(|v| v.as_str() == Some(KEY_ARG))
    {
        req.push(json!(KEY_ARG));
    }
    let description = match tool.get("description").and_then(Value::as_str) {
        // A paragraph of its own: the original may end without a full stop, in a list or a
        // code block ("...in the knowledge graph This tool has side effects" read as one
        // sentence), and a model reads a separate paragraph as a separate instruction.
        Some(d) if !d.trim().is_empty() => format!("{}\n\n{KEY_SENTENCE}", d.trim_end()),
        _ => KEY_SENTENCE.to_owned(),
    };
    tool.insert("description".into(), Value::String(description));
}

fn hide(tool: &mut Map<String, Value>) {
    let Some(schema) = tool.get_mut("inputSchema").and_then(Value::as_object_mut) else {
        return;
    };
    if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        props.remove(KEY_ARG);
    }
    if let Some(req) = schema.get_mut("required").and_then(Value::as_array_mut) {
        req.retain(|v| v.as_str() != Some(KEY_ARG));
    }
}

/// What a call's key looked like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyArg {
    /// None was sent (where this tool takes keys from).
    Missing,
    /// One was sent, as a string.
    Present(String),
    /// It was sent but is not usable (not a string, or two runtime keys that disagree).
    Invalid(String),
}

/// Reads the key of a `tools/call` (its raw `params`), and edits the params into what goes
/// upstream: the argument is removed (or set to the key, when the upstream declares it), and
/// `_meta.idempotency_key` is removed. Returns the key and the arguments without it (what the
/// fingerprint covers).
pub fn take_key(
    params: &mut Map<String, Value>,
    source: KeySource,
    upstream_declares: bool,
) -> (KeyArg, Map<String, Value>) {
    let from_meta = params
        .get_mut("_meta")
        .and_then(Value::as_object_mut)
        .and_then(|m| m.remove(KEY_ARG));
    if params
        .get("_meta")
        .and_then(Value::as_object)
        .is_some_and(Map::is_empty)
    {
        params.remove("_meta");
    }
    let from_param = params.get(SEP_KEY_PARAM).cloned();
    let had_arguments = params.contains_key("arguments");
    let mut args = match params.remove("arguments") {
        Some(Value::Object(a)) => a,
        _ => Map::new(),
    };
    let from_args = args.remove(KEY_ARG);
    let runtime = match (from_meta, from_param) {
        (Some(Value::String(a)), Some(Value::String(b))) if a != b => Some(KeyArg::Invalid(
            "_meta.idempotency_key and idempotencyKey differ; send one".into(),
        )),
        (Some(k), _) | (None, Some(k)) => Some(as_key(k)),
        (None, None) => None,
    };
    let key = match (runtime, source) {
        (Some(k), _) => k,
        (None, KeySource::Model) => from_args.map_or(KeyArg::Missing, as_key),
        (None, KeySource::Runtime | KeySource::Derived) => KeyArg::Missing,
    };
    let mut forward = args.clone();
    if let (KeyArg::Present(k), true) = (&key, upstream_declares) {
        // An upstream that declares the key gets it however it came: it may dedup by it
        // itself, which is what makes `on_unknown = "retry"` safe
        // ([design §5](docs/design.md#5-unknown-outcomes)).
        forward.insert(KEY_ARG.into(), Value::String(k.clone()));
    }
    if had_arguments || !forward.is_empty() {
        params.insert("arguments".into(), Value::Object(forward));
    }
    (key, args)
}

fn as_key(v: Value) -> KeyArg {
    match v {
        Value::String(k) => KeyArg::Present(k),
        other => KeyArg::Invalid(format!(
            "idempotency_key must be a string, not {}",
            kind(&other)
        )),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            other => panic!("not an object: {other}"),
        }
    }

    #[test]
    fn adds_a_required_property_and_a_sentence_and_keeps_the_rest() {
        let mut t = json!({"name": "charge_card", "description": "Charges a card.",
            "inputSchema": {"type":"object","properties":{"amount_cents":{"type":"integer"}},"required":["amount_cents"]},
            "execution": {"taskSupport": "optional"}, "x-future": [1, 2]});
        present(&mut t, KeySource::Model);
        let s = &t["inputSchema"];
        assert_eq!(s["properties"][KEY_ARG]["type"], "string");
        assert_eq!(s["properties"]["amount_cents"]["type"], "integer");
        assert_eq!(s["required"], json!(["amount_cents", KEY_ARG]));
        assert_eq!(
            t["description"],
            format!("Charges a card.\n\n{KEY_SENTENCE}")
        );
        assert_eq!(t["execution"], json!({"taskSupport": "optional"}));
        assert_eq!(t["x-future"], json!([1, 2]));
        // One that ends without a full stop (the memory server's) does not run into it.
        let mut t = json!({"name": "create_entities", "description": "Create entities in the knowledge graph  \n"});
        present(&mut t, KeySource::Model);
        assert_eq!(
            t["description"],
            format!("Create entities in the knowledge graph\n\n{KEY_SENTENCE}")
        );
    }

    #[test]
    fn a_bare_schema_and_an_existing_declaration_are_handled() {
        let mut t = json!({"name": "x", "inputSchema": {"type":"object"}});
        present(&mut t, KeySource::Model);
        assert_eq!(t["inputSchema"]["required"], json!([KEY_ARG]));
        assert_eq!(t["description"], KEY_SENTENCE);
        let own = json!({"name": "x", "inputSchema": {"type":"object","properties":{"idempotency_key":{"type":"string","description":"mine"}},"required":["idempotency_key"]}});
        assert!(declares_key(&own));
        let mut t = own.clone();
        present(&mut t, KeySource::Model);
        assert_eq!(
            t["inputSchema"]["properties"][KEY_ARG]["description"],
            "mine"
        );
        assert_eq!(t["inputSchema"]["required"], json!([KEY_ARG]));
    }

    #[test]
    fn runtime_and_derived_keys_hide_the_property_from_the_model() {
        for source in [KeySource::Runtime, KeySource::Derived] {
            let mut t = json!({"name": "x", "description": "D.", "inputSchema": {"type":"object",
                "properties":{"idempotency_key":{"type":"string"},"a":{}},"required":["idempotency_key","a"]}});
            present(&mut t, source);
            assert_eq!(t["inputSchema"]["properties"], json!({"a": {}}));
            assert_eq!(t["inputSchema"]["required"], json!(["a"]));
            assert_eq!(t["description"], "D.");
        }
    }

    #[test]
    fn the_runtime_key_wins_over_the_model_argument() {
        let mut p = obj(
            json!({"name": "c", "arguments": {"a": 1, "idempotency_key": "model-7"},
            "_meta": {"idempotency_key": "run-1", "progressToken": 3}}),
        );
        let (key, args) = take_key(&mut p, KeySource::Model, false);
        assert_eq!(key, KeyArg::Present("run-1".into()));
        assert_eq!(Value::Object(args), json!({"a": 1}));
        assert_eq!(
            Value::Object(p),
            json!({"name": "c", "arguments": {"a": 1}, "_meta": {"progressToken": 3}})
        );
        // SEP-3182's parameter is a runtime key too, and is forwarded as it is.
        let mut p = obj(
            json!({"name": "c", "arguments": {"idempotency_key": "m"}, "idempotencyKey": "sep"}),
        );
        let (key, _) = take_key(&mut p, KeySource::Model, true);
        assert_eq!(key, KeyArg::Present("sep".into()));
        assert_eq!(p["arguments"], json!({"idempotency_key": "sep"}));
        assert_eq!(p["idempotencyKey"], "sep");
        let mut p =
            obj(json!({"name": "c", "idempotencyKey": "a", "_meta": {"idempotency_key": "b"}}));
        assert!(
            matches!(take_key(&mut p, KeySource::Model, false).0, KeyArg::Invalid(m) if m.contains("differ"))
        );
    }

    #[test]
    fn the_model_argument_counts_only_where_the_model_supplies_keys() {
        let call = json!({"name": "c", "arguments": {"a": 1, "idempotency_key": "k1"}});
        let (key, _) = take_key(&mut obj(call.clone()), KeySource::Model, false);
        assert_eq!(key, KeyArg::Present("k1".into()));
        for source in [KeySource::Runtime, KeySource::Derived] {
            let mut p = obj(call.clone());
            let (key, args) = take_key(&mut p, source, false);
            assert_eq!(key, KeyArg::Missing);
            assert_eq!(Value::Object(args), json!({"a": 1}));
            assert_eq!(p["arguments"], json!({"a": 1}));
        }
        let (key, _) = take_key(&mut obj(json!({"name": "c"})), KeySource::Model, false);
        assert_eq!(key, KeyArg::Missing);
        let (key, _) = take_key(
            &mut obj(json!({"name": "c", "arguments": {"idempotency_key": 7}})),
            KeySource::Model,
            false,
        );
        assert!(matches!(key, KeyArg::Invalid(m) if m.contains("a number")));
    }
}
