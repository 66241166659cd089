//! The shared conformance suite, run against [`MemoryStore`].

use std::sync::Arc;

use idem_conformance::{Harness, Unavailable};
use idem_core::{Clock, MemoryStore};

struct Memory;

impl Harness for Memory {
    type Store = MemoryStore;

    async fn open(&self, clock: Arc<dyn Clock>) -> Result<MemoryStore, Unavailable> {
        Ok(MemoryStore::with_clock(clock))
    }
}

idem_conformance::conformance_suite!(Memory);
