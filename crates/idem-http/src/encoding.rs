//! A request body as the fingerprint reads it: decoded from its `Content-Encoding`
//! ([design §1](docs/design.md#1-words)).
//!
//! The same JSON compressed twice is not the same bytes: a gzip member stamps the time it was
//! made (Python's `gzip.compress()` does, every call), and another compression level or
//! library writes other bytes again. A client that compresses each attempt would have every
//! retry refused as `key-reused`, so the fingerprint covers what the body says, not how it
//! was packed: `gzip` (and `x-gzip`), `deflate` (zlib, and the raw deflate some clients send
//! under that name) and `br` are decoded, in the reverse of the order they were applied.
//!
//! Decoding is bounded: at most `max` bytes come out (the route's `max_body_bytes`), so a
//! small body that inflates to gigabytes costs no more than a body at the bound. A body that
//! cannot be decoded (another coding, corrupt, or over the bound decoded) is fingerprinted as
//! its bytes, as before: never refused for that alone. The handler is always given the bytes
//! as they came.

use std::borrow::Cow;
use std::io::Read;

/// `body` decoded from the codings `encoding` (a `Content-Encoding` value) names, or `body`
/// itself when there are none to undo or they cannot be undone within `max` bytes.
pub fn decoded<'a>(encoding: Option<&str>, body: &'a [u8], max: usize) -> Cow<'a, [u8]> {
    let Some(encoding) = encoding else {
        return Cow::Borrowed(body);
    };
    let codings: Vec<String> = encoding
        .split(',')
        .map(|c| c.trim().to_ascii_lowercase())
        .filter(|c| !c.is_empty() && c != "identity")
        .collect();
    if codings.is_empty() || body.is_empty() {
        return Cow::Borrowed(body);
    }
    let mut current: Cow<'a, [u8]> = Cow::Borrowed(body);
    for coding in codings.iter().rev() {
        match decode_one(coding, &current, max) {
            Some(next) => current = Cow::Owned(next),
            None => return Cow::Borrowed(body),
        }
    }
    current
}

/// One coding undone, or `None` (unknown, corrupt, or more than `max` bytes decoded).
fn decode_one(coding: &str, data: &[u8], max: usize) -> Option<Vec<u8>> {
    match coding {
        "gzip" | "x-gzip" => bounded(flate2::read::MultiGzDecoder::new(data), max),
        // RFC 9110 §8.4.1.2 says zlib; some clients send raw deflate under the name.
        "deflate" => bounded(flate2::read::ZlibDecoder::new(data), max)
            .or_else(|| bounded(flate2::read::DeflateDecoder::new(data), max)),
        "br" => bounded(brotli_decompressor::Decompressor::new(data, 4096), max),
        _ => None,
    }
}

/// All of `reader`, if it ends cleanly within `max` bytes.
fn bounded(reader: impl Read, max: usize) -> Option<Vec<u8>> {
    let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    let mut out = Vec::new();
    reader.take(limit).read_to_end(&mut out).ok()?;
    (out.len() <= max).then_some(out)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    const JSON: &[u8] = br#"{"customer":"cus_1","amount_cents":4900}"#;

    fn gzip(data: &[u8], mtime: u32) -> Vec<u8> {
        let mut e = flate2::GzBuilder::new()
            .mtime(mtime)
            .write(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn a_body_compressed_again_reads_the_same() {
        let (one, two) = (gzip(JSON, 1), gzip(JSON, 2));
        assert_ne!(one, two, "gzip stamps its time");
        assert_eq!(decoded(Some("gzip"), &one, 1 << 16), JSON);
        assert_eq!(decoded(Some("x-gzip"), &two, 1 << 16), JSON);
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        z.write_all(JSON).unwrap();
        assert_eq!(
            decoded(Some("deflate"), &z.finish().unwrap(), 1 << 16),
            JSON
        );
        let mut raw = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
        raw.write_all(JSON).unwrap();
        assert_eq!(
            decoded(Some("Deflate"), &raw.finish().unwrap(), 1 << 16),
            JSON
        );
        // Two codings, undone in reverse: gzip applied first, then gzip again.
        let twice = gzip(&gzip(JSON, 3), 4);
        assert_eq!(decoded(Some("gzip, gzip"), &twice, 1 << 16), JSON);
    }

    #[test]
    fn brotli_is_decoded() {
        // `{"a":1}` compressed by brotli at quality 11.
        let br = [
            0x0b, 0x03, 0x80, 0x7b, 0x22, 0x61, 0x22, 0x3a, 0x31, 0x7d, 0x03,
        ];
        assert_eq!(decoded(Some("br"), &br, 1 << 16), br#"{"a":1}"#.as_slice());
    }

    #[test]
    fn what_cannot_be_decoded_stays_as_it_came() {
        for (coding, body) in [
            (Some("gzip"), b"not gzip".as_slice()),
            (Some("br"), b"\xff\xff\xff"),
            (Some("compress"), b"anything"),
            (Some("identity"), JSON),
            (None, JSON),
        ] {
            assert_eq!(decoded(coding, body, 1 << 16), body, "{coding:?}");
        }
        // A truncated member is corrupt.
        let whole = gzip(JSON, 1);
        let cut = &whole[..whole.len() - 4];
        assert_eq!(decoded(Some("gzip"), cut, 1 << 16), cut);
    }

    proptest::proptest! {
        /// One body, one reading, however it was packed; two bodies, two readings.
        #[test]
        fn a_body_reads_the_same_packed_any_way(
            a in proptest::collection::vec(proptest::num::u8::ANY, 1..512),
            b in proptest::collection::vec(proptest::num::u8::ANY, 1..512),
            mtime in proptest::num::u32::ANY,
        ) {
            let once = decoded(Some("gzip"), &gzip(&a, mtime), 1 << 16).into_owned();
            proptest::prop_assert_eq!(&once, &a);
            let again = decoded(Some("gzip"), &gzip(&a, mtime.wrapping_add(1)), 1 << 16).into_owned();
            proptest::prop_assert_eq!(&again, &a);
            let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
            z.write_all(&a).unwrap();
            let zlib = decoded(Some("deflate"), &z.finish().unwrap(), 1 << 16).into_owned();
            proptest::prop_assert_eq!(&zlib, &a);
            if a != b {
                let other = decoded(Some("gzip"), &gzip(&b, mtime), 1 << 16).into_owned();
                proptest::prop_assert_ne!(&other, &a);
            }
        }
    }

    #[test]
    fn decoding_stops_at_the_bound() {
        let bomb = gzip(&vec![b'0'; 1 << 20], 0);
        assert!(bomb.len() < 4096);
        assert_eq!(decoded(Some("gzip"), &bomb, 65536), bomb.as_slice());
        assert_eq!(decoded(Some("gzip"), &bomb, 1 << 20).len(), 1 << 20);
    }
}
