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
    /// tokio-postgres refused the connection string. Its own message stops at "invalid
    /// connection string"; `detail` adds what can be said without showing any
    /// part of a password.
    #[error("{error}{}", detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
    Config {
        /// tokio-postgres's refusal.
        error: tokio_postgres::Error,
        /// The option it refused and what to write instead, when that is safe to show.
        detail: Option<String>,
    },
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
    /// Two `@` before the URL's path: a user name or password holding a raw `@`, which
    /// tokio-postgres would end at the first and then look up the rest as a host.
    #[error("a user name or password holds `@`: percent-encode it as %40")]
    UnencodedAt,
    /// One of idem's parameters given twice: the last would win quietly, and a `schema=`
    /// that is not the one meant puts the records beside another deployment's.
    #[error("{0}= is given twice; give it once")]
    Repeated(&'static str),
    /// `pool_size=` is not a whole number from 1 to [`MAX_POOL_SIZE`].
    #[error("pool_size={0} is not a whole number from 1 to {MAX_POOL_SIZE}")]
    PoolSize(String),
}

/// idem's own parameters in a PostgreSQL URL.
const IDEM_NAMES: [&str; 4] = ["schema", "pooler", "durability", "pool_size"];

/// What tokio-postgres's refusal of `url` can add to its bare "invalid connection string":
/// the option it did not know, or the one whose value it refused (never the value), and for
/// an unknown one the parameters idem takes, since a misspelled `schema=` is the likely
/// mistake.
///
/// Only for the URL form, and only when nothing in its query could be a password's: a
/// `key=value` string's tokens and a URL whose query holds an `@` (a raw `?` or `@` typed
/// into the password, which tokio-postgres then reads partly as the query) or a
/// `password=` (whose value a raw `&` would split into a second "option") get nothing.
fn refusal_detail(url: &str, url_form: bool, e: &tokio_postgres::Error) -> Option<String> {
    use std::error::Error as _;
    let query = url.split_once('?').map_or("", |(_, query)| query);
    if !url_form || query.contains("password=") {
        return None;
    }
    if query.contains('@') {
        return Some(
            "if the user name or password holds `?` or `@`, write them as %3F and %40".to_owned(),
        );
    }
    let cause = e.source()?.to_string();
    if let Some(name) = cause
        .strip_prefix("unknown option `")
        .and_then(|rest| rest.strip_suffix('`'))
    {
        return Some(if IDEM_NAMES.contains(&name) {
            format!(
                "{cause}: idem reads {name}= from the URL's query written plainly, not percent-encoded"
            )
        } else {
            let [schema, pooler, durability, pool_size] = IDEM_NAMES;
            format!(
                "{cause}; idem takes {schema}=, {pooler}=, {durability}= and {pool_size}=, and the rest as libpq's connection parameters"
            )
        });
    }
    cause
        .starts_with("invalid value for option `")
        .then_some(cause)
}

/// Whether `s` is the URL form (`postgres://` or `postgresql://`) rather than a libpq
/// `key=value` string, whose values may hold a `?` that is not a query's start.
fn is_url(s: &str) -> bool {
    ["postgres://", "postgresql://"].iter().any(|scheme| {
        s.get(..scheme.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(scheme))
    })
}

/// The most connections `pool_size=` may ask for: PostgreSQL's own default
/// `max_connections` is 100, and a pool larger than the server allows fails under load.
pub const MAX_POOL_SIZE: usize = 1000;

impl PgOptions {
    /// Parses `postgres://...`, taking idem's `schema=NAME`, `pooler=none|transaction`,
    /// `durability=required|volatile` and `pool_size=N` query parameters out before
    /// tokio-postgres reads the rest. A libpq `key=value` string is passed whole: idem's
    /// parameters are read from a URL's query only.
    pub fn from_url(url: &str) -> Result<Self, PgUrlError> {
        // idem's parameters live in a URL's query only; a `key=value` string is left whole.
        let url_form = is_url(url);
        let lowered;
        let url = if url_form {
            // tokio-postgres reads only a lower-case scheme; idem's URLs take any case.
            let (scheme, rest) = url.split_once("://").unwrap_or((url, ""));
            lowered = format!("{}://{rest}", scheme.to_ascii_lowercase());
            let before_path = rest
                .split_once('/')
                .map_or(rest, |(authority, _)| authority);
            if before_path.matches('@').count() > 1 {
                return Err(PgUrlError::UnencodedAt);
            }
            if let Some(name) = idem_core::store::repeated_url_param(rest, &IDEM_NAMES) {
                return Err(PgUrlError::Repeated(name));
            }
            lowered.as_str()
        } else {
            url
        };
        let take = |s: &str, name: &str| match url_form {
            true => idem_core::store::take_url_param(s, name),
            false => (s.to_owned(), None),
        };
        let (rest, pooler) = take(url, "pooler");
        let pooler = match pooler.as_deref() {
            None => Pooler::Detect,
            Some("none") => Pooler::None,
            Some("transaction") => Pooler::Transaction,
            Some(other) => return Err(PgUrlError::Pooler(other.to_owned())),
        };
        let (rest, durability) = take(&rest, "durability");
        let durability = match durability.as_deref() {
            None | Some("required") => Durability::Required,
            Some("volatile") => Durability::Volatile,
            Some(other) => return Err(PgUrlError::Durability(other.to_owned())),
        };
        let (rest, pool_size) = take(&rest, "pool_size");
        let pool_size = match pool_size {
            None => DEFAULT_POOL_SIZE,
            Some(n) => match n.parse::<usize>() {
                Ok(n) if (1..=MAX_POOL_SIZE).contains(&n) => n,
                _ => return Err(PgUrlError::PoolSize(n)),
            },
        };
        let (rest, schema) = take(&rest, "schema");
        let schema = schema.unwrap_or_else(|| DEFAULT_SCHEMA.to_owned());
        if !is_identifier(&schema) {
            return Err(PgUrlError::Schema(schema));
        }
        let mut config: tokio_postgres::Config = rest.parse().map_err(|error| {
            let detail = refusal_detail(&rest, url_form, &error);
            PgUrlError::Config { error, detail }
        })?;
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
            Err(PgUrlError::Config { .. })
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
        let encoded = refusal("postgres://h/db?sch%65ma=x");
        assert!(encoded.contains("not percent-encoded"), "{encoded}");
    }

    #[test]
    fn an_upper_case_scheme_reads_as_the_lower_case_one() {
        for url in ["POSTGRES://u@h/db?schema=s", "PostgreSQL://u@h/db?schema=s"] {
            let o = PgOptions::from_url(url).expect("parses");
            assert_eq!(
                (o.schema.as_str(), o.config.get_dbname()),
                ("s", Some("db")),
                "{url}"
            );
        }
    }

    #[test]
    fn a_raw_at_sign_or_a_repeated_parameter_is_refused() {
        for url in [
            "postgres://postgres:s3cr@t@127.0.0.1:5432/test",
            "postgres://us@r:pw@127.0.0.1:5432/test",
            "postgres://u:p@ss?k=v@127.0.0.1:5432/test",
        ] {
            match PgOptions::from_url(url) {
                Err(e @ PgUrlError::UnencodedAt) => assert!(!e.to_string().contains("s3cr")),
                other => panic!("{url}: {other:?}"),
            }
        }
        assert!(PgOptions::from_url("postgres://h/db?application_name=me@x&schema=s").is_ok());
        assert!(PgOptions::from_url("postgres://u:s3cr%40t@h/db").is_ok());
        for (url, name) in [
            ("postgres://h/db?schema=a&schema=b", "schema"),
            (
                "postgres://h/db?pool_size=4&schema=a&pool_size=8",
                "pool_size",
            ),
        ] {
            assert!(
                matches!(PgOptions::from_url(url), Err(PgUrlError::Repeated(n)) if n == name),
                "{url}"
            );
        }
    }

    /// A `key=value` string is left whole: a `?` in its password starts no query.
    #[test]
    fn a_key_value_string_keeps_its_password_whole() {
        for input in [
            "host=h password=pa?pool_size=Secret",
            "host=h password=pa?schema=x",
        ] {
            let o = PgOptions::from_url(input).expect("parses");
            assert_eq!(o.schema, DEFAULT_SCHEMA, "{input}");
            assert_eq!(o.pool_size, DEFAULT_POOL_SIZE, "{input}");
            let password = o.config.get_password().map(<[u8]>::to_vec);
            assert_eq!(
                password.as_deref(),
                input.strip_prefix("host=h password=").map(str::as_bytes)
            );
        }
    }

    /// Where tokio-postgres would read part of a password as the query, or a `key=value`
    /// string's tokens, the refusal names nothing.
    #[test]
    fn a_refusal_shows_no_part_of_a_password() {
        for (input, secret) in [
            ("postgres://u:pa?s3cr@127.0.0.1:5432/test?schema=x", "s3cr"),
            ("postgres://u:s3cret@h/db?password=hun&ter=2", "ter"),
            ("host=h dbname=test password=correct horse=battery", "horse"),
            ("host=h dbname=test password=correct horse battery", "`b`"),
            ("host=h password='correct'horse=1", "horse"),
        ] {
            match PgOptions::from_url(input) {
                Err(e) => {
                    let said = e.to_string();
                    assert!(!said.contains(secret), "{input}: {said}");
                    assert!(said.starts_with("invalid connection string"), "{said}");
                    if input.starts_with("postgres://u:pa?s3cr") {
                        assert!(said.contains("%3F"), "{said}");
                    }
                }
                Ok(_) => panic!("{input} parsed"),
            }
        }
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
