//! How to reach the database, and the few choices a deployment makes.

use std::sync::Arc;
use std::time::Duration;

use idem_core::Clock;

/// How to open a [`crate::PgStore`].
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// The connection, as tokio-postgres parses it (URL or `key=value` form), without idem's
    /// own `schema` parameter.
    pub config: tokio_postgres::Config,
    /// The schema that holds idem's tables; created if absent. Each test uses its own.
    pub schema: String,
    /// Whether connecting creates the schema when it is absent: true (the default) for a
    /// gateway or a service; false for an operator's command, which must find the store it
    /// was pointed at ([`crate::NoSchema`]), since one it made would be empty and every
    /// answer about it wrong.
    pub create_schema: bool,
    /// Connections kept open in the store's first pool (the second, whose commits do not
    /// wait for the disk, has half as many), and the budget the handles of other runtimes
    /// take their own batchers' connections from ([`crate::PgStore`]'s `for_this_runtime`).
    /// A claim holds one for one round trip. `pool_size=N` in the URL.
    pub pool_size: usize,
    /// How many batched claim statements (and, apart, completion statements) run at once.
    /// Fewer means larger batches; two keep one filling while the other commits.
    pub batches_in_flight: usize,
    /// Where time comes from. `None` (the default) reads the database's clock in each
    /// statement, so gateways on hosts whose clocks drift apart still agree on when a lease
    /// ends. Tests inject a manual clock.
    pub clock: Option<Arc<dyn Clock>>,
    /// The bound on any one operation, connection included: past it the store is
    /// unavailable and the request fails closed, rather than hang on a dead server.
    pub op_timeout: Duration,
    /// Whether a connection pooler (PgBouncer) stands between idem and the server.
    pub pooler: Pooler,
    /// What to do with a server that can lose a claim it acknowledged.
    pub durability: Durability,
}

/// Whether a connection pooler stands between idem and PostgreSQL, from the URL's
/// `pooler=` parameter.
///
/// A pooler in transaction mode (PgBouncer's `pool_mode = transaction`) hands each
/// transaction to whichever server connection is free, so nothing may outlive a transaction:
/// a named prepared statement made in one is missing (or another client's) in the next, and a
/// session setting leaks to other clients. PgBouncer also refuses the startup parameter
/// (`options`) that carries idem's settings directly.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Pooler {
    /// No parameter: connect with the settings as startup options and cached prepared
    /// statements (the fastest path, one round trip per statement), and switch to
    /// [`Pooler::Transaction`] by itself when the server refuses startup options (PgBouncer
    /// says "unsupported startup parameter") or drops them (PgBouncer's
    /// `ignore_startup_parameters = options`), logging that it did.
    #[default]
    Detect,
    /// `pooler=none`: a direct connection; a server that refuses or drops the settings is an
    /// error rather than a reason to switch.
    None,
    /// `pooler=transaction`: every statement unnamed (parsed and planned where it runs), and
    /// every write in a transaction that sets its own settings with `SET LOCAL`. Works under
    /// transaction and session pooling alike, and on a direct connection.
    Transaction,
}

/// What [`crate::PgStore::connect`] does with a server that can lose an acknowledged claim
/// (and so let a retry run the effect again): `durability=required|volatile`, the words the
/// Redis store uses ([design §6](docs/design.md#6-a-store-failure-fails-closed)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Durability {
    /// Refuse it, naming the setting to change: `fsync` off, or a URL that names several
    /// hosts (it expects a standby to be promoted) or a server with streaming replicas while
    /// `synchronous_standby_names` is empty (a promoted standby may lack the last claims).
    #[default]
    Required,
    /// `durability=volatile`: the operator accepts that a crash or a failover may lose
    /// claims; each shortfall is logged as a warning and the store runs.
    Volatile,
}

/// Connections in the store's first pool unless the URL's `pool_size=` says otherwise.
pub const DEFAULT_POOL_SIZE: usize = 16;

/// The schema used unless the URL names another.
pub const DEFAULT_SCHEMA: &str = "idem";

/// Why a PostgreSQL URL was refused.
#[derive(Debug, thiserror::Error)]
pub enum PgUrlError {
    /// tokio-postgres refused the connection string. Shown with its cause (tokio-postgres's
    /// own message stops at "invalid connection string", which names neither the option nor
    /// the value) and, for an option neither idem nor tokio-postgres knows, the ones idem
    /// takes, since a misspelled `schema=` is the likely mistake.
    #[error("{}", config_refusal(.0))]
    Config(#[from] tokio_postgres::Error),
    /// The schema name is not a plain identifier.
    #[error(
        "schema {0:?} is not a plain identifier: use 1 to 63 of a-z, 0-9 and _, not starting with a digit or pg_"
    )]
    Schema(String),
    /// `pooler=` is not one of its values.
    #[error("pooler={0} is not none or transaction")]
    Pooler(String),
    /// `durability=` is neither `required` nor `volatile`.
    #[error("durability={0} is not required or volatile")]
    Durability(String),
    /// `pool_size=` is not a whole number from 1 to [`MAX_POOL_SIZE`].
    #[error("pool_size={0} is not a whole number from 1 to {MAX_POOL_SIZE}")]
    PoolSize(String),
}

/// idem's own parameters in a PostgreSQL URL, as a refusal names them.
const IDEM_PARAMETERS: &str = "schema=, pooler=, durability= and pool_size=";

/// tokio-postgres's refusal with its cause, which its `Display` leaves out.
fn config_refusal(e: &tokio_postgres::Error) -> String {
    use std::error::Error as _;
    match e.source() {
        Some(cause) if cause.to_string().starts_with("unknown option") => format!(
            "{e}: {cause}; idem takes {IDEM_PARAMETERS}, and the rest as libpq's connection parameters"
        ),
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

/// The most connections `pool_size=` may ask for: PostgreSQL's own default
/// `max_connections` is 100, and a pool larger than the server allows fails under load.
pub const MAX_POOL_SIZE: usize = 1000;

impl PgOptions {
    /// Parses `postgres://...`, taking idem's `schema=NAME`, `pooler=none|transaction`,
    /// `durability=required|volatile` and `pool_size=N` query parameters out before
    /// tokio-postgres reads the rest.
    pub fn from_url(url: &str) -> Result<Self, PgUrlError> {
        let (rest, pooler) = idem_core::store::take_url_param(url, "pooler");
        let pooler = match pooler.as_deref() {
            None => Pooler::Detect,
            Some("none") => Pooler::None,
            Some("transaction") => Pooler::Transaction,
            Some(other) => return Err(PgUrlError::Pooler(other.to_owned())),
        };
        let (rest, durability) = idem_core::store::take_url_param(&rest, "durability");
        let durability = match durability.as_deref() {
            None | Some("required") => Durability::Required,
            Some("volatile") => Durability::Volatile,
            Some(other) => return Err(PgUrlError::Durability(other.to_owned())),
        };
        let (rest, pool_size) = idem_core::store::take_url_param(&rest, "pool_size");
        let pool_size = match pool_size {
            None => DEFAULT_POOL_SIZE,
            Some(n) => match n.parse::<usize>() {
                Ok(n) if (1..=MAX_POOL_SIZE).contains(&n) => n,
                _ => return Err(PgUrlError::PoolSize(n)),
            },
        };
        let (rest, schema) = idem_core::store::take_url_param(&rest, "schema");
        let schema = schema.unwrap_or_else(|| DEFAULT_SCHEMA.to_owned());
        if !is_identifier(&schema) {
            return Err(PgUrlError::Schema(schema));
        }
        let mut config: tokio_postgres::Config = rest.parse()?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(5));
        }
        keep_alive(&mut config);
        config.application_name("idem");
        Ok(PgOptions {
            config,
            schema,
            create_schema: true,
            pool_size,
            batches_in_flight: 2,
            clock: None,
            op_timeout: Duration::from_secs(10),
            pooler,
            durability,
        })
    }
}

/// TCP keepalive probing sooner than the kernel's two idle hours (tokio-postgres's
/// default): a pooled connection that went silent while idle (its peer gone without a word,
/// a NAT or a firewall that forgot it) is found dead within [`KEEPALIVE_IDLE`] plus
/// [`KEEPALIVE_RETRIES`] probes [`KEEPALIVE_INTERVAL`] apart, and the pool drops it before
/// handing it out, rather than the next operation on it waiting out its bound. Read from the
/// parsed connection string, so the URL and the `key=value` forms, percent-encoded or not,
/// count alike: what it sets (`keepalives=0`, `keepalives_interval`, `keepalives_retries`)
/// is kept, and so is `keepalives_idle` unless it is tokio-postgres's own default, two
/// hours, which reads as unset.
fn keep_alive(config: &mut tokio_postgres::Config) {
    if config.get_keepalives_idle() == TOKIO_POSTGRES_KEEPALIVE_IDLE {
        config.keepalives_idle(KEEPALIVE_IDLE);
    }
    if config.get_keepalives_interval().is_none() {
        config.keepalives_interval(KEEPALIVE_INTERVAL);
    }
    if config.get_keepalives_retries().is_none() {
        config.keepalives_retries(KEEPALIVE_RETRIES);
    }
}

/// tokio-postgres's idle time before the first probe when none is set.
const TOKIO_POSTGRES_KEEPALIVE_IDLE: Duration = Duration::from_secs(2 * 60 * 60);

/// Idle time before a connection's first keepalive probe, unless the URL says otherwise.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// Time between keepalive probes, unless the URL says otherwise.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Unanswered probes after which the kernel drops a connection, unless the URL says
/// otherwise: a silent idle connection is gone within a minute.
pub const KEEPALIVE_RETRIES: u32 = 3;

/// A lower-case SQL identifier that needs no quoting rules beyond double quotes.
pub(crate) fn is_identifier(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && !b[0].is_ascii_digit()
        && !s.starts_with("pg_")
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_comes_out_of_the_url() {
        let o = PgOptions::from_url("postgres://u@127.0.0.1:5432/test?schema=t_1&sslmode=disable")
            .expect("parses");
        assert_eq!(o.schema, "t_1");
        assert_eq!(o.config.get_dbname(), Some("test"));
        let o = PgOptions::from_url("postgres://u@127.0.0.1/test").expect("parses");
        assert_eq!(o.schema, DEFAULT_SCHEMA);
    }

    #[test]
    fn refuses_bad_schemas_and_urls() {
        for bad in ["Idem", "1x", "a-b", "", "pg_x", "x\"; drop table y; --"] {
            assert!(
                matches!(
                    PgOptions::from_url(&format!("postgres://h/db?schema={bad}")),
                    Err(PgUrlError::Schema(_))
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            PgOptions::from_url("postgres://h/db?nonsense=1"),
            Err(PgUrlError::Config(_))
        ));
        assert!(matches!(
            PgOptions::from_url("postgres://h/db?pooler=pgbouncer"),
            Err(PgUrlError::Pooler(_))
        ));
        assert!(matches!(
            PgOptions::from_url("postgres://h/db?durability=maybe"),
            Err(PgUrlError::Durability(_))
        ));
    }

    #[test]
    fn a_refused_connection_string_names_what_was_refused() {
        let refusal = |url: &str| match PgOptions::from_url(url) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{url} parsed"),
        };
        let misspelled = refusal("postgres://u:secret@h/db?schem=other");
        assert!(
            misspelled.contains("unknown option `schem`"),
            "{misspelled}"
        );
        assert!(misspelled.contains("schema="), "{misspelled}");
        assert!(!misspelled.contains("secret"), "{misspelled}");
        let bad_port = refusal("postgres://h:port/db");
        assert!(bad_port.contains("`port`"), "{bad_port}");
        assert!(!bad_port.contains("idem takes"), "{bad_port}");
    }

    #[test]
    fn keepalive_probes_within_a_minute_unless_the_connection_string_says_otherwise() {
        for plain in ["postgres://u@h/db", "host=h user=u dbname=db"] {
            let c = PgOptions::from_url(plain).expect("parses").config;
            assert!(c.get_keepalives(), "{plain}");
            assert_eq!(c.get_keepalives_idle(), KEEPALIVE_IDLE, "{plain}");
            assert_eq!(c.get_keepalives_interval(), Some(KEEPALIVE_INTERVAL));
            assert_eq!(c.get_keepalives_retries(), Some(KEEPALIVE_RETRIES));
        }
        for set in [
            "postgres://u@h/db?keepalives_idle=600&keepalives_interval=75&keepalives_retries=9&schema=s",
            "postgres://u@h/db?keepalives%5Fidle=600&keepalives_interval=75&keepalives_retries=9",
            "host=h keepalives_idle=600 keepalives_interval=75 keepalives_retries=9",
        ] {
            let c = PgOptions::from_url(set).expect("parses").config;
            assert_eq!(c.get_keepalives_idle(), Duration::from_secs(600), "{set}");
            assert_eq!(c.get_keepalives_interval(), Some(Duration::from_secs(75)));
            assert_eq!(c.get_keepalives_retries(), Some(9));
        }
        for off in ["postgres://u@h/db?keepalives=0", "host=h keepalives=0"] {
            let c = PgOptions::from_url(off).expect("parses").config;
            assert!(!c.get_keepalives(), "{off}");
        }
    }

    #[test]
    fn pool_size_comes_out_of_the_url() {
        let o = PgOptions::from_url("postgres://u@h/db?pool_size=40&schema=s").expect("parses");
        assert_eq!((o.pool_size, o.schema.as_str()), (40, "s"));
        let o = PgOptions::from_url("postgres://u@h/db").expect("parses");
        assert_eq!(o.pool_size, DEFAULT_POOL_SIZE);
        for bad in ["0", "-1", "x", "", "1001", "4.5"] {
            let e = PgOptions::from_url(&format!("postgres://h/db?pool_size={bad}"));
            assert!(matches!(e, Err(PgUrlError::PoolSize(_))), "{bad}: {e:?}");
        }
    }

    #[test]
    fn pooler_and_durability_come_out_of_the_url() {
        let o = PgOptions::from_url("postgres://u@h:6432/test?pooler=transaction&schema=s")
            .expect("parses");
        assert_eq!(
            (o.pooler, o.durability),
            (Pooler::Transaction, Durability::Required)
        );
        let o = PgOptions::from_url(
            "postgres://u@a:5432,b:5433/test?target_session_attrs=read-write&durability=volatile",
        )
        .expect("parses");
        assert_eq!(
            (o.pooler, o.durability),
            (Pooler::Detect, Durability::Volatile)
        );
        assert_eq!(o.config.get_hosts().len(), 2);
        let o = PgOptions::from_url("postgres://u@h/test?pooler=none").expect("parses");
        assert_eq!(o.pooler, Pooler::None);
    }
}
