//! The schema, created and versioned on connect.
//!
//! Several gateways may start at once against an empty database: the migration runs in one
//! transaction under an advisory lock named after the schema, so exactly one creates the
//! tables and the others find them.

use idem_core::StoreError;
use tokio_postgres::types::Type;

use crate::sql::unavailable;

/// The schema version this build writes. A database at a newer version is refused: an older
/// idem must not misread records a newer one wrote.
pub const SCHEMA_VERSION: i32 = 1;

fn version_1(s: &str) -> String {
    // COLLATE "C": scopes and keys compare byte for byte, whatever the database's locale.
    // The expiry index holds completed records only: in-flight and abandoned ones never
    // expire, and leaving them out keeps a claim's insert to one index.
    format!(
        r#"CREATE TABLE {s}.records (
    scope            text COLLATE "C" NOT NULL,
    key              text COLLATE "C" NOT NULL,
    fingerprint      bytea  NOT NULL,
    token            bigint NOT NULL,
    created_at       bigint NOT NULL,
    acquired_at      bigint NOT NULL,
    lease_expires_at bigint NOT NULL,
    completed_at     bigint,
    completed_by     smallint,
    expires_at       bigint NOT NULL,
    retention_ms     bigint NOT NULL,
    attempts         bigint NOT NULL,
    replays          bigint NOT NULL,
    response         bytea,
    PRIMARY KEY (scope, key)
);
CREATE INDEX records_by_expiry ON {s}.records (expires_at) WHERE completed_at IS NOT NULL;
INSERT INTO {s}.schema_version (version) VALUES (1);"#
    )
}

/// The schema a store was told to find is not in the database: a store opened with
/// [`crate::PgOptions::create_schema`] false (an operator's command) refuses to make it. It
/// reaches the caller inside [`StoreError::Unavailable`], so a front end can recognise it
/// (with `downcast_ref`) and say which of its own flags to check.
#[derive(Debug, thiserror::Error)]
#[error("no idem schema {0:?} in this database (idem serve and idem migrate create it)")]
pub struct NoSchema(pub String);

/// Creates or checks the schema. `quoted` is the schema's quoted name. With `create` false
/// an absent schema is refused with [`NoSchema`] and nothing is created.
pub(crate) async fn migrate(
    client: &mut tokio_postgres::Client,
    name: &str,
    quoted: &str,
    create: bool,
) -> Result<(), StoreError> {
    let tx = client
        .transaction()
        .await
        .map_err(|e| unavailable("begin migration", e))?;
    // Unnamed statements only (`*_typed`), here as everywhere: behind a transaction pooler
    // a named one could meet another client's of the same name on the server connection.
    tx.execute_typed(
        "SELECT pg_advisory_xact_lock(hashtext('idem schema ' || $1::text))",
        &[(&name, Type::TEXT)],
    )
    .await
    .map_err(|e| unavailable("lock for migration", e))?;
    if !create {
        let versions = format!("{quoted}.schema_version");
        let found: bool = tx
            .query_typed(
                "SELECT to_regclass($1::text) IS NOT NULL",
                &[(&versions, Type::TEXT)],
            )
            .await
            .map_err(|e| unavailable("look for the schema", e))?
            .first()
            .is_some_and(|row| row.get(0));
        if !found {
            return Err(StoreError::unavailable(NoSchema(name.to_owned())));
        }
    }
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {quoted};
         CREATE TABLE IF NOT EXISTS {quoted}.schema_version (version integer NOT NULL);"
    ))
    .await
    .map_err(|e| unavailable("create schema", e))?;
    let found: Option<i32> = tx
        .query_typed(
            &format!("SELECT max(version) FROM {quoted}.schema_version"),
            &[],
        )
        .await
        .map_err(|e| unavailable("read schema version", e))?
        .first()
        .and_then(|row| row.get(0));
    match found {
        None => tx
            .batch_execute(&version_1(quoted))
            .await
            .map_err(|e| unavailable("create tables", e))?,
        Some(SCHEMA_VERSION) => {}
        Some(v) => {
            return Err(StoreError::Unavailable(
                format!(
                    "postgres schema {name} is at version {v}; this idem knows up to \
                     {SCHEMA_VERSION}: upgrade idem"
                )
                .into(),
            ));
        }
    }
    tx.commit()
        .await
        .map_err(|e| unavailable("commit migration", e))
}
