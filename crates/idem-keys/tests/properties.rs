//! Properties over generated arguments: the key names the intent, not its spelling.

use idem_core::Key;
use proptest::prelude::*;
use serde_json::{Map, Value};

/// JSON values whose numbers JCS carries exactly.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-(1i64 << 53)..=(1i64 << 53)).prop_map(Value::from),
        (-1e15f64..1e15)
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("\\PC{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<String, Value>>())),
        ]
    })
}

/// Writes `v` with object members in an order set by `seed` and arbitrary whitespace.
fn spell(v: &Value, seed: u64, out: &mut String) {
    let ws = |n: u64| [" ", "\n", "\t", "", "  "][(n % 5) as usize];
    match v {
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            members.sort_by_key(|(k, _)| {
                k.bytes()
                    .fold(seed, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))
            });
            out.push('{');
            for (i, (k, v)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(ws(seed + i as u64));
                out.push_str(&Value::from(k.as_str()).to_string());
                out.push_str(ws(seed >> 3));
                out.push(':');
                spell(v, seed.rotate_left(7) ^ i as u64, out);
            }
            out.push_str(ws(seed >> 5));
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(ws(seed + 1));
                    out.push(',');
                }
                spell(item, seed.rotate_left(11) ^ i as u64, out);
            }
            out.push(']');
        }
        leaf => out.push_str(&leaf.to_string()),
    }
}

fn count_leaves(v: &Value) -> usize {
    match v {
        Value::Array(items) => items.iter().map(count_leaves).sum::<usize>().max(1),
        Value::Object(map) => map.values().map(count_leaves).sum::<usize>().max(1),
        _ => 1,
    }
}

/// Replaces leaf number `n` (depth first; an empty container counts as a leaf) with another
/// value. Returns true once done.
fn change_leaf(v: &mut Value, n: &mut usize) -> bool {
    let container_empty = match v {
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => map.is_empty(),
        _ => false,
    };
    if !container_empty {
        match v {
            Value::Array(items) => return items.iter_mut().any(|i| change_leaf(i, n)),
            Value::Object(map) => return map.values_mut().any(|i| change_leaf(i, n)),
            _ => {}
        }
    }
    if *n > 0 {
        *n -= 1;
        return false;
    }
    *v = match v.take() {
        Value::Null => Value::from(0),
        Value::Bool(b) => Value::from(!b),
        Value::String(s) => Value::from(format!("{s}x")),
        Value::Number(num) => match num.as_i64() {
            Some(i) if i < (1 << 53) => Value::from(i + 1),
            Some(i) => Value::from(i - 1),
            None => Value::from(num.as_f64().unwrap_or(0.0) + 0.5),
        },
        Value::Array(_) => Value::Array(vec![Value::Null]),
        Value::Object(_) => {
            let mut m = Map::new();
            m.insert("k".into(), Value::Null);
            Value::Object(m)
        }
    };
    true
}

fn key_of(args: &Value) -> Key {
    idem_keys::derive("turn_1", "charge_card", args, 0, None).expect("derive")
}

proptest! {
    #[test]
    fn member_order_and_whitespace_never_change_the_key(args in json(), seed in any::<u64>()) {
        let mut text = String::new();
        spell(&args, seed, &mut text);
        let reparsed = idem_keys::parse_args(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        prop_assert_eq!(key_of(&reparsed), key_of(&args));
    }

    #[test]
    fn any_changed_value_changes_the_key(args in json(), which in any::<usize>()) {
        let mut changed = args.clone();
        let leaves = count_leaves(&args);
        change_leaf(&mut changed, &mut (which % leaves));
        prop_assert_ne!(&changed, &args);
        prop_assert_ne!(key_of(&changed), key_of(&args));
    }

    #[test]
    fn every_derived_key_is_a_valid_key(scope in "\\PC{1,300}", tool in "\\PC{1,300}", ordinal in 0u64..=(1 << 53), args in json()) {
        let key = idem_keys::derive(&scope, &tool, &args, ordinal, None).unwrap();
        prop_assert!(key.as_str().len() <= 255);
        prop_assert_eq!(Key::new(key.as_str()).ok(), Some(key.clone()));
        prop_assert_eq!(Key::from_header(key.to_header_value().as_bytes()).ok(), Some(key));
    }

    /// What is hashed is RFC 8785 of the tuple, byte for byte as a general JCS serializer
    /// writes it, the `idempotency_key` argument left out.
    #[test]
    fn the_hashed_bytes_are_the_jcs_of_the_tuple(scope in "\\PC{1,20}", tool in "\\PC{1,20}", ordinal in 0u64..=(1 << 53), args in json(), with_key in any::<bool>()) {
        let mut sent = args.clone();
        if let (true, Value::Object(members)) = (with_key, &mut sent) {
            members.insert("idempotency_key".into(), Value::from("k-1"));
        }
        let tuple = Value::Array(vec![
            Value::from(idem_keys::VERSION),
            Value::from(scope.as_str()),
            Value::from(tool.as_str()),
            Value::from(ordinal),
            args,
        ]);
        let reference = serde_json_canonicalizer::to_vec(&tuple).unwrap();
        let ours = idem_keys::canonical_bytes(&scope, &tool, &sent, ordinal).unwrap();
        prop_assert_eq!(String::from_utf8_lossy(&ours), String::from_utf8_lossy(&reference));
    }
}
