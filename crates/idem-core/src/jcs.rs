//! RFC 8785 (JCS) canonical JSON, written straight from a parsed [`Value`] (a tool call's
//! arguments), or from JSON text in the one parse that also checks it is I-JSON (RFC 7493).
//!
//! Why not a general JCS serializer: every JSON body of a keyed request is canonicalised
//! before its fingerprint is taken, on every request, replays included. A serializer that
//! must accept any `Serialize` type buffers each member apart, parses each key again to sort
//! it, and boxes a writer per write; with a second parse to check I-JSON, that was half of the
//! instructions the layer spends on a replay ([benchmarks](../../../docs/benchmarks.md)). A
//! `Value` is already parsed, its strings unescaped and its keys unique, so the canonical form
//! is one walk: members sorted by UTF-16 code units, strings in JSON's minimal escaping,
//! numbers as ECMAScript writes a double (`ryu-js`, the formatter JCS implementations share).
//! From text (a request body) not even a `Value` is built: see [`canonical_i_json`].
//! The tests check it byte for byte against two independent implementations, and the text
//! path against the `Value` path.

use std::borrow::Cow;
use std::cmp::Ordering;
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
        Value::Array(items) => write_array(items, write, out),
        Value::Object(members) => write_object(members, None, out),
    }
}

/// Appends the canonical form of an object, leaving out the member named `without` if given:
/// what a tool call's key is derived from, without copying the arguments to drop one member.
pub fn write_object(members: &Map<String, Value>, without: Option<&str>, out: &mut Vec<u8>) {
    let mut sorted: Vec<(&String, &Value)> = members
        .iter()
        .filter(|(name, _)| Some(name.as_str()) != without)
        .collect();
    // The map's order is UTF-8's, not JCS's.
    sorted.sort_unstable_by(|a, b| utf16_order(a.0, b.0));
    write_members(sorted, write, out);
}

/// `[item,item]`, each item written by `each`.
fn write_array<T>(items: &[T], each: fn(&T, &mut Vec<u8>), out: &mut Vec<u8>) {
    out.push(b'[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        each(item, out);
    }
    out.push(b']');
}

/// `{"name":member,...}` in the order given, each member written by `each`.
fn write_members<'a, N, T: 'a>(
    members: impl IntoIterator<Item = (&'a N, &'a T)>,
    each: fn(&T, &mut Vec<u8>),
    out: &mut Vec<u8>,
) where
    N: AsRef<str> + ?Sized + 'a,
{
    out.push(b'{');
    for (i, (name, member)) in members.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(name.as_ref(), out);
        out.push(b':');
        each(member, out);
    }
    out.push(b'}');
}

/// Every JSON number is a double to JCS, written as ECMAScript's `Number.prototype.toString`.
fn write_number(n: &Number, out: &mut Vec<u8>) {
    match n.as_f64().filter(|f| f.is_finite()) {
        Some(f) => write_double(f, out),
        // A parsed number is always a finite double; kept exact rather than dropped.
        None => out.extend_from_slice(n.to_string().as_bytes()),
    }
}

/// A finite double as ECMAScript writes it.
fn write_double(f: f64, out: &mut Vec<u8>) {
    out.extend_from_slice(ryu_js::Buffer::new().format_finite(f).as_bytes());
}

/// JSON's minimal escaping, which is JCS's (RFC 8785 §3.2.2.2): `"`, `\` and the control
/// characters, with the short forms where JSON has them and lowercase `\u00xx` otherwise;
/// serde_json's own string writer does exactly that.
pub fn write_string(s: &str, out: &mut Vec<u8>) {
    // Writing a string into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// The canonical form of JSON text, if it is I-JSON: it parses, no object repeats a member
/// name, and no number has magnitude 2^53 or more. One parse does both the check and the form.
///
/// The parse builds no [`Value`]: strings without escapes stay borrowed from `text`, and an
/// object is a vector of members, sorted once for both the canonical order and the duplicate
/// check. This runs on every keyed JSON request, replays included.
pub fn canonical_i_json(text: &[u8]) -> Option<Vec<u8>> {
    let node = serde_json::from_slice::<Node<'_>>(text).ok()?;
    let mut out = Vec::with_capacity(text.len());
    node.write(&mut out);
    Some(out)
}

/// A parsed I-JSON value, borrowing from the text where it can.
enum Node<'a> {
    Null,
    Bool(bool),
    /// Every JSON number is a double to JCS; this one is below 2^53 in magnitude.
    Number(f64),
    String(Cow<'a, str>),
    Array(Vec<Node<'a>>),
    /// Members in canonical order, names unique.
    Object(Vec<(Cow<'a, str>, Node<'a>)>),
}

impl Node<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Node::Null => out.extend_from_slice(b"null"),
            Node::Bool(true) => out.extend_from_slice(b"true"),
            Node::Bool(false) => out.extend_from_slice(b"false"),
            Node::Number(f) => write_double(*f, out),
            Node::String(s) => write_string(s, out),
            Node::Array(items) => write_array(items, Node::write, out),
            Node::Object(members) => {
                write_members(members.iter().map(|(n, m)| (n, m)), Node::write, out);
            }
        }
    }
}

/// RFC 8785 §3.2.3's member order: by UTF-16 code units. UTF-8 byte order is code point order,
/// which is UTF-16's except between U+E000..U+FFFF and the characters beyond U+FFFF (whose
/// UTF-16 form starts with a surrogate, below U+E000). Both begin with a byte of at least
/// 0xEE, so only names that first differ at two such bytes are compared in UTF-16.
fn utf16_order(a: &str, b: &str) -> Ordering {
    let (x, y) = (a.as_bytes(), b.as_bytes());
    match x.iter().zip(y).position(|(p, q)| p != q) {
        Some(i) if x[i] >= 0xEE && y[i] >= 0xEE => a.encode_utf16().cmp(b.encode_utf16()),
        Some(i) => x[i].cmp(&y[i]),
        None => x.len().cmp(&y.len()),
    }
}

impl<'de> Deserialize<'de> for Node<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl NodeVisitor {
    fn number<'a, E: de::Error>(f: f64) -> Result<Node<'a>, E> {
        if f.abs() < EXACT_LIMIT {
            Ok(Node::Number(f))
        } else {
            Err(E::custom("number beyond 2^53"))
        }
    }
}

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("I-JSON")
    }
    fn visit_unit<E>(self) -> Result<Node<'de>, E> {
        Ok(Node::Null)
    }
    fn visit_bool<E>(self, b: bool) -> Result<Node<'de>, E> {
        Ok(Node::Bool(b))
    }
    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Node<'de>, E> {
        Ok(Node::String(Cow::Borrowed(s)))
    }
    fn visit_str<E>(self, s: &str) -> Result<Node<'de>, E> {
        Ok(Node::String(Cow::Owned(s.to_owned())))
    }
    fn visit_string<E>(self, s: String) -> Result<Node<'de>, E> {
        Ok(Node::String(Cow::Owned(s)))
    }
    // Integers below 2^53 are exact doubles; those at or beyond it are refused either way.
    #[allow(clippy::cast_precision_loss)]
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Node<'de>, E> {
        Self::number(v as f64)
    }
    #[allow(clippy::cast_precision_loss)]
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Node<'de>, E> {
        Self::number(v as f64)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Node<'de>, E> {
        if v.is_finite() {
            Self::number(v)
        } else {
            Err(E::custom("not a finite number"))
        }
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node<'de>, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node<'de>, A::Error> {
        let mut members = Vec::with_capacity(map.size_hint().unwrap_or(0).min(64));
        while let Some(Name(name)) = map.next_key()? {
            members.push((name, map.next_value()?));
        }
        members.sort_unstable_by(|a: &(Cow<'de, str>, Node<'de>), b| utf16_order(&a.0, &b.0));
        // Sorted, a repeated name sits next to itself.
        if members.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(de::Error::custom("duplicate member name"));
        }
        Ok(Node::Object(members))
    }
}

/// A member name, borrowed from the text unless it had escapes.
struct Name<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Name<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(NameVisitor)
    }
}

struct NameVisitor;

impl<'de> Visitor<'de> for NameVisitor {
    type Value = Name<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }
    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Name<'de>, E> {
        Ok(Name(Cow::Borrowed(s)))
    }
    fn visit_str<E>(self, s: &str) -> Result<Name<'de>, E> {
        Ok(Name(Cow::Owned(s.to_owned())))
    }
    fn visit_string<E>(self, s: String) -> Result<Name<'de>, E> {
        Ok(Name(Cow::Owned(s)))
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

    /// JSON text for `v` with its members in another order and spacing, and its strings escaped
    /// more than they need be, so the text path has reordering and unescaping to do.
    fn scrambled(v: &Value, g: &mut Gen, out: &mut String) {
        match v {
            Value::String(s) => scrambled_string(s, g, out),
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(" ,");
                    }
                    scrambled(item, g, out);
                }
                out.push(']');
            }
            Value::Object(members) => {
                let mut members: Vec<_> = members.iter().collect();
                members.reverse();
                out.push_str("{ ");
                for (i, (name, member)) in members.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    scrambled_string(name, g, out);
                    out.push_str(" :\n");
                    scrambled(member, g, out);
                }
                out.push('}');
            }
            other => out.push_str(&other.to_string()),
        }
    }

    fn scrambled_string(s: &str, g: &mut Gen, out: &mut String) {
        if g.below(2) == 0 {
            out.push_str(&Value::from(s).to_string());
            return;
        }
        out.push('"');
        for unit in s.encode_utf16() {
            out.push_str(&format!("\\u{unit:04x}"));
        }
        out.push('"');
    }

    /// Whether every number in `v` is below 2^53 in magnitude.
    fn exact(v: &Value) -> bool {
        match v {
            Value::Number(n) => n.as_f64().is_some_and(|f| f.abs() < EXACT_LIMIT),
            Value::Array(items) => items.iter().all(exact),
            Value::Object(members) => members.values().all(exact),
            _ => true,
        }
    }

    #[test]
    fn text_and_value_give_one_canonical_form() {
        let mut g = Gen(0x2545_f491_4f6c_dd1d);
        let mut canonicalised = 0;
        for case in 0..5_000 {
            let v = g.value(0);
            let mut text = String::new();
            scrambled(&v, &mut g, &mut text);
            // Numbers from 2^53 on are not I-JSON: the text is refused.
            let expected = exact(&v).then(|| String::from_utf8_lossy(&to_vec(&v)).into_owned());
            canonicalised += usize::from(expected.is_some());
            assert_eq!(
                canonical_i_json(text.as_bytes()).map(|c| String::from_utf8_lossy(&c).into_owned()),
                expected,
                "case {case}: {text}"
            );
        }
        assert!(
            canonicalised > 2_500,
            "only {canonicalised} cases were I-JSON"
        );
    }

    #[test]
    fn utf16_order_is_the_order_of_utf16_code_units() {
        let chars = [
            "",
            "a",
            "\u{7f}",
            "\u{80}",
            "\u{7ff}",
            "\u{800}",
            "\u{d7ff}",
            "\u{e000}",
            "\u{ffff}",
            "\u{10000}",
            "\u{1f600}",
            "\u{10ffff}",
        ];
        for a in chars {
            for b in chars {
                for (x, y) in [
                    (format!("{a}{b}"), format!("{b}{a}")),
                    (format!("k{a}"), format!("k{b}z")),
                ] {
                    assert_eq!(
                        utf16_order(&x, &y),
                        x.encode_utf16().cmp(y.encode_utf16()),
                        "{x:?} {y:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn parses_what_serde_json_parses_and_refuses_what_i_json_does() {
        let text = br#"{"b":[1,-2,3.5,"x\u0000y",null,true],"a":{"\u20ac":{}},"c":-0.0}"#;
        let value = serde_json::from_slice::<Value>(text).unwrap_or_default();
        assert_eq!(canonical_i_json(text), Some(to_vec(&value)));
        for refused in [
            &br#"{"a":1,"a":1}"#[..],
            br#"{"a":1,"\u0061":2}"#,
            br#"[{"x":{"y":1,"z":0,"y":2}}]"#,
            b"9007199254740992",
            b"-9007199254740993",
            b"1e300",
            b"{not json",
            b"",
        ] {
            assert_eq!(
                canonical_i_json(refused),
                None,
                "{}",
                String::from_utf8_lossy(refused)
            );
        }
        assert_eq!(
            canonical_i_json(b"9007199254740991").as_deref(),
            Some(&b"9007199254740991"[..])
        );
    }

    /// The doubles are parsed exactly (serde_json's `float_roundtrip`, which idem-core asks for
    /// itself): serde_json's fast parse reads these one bit off, and the canonical form would
    /// then name another number.
    #[test]
    fn doubles_are_parsed_exactly() {
        for text in ["172.65573157332975", "1.1e-30", "0.1", "19.99"] {
            assert_eq!(
                canonical_i_json(text.as_bytes()).as_deref(),
                Some(text.as_bytes()),
                "{text}"
            );
        }
        assert_eq!(
            canonical_i_json(br#"{"amount":172.65573157332975}"#).as_deref(),
            Some(&br#"{"amount":172.65573157332975}"#[..])
        );
    }
}
