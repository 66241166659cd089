//! The `idempotency_key` argument: added to each effect tool's input schema on `tools/list`,
//! read and removed from a `tools/call`'s arguments before they go upstream.
//!
//! The model sees a required string property and a sentence telling it to pass the same key
//! when it retries the same intent ([design §7](docs/design.md#7-the-runtime-side): the key travels
//! as a tool argument so it survives logging and replay). The upstream server never sees a property
//! it did not declare; one that declares `idempotency_key` itself (it dedups on its own) gets it
//! forwarded.

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool};
use serde_json::{Value, json};

/// The argument's name ([design §1](docs/design.md#1-words)).
pub const KEY_ARG: &str = "idempotency_key";

/// The sentence appended to an effect tool's description.
pub const KEY_SENTENCE: &str = "This tool has side effects: pass `idempotency_key`, a string \
naming this one intent (e.g. a turn id plus the tool name), and when retrying the same intent \
(after a timeout, an error or a restart) pass the same key again, so it runs at most once; use \
a new key for a new intent.";

/// Whether the upstream's schema declares `idempotency_key` itself.
pub fn declares_key(schema: &JsonObject) -> bool {
    schema
        .get("properties")
        .and_then(Value::as_object)
        .is_some_and(|p| p.contains_key(KEY_ARG))
}

/// The tool as the client sees it when it is an effect: `idempotency_key` is a required string
/// property (1..=255 bytes of visible ASCII), and the description says how to use it.
pub fn with_key(mut tool: Tool) -> Tool {
    let mut schema: JsonObject = (*tool.input_schema).clone();
    if !schema.contains_key("type") {
        schema.insert("type".into(), json!("object"));
    }
    let properties = schema
        .entry("properties")
        .or_insert_with(|| Value::Object(JsonObject::new()));
    if !properties.is_object() {
        *properties = Value::Object(JsonObject::new());
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
    tool.input_schema = Arc::new(schema);
    tool.description = Some(match tool.description.take() {
        Some(d) if !d.trim().is_empty() => format!("{} {KEY_SENTENCE}", d.trim_end()).into(),
        _ => KEY_SENTENCE.into(),
    });
    tool
}

/// What a key in a call looked like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyArg {
    /// None was sent.
    Missing,
    /// One was sent, as a string.
    Present(String),
    /// It was sent but is not usable (not a string, or argument and `_meta` disagree).
    Invalid(String),
}

/// Reads the key from the arguments or from the request's `_meta`, and returns the arguments
/// without it (what the fingerprint covers), plus the arguments to forward: the same, or with
/// the key kept when the upstream declares the property itself.
pub fn take_key(
    arguments: Option<JsonObject>,
    meta: Option<&JsonObject>,
    upstream_declares: bool,
) -> (KeyArg, JsonObject, Option<JsonObject>) {
    let had_arguments = arguments.is_some();
    let mut args = arguments.unwrap_or_default();
    let from_args = args.remove(KEY_ARG);
    let from_meta = meta.and_then(|m| m.get(KEY_ARG)).cloned();
    let key = match (from_args.clone(), from_meta) {
        (None, None) => KeyArg::Missing,
        (Some(Value::String(a)), Some(Value::String(m))) if a != m => KeyArg::Invalid(
            "the idempotency_key argument and the one in _meta differ; send one".into(),
        ),
        (Some(Value::String(k)), _) | (None, Some(Value::String(k))) => KeyArg::Present(k),
        (Some(other), _) | (None, Some(other)) => KeyArg::Invalid(format!(
            "idempotency_key must be a string, not {}",
            kind(&other)
        )),
    };
    // An upstream that declares the key gets it however it came (argument or `_meta`): it
    // may dedup by it itself, which is what makes `on_unknown = "retry"` safe
    // ([design §5](docs/design.md#5-unknown-outcomes)).
    let forward = match &key {
        KeyArg::Present(k) if upstream_declares => {
            let mut f = args.clone();
            f.insert(KEY_ARG.into(), Value::String(k.clone()));
            Some(f)
        }
        _ if had_arguments || !args.is_empty() => Some(args.clone()),
        _ => None,
    };
    (key, args, forward)
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

    fn obj(v: Value) -> JsonObject {
        match v {
            Value::Object(m) => m,
            other => panic!("not an object: {other}"),
        }
    }

    fn tool(schema: Value, description: Option<&'static str>) -> Tool {
        let mut t = Tool::default();
        t.name = "charge_card".into();
        t.input_schema = Arc::new(obj(schema));
        t.description = description.map(Into::into);
        t
    }

    #[test]
    fn adds_a_required_property_and_a_sentence() {
        let t = with_key(tool(
            json!({"type":"object","properties":{"amount_cents":{"type":"integer"}},"required":["amount_cents"]}),
            Some("Charges a card."),
        ));
        let s = Value::Object((*t.input_schema).clone());
        assert_eq!(s["properties"][KEY_ARG]["type"], "string");
        assert_eq!(s["properties"]["amount_cents"]["type"], "integer");
        assert_eq!(s["required"], json!(["amount_cents", KEY_ARG]));
        let d = t.description.as_deref().unwrap_or_default();
        assert!(
            d.starts_with("Charges a card. This tool has side effects"),
            "{d}"
        );
        assert!(d.contains("same key"), "{d}");
    }

    #[test]
    fn a_bare_schema_and_an_existing_declaration_are_handled() {
        let t = with_key(tool(json!({"type":"object"}), None));
        let s = Value::Object((*t.input_schema).clone());
        assert_eq!(s["required"], json!([KEY_ARG]));
        assert_eq!(t.description.as_deref(), Some(KEY_SENTENCE));
        // Declared upstream: its own property is kept, not duplicated in `required`.
        let own = json!({"type":"object","properties":{"idempotency_key":{"type":"string","description":"mine"}},"required":["idempotency_key"]});
        assert!(declares_key(&obj(own.clone())));
        let t = with_key(tool(own, None));
        let s = Value::Object((*t.input_schema).clone());
        assert_eq!(s["properties"][KEY_ARG]["description"], "mine");
        assert_eq!(s["required"], json!([KEY_ARG]));
    }

    #[test]
    fn takes_the_key_from_arguments_or_meta() {
        let args = obj(json!({"amount_cents": 4900, "idempotency_key": "k1"}));
        let (key, rest, fwd) = take_key(Some(args.clone()), None, false);
        assert_eq!(key, KeyArg::Present("k1".into()));
        assert_eq!(Value::Object(rest), json!({"amount_cents": 4900}));
        assert_eq!(fwd.map(Value::Object), Some(json!({"amount_cents": 4900})));
        // An upstream that declares the key gets it.
        let (_, _, fwd) = take_key(Some(args), None, true);
        assert_eq!(
            fwd.map(Value::Object),
            Some(json!({"amount_cents": 4900, "idempotency_key": "k1"}))
        );
        let meta = obj(json!({"idempotency_key": "k2"}));
        let (key, _, _) = take_key(Some(obj(json!({"a": 1}))), Some(&meta), false);
        assert_eq!(key, KeyArg::Present("k2".into()));
        let (key, _, fwd) = take_key(None, None, false);
        assert_eq!((key, fwd), (KeyArg::Missing, None));
        // A key sent in _meta still reaches an upstream that declares the property.
        let meta = obj(json!({"idempotency_key": "k3"}));
        let (_, _, fwd) = take_key(Some(obj(json!({"a": 1}))), Some(&meta), true);
        assert_eq!(
            fwd.map(Value::Object),
            Some(json!({"a": 1, "idempotency_key": "k3"}))
        );
    }

    #[test]
    fn unusable_keys_are_named() {
        let (key, _, _) = take_key(Some(obj(json!({"idempotency_key": 7}))), None, false);
        assert!(matches!(key, KeyArg::Invalid(m) if m.contains("a number")));
        let meta = obj(json!({"idempotency_key": "b"}));
        let (key, _, _) = take_key(
            Some(obj(json!({"idempotency_key": "a"}))),
            Some(&meta),
            false,
        );
        assert!(matches!(key, KeyArg::Invalid(m) if m.contains("differ")));
    }
}
