//! Where a record and its indexes live: the key names, and the shard each record belongs to.
//!
//! A store's records are spread over [`SHARDS`] shards. Each shard is one Redis Cluster hash
//! slot, named by the hash tag `{PREFIX.N}` in every key of the shard:
//!
//! ```text
//! PREFIX:{PREFIX.N}:r:<scope length>:<scope>:<key>   a record (a hash)
//! PREFIX:{PREFIX.N}:live                             records not completed, by lease end
//! PREFIX:{PREFIX.N}:expiry                           completed records, by retention's end
//! ```
//!
//! Why shards: every script must touch keys of one slot only (Redis Cluster runs a script on
//! one node), and a script that changes a record's state updates the indexes in the same
//! atomic step, so the indexes are never behind the records. One index for the whole store
//! would put every completion of every gateway on one key of one node (a hot spot) and could
//! not share a slot with the records. With a shard per slot, the indexes are spread like the
//! records, a listing reads this store's own indexes instead of scanning the server's whole
//! keyspace (other prefixes' and other applications' keys included), and a purge reads each
//! shard's due records. [`SHARDS`] is part of the stored layout: every gateway on a prefix
//! must agree on it, so it is a constant, not a setting.

use idem_core::{Key, Scope};

/// How many shards a store's records are spread over. 64 slots spread over the masters of a
/// cluster about evenly (the node owning the most holds a few more than its share); a
/// listing or purge visits each shard's two indexes, a pipelined read each.
pub(crate) const SHARDS: u16 = 64;

/// The shard of a record: FNV-1a over the scope and the key, so it is stable across versions,
/// processes and machines (Rust's own hasher is not).
pub(crate) fn shard_of(scope: &Scope, key: &Key) -> u16 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    let scope = scope.as_str().as_bytes();
    // The scope's length first: ("ab", "c") and ("a", "bc") land apart.
    for b in (scope.len() as u64)
        .to_le_bytes()
        .iter()
        .chain(scope)
        .chain(key.as_str().as_bytes())
    {
        h ^= u64::from(*b);
        h = h.wrapping_mul(PRIME);
    }
    (h % u64::from(SHARDS)) as u16
}

/// The names of one shard's keys.
#[derive(Debug, Clone)]
pub(crate) struct Shard {
    /// `PREFIX:{PREFIX.N}:`, which every key of the shard starts with.
    base: String,
    live: String,
    expiry: String,
}

impl Shard {
    fn new(prefix: &str, n: u16) -> Self {
        let base = format!("{prefix}:{{{prefix}.{n}}}:");
        Shard {
            live: format!("{base}live"),
            expiry: format!("{base}expiry"),
            base,
        }
    }

    /// `...:r:<scope length>:<scope>:<key>`: readable in redis-cli, and unambiguous although
    /// scopes and keys may hold colons (and braces: only the first `{...}`, the shard's, is
    /// the hash tag). Written piece by piece, not by `format!`: it is named on every call.
    pub(crate) fn record(&self, scope: &Scope, key: &Key) -> String {
        let (scope, key) = (scope.as_str(), key.as_str());
        let mut length = itoa::Buffer::new();
        let length = length.format(scope.len());
        let mut name =
            String::with_capacity(self.base.len() + 4 + length.len() + scope.len() + key.len());
        for part in [self.base.as_str(), "r:", length, ":", scope, ":", key] {
            name.push_str(part);
        }
        name
    }

    /// The shard's records that have no result yet (in flight or abandoned), scored by when
    /// their lease ends: those scored at or before now are abandoned.
    pub(crate) fn live(&self) -> &str {
        &self.live
    }

    /// The shard's completed records, scored by when their retention ends.
    pub(crate) fn expiry(&self) -> &str {
        &self.expiry
    }
}

/// Every shard of a store, named once when it connects rather than on every call (two
/// `format!`s a call, about 7,000 instructions of a Redis new key: docs/benchmarks.md).
#[derive(Debug)]
pub(crate) struct Shards(Vec<Shard>);

impl Shards {
    pub(crate) fn new(prefix: &str) -> Self {
        Shards((0..SHARDS).map(|n| Shard::new(prefix, n)).collect())
    }

    /// Every shard, in order: what a listing, a purge or a deletion visits.
    pub(crate) fn all(&self) -> &[Shard] {
        &self.0
    }

    /// The shard a record belongs to.
    pub(crate) fn of(&self, scope: &Scope, key: &Key) -> &Shard {
        &self.0[usize::from(shard_of(scope, key))]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sk(s: &str, k: &str) -> (Scope, Key) {
        (
            Scope::new(s.to_owned()).expect("scope"),
            Key::new(k.to_owned()).expect("key"),
        )
    }

    #[test]
    fn a_shards_keys_share_one_hash_tag() {
        let (s, k) = sk("team:{x}", "order-{1}");
        let shards = Shards::new("idem");
        let shard = shards.of(&s, &k);
        let tag = |name: &str| {
            let open = name.find('{').expect("a tag");
            let close = open + name[open..].find('}').expect("closed");
            name[open..=close].to_owned()
        };
        let record = shard.record(&s, &k);
        assert_eq!(tag(&record), tag(shard.live()));
        assert_eq!(tag(&record), tag(shard.expiry()));
        assert!(record.starts_with("idem:{idem."), "{record}");
        assert!(record.ends_with(":r:8:team:{x}:order-{1}"), "{record}");
    }

    #[test]
    fn shards_are_stable_and_spread() {
        // Pinned: a change here moves every stored record out of its gateways' sight.
        for (key, shard) in [("k1", 29), ("order-1", 17)] {
            let (s, k) = sk("anonymous", key);
            assert_eq!(shard_of(&s, &k), shard, "{key}");
        }
        let (a, b) = (sk("ab", "c"), sk("a", "bc"));
        assert_ne!(shard_of(&a.0, &a.1), shard_of(&b.0, &b.1));
        let mut counts = [0u32; SHARDS as usize];
        for i in 0..6400 {
            let (s, k) = sk("anonymous", &format!("order-{i}"));
            counts[usize::from(shard_of(&s, &k))] += 1;
        }
        let (min, max) = (counts.iter().min(), counts.iter().max());
        assert!(
            min >= Some(&60) && max <= Some(&140),
            "{min:?}..{max:?}: {counts:?}"
        );
    }
}
