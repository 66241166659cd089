//! `idem key` prints the same key as the published vectors, and refuses what JCS cannot carry.

use std::process::Command;

fn idem_key(args: &[&str]) -> (bool, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_idem"))
        .arg("key")
        .args(args)
        .env("IDEM_TEST_SECRET", "server-side secret")
        .output()
        .expect("run idem key");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn prints_the_vector_keys() {
    let base = ["--scope", "turn_9f3a", "--tool", "charge_card"];
    let args = r#"{"customer":"cus_8g2k","amount_cents":4900}"#;
    let (ok, out, err) = idem_key(&[&base[..], &["--args", args]].concat());
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "turn_9f3a-charge_card-dmg4hof5wdajf4ppiwf4n53dsjb5peby"
    );
    // The HMAC vector, with the secret from the environment; and the ordinal.
    let vectors: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/key-vectors.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let want = |name: &str| {
        vectors["vectors"]
            .as_array()
            .and_then(|vs| vs.iter().find(|v| v["name"] == name))
            .and_then(|v| v["key"].as_str())
            .unwrap_or_else(|| panic!("vector {name}"))
            .to_owned()
    };
    let (_, out, _) = idem_key(
        &[
            &base[..],
            &["--args", args, "--secret-env", "IDEM_TEST_SECRET"],
        ]
        .concat(),
    );
    assert_eq!(out, want("HMAC with a secret"));
    let (_, out, _) = idem_key(&[&base[..], &["--args", args, "--ordinal", "1"]].concat());
    assert_eq!(out, want("ordinal 1 is another intent"));
    // From a file.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("args.json");
    std::fs::write(&file, args).unwrap();
    let at = format!("@{}", file.display());
    let (_, out, _) = idem_key(&[&base[..], &["--args", &at]].concat());
    assert_eq!(
        out,
        "turn_9f3a-charge_card-dmg4hof5wdajf4ppiwf4n53dsjb5peby"
    );
}

#[test]
fn refuses_with_a_reason() {
    let base = ["--scope", "s", "--tool", "t"];
    for (args, want) in [
        (vec!["--args", r#"{"id":9007199254740993}"#], "beyond 2^53"),
        (vec!["--args", "{not json"], "args are not JSON"),
        (
            vec!["--args", "@/nonexistent/args.json"],
            "cannot read --args file",
        ),
        (
            vec!["--args", "{}", "--secret-env", "IDEM_NO_SUCH_VAR"],
            "is not set",
        ),
        (
            vec!["--args", "{}", "--ordinal", "9007199254740993"],
            "--ordinal",
        ),
    ] {
        let (ok, _, err) = idem_key(&[&base[..], &args].concat());
        assert!(!ok, "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: {want:?} not in {err}");
    }
    let (ok, _, err) = idem_key(&["--scope", "", "--tool", "t", "--args", "{}"]);
    assert!(
        !ok && err.contains("scope must be a non-empty string"),
        "{err}"
    );
}
