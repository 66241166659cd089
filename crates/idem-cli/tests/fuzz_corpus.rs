//! The fuzz corpus as a regression test: every input under `fuzz/corpus/TARGET/` goes through
//! the check its fuzz target runs (`fuzz/src/lib.rs`), on stable Rust, without libFuzzer. An
//! input that once crashed a parser is kept there, so the crash cannot come back unseen.
//! Fuzzing itself is `cargo fuzz run TARGET` (docs/fuzzing.md).

#[path = "../../../fuzz/src/lib.rs"]
mod checks;

use std::path::Path;

#[test]
fn every_corpus_input_passes_its_targets_check() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    for (target, check) in checks::TARGETS {
        let dir = root.join(target);
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let mut inputs = 0;
        for entry in entries {
            let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
            let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let outcome = std::panic::catch_unwind(|| check(&data));
            assert!(
                outcome.is_ok(),
                "{target}: {} fails its check",
                path.display()
            );
            inputs += 1;
        }
        assert!(inputs > 0, "{target}: no corpus in {}", dir.display());
    }
}
