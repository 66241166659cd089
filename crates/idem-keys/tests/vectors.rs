//! Every vector of docs/key-vectors.json, read from the file, reproduced byte for byte.
//! Nothing here generates a vector: they come from the Python reference.

use serde_json::Value;

#[test]
fn every_vector_in_the_file() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/key-vectors.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["version"], idem_keys::VERSION);
    let vectors = doc["vectors"].as_array().expect("no vectors");
    assert!(vectors.len() >= 30, "only {} vectors", vectors.len());
    for v in vectors {
        let name = v["name"].as_str().unwrap_or_default();
        let s = |f: &str| {
            v[f].as_str()
                .unwrap_or_else(|| panic!("{name}: {f}"))
                .to_owned()
        };
        let ordinal = v["ordinal"]
            .as_u64()
            .unwrap_or_else(|| panic!("{name}: ordinal"));
        let secret = v["secret_hex"].as_str().map(|h| {
            (0..h.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
                .collect::<Vec<u8>>()
        });
        let result = idem_keys::parse_args(&s("args_json")).and_then(|args| {
            let canonical = idem_keys::canonical_bytes(&s("scope"), &s("tool"), &args, ordinal)?;
            let key =
                idem_keys::derive(&s("scope"), &s("tool"), &args, ordinal, secret.as_deref())?;
            Ok((canonical, key))
        });
        match (result, v.get("error").and_then(Value::as_str)) {
            (Ok((canonical, key)), None) => {
                assert_eq!(
                    String::from_utf8_lossy(&canonical),
                    s("canonical"),
                    "{name}: canonical"
                );
                assert_eq!(key.as_str(), s("key"), "{name}: key");
            }
            (Err(e), Some(want)) => assert!(e.to_string().contains(want), "{name}: {e}"),
            (Ok((_, key)), Some(want)) => panic!("{name}: expected an error ({want}), got {key}"),
            (Err(e), None) => panic!("{name}: unexpected error {e}"),
        }
    }
}
