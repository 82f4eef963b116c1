//! What a PostgreSQL error means for a lock call: whether the statement
//! may have run (a resend must reuse its owner id) and whether trying again
//! may help; and where the server is, for messages.

use tokio_postgres::error::SqlState;

use crate::backend::fault::Fault;

/// `host:port/dbname` of a configuration, without credentials.
pub(crate) fn describe(config: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        #[cfg(unix)]
        Some(Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config
        .get_dbname()
        .or(config.get_user())
        .unwrap_or_default();
    format!("{host}:{port}/{db}")
}

/// Errors that the same settings meet on every try: no such database, a
/// wrong password, a role without the right.
fn is_settled(code: &SqlState) -> bool {
    [
        SqlState::INVALID_PASSWORD,
        SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
        SqlState::INVALID_CATALOG_NAME,
        SqlState::INSUFFICIENT_PRIVILEGE,
        SqlState::INVALID_SCHEMA_NAME,
        SqlState::UNDEFINED_FUNCTION,
        SqlState::UNDEFINED_TABLE,
        SqlState::SYNTAX_ERROR,
    ]
    .contains(code)
}

fn message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({}: {})", db.message(), db.severity(), db.code().code()),
        None => {
            let mut s = e.to_string();
            let mut src = std::error::Error::source(e);
            while let Some(inner) = src {
                s.push_str(&format!(": {inner}"));
                src = inner.source();
            }
            s
        }
    }
}

/// A failed statement. An error the server answered did not commit (each
/// call is one autocommit statement); a connection that broke under it
/// may have.
pub(crate) fn sql_fault(context: &str, e: &tokio_postgres::Error) -> Fault {
    let (may_have_run, transient) = match e.code() {
        Some(code) => (false, !is_settled(code)),
        None => (true, true),
    };
    Fault::Sql {
        context: context.to_owned(),
        message: message(e),
        may_have_run,
        transient,
    }
}

/// A failed connect: nothing was sent. A wrong password or a missing
/// database is the same on every try.
pub(crate) fn connect_fault(context: &str, e: &tokio_postgres::Error) -> Fault {
    let transient = e.code().is_none_or(|c| !is_settled(c));
    Fault::Sql {
        context: context.to_owned(),
        message: message(e),
        may_have_run: false,
        transient,
    }
}

/// A socket that could not be opened: nothing was sent, and the next try
/// may reach the server.
pub(crate) fn io_fault(context: &str, e: &std::io::Error) -> Fault {
    Fault::Sql {
        context: context.to_owned(),
        message: e.to_string(),
        may_have_run: false,
        transient: true,
    }
}
