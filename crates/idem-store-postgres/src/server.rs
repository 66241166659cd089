//! What the server is, read once at connect on a connection of its own, before the pools
//! open: whether a pooler stands in between (it refuses or drops the startup options that
//! carry idem's settings), and whether the server can lose a claim it acknowledged.
//!
//! An idempotency store that loses an acknowledged claim runs the side effect twice, so the
//! store says so before it happens ([design §6](docs/design.md#6-a-store-failure-fails-closed)),
//! as the Redis store does: a shortfall is refused, naming the setting to change, unless the
//! URL says `durability=volatile`.

use idem_core::{FencingToken, StoreError};
use tokio_postgres::NoTls;

use crate::inner::{Lane, Settings};
use crate::options::{Durability, PgOptions, Pooler};
use crate::sql::{unavailable, unavailable_because};

/// What the probe found.
pub(crate) struct Probe {
    /// A pooler stands in between: settings per transaction, unnamed statements.
    pub(crate) pooled: bool,
    /// What can lose an acknowledged claim; empty when nothing can, and non-empty only under
    /// `durability=volatile`.
    pub(crate) warnings: Vec<String>,
}

/// The server's answers that decide durability.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Durable {
    pub(crate) fsync: String,
    pub(crate) synchronous_standby_names: String,
    /// Streaming replicas attached to this server (`pg_stat_replication`).
    pub(crate) replicas: i64,
    /// Hosts the URL names: more than one means a standby is expected to take over.
    pub(crate) hosts: usize,
}

/// Connects once, decides the route and reads the durability settings; refuses a server that
/// can lose an acknowledged claim unless `opts.durability` accepts it.
pub(crate) async fn probe(opts: &PgOptions) -> Result<Probe, StoreError> {
    let settings = Settings::of(opts);
    let (client, pooled) = match opts.pooler {
        Pooler::Transaction => (open(&opts.config).await?, true),
        Pooler::Detect | Pooler::None => {
            let nonce = FencingToken::random().to_string();
            match open(&with_probe(
                settings.startup(&opts.config, Lane::Claim),
                &nonce,
            ))
            .await
            {
                Ok(client) => {
                    // A pooler told to ignore startup options (PgBouncer's
                    // `ignore_startup_parameters = options`) drops them silently: the
                    // claims would run without `synchronous_commit=on`.
                    if applied(&client, &nonce).await? {
                        (client, false)
                    } else if opts.pooler == Pooler::None {
                        return Err(no_options(
                            "the server ignored the startup options that carry idem's settings (a pooler's ignore_startup_parameters?)",
                        ));
                    } else {
                        tracing::info!(
                            "postgres: the startup options were dropped (a connection pooler?): \
                             running with per-transaction settings and unnamed statements, as \
                             pooler=transaction does"
                        );
                        (client, true)
                    }
                }
                Err(e) if refused_options(&e) => {
                    if opts.pooler == Pooler::None {
                        return Err(no_options(&e.to_string()));
                    }
                    tracing::info!(
                        "postgres: the server refused startup options (a connection pooler: \
                         {e}): running with per-transaction settings and unnamed statements, as \
                         pooler=transaction does"
                    );
                    (open(&opts.config).await?, true)
                }
                Err(e) => return Err(e),
            }
        }
    };
    let found = read_durability(&client, opts.config.get_hosts().len()).await?;
    let warnings = shortfalls(&found);
    if !warnings.is_empty() && opts.durability == Durability::Required {
        return Err(refusal(&warnings));
    }
    for w in &warnings {
        tracing::warn!("postgres store (durability=volatile): {w}");
    }
    Ok(Probe { pooled, warnings })
}

/// One connection, its driver on the runtime, closed when the client is dropped.
async fn open(config: &tokio_postgres::Config) -> Result<tokio_postgres::Client, StoreError> {
    let (client, connection) = config
        .connect(NoTls)
        .await
        .map_err(|e| unavailable("connect", e))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// Whether `e` is a pooler refusing the `options` startup parameter (PgBouncer: "unsupported
/// startup parameter: options").
fn refused_options(e: &StoreError) -> bool {
    e.to_string().contains("unsupported startup parameter")
}

fn no_options(why: &str) -> StoreError {
    unavailable_because(
        "connect",
        format!(
            "{why}; the URL says pooler=none. Behind a connection pooler (PgBouncer), say \
             pooler=transaction, or leave pooler out to detect it"
        ),
    )
}

/// The probe's name for the random value it sends among the startup options.
const PROBE_SETTING: &str = "idem.probe";

/// `config` with one more startup option, [`PROBE_SETTING`] set to `nonce`: a setting no
/// server, role or database has of its own, so the probe can tell whether the options
/// arrived. (Comparing one of idem's own settings would not do: a role whose
/// `lock_timeout` already equals idem's made a pooler that drops the options look like a
/// direct connection.)
fn with_probe(mut config: tokio_postgres::Config, nonce: &str) -> tokio_postgres::Config {
    let options = format!(
        "{} -c {PROBE_SETTING}={nonce}",
        config.get_options().unwrap_or_default()
    );
    config.options(options.trim_start());
    config
}

/// Whether the connection's startup options arrived: it has the probe's `nonce`.
async fn applied(client: &tokio_postgres::Client, nonce: &str) -> Result<bool, StoreError> {
    let rows = client
        .simple_query(&format!("SELECT current_setting('{PROBE_SETTING}', true)"))
        .await
        .map_err(|e| unavailable("read settings", e))?;
    let setting = rows.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
        _ => None,
    });
    Ok(setting.as_deref() == Some(nonce))
}

async fn read_durability(
    client: &tokio_postgres::Client,
    hosts: usize,
) -> Result<Durable, StoreError> {
    // Simple protocol: an unnamed statement, nothing left on a pooled server connection.
    let rows = client
        .simple_query(
            "SELECT current_setting('fsync'), current_setting('synchronous_standby_names'), \
             (SELECT count(*) FROM pg_stat_replication)",
        )
        .await
        .map_err(|e| unavailable("read durability settings", e))?;
    let row = rows
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(r),
            _ => None,
        })
        .ok_or_else(|| unavailable_because("read durability settings", "no row"))?;
    let text = |i: usize| row.get(i).unwrap_or_default().to_owned();
    Ok(Durable {
        fsync: text(0),
        synchronous_standby_names: text(1),
        replicas: text(2).parse().unwrap_or(0),
        hosts,
    })
}

/// What in `d` can lose a claim the server acknowledged, each naming the setting to change.
/// A claim commits with `synchronous_commit=on` whatever the server's default (idem sets
/// it), so that setting is not read: with a synchronous standby named, `on` waits for the
/// standby to flush the claim, which a promotion then replays.
pub(crate) fn shortfalls(d: &Durable) -> Vec<String> {
    let mut out = Vec::new();
    if d.fsync != "on" {
        out.push(format!(
            "fsync is {}: a crash of the server's machine can lose claims it acknowledged, \
             and their retries run again (set fsync = on)",
            d.fsync
        ));
    }
    if d.synchronous_standby_names.trim().is_empty() && (d.hosts > 1 || d.replicas > 0) {
        let why = if d.hosts > 1 {
            format!(
                "the URL names {} hosts, so a standby is expected to take over",
                d.hosts
            )
        } else {
            format!("{} streaming replica(s) are attached", d.replicas)
        };
        out.push(format!(
            "{why}, but synchronous_standby_names is empty: replication is asynchronous, a \
             standby promoted after the primary fails may lack the last claims the primary \
             acknowledged, and their retries run again (set synchronous_standby_names on the \
             primary, e.g. 'ANY 1 (*)', so that each claim's commit waits for a standby)"
        ));
    }
    out
}

/// The refusal of a server with shortfalls, unless the URL opts in.
fn refusal(shortfalls: &[String]) -> StoreError {
    StoreError::Unavailable(
        format!(
            "postgres: refused: this server can lose claims it acknowledged: {}. Change the \
             server's settings, or add durability=volatile to the store URL \
             (postgres://USER@HOST/DB?durability=volatile) to accept that a crash or a failover \
             may run a request twice",
            shortfalls.join("; ")
        )
        .into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn durable(fsync: &str, names: &str, replicas: i64, hosts: usize) -> Durable {
        Durable {
            fsync: fsync.into(),
            synchronous_standby_names: names.into(),
            replicas,
            hosts,
        }
    }

    #[test]
    fn a_lone_server_with_fsync_is_durable() {
        assert!(shortfalls(&durable("on", "", 0, 1)).is_empty());
        assert!(shortfalls(&durable("on", "ANY 1 (*)", 1, 2)).is_empty());
    }

    #[test]
    fn each_shortfall_names_its_setting() {
        let w = shortfalls(&durable("off", "", 0, 1));
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("fsync = on"), "{w:?}");
        let w = shortfalls(&durable("on", "", 0, 2));
        assert!(w[0].contains("2 hosts") && w[0].contains("synchronous_standby_names"));
        let w = shortfalls(&durable("on", " ", 1, 1));
        assert!(w[0].contains("1 streaming replica"), "{w:?}");
        let e = refusal(&w).to_string();
        assert!(e.contains("durability=volatile"), "{e}");
    }
}
