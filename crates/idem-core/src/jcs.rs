//! RFC 8785 (JCS) canonical JSON, written straight from a parsed [`Value`], and the one parse
//! that checks a body is I-JSON (RFC 7493) while it builds that value.
//!
//! Why not a general JCS serializer: every JSON body of a keyed request is canonicalised
//! before its fingerprint is taken, on every request, replays included. A serializer that
//! must accept any `Serialize` type buffers each member apart, parses each key again to sort
//! it, and boxes a writer per write; with a second parse to check I-JSON, that was half of the
//! instructions the layer spends on a replay ([benchmarks](../../../docs/benchmarks.md)). A
//! `Value` is already parsed, its strings unescaped and its keys unique, so the canonical form
//! is one walk: members sorted by UTF-16 code units, strings in JSON's minimal escaping,
//! numbers as ECMAScript writes a double (`ryu-js`, the formatter JCS implementations share).
//! The tests check it byte for byte against two independent implementations.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// 2^53: from here on, not every integer is a distinct IEEE double, so JCS (which writes
/// doubles) would make two different numbers one.
pub(crate) const EXACT_LIMIT: f64 = 9_007_199_254_740_992.0;

/// The canonical form of `value`.
pub fn to_vec(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    write(value, &mut out);
    out
}

/// Appends the canonical form of `value` to `out`.
pub fn write(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(item, out);
            }
            out.push(b']');
        }
        Value::Object(members) => {
            let mut sorted: Vec<(&String, &Value)> = members.iter().collect();
            // RFC 8785 §3.2.3: by UTF-16 code units, which differs from the map's UTF-8 order
            // once characters beyond U+FFFF meet ones from U+E000 to U+FFFF.
            sorted.sort_unstable_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push(b'{');
            for (i, (name, member)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(name, out);
                out.push(b':');
                write(member, out);
            }
            out.push(b'}');
        }
    }
}

/// Every JSON number is a double to JCS, written as ECMAScript's `Number.prototype.toString`.
fn write_number(n: &Number, out: &mut Vec<u8>) {
    match n.as_f64().filter(|f| f.is_finite()) {
        Some(f) => out.extend_from_slice(ryu_js::Buffer::new().format_finite(f).as_bytes()),
        // A parsed number is always a finite double; kept exact rather than dropped.
        None => out.extend_from_slice(n.to_string().as_bytes()),
    }
}

/// JSON's minimal escaping, which is JCS's (RFC 8785 §3.2.2.2): `"`, `\` and the control
/// characters, with the short forms where JSON has them and lowercase `\u00xx` otherwise;
/// serde_json's own string writer does exactly that.
fn write_string(s: &str, out: &mut Vec<u8>) {
    // Writing a string into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// JSON text as a value, if it is I-JSON: it parses, no object repeats a member name, and no
/// number has magnitude 2^53 or more. One parse does both the check and the value.
pub fn parse_i_json(text: &[u8]) -> Option<Value> {
    serde_json::from_slice::<IJson>(text).ok().map(|v| v.0)
}

/// A value parsed under I-JSON's rules.
struct IJson(Value);

impl<'de> Deserialize<'de> for IJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(IJsonVisitor)
    }
}

struct IJsonVisitor;

impl IJsonVisitor {
    fn number<E: de::Error>(n: Number) -> Result<IJson, E> {
        match n.as_f64() {
            Some(f) if f.abs() < EXACT_LIMIT => Ok(IJson(Value::Number(n))),
            _ => Err(E::custom("number beyond 2^53")),
        }
    }
}

impl<'de> Visitor<'de> for IJsonVisitor {
    type Value = IJson;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("I-JSON")
    }
    fn visit_unit<E>(self) -> Result<IJson, E> {
        Ok(IJson(Value::Null))
    }
    fn visit_bool<E>(self, b: bool) -> Result<IJson, E> {
        Ok(IJson(Value::Bool(b)))
    }
    fn visit_str<E>(self, s: &str) -> Result<IJson, E> {
        Ok(IJson(Value::String(s.to_owned())))
    }
    fn visit_string<E>(self, s: String) -> Result<IJson, E> {
        Ok(IJson(Value::String(s)))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<IJson, E> {
        Self::number(v.into())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<IJson, E> {
        Self::number(v.into())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<IJson, E> {
        match Number::from_f64(v) {
            Some(n) => Self::number(n),
            None => Err(E::custom("not a finite number")),
        }
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<IJson, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(IJson(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(IJson(Value::Array(items)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<IJson, A::Error> {
        let mut members = Map::new();
        while let Some(name) = map.next_key::<String>()? {
            let IJson(member) = map.next_value()?;
            if members.insert(name, member).is_some() {
                return Err(de::Error::custom("duplicate member name"));
            }
        }
        Ok(IJson(Value::Object(members)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift), so a failure names its case.
    struct Gen(u64);

    impl Gen {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn string(&mut self) -> String {
            // ASCII, controls, the RFC's sorting trouble-makers (U+E000..U+FFFF against
            // astral characters), and escapes.
            const PARTS: [&str; 18] = [
                "a",
                "Z",
                "1",
                "\"",
                "\\",
                "/",
                "\n",
                "\r",
                "\t",
                "\u{8}",
                "\u{c}",
                "\u{1}",
                "\u{1f}",
                "\u{7f}",
                "\u{80}",
                "\u{20ac}",
                "\u{fb33}",
                "\u{1f600}",
            ];
            (0..self.below(6))
                .map(|_| PARTS[self.below(PARTS.len() as u64) as usize])
                .collect()
        }
        fn number(&mut self) -> Value {
            match self.below(6) {
                0 => Value::from(self.next() % 1_000_000),
                1 => Value::from(-((self.next() % (1 << 53)) as i64)),
                2 => Value::from(f64::from_bits(self.next()))
                    .as_f64()
                    .filter(|f| f.is_finite())
                    .map_or(Value::from(0.5), Value::from),
                3 => Value::from((self.next() % 100_000) as f64 / 1000.0),
                4 => Value::from(-0.0),
                _ => Value::from(1e21 * (self.below(1000) as f64)),
            }
        }
        fn value(&mut self, depth: u32) -> Value {
            match self.below(if depth > 3 { 5 } else { 7 }) {
                0 => Value::Null,
                1 => Value::Bool(self.below(2) == 0),
                2 | 3 => self.number(),
                4 => Value::String(self.string()),
                5 => Value::Array((0..self.below(4)).map(|_| self.value(depth + 1)).collect()),
                _ => Value::Object(
                    (0..self.below(5))
                        .map(|_| (self.string(), self.value(depth + 1)))
                        .collect(),
                ),
            }
        }
    }

    #[test]
    fn writes_what_two_other_implementations_write() {
        let mut g = Gen(0x9e37_79b9_7f4a_7c15);
        for case in 0..5_000 {
            let v = g.value(0);
            let ours = to_vec(&v);
            let reference = serde_json_canonicalizer::to_vec(&v).expect("canonicalizer");
            assert_eq!(
                String::from_utf8_lossy(&ours),
                String::from_utf8_lossy(&reference),
                "case {case}: {v}"
            );
            let other = serde_jcs::to_vec(&v).expect("serde_jcs");
            assert_eq!(ours, other, "case {case}: {v}");
        }
    }

    #[test]
    fn parses_what_serde_json_parses_and_refuses_what_i_json_does() {
        let text = br#"{"b":[1,-2,3.5,"x\u0000y",null,true],"a":{"\u20ac":{}},"c":-0.0}"#;
        assert_eq!(
            parse_i_json(text),
            serde_json::from_slice::<Value>(text).ok()
        );
        for refused in [
            &br#"{"a":1,"a":1}"#[..],
            br#"[{"x":{"y":1,"y":2}}]"#,
            b"9007199254740992",
            b"-9007199254740993",
            b"1e300",
            b"{not json",
            b"",
        ] {
            assert_eq!(
                parse_i_json(refused),
                None,
                "{}",
                String::from_utf8_lossy(refused)
            );
        }
        assert!(parse_i_json(b"9007199254740991").is_some());
    }

    /// The doubles are parsed exactly (serde_json's `float_roundtrip`, which idem-core asks for
    /// itself): serde_json's fast parse reads these one bit off, and the canonical form would
    /// then name another number.
    #[test]
    fn doubles_are_parsed_exactly() {
        for text in ["172.65573157332975", "1.1e-30", "0.1", "19.99"] {
            let parsed = parse_i_json(text.as_bytes()).and_then(|v| v.as_f64());
            assert_eq!(parsed, text.parse::<f64>().ok(), "{text}");
        }
        assert_eq!(
            to_vec(&parse_i_json(br#"{"amount":172.65573157332975}"#).unwrap_or_default()),
            br#"{"amount":172.65573157332975}"#
        );
    }
}
