#![no_main]
//! Fuzzes `idem_fuzz::mcp_jsonrpc`; see `fuzz/src/lib.rs` for what it checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| idem_fuzz::mcp_jsonrpc(data));
