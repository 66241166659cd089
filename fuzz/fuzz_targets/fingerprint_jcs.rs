#![no_main]
//! Fuzzes `idem_fuzz::fingerprint_jcs`; see `fuzz/src/lib.rs` for what it checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| idem_fuzz::fingerprint_jcs(data));
