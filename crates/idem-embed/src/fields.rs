//! Keys from a subset of the arguments ([design §7](docs/design.md#7-the-runtime-side)).
//!
//! Some arguments carry noise that must not make a retry a new intent: a timestamp, a
//! free-text note the model rephrases. A tool then names the fields its key is derived from
//! (as AWS Lambda Powertools' key paths do), and the derivation hashes
//! `{"<field>": <value>, ...}` (each field as it was written) instead of the whole arguments.
//!
//! A field is a top-level name (`customer`), a dotted path into objects and arrays
//! (`order.id`, `items.0.sku`), or an RFC 6901 JSON Pointer (`/meta/a.b`) for names that hold
//! dots. A field missing from the arguments is an error, never a silent `null`: a key derived
//! from nothing would make every call one intent.

use serde_json::{Map, Value};

/// The fields a key is derived from, parsed once (at decoration time) and checked then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyFields(Vec<Field>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Field {
    /// As written: the member name in the hashed object.
    spec: String,
    /// Path segments into the arguments.
    path: Vec<String>,
}

/// A key field that is malformed or absent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FieldError {
    /// No fields were named: the key would be the same for every call.
    #[error(
        "key_fields is empty; name at least one argument, or leave key_fields unset to use all of them"
    )]
    Empty,
    /// A field is empty or has an empty segment (`a..b`, a trailing dot).
    #[error(
        "key field {0:?} is malformed: use a name, a dotted path (order.id, items.0.sku) or a JSON Pointer (/order/id)"
    )]
    Malformed(String),
    /// A field was named twice.
    #[error("key field {0:?} is named twice")]
    Duplicate(String),
    /// The arguments have no value at a field's path.
    #[error("key field {field:?} is not in the arguments{}", if available.is_empty() { String::new() } else { format!(" (they have: {})", available.join(", ")) })]
    Missing {
        /// The field as named.
        field: String,
        /// The top-level argument names present, to help a caller fix a typo.
        available: Vec<String>,
    },
}

impl KeyFields {
    /// Parses field specs; see the module documentation.
    pub fn parse<I, S>(specs: I) -> Result<Self, FieldError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut fields: Vec<Field> = Vec::new();
        for spec in specs {
            let spec = spec.as_ref();
            let path = parse_path(spec).ok_or_else(|| FieldError::Malformed(spec.to_owned()))?;
            if fields.iter().any(|f| f.spec == spec) {
                return Err(FieldError::Duplicate(spec.to_owned()));
            }
            fields.push(Field {
                spec: spec.to_owned(),
                path,
            });
        }
        if fields.is_empty() {
            return Err(FieldError::Empty);
        }
        Ok(KeyFields(fields))
    }

    /// The fields as written.
    pub fn specs(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|f| f.spec.as_str())
    }

    /// The object that is hashed instead of the arguments: each field's spec mapped to its
    /// value.
    pub fn select(&self, args: &Value) -> Result<Value, FieldError> {
        let mut out = Map::new();
        for field in &self.0 {
            let value = lookup(args, &field.path).ok_or_else(|| FieldError::Missing {
                field: field.spec.clone(),
                available: match args {
                    Value::Object(m) => m.keys().cloned().collect(),
                    _ => Vec::new(),
                },
            })?;
            out.insert(field.spec.clone(), value.clone());
        }
        Ok(Value::Object(out))
    }
}

fn parse_path(spec: &str) -> Option<Vec<String>> {
    let segments: Vec<String> = if let Some(pointer) = spec.strip_prefix('/') {
        // RFC 6901: `~1` is `/`, `~0` is `~`, in that order.
        pointer
            .split('/')
            .map(|s| s.replace("~1", "/").replace("~0", "~"))
            .collect()
    } else {
        spec.split('.').map(str::to_owned).collect()
    };
    (!spec.is_empty() && segments.iter().all(|s| !s.is_empty())).then_some(segments)
}

fn lookup<'a>(mut value: &'a Value, path: &[String]) -> Option<&'a Value> {
    for segment in path {
        value = match value {
            Value::Object(map) => map.get(segment)?,
            Value::Array(items) => items.get(segment.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selects_names_paths_and_pointers() {
        let args = json!({"order": {"id": "o1", "a.b": 2}, "items": [{"sku": "s"}], "note": "x"});
        let fields = KeyFields::parse(["order.id", "items.0.sku", "/order/a.b"]).unwrap();
        assert_eq!(
            fields.select(&args).unwrap(),
            json!({"order.id": "o1", "items.0.sku": "s", "/order/a.b": 2})
        );
    }

    #[test]
    fn noise_outside_the_fields_does_not_change_the_selection() {
        let fields = KeyFields::parse(["customer"]).unwrap();
        let a = fields.select(&json!({"customer": "c", "at": 1})).unwrap();
        let b = fields.select(&json!({"customer": "c", "at": 2})).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn a_missing_field_is_an_error_naming_what_is_there() {
        let fields = KeyFields::parse(["custmer"]).unwrap();
        let err = fields.select(&json!({"customer": "c"})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "key field \"custmer\" is not in the arguments (they have: customer)"
        );
        // A null is a value; an absent member is not.
        assert!(fields.select(&json!({"custmer": null})).is_ok());
    }

    #[test]
    fn malformed_empty_and_duplicate_specs_are_refused() {
        for bad in ["", "a..b", "a.", "/", "/a//b"] {
            assert_eq!(
                KeyFields::parse([bad]),
                Err(FieldError::Malformed(bad.into()))
            );
        }
        assert_eq!(KeyFields::parse(Vec::<&str>::new()), Err(FieldError::Empty));
        assert_eq!(
            KeyFields::parse(["a", "a"]),
            Err(FieldError::Duplicate("a".into()))
        );
    }

    #[test]
    fn pointer_escapes() {
        let fields = KeyFields::parse(["/a~1b/c~0d"]).unwrap();
        assert_eq!(
            fields.select(&json!({"a/b": {"c~d": 1}})).unwrap(),
            json!({"/a~1b/c~0d": 1})
        );
    }
}
