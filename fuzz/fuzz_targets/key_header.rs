#![no_main]
//! Fuzzes `idem_fuzz::key_header`; see `fuzz/src/lib.rs` for what it checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| idem_fuzz::key_header(data));
