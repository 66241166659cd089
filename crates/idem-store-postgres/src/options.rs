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
    /// Connections kept open. A claim holds one for one round trip.
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
}

/// The schema used unless the URL names another.
pub const DEFAULT_SCHEMA: &str = "idem";

/// Why a PostgreSQL URL was refused.
#[derive(Debug, thiserror::Error)]
pub enum PgUrlError {
    /// tokio-postgres refused the connection string.
    #[error("{0}")]
    Config(#[from] tokio_postgres::Error),
    /// The schema name is not a plain identifier.
    #[error(
        "schema {0:?} is not a plain identifier: use 1 to 63 of a-z, 0-9 and _, not starting with a digit or pg_"
    )]
    Schema(String),
}

impl PgOptions {
    /// Parses `postgres://...`, taking idem's `schema=NAME` query parameter out before
    /// tokio-postgres reads the rest.
    pub fn from_url(url: &str) -> Result<Self, PgUrlError> {
        let (rest, schema) = idem_core::store::take_url_param(url, "schema");
        let schema = schema.unwrap_or_else(|| DEFAULT_SCHEMA.to_owned());
        if !is_identifier(&schema) {
            return Err(PgUrlError::Schema(schema));
        }
        let mut config: tokio_postgres::Config = rest.parse()?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(5));
        }
        config.keepalives(true);
        config.application_name("idem");
        Ok(PgOptions {
            config,
            schema,
            pool_size: 16,
            batches_in_flight: 2,
            clock: None,
            op_timeout: Duration::from_secs(10),
        })
    }
}

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
    }
}
