//! The statements, written once per schema, and rows read back into records.
//!
//! Every statement takes the time as its first parameter: a number from an injected clock,
//! or NULL to read the database's own clock, so all gateways agree on when a lease ends.

use idem_core::store::columns::{Columns, ListedColumns};
use idem_core::{Listed, Record, StoreError, Timestamp};
use tokio_postgres::Row;

/// The time inside a statement: `$1`, or the database's clock when it is NULL.
const NOW: &str =
    "SELECT COALESCE($1::bigint, (extract(epoch FROM clock_timestamp()) * 1000)::bigint) AS now";

/// A completed record's columns for the completion that wrote it: every column but the
/// response, which its caller holds already (sending it back and decoding it cost a new key
/// about 2,500 instructions in the gateway, and the server the bytes).
const WRITTEN_BUT_RESPONSE: &str = "r.scope, r.key, r.fingerprint, r.token, r.created_at, \
     r.acquired_at, r.lease_expires_at, r.completed_at, r.completed_by, r.expires_at, \
     r.retention_ms, r.attempts, r.replays, NULL::bytea AS response";

/// `now + ms`, saturating at the largest bigint ("never") instead of failing the statement.
fn plus(now: &str, ms: &str) -> String {
    format!(
        "(CASE WHEN {ms} > 9223372036854775807 - {now} THEN 9223372036854775807 ELSE {now} + {ms} END)"
    )
}

/// The statements over one schema.
#[derive(Debug)]
pub(crate) struct Sql {
    pub(crate) claim: String,
    pub(crate) complete: String,
    pub(crate) complete_one: String,
    pub(crate) release: String,
    pub(crate) release_many: String,
    pub(crate) extend: String,
    pub(crate) get: String,
    pub(crate) get_for_update: String,
    pub(crate) put: String,
    pub(crate) delete: String,
    pub(crate) purge: String,
    pub(crate) count_replays: String,
    pub(crate) list: String,
}

impl Sql {
    /// How many statements there are.
    pub(crate) const COUNT: usize = 13;

    /// Every statement's text, each at its own index. A statement left out of this list still
    /// runs, prepared through deadpool's cache by its text ([`crate::prepared`]).
    fn texts(&self) -> [&str; Self::COUNT] {
        [
            &self.claim,
            &self.complete,
            &self.complete_one,
            &self.release,
            &self.release_many,
            &self.extend,
            &self.get,
            &self.get_for_update,
            &self.put,
            &self.delete,
            &self.purge,
            &self.count_replays,
            &self.list,
        ]
    }

    /// Which of these statements `sql` is: the same text in the same place, not an equal
    /// one, so the answer costs a few comparisons of addresses, not of texts.
    pub(crate) fn index_of(&self, sql: &str) -> Option<usize> {
        self.texts()
            .iter()
            .position(|t| std::ptr::eq(t.as_ptr(), sql.as_ptr()) && t.len() == sql.len())
    }

    pub(crate) fn new(schema: &str) -> Self {
        let t = format!("{schema}.records");
        Sql {
            // One statement ([design §2](docs/design.md#2-the-records-life): the claim is atomic).
            // `cur` reads what is there in the statement's snapshot; the INSERT runs only when that
            // is absent, expired, or an abandoned record the retry policy may take over, so a
            // replay writes nothing. The unique index settles racing inserts, and ON CONFLICT
            // re-checks the takeover condition against the newest committed row. When a race leaves
            // the snapshot behind the row, the statement returns no row or a row whose state
            // says "acquire" without `acquired`, and the caller runs it again on a fresh
            // snapshot.
            // One statement for any number of claims (one request, or a batch of
            // concurrent ones; keys distinct, one abandoned policy: $7). `cur` reads what
            // is there in the statement's snapshot; the INSERT runs only for keys absent,
            // expired, or abandoned and taken over under the retry policy, so a replay
            // writes nothing. Rows go in key order so concurrent batches lock in one order
            // and cannot deadlock. The unique index settles racing inserts, and ON CONFLICT
            // re-checks the takeover condition against the newest committed row. When a
            // race leaves the snapshot behind a row, the statement returns no row for that
            // key, or a row whose state says "acquire" without `acquired`, and the caller
            // runs that claim again on a fresh snapshot.
            claim: format!(
                r#"WITH t AS ({NOW}),
q AS (SELECT * FROM unnest($2::text[], $3::text[], $4::bytea[], $5::bigint[], $6::bigint[])
      AS q(scope, key, fp, token, lease)),
cur AS (SELECT r.* FROM q CROSS JOIN LATERAL
        (SELECT * FROM {t} r WHERE r.scope = q.scope AND r.key = q.key LIMIT 1) r),
ins AS (
  INSERT INTO {t} AS r (scope, key, fingerprint, token, created_at, acquired_at, lease_expires_at,
      completed_at, completed_by, expires_at, retention_ms, attempts, replays, response)
  SELECT q.scope, q.key, q.fp, q.token, t.now, t.now, {lease}, NULL, NULL,
         9223372036854775807, $8, 1, 0, NULL
  FROM q, t
  WHERE NOT EXISTS (
    SELECT 1 FROM cur WHERE cur.scope = q.scope AND cur.key = q.key AND cur.expires_at > t.now
      AND NOT (cur.completed_at IS NULL AND cur.lease_expires_at <= t.now
               AND cur.fingerprint = q.fp AND $7::boolean))
  ORDER BY q.scope, q.key
  ON CONFLICT (scope, key) DO UPDATE SET
    fingerprint = excluded.fingerprint,
    token = excluded.token,
    created_at = CASE WHEN r.expires_at <= excluded.created_at
                      THEN excluded.created_at ELSE r.created_at END,
    acquired_at = excluded.acquired_at,
    lease_expires_at = excluded.lease_expires_at,
    completed_at = NULL,
    completed_by = NULL,
    response = NULL,
    expires_at = excluded.expires_at,
    retention_ms = excluded.retention_ms,
    attempts = CASE WHEN r.expires_at <= excluded.created_at
                    THEN 1 ELSE LEAST(r.attempts + 1, 4294967295) END,
    replays = CASE WHEN r.expires_at <= excluded.created_at THEN 0 ELSE r.replays END
  WHERE r.expires_at <= excluded.created_at
     OR (r.completed_at IS NULL AND r.lease_expires_at <= excluded.created_at
         AND r.fingerprint = excluded.fingerprint AND $7::boolean)
  RETURNING r.*
)
SELECT true AS acquired, t.now, ins.* FROM ins, t
UNION ALL
SELECT false, t.now, cur.* FROM cur, t
WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.scope = cur.scope AND ins.key = cur.key)"#,
                lease = plus("t.now", "q.lease"),
            ),
            // Fenced, like release and extend: only the lease's token changes an
            // uncompleted record. In-flight and abandoned records never expire, so no expiry
            // test is needed. Any number of completions (of distinct keys) in one statement.
            complete: format!(
                "WITH t AS ({NOW}), \
                 u AS (SELECT * FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bytea[]) \
                       AS u(scope, key, token, response)) \
                 UPDATE {t} r SET completed_at = t.now, completed_by = 0, \
                 expires_at = {exp}, response = u.response FROM t, u \
                 WHERE r.scope = u.scope AND r.key = u.key AND r.token = u.token \
                 AND r.completed_at IS NULL \
                 RETURNING t.now, {WRITTEN_BUT_RESPONSE}",
                exp = plus("t.now", "r.retention_ms"),
            ),
            // One completion, by primary key: in a service's transaction (which keeps
            // its cached plans) and for a completion that runs alone.
            complete_one: format!(
                "WITH t AS ({NOW}) UPDATE {t} r SET completed_at = t.now, completed_by = 0, \
                 expires_at = {exp}, response = $5 FROM t \
                 WHERE r.scope = $2 AND r.key = $3 AND r.token = $4 AND r.completed_at IS NULL \
                 RETURNING t.now, {WRITTEN_BUT_RESPONSE}",
                exp = plus("t.now", "r.retention_ms"),
            ),
            release: format!(
                "DELETE FROM {t} r WHERE r.scope = $1 AND r.key = $2 AND r.token = $3 \
                 AND r.completed_at IS NULL"
            ),
            // Fenced as `release` is, any number of keys: a batch's departed callers.
            release_many: format!(
                "DELETE FROM {t} r USING unnest($1::text[], $2::text[], $3::bigint[]) \
                 AS u(scope, key, token) \
                 WHERE r.scope = u.scope AND r.key = u.key AND r.token = u.token \
                 AND r.completed_at IS NULL"
            ),
            extend: format!(
                "WITH t AS ({NOW}) UPDATE {t} r SET lease_expires_at = {lease} FROM t \
                 WHERE r.scope = $2 AND r.key = $3 AND r.token = $4 AND r.completed_at IS NULL \
                 RETURNING r.lease_expires_at",
                lease = plus("t.now", "$5::bigint"),
            ),
            get: format!(
                "WITH t AS ({NOW}) SELECT t.now, r.* FROM t LEFT JOIN {t} r \
                 ON r.scope = $2 AND r.key = $3"
            ),
            get_for_update: format!(
                "WITH t AS ({NOW}) SELECT t.now, r.* FROM t LEFT JOIN LATERAL \
                 (SELECT * FROM {t} WHERE scope = $2 AND key = $3 FOR UPDATE) r ON true"
            ),
            put: format!(
                "UPDATE {t} SET fingerprint = $3, token = $4, created_at = $5, acquired_at = $6, \
                 lease_expires_at = $7, completed_at = $8, completed_by = $9, expires_at = $10, \
                 retention_ms = $11, attempts = $12, replays = $13, response = $14 \
                 WHERE scope = $1 AND key = $2"
            ),
            delete: format!("DELETE FROM {t} WHERE scope = $1 AND key = $2"),
            // SKIP LOCKED: gateways purging at once split the work instead of queueing.
            purge: format!(
                "WITH t AS ({NOW}), doomed AS ( \
                   SELECT r.scope, r.key FROM {t} r, t \
                   WHERE r.completed_at IS NOT NULL AND r.expires_at <= t.now \
                   ORDER BY r.expires_at LIMIT $2 FOR UPDATE OF r SKIP LOCKED) \
                 DELETE FROM {t} r USING doomed d WHERE r.scope = d.scope AND r.key = d.key"
            ),
            // An operator's listing (`ListRecords`): unexpired rows matching the prefixes
            // (`starts_with`, no LIKE wildcards) and the state rank ($4, NULL for any), in the
            // listing's order (abandoned, in flight, completed; newest first; then bytewise by
            // scope and key, hence COLLATE "C"). LEFT JOIN so the time comes back with no row.
            // Only the columns the listing shows: never a response body.
            list: format!(
                r#"WITH t AS ({NOW}) SELECT t.now, r.* FROM t LEFT JOIN LATERAL (
  SELECT x.scope, x.key, x.created_at, x.lease_expires_at, x.completed_at, x.expires_at,
    x.attempts, x.replays
  FROM {t} x WHERE x.expires_at > t.now
    AND starts_with(x.key, $2) AND starts_with(x.scope, $3)
    AND ($4::int IS NULL OR {rank} = $4::int)
  ORDER BY {rank}, x.created_at DESC, x.scope COLLATE "C", x.key COLLATE "C"
  LIMIT $5) r ON true"#,
                rank = "(CASE WHEN x.completed_at IS NOT NULL THEN 2 \
                         WHEN x.lease_expires_at > t.now THEN 1 ELSE 0 END)",
            ),
            count_replays: format!(
                "UPDATE {t} r SET replays = LEAST(r.replays + u.n, 4294967295) \
                 FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) \
                   AS u(scope, key, token, n) \
                 WHERE r.scope = u.scope AND r.key = u.key AND r.token = u.token"
            ),
        }
    }
}

/// The store is unusable: `e` with its causes, since tokio-postgres's own text for a
/// server error is only "db error".
pub(crate) fn unavailable(what: &str, e: impl std::error::Error) -> StoreError {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        // Wrappers often repeat their cause's text; say each thing once.
        let said = c.to_string();
        if !text.ends_with(&said) {
            text = format!("{text}: {said}");
        }
        cause = c.source();
    }
    unavailable_because(what, text)
}

pub(crate) fn unavailable_because(what: &str, why: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("postgres: {what}: {why}").into())
}

fn db(e: tokio_postgres::Error) -> StoreError {
    unavailable("read row", e)
}

/// The `now` column every statement returns.
pub(crate) fn now_of(row: &Row) -> Result<Timestamp, StoreError> {
    row.try_get::<_, i64>("now")
        .map(Timestamp::from_millis)
        .map_err(db)
}

/// The listed columns in `row` (the listing's statement), or `None` for a LEFT JOIN that
/// found nothing.
pub(crate) fn listed_of(row: &Row) -> Result<Option<Listed>, StoreError> {
    let Some(scope) = row.try_get::<_, Option<String>>("scope").map_err(db)? else {
        return Ok(None);
    };
    let columns = ListedColumns {
        scope,
        key: row.try_get("key").map_err(db)?,
        created_at: row.try_get("created_at").map_err(db)?,
        lease_expires_at: row.try_get("lease_expires_at").map_err(db)?,
        completed_at: row.try_get("completed_at").map_err(db)?,
        expires_at: row.try_get("expires_at").map_err(db)?,
        attempts: row.try_get("attempts").map_err(db)?,
        replays: row.try_get("replays").map_err(db)?,
    };
    columns.into_listed("postgres").map(Some)
}

/// The record in `row`, or `None` for a LEFT JOIN that found nothing.
pub(crate) fn record_of(row: &Row) -> Result<Option<Record>, StoreError> {
    let mut read = InOrder::new(row);
    let Some(scope) = read.next::<Option<String>>("scope")? else {
        return Ok(None);
    };
    let columns = Columns {
        scope,
        key: read.next("key")?,
        fingerprint: read.next("fingerprint")?,
        token: read.next("token")?,
        created_at: read.next("created_at")?,
        acquired_at: read.next("acquired_at")?,
        lease_expires_at: read.next("lease_expires_at")?,
        completed_at: read.next("completed_at")?,
        completed_by: read.next::<Option<i16>>("completed_by")?.map(i64::from),
        expires_at: read.next("expires_at")?,
        retention_ms: read.next("retention_ms")?,
        attempts: read.next("attempts")?,
        replays: read.next("replays")?,
        response: read.next("response")?,
    };
    columns.into_record("postgres").map(Some)
}

/// Reads a row's columns by name, asked for in the order the statements return them (the
/// table's, [`crate::schema`]): each name is compared first with the column after the last
/// one read, so a row in that order costs one comparison per column, where tokio-postgres's
/// lookup by name scans every column before it (~2,500 instructions per new key). A row in
/// another order is still read right, by that scan.
struct InOrder<'r> {
    row: &'r Row,
    next: usize,
}

impl<'r> InOrder<'r> {
    fn new(row: &'r Row) -> Self {
        InOrder { row, next: 0 }
    }

    fn next<'a, T: tokio_postgres::types::FromSql<'a>>(
        &mut self,
        name: &str,
    ) -> Result<T, StoreError>
    where
        'r: 'a,
    {
        let columns = self.row.columns();
        let at = match columns.get(self.next) {
            Some(c) if c.name() == name => self.next,
            _ => columns
                .iter()
                .position(|c| c.name() == name)
                .ok_or_else(|| {
                    unavailable_because("read row", format!("no column {name:?} in the row"))
                })?,
        };
        self.next = at + 1;
        self.row.try_get(at).map_err(db)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PG: &str = "127.0.0.1:5432";

    fn ok<T, E: std::fmt::Debug>(r: Result<T, E>) -> T {
        r.unwrap_or_else(|e| panic!("{e:?}"))
    }

    /// An in-flight record's columns, in the table's order, the bigints each different.
    const COLUMNS: [&str; 14] = [
        "'s'::text AS scope",
        "'k'::text AS key",
        "decode(repeat('01', 32), 'hex') AS fingerprint",
        "4::bigint AS token",
        "5::bigint AS created_at",
        "6::bigint AS acquired_at",
        "7::bigint AS lease_expires_at",
        "NULL::bigint AS completed_at",
        "NULL::smallint AS completed_by",
        "9223372036854775807::bigint AS expires_at",
        "11::bigint AS retention_ms",
        "12::bigint AS attempts",
        "13::bigint AS replays",
        "NULL::bytea AS response",
    ];

    /// A row read in the table's order, behind other columns, or in any other order gives the
    /// same record: the reader's guess of where the next column is only saves a search.
    #[tokio::test]
    async fn a_record_reads_the_same_whatever_its_columns_order() {
        if !idem_conformance::server_reachable(
            "a_record_reads_the_same_whatever_its_columns_order",
            "PostgreSQL",
            PG,
        ) {
            return;
        }
        let (client, connection) = ok(tokio_postgres::connect(
            &format!("postgres://postgres@{PG}/test"),
            tokio_postgres::NoTls,
        )
        .await);
        tokio::spawn(connection);
        let read = async |columns: Vec<&str>| {
            let row = ok(client
                .query_one(&format!("SELECT {}", columns.join(", ")), &[])
                .await);
            ok(record_of(&row)).map(|r| format!("{r:?}"))
        };
        let in_order = ok(read(COLUMNS.to_vec()).await.ok_or("a record"));
        let mut behind = vec!["true AS acquired", "1::bigint AS now"];
        behind.extend(COLUMNS);
        assert_eq!(read(behind).await.as_ref(), Some(&in_order));
        let mut reversed = COLUMNS.to_vec();
        reversed.reverse();
        assert_eq!(read(reversed).await.as_ref(), Some(&in_order));
        let mut shuffled = COLUMNS.to_vec();
        shuffled.swap(4, 5); // created_at and acquired_at, both bigints
        shuffled.rotate_left(3);
        assert_eq!(read(shuffled).await.as_ref(), Some(&in_order));
        // Without its scope, no record (a LEFT JOIN that found nothing).
        let without = COLUMNS.map(|c| c.replacen("'s'::text", "NULL::text", 1));
        assert_eq!(
            read(without.iter().map(String::as_str).collect()).await,
            None
        );
        // A column missing: an error, not a record with a default.
        let row = ok(client.query_one("SELECT 's'::text AS scope", &[]).await);
        assert!(record_of(&row).is_err());
    }
}
