"""Reproduces every vector of docs/key-vectors.json byte for byte. Run: python3 -m unittest"""

import json
import pathlib
import unittest

import idem_key

VECTORS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "key-vectors.json"


class Vectors(unittest.TestCase):
    def test_every_vector(self):
        doc = json.loads(VECTORS.read_text(encoding="utf-8"))
        self.assertGreaterEqual(len(doc["vectors"]), 30)
        for v in doc["vectors"]:
            with self.subTest(v["name"]):
                secret = bytes.fromhex(v["secret_hex"]) if v.get("secret_hex") is not None else None
                try:
                    args = idem_key.loads_args(v["args_json"])
                    canonical = idem_key.canonical_bytes(v["scope"], v["tool"], args, v["ordinal"])
                    key = idem_key.derive(v["scope"], v["tool"], args, v["ordinal"], secret)
                except idem_key.DeriveError as e:
                    self.assertIn("error", v, f"unexpected error: {e}")
                    self.assertIn(v["error"], str(e))
                    continue
                self.assertNotIn("error", v, f"expected an error, got {key}")
                self.assertEqual(canonical.decode("utf-8", "surrogatepass"), v["canonical"])
                self.assertEqual(key, v["key"])


class Numbers(unittest.TestCase):
    def test_es_formatting(self):
        cases = {1.0: "1", -0.0: "0", 1e21: None, 1e20: None, 0.1: "0.1",
                 1e-7: "1e-7", 1.5e-7: "1.5e-7", 123.456: "123.456", 5e-324: "5e-324",
                 0.000001: "0.000001", 1e-6: "0.000001", 2.5e20: None, 123456789012.5: "123456789012.5",
                 333333333.33333329: "333333333.3333333", 4.5: "4.5", 0.002: "0.002", 1e-27: "1e-27",
                 1.7976931348623157e308: None}
        for x, want in cases.items():
            if want is None:
                with self.assertRaises(idem_key.DeriveError):
                    idem_key.canonical(x)
            else:
                self.assertEqual(idem_key.canonical(x), want, repr(x))

    def test_rfc8785_sorting_example(self):
        obj = {"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet With Dagesh",
               "1": "One", "\U0001f600": "Emoji: Grinning Face", "\u0080": "Control",
               "\u00f6": "Latin Small Letter O With Diaeresis"}
        keys = [k for k in json.loads(idem_key.canonical(obj))]
        self.assertEqual(keys, ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"])


if __name__ == "__main__":
    unittest.main()
