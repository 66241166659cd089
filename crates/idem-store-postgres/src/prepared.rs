//! The store's statements prepared on each direct connection, found without hashing their
//! text.
//!
//! deadpool's statement cache finds a statement by its text and parameter types: every call
//! SipHashes the whole text (a claim's is 1.6 KB) and builds the types' vector, ~6,800
//! instructions per new key in the gateway (`bench/gateway_instructions.sh`, PostgreSQL),
//! more than the statement's encoding. The store's statements are the fields of its
//! [`Sql`], which live as long as the store, so here a statement is found by which field it
//! is, on a connection found by the address of its deadpool cache. A text that is not one of
//! them, or parameters of other types than the statement was prepared with, go to deadpool's
//! cache as before, and every statement prepared here is prepared through that cache, so
//! concurrent first uses on one connection still share one `PREPARE`. A statement the server
//! refuses as stale is forgotten here and asked of deadpool's cache again ([`Prepared::run`]),
//! so clearing that cache, deadpool's remedy for a table whose row type changed, still works.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};

use deadpool_postgres::StatementCache;
use tokio_postgres::Statement;
use tokio_postgres::types::Type;

use crate::inner::{Conn, Params};
use crate::sql::Sql;

/// What is prepared, per connection.
#[derive(Default)]
pub(crate) struct Prepared {
    /// By the address of the connection's deadpool cache, which the entry's `Weak` keeps
    /// allocated: while an entry lives, no other connection's cache can take that address.
    connections: Mutex<HashMap<usize, Connection>>,
}

/// One connection's statements, by their index in [`Sql::texts`].
struct Connection {
    cache: Weak<StatementCache>,
    statements: [Option<Statement>; Sql::COUNT],
}

impl Prepared {
    /// `run` with `sql` prepared on `c` for `params`' types.
    ///
    /// A statement kept here that the server no longer runs as prepared (the table's row type
    /// changed: "cached plan must not change result type"; or it was deallocated) is
    /// forgotten, and `run` goes once more with the statement deadpool's cache gives, as it
    /// did before this table: if the caller cleared deadpool's caches (its remedy for a
    /// changed table), that one is prepared afresh. The server refused the first before
    /// running it, so nothing ran twice. Inside a transaction the refusal aborted the
    /// transaction, so there is nothing to run again in it.
    pub(crate) async fn run<C, T, F>(
        &self,
        statements: &Sql,
        c: &C,
        sql: &str,
        params: &Params<'_>,
        run: impl Fn(Statement) -> F,
    ) -> Result<T, tokio_postgres::Error>
    where
        C: Conn,
        F: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let Some(which) = statements.index_of(sql) else {
            return run(by_text(c, sql, params).await?).await;
        };
        let cache = c.statement_cache();
        if let Some(found) = self.find(cache, which)
            && same_types(&found, params)
        {
            match run(found).await {
                Err(e) if stale(&e) => {
                    self.forget(cache, which);
                    if c.in_transaction() {
                        return Err(e);
                    }
                }
                answer => return answer,
            }
        }
        let statement = by_text(c, sql, params).await?;
        if same_types(&statement, params) {
            self.keep(cache, which, statement.clone());
        }
        run(statement).await
    }

    fn find(&self, cache: &Arc<StatementCache>, which: usize) -> Option<Statement> {
        let connections = self.connections.lock().ok()?;
        connections.get(&address(cache))?.statements[which].clone()
    }

    fn keep(&self, cache: &Arc<StatementCache>, which: usize, statement: Statement) {
        let Ok(mut connections) = self.connections.lock() else {
            return;
        };
        let key = address(cache);
        if !connections.contains_key(&key) {
            // A connection new here: the time to forget those closed since the last one.
            connections.retain(|_, c| c.cache.strong_count() > 0);
        }
        let connection = connections.entry(key).or_insert_with(|| Connection {
            cache: Arc::downgrade(cache),
            statements: Default::default(),
        });
        connection.statements[which] = Some(statement);
    }

    fn forget(&self, cache: &Arc<StatementCache>, which: usize) {
        if let Ok(mut connections) = self.connections.lock()
            && let Some(connection) = connections.get_mut(&address(cache))
        {
            connection.statements[which] = None;
        }
    }

    /// How many connections have statements here, for the tests.
    #[cfg(test)]
    pub(crate) fn connections(&self) -> usize {
        self.connections.lock().map_or(0, |c| c.len())
    }
}

/// Whether the server refused a prepared statement as it was prepared: its plan's result
/// type changed (a column added to the table), or it no longer exists.
fn stale(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    matches!(
        e.code(),
        Some(c) if *c == SqlState::FEATURE_NOT_SUPPORTED || *c == SqlState::INVALID_SQL_STATEMENT_NAME
    )
}

fn address(cache: &Arc<StatementCache>) -> usize {
    Arc::as_ptr(cache) as usize
}

/// Whether `statement` was prepared for parameters of `params`' types.
fn same_types(statement: &Statement, params: &Params<'_>) -> bool {
    statement.params().iter().eq(params.iter().map(|(_, t)| t))
}

/// `sql` prepared with its parameters' types through deadpool's cache.
async fn by_text(
    c: &impl Conn,
    sql: &str,
    params: &Params<'_>,
) -> Result<Statement, tokio_postgres::Error> {
    let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
    c.prepare_typed_cached(sql, &types).await
}

#[cfg(test)]
mod tests {
    use deadpool_postgres::Object;

    use super::*;
    use crate::{PgOptions, PgStore};

    const PG: &str = "127.0.0.1:5432";

    fn ok<T, E: std::fmt::Debug>(r: Result<T, E>) -> T {
        r.unwrap_or_else(|e| panic!("{e:?}"))
    }

    /// A store on a schema of its own, or `None` when the test skips.
    async fn store(test: &str) -> Option<PgStore> {
        if !idem_conformance::server_reachable(test, "PostgreSQL", PG) {
            return None;
        }
        let mut opts = ok(PgOptions::from_url(&format!(
            "postgres://postgres@{PG}/test"
        )));
        opts.schema = format!("idem_prepared_{:016x}", rand::random::<u64>());
        Some(ok(PgStore::connect(opts).await))
    }

    /// The statement `prepared` gives for `sql` on `c`.
    async fn statement(
        prepared: &Prepared,
        statements: &Sql,
        c: &impl Conn,
        sql: &str,
        params: &Params<'_>,
    ) -> Statement {
        let given = prepared.run(statements, c, sql, params, |s| async move { Ok(s) });
        ok(given.await)
    }

    /// The statement as tokio-postgres shows it, its server-side name first: tokio-postgres
    /// numbers every statement it prepares anew, on whichever connection.
    fn name(s: &Statement) -> String {
        let shown = format!("{s:?}");
        shown.split(", params").next().unwrap_or(&shown).to_owned()
    }

    /// A statement is found again on the connection that prepared it, never on another; a
    /// closed connection's statements are forgotten once another connection comes; a text
    /// that is not the store's own, or other parameter types, are prepared through deadpool's
    /// cache and change nothing here.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn statements_stay_with_the_connection_that_prepared_them() {
        let Some(store) = store("statements_stay_with_the_connection_that_prepared_them").await
        else {
            return;
        };
        let inner = store.inner();
        let (sql, prepared) = (&inner.sql, &inner.prepared);
        let (now, scope, key) = (None::<i64>, "s".to_owned(), "k".to_owned());
        let params: &Params<'_> = &[(&now, Type::INT8), (&scope, Type::TEXT), (&key, Type::TEXT)];
        let a = ok(inner.pool.get().await);
        let b = ok(inner.pool.get().await);

        let on_a = statement(prepared, sql, &a, &sql.get, params).await;
        let again = statement(prepared, sql, &a, &sql.get, params).await;
        let on_b = statement(prepared, sql, &b, &sql.get, params).await;
        assert_eq!(name(&on_a), name(&again), "found again on its connection");
        assert_ne!(name(&on_a), name(&on_b), "each connection prepares its own");
        assert_eq!(prepared.connections(), 2);
        // Each runs where it was prepared: the row of a key nobody claimed is all NULL.
        for (c, s) in [(&a, &on_a), (&b, &on_b)] {
            let rows = ok(c.query(s, &[&now, &scope, &key]).await);
            assert_eq!(rows.len(), 1);
            assert_eq!(ok(rows[0].try_get::<_, Option<String>>("scope")), None);
        }

        // The same text elsewhere is not the store's statement: deadpool's cache answers.
        let copy = sql.get.clone();
        assert_eq!(sql.index_of(&copy), None);
        let by_copy = statement(prepared, sql, &a, &copy, params).await;
        assert_eq!(
            name(&by_copy),
            name(&on_a),
            "deadpool's cache holds what this one does"
        );
        // Other parameter types: prepared for them, not taken from here.
        let key_as_varchar: &Params<'_> = &[
            (&now, Type::INT8),
            (&scope, Type::TEXT),
            (&key, Type::VARCHAR),
        ];
        let other_types = statement(prepared, sql, &a, &sql.get, key_as_varchar).await;
        assert_ne!(name(&other_types), name(&on_a));
        assert_eq!(other_types.params()[2], Type::VARCHAR);

        // `a` closed: its entry goes when the next connection is new here.
        drop(Object::take(a));
        let c = ok(inner.pool.get().await);
        let on_c = statement(prepared, sql, &c, &sql.get, params).await;
        assert_ne!(name(&on_c), name(&on_a));
        assert_ne!(name(&on_c), name(&on_b));
        assert_eq!(prepared.connections(), 2, "b's and c's");
        drop((b, c));
        ok(store.drop_schema().await);
    }

    /// The remedy deadpool documents for a table whose row type changed (its statements then
    /// fail with "cached plan must not change result type") is to clear its statement
    /// caches: it reaches the statements kept here too, and without it the store answers as
    /// it did before this table, with the server's error.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn clearing_deadpools_caches_reaches_the_statements_kept_here() {
        let Some(store) = store("clearing_deadpools_caches_reaches_the_statements_kept_here").await
        else {
            return;
        };
        let inner = store.inner();
        let (scope, key) = (ok(idem_core::Scope::new("s")), ok(idem_core::Key::new("k")));
        let a = ok(inner.pool.get().await);
        ok(inner.read_on(&a, &inner.sql.get, &scope, &key).await);
        let alter = format!(
            "ALTER TABLE {}.records ADD COLUMN extra integer",
            inner.quoted
        );
        ok(a.batch_execute(&alter).await);
        for _ in 0..2 {
            let stale = inner.read_on(&a, &inner.sql.get, &scope, &key).await;
            assert!(
                format!("{stale:?}").contains("cached plan must not change result type"),
                "{stale:?}"
            );
        }
        store.pool().manager().statement_caches.clear();
        let (_, none) = ok(inner.read_on(&a, &inner.sql.get, &scope, &key).await);
        assert!(none.is_none());
        // Inside a transaction the refusal aborts it: nothing runs again there, and the
        // statement is forgotten for the next use.
        let b = ok(inner.pool.get().await);
        ok(inner.read_on(&b, &inner.sql.get, &scope, &key).await);
        let drop_it = format!("ALTER TABLE {}.records DROP COLUMN extra", inner.quoted);
        ok(b.batch_execute(&drop_it).await);
        store.pool().manager().statement_caches.clear();
        let mut b = b;
        let tx = ok(b.transaction().await);
        let refused = inner.read_on(&tx, &inner.sql.get, &scope, &key).await;
        assert!(
            format!("{refused:?}").contains("cached plan"),
            "{refused:?}"
        );
        drop(tx);
        ok(inner.read_on(&b, &inner.sql.get, &scope, &key).await);
        drop((a, b));
        ok(store.drop_schema().await);
    }
}
