//! Arguments straight from Python objects, skipping JSON text on a tool call's hot path.
//!
//! `json.dumps` in Python and a parse in Rust cost more than the rest of a replay's Python
//! side. For the plain types (`dict` with `str` keys, `list`, `tuple`, `str`, `int`, `float`,
//! `bool`, `None`, exactly those classes) the value is built here instead: the same
//! `serde_json::Value` the text would parse to, so keys and fingerprints do not depend on the
//! path. Anything else (a subclass, a dataclass, a non-`str` key, a float that is not finite,
//! an integer beyond 64 bits, a string with a lone surrogate) answers `None`, and the caller
//! takes the JSON text path, whose `default` hook and errors say what the value is.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Value};

/// serde_json's own nesting limit for parsed text.
const MAX_DEPTH: u32 = 128;

/// The value of `obj`, or `None` when it is not made of plain types only.
pub(crate) fn plain_value(obj: &Bound<'_, PyAny>) -> Option<Value> {
    value(obj, 0)
}

fn value(obj: &Bound<'_, PyAny>, depth: u32) -> Option<Value> {
    if depth > MAX_DEPTH {
        return None;
    }
    if obj.is_none() {
        return Some(Value::Null);
    }
    if let Ok(s) = obj.cast_exact::<PyString>() {
        return s.to_cow().ok().map(|s| Value::String(s.into_owned()));
    }
    if let Ok(b) = obj.cast_exact::<PyBool>() {
        return Some(Value::Bool(b.is_true()));
    }
    if obj.is_exact_instance_of::<PyInt>() {
        // Within 64 bits; the derivation refuses magnitudes beyond 2^53 as the text path does.
        if let Ok(i) = obj.extract::<i64>() {
            return Some(Value::from(i));
        }
        return obj.extract::<u64>().ok().map(Value::from);
    }
    if let Ok(f) = obj.cast_exact::<PyFloat>() {
        let f = f.value();
        return f.is_finite().then(|| Value::from(f));
    }
    if let Ok(d) = obj.cast_exact::<PyDict>() {
        let mut map = Map::new();
        for (k, v) in d.iter() {
            let k = k.cast_exact::<PyString>().ok()?.to_cow().ok()?.into_owned();
            map.insert(k, value(&v, depth + 1)?);
        }
        return Some(Value::Object(map));
    }
    if let Ok(l) = obj.cast_exact::<PyList>() {
        return array(l.iter(), depth);
    }
    if let Ok(t) = obj.cast_exact::<PyTuple>() {
        return array(t.iter(), depth);
    }
    None
}

fn array<'py>(items: impl Iterator<Item = Bound<'py, PyAny>>, depth: u32) -> Option<Value> {
    items
        .map(|v| value(&v, depth + 1))
        .collect::<Option<_>>()
        .map(Value::Array)
}
