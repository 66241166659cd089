"""Writes docs/key-vectors.json from the inputs below, with this reference implementation.

The other implementations (Rust, JavaScript) are checked against the file; none of them
generates it. Run: python3 clients/python/make_vectors.py
"""

import json
import pathlib

import idem_key

S, T = "turn_9f3a", "charge_card"
INPUTS = [
    # name, scope, tool, args_json, ordinal, secret
    ("basic", S, T, '{"customer":"cus_8g2k","amount_cents":4900}', 0, None),
    ("member order does not matter", S, T, '{"amount_cents":4900,"customer":"cus_8g2k"}', 0, None),
    ("whitespace does not matter", S, T, ' { "customer" : "cus_8g2k" ,\n\t"amount_cents" : 4900 } ', 0, None),
    ("a changed value changes the key", S, T, '{"customer":"cus_8g2k","amount_cents":4901}', 0, None),
    ("ordinal 1 is another intent", S, T, '{"customer":"cus_8g2k","amount_cents":4900}', 1, None),
    ("ordinal at 2^53", S, T, '{}', 9007199254740992, None),
    ("idempotency_key member is removed", S, T, '{"customer":"cus_8g2k","amount_cents":4900,"idempotency_key":"anything"}', 0, None),
    ("idempotency_key removed only at the top", S, T, '{"nested":{"idempotency_key":"kept"}}', 0, None),
    ("empty args object", S, T, '{}', 0, None),
    ("args may be any JSON value", S, T, '[1,"two",null,true,false]', 0, None),
    ("args null", S, T, 'null', 0, None),
    ("nested objects and arrays sort inside", S, "send_email", '{"to":["b@x.test","a@x.test"],"meta":{"z":1,"a":{"y":[],"b":{}}}}', 0, None),
    ("RFC 8785 sorting example", S, T, '{"\\u20ac":"Euro Sign","\\r":"Carriage Return","\\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\\ud83d\\ude00":"Emoji: Grinning Face","\\u0080":"Control","\\u00f6":"Latin Small Letter O With Diaeresis"}', 0, None),
    ("RFC 8785 numbers", S, T, '{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001]}', 0, "error: 1e30 is integral"),
    ("RFC 8785 numbers without the big one", S, T, '{"numbers":[333333333.33333329,4.50,2e-3,0.000000000000000000000000001]}', 0, None),
    ("1.0 is 1", S, T, '{"n":1.0}', 0, None),
    ("1 is 1", S, T, '{"n":1}', 0, None),
    ("-0 is 0", S, T, '{"n":-0}', 0, None),
    ("5e-324, the smallest double", S, T, '{"n":5e-324}', 0, None),
    ("1e-7 switches to exponent form", S, T, '{"n":1e-7,"m":0.000001}', 0, None),
    ("2^53 is the largest integer", S, T, '{"n":9007199254740992,"m":-9007199254740992}', 0, None),
    ("2^53 + 1 is an error", S, T, '{"n":9007199254740993}', 0, "integer"),
    ("1e21 is an integer beyond 2^53", S, T, '{"n":1e21}', 0, "beyond 2^53"),
    ("a 64-bit id must be a string", S, T, '{"order_id":1850026147163422721}', 0, "beyond 2^53"),
    ("string escapes", S, T, '{"s":"quote \\" backslash \\\\ slash / tab \\t nl \\n cr \\r bs \\b ff \\f nul \\u0000 us \\u001f del \\u007f"}', 0, None),
    ("astral plane and combining characters", S, T, '{"s":"\\ud83d\\ude00 caf\\u00e9 cafe\\u0301 \\u2028"}', 0, None),
    ("non-ASCII member names", S, T, '{"\\u00e9":1,"e":2,"\\uff41":3,"z":4}', 0, None),
    ("unicode scope and tool are sanitised in the label", "tâche/42 ✓", "envoyer un e-mail", '{"to":"a@x.test"}', 0, None),
    ("long scope and tool labels are cut at 48", "s" * 300, "t" * 300, '{}', 0, None),
    ("a task id as scope (a re-delegated worker derives the same key)", "task_01HV6Z5N3M0QK8W2T7Y9R4C1XA", "provision_vm", '{"size":"m","region":"eu-west"}', 0, None),
    ("an order id as scope absorbs a human re-send", "order_17", T, '{"customer":"cus_8g2k","amount_cents":4900}', 0, None),
    ("HMAC with a secret", S, T, '{"customer":"cus_8g2k","amount_cents":4900}', 0, b"server-side secret"),
    ("HMAC with another secret", S, T, '{"customer":"cus_8g2k","amount_cents":4900}', 0, b"another secret"),
    ("HMAC with an empty secret", S, T, '{}', 0, b""),
    ("HMAC with a binary secret", S, T, '{}', 0, bytes(range(64))),
    ("deeply nested", S, T, '{"a":[[[[[{"b":[[]]}]]]]]}', 0, None),
    ("floats", S, T, '{"price":19.99,"ratio":0.3333333333333333,"neg":-1.5e-10}', 0, None),
    ("booleans and null", S, T, '{"t":true,"f":false,"n":null}', 0, None),
    ("a lone high surrogate is an error", S, T, '{"x":"\\ud800"}', 0, "lone surrogate"),
    ("a lone low surrogate is an error", S, T, '{"x":"\\udc00x"}', 0, "lone surrogate"),
    ("a lone surrogate in a member name is an error", S, T, '{"\\udbff":1}', 0, "lone surrogate"),
]


def main():
    vectors = []
    for name, scope, tool, args_json, ordinal, extra in INPUTS:
        secret = extra if isinstance(extra, bytes) else None
        v = {"name": name, "scope": scope, "tool": tool, "ordinal": ordinal, "args_json": args_json,
             "secret_hex": secret.hex() if secret is not None else None}
        try:
            args = idem_key.loads_args(args_json)
            v["canonical"] = idem_key.canonical_bytes(scope, tool, args, ordinal).decode("utf-8", "surrogatepass")
            v["key"] = idem_key.derive(scope, tool, args, ordinal, secret)
        except idem_key.DeriveError as e:
            v["error"] = "lone surrogate" if "lone surrogate" in str(e) else "beyond 2^53"
            assert v["error"] in str(e), (name, e)
        if isinstance(extra, str):
            assert "error" in v, name
        vectors.append(v)
    doc = {
        "version": idem_key.VERSION,
        "spec": "docs/key-derivation.md",
        "note": "args_json is parsed as JSON text; secret_hex is the HMAC key as hex, null for plain SHA-256; "
                "an entry with 'error' must be refused with a message containing that text.",
        "vectors": vectors,
    }
    out = pathlib.Path(__file__).resolve().parents[2] / "docs" / "key-vectors.json"
    out.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(vectors)} vectors to {out}")


if __name__ == "__main__":
    main()
