//! The SQL of the PostgreSQL engine: the tables (`sql/schema.sql`) and one
//! function per operation (`sql/lock_*_v1.sql`), loaded here with
//! `include_str!` as `scripts.rs` loads the Lua. The functions carry a
//! version in their names, so clients of two versions share one database.
//!
//! Invariant: **the functions, and the fast path beside them
//! (`fast_path.rs`), are the only writers of lock state.** The client
//! sends one statement per call, in autocommit: no transaction stays open
//! between calls, and a pooler in transaction mode passes every statement.

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::errors::sql_fault;
use crate::backend::fault::Fault;

/// The tables.
pub(crate) const TABLES: &str = include_str!("../../../sql/schema.sql");

/// The functions, in the order they are created (one calls the ones
/// before it).
pub(crate) const FUNCTIONS: [(&str, &str); 11] = [
    (
        "lock_settle_v1",
        include_str!("../../../sql/lock_settle_v1.sql"),
    ),
    (
        "lock_sweep_v1",
        include_str!("../../../sql/lock_sweep_v1.sql"),
    ),
    (
        "lock_serve_v1",
        include_str!("../../../sql/lock_serve_v1.sql"),
    ),
    (
        "lock_acquire_v1",
        include_str!("../../../sql/lock_acquire_v1.sql"),
    ),
    (
        "lock_release_v1",
        include_str!("../../../sql/lock_release_v1.sql"),
    ),
    (
        "lock_keep_v1",
        include_str!("../../../sql/lock_keep_v1.sql"),
    ),
    (
        "lock_renew_v1",
        include_str!("../../../sql/lock_renew_v1.sql"),
    ),
    (
        "lock_queued_v1",
        include_str!("../../../sql/lock_queued_v1.sql"),
    ),
    (
        "lock_inspect_v1",
        include_str!("../../../sql/lock_inspect_v1.sql"),
    ),
    (
        "lock_names_v1",
        include_str!("../../../sql/lock_names_v1.sql"),
    ),
    (
        "lock_listen_v1",
        include_str!("../../../sql/lock_listen_v1.sql"),
    ),
];

/// Every statement a team that migrates by hand applies, in order.
pub(crate) fn all_sql() -> String {
    let mut sql = String::from(TABLES);
    for (_, f) in FUNCTIONS {
        sql.push('\n');
        sql.push_str(f);
    }
    sql
}

/// Any key of this value serializes the clients that create the schema at
/// once (`CREATE OR REPLACE FUNCTION` run side by side fails with "tuple
/// concurrently updated"); a transaction-scoped lock, gone at commit.
const INSTALL_LOCK: i64 = 0x006c_6f63_6b5f_7631;

/// Create what is missing, in one transaction. First asks whether every
/// function is there (one read): a client of a database set up already
/// changes nothing, and needs no CREATE privilege.
pub(crate) async fn install(client: &Client) -> Result<(), Fault> {
    let names: Vec<&str> = FUNCTIONS.iter().map(|(n, _)| *n).collect();
    let present: i64 = client
        .query_typed_one(
            "SELECT count(DISTINCT p.proname) FROM pg_proc p \
             WHERE p.proname = ANY($1) AND p.pronamespace = to_regnamespace(current_schema())",
            &[(&names, tokio_postgres::types::Type::TEXT_ARRAY)],
        )
        .await
        .map_err(|e| sql_fault("checking the lock tables", &e))?
        .get(0);
    if present == names.len() as i64 {
        return Ok(());
    }
    let batch = format!(
        "BEGIN;\nSELECT pg_advisory_xact_lock({INSTALL_LOCK});\n{}\nCOMMIT;",
        all_sql()
    );
    match client.batch_execute(&batch).await {
        Ok(()) => Ok(()),
        Err(e) => {
            // Leave no transaction open on this connection.
            let _ = client.batch_execute("ROLLBACK").await;
            let code = e.code();
            if code == Some(&SqlState::INSUFFICIENT_PRIVILEGE)
                || code == Some(&SqlState::INVALID_SCHEMA_NAME)
            {
                return Err(Fault::Config(format!(
                    "the lock tables are missing and this role may not create them ({}); \
                     apply this SQL once as a role that may (also in docs/POSTGRES.md):\n{}",
                    e.as_db_error()
                        .map_or_else(|| e.to_string(), |d| d.message().to_owned()),
                    all_sql()
                )));
            }
            if code == Some(&SqlState::UNDEFINED_COLUMN) {
                // `CREATE TABLE IF NOT EXISTS` kept a table of an earlier
                // layout, which the statements of this version cannot use.
                return Err(Fault::Config(format!(
                    "the lock tables here are of an earlier layout ({}); while no lock is \
                     held, drop the tables lock_holders, lock_waiters, lock_listeners (and \
                     lock_fences, if there) and the lock_*_v1 functions, then connect again",
                    e.as_db_error()
                        .map_or_else(|| e.to_string(), |d| d.message().to_owned()),
                )));
            }
            Err(sql_fault("creating the lock tables", &e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sql_file_states_its_contract_first() {
        for (name, sql) in FUNCTIONS {
            assert!(sql.starts_with("-- "), "{name} opens with its contract");
            assert!(
                sql.contains(&format!("FUNCTION {name}(")),
                "{name}.sql defines {name}"
            );
        }
        assert!(TABLES.contains("fillfactor"));
    }
}
