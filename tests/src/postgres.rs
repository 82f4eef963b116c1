//! Test harness for the PostgreSQL engine: throwaway `postgres` servers on
//! free ports, which tests can kill, pause, resume, restart and look into,
//! a `pgbouncer` in transaction mode in front of one, and streaming
//! standbys.
//!
//! Starting is fast: `initdb` runs once per machine (a template data
//! directory under the temp dir, keyed by the server's version and this
//! file's `TEMPLATE_VERSION`), and each server copies it. Tests that need
//! no server of their own share one per test binary ([`PostgresServer::shared`])
//! and take a fresh database each ([`PostgresServer::fresh_database`]).
//!
//! The server refuses to run as root: when the tests run as root, the
//! server, `initdb` and `pgbouncer` run as the `postgres` system user (the
//! Debian packages create it), and the temp dirs are made its own.
//!
//! Settings: every server runs with `synchronous_commit=on`, so a commit's
//! WAL is written (to the kernel) before the reply: a SIGKILL of every
//! server process loses nothing that was acknowledged. By default
//! `fsync=off` and `full_page_writes=off`, which only a crash of the
//! machine would expose; [`PgOptions::durable`] turns both on for the tests
//! whose subject is durability (the crash-and-restart tests) and for the
//! benchmarks. Queries from the harness go through `psql` over the server's
//! unix socket (trust auth there even when TCP asks for a password).

use std::fmt::Write as _;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::{free_port, spawn_tied};

/// Bump when the template's contents change (a new `initdb` option, a new
/// extension): servers then build a new one instead of copying a stale one.
const TEMPLATE_VERSION: u32 = 1;

/// Where the server binaries are: `LOCK_TEST_PG_BIN`, else the newest
/// `/usr/lib/postgresql/<version>/bin` (Debian's layout, not on PATH),
/// else the directory of `initdb` on PATH.
pub fn bin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Ok(dir) = std::env::var("LOCK_TEST_PG_BIN") {
            return PathBuf::from(dir);
        }
        let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let v = e.file_name().to_str()?.parse::<u32>().ok()?;
                let bin = e.path().join("bin");
                bin.join("postgres").exists().then_some((v, bin))
            })
            .collect();
        versions.sort();
        if let Some((_, bin)) = versions.pop() {
            return bin;
        }
        std::env::var_os("PATH")
            .into_iter()
            .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .find(|d| d.join("initdb").exists() && d.join("postgres").exists())
            .expect(
                "PostgreSQL server binaries not found: run scripts/install-postgres.sh, \
                 or set LOCK_TEST_PG_BIN to the directory holding initdb and postgres",
            )
    })
}

fn bin(name: &str) -> PathBuf {
    bin_dir().join(name)
}

/// The server's major version, e.g. `15`.
pub fn major_version() -> u32 {
    static V: OnceLock<u32> = OnceLock::new();
    *V.get_or_init(|| {
        let out = Command::new(bin("postgres"))
            .arg("--version")
            .output()
            .expect("postgres --version");
        // "postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)"
        let text = String::from_utf8_lossy(&out.stdout);
        text.split_whitespace()
            .nth(2)
            .and_then(|v| v.split('.').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("cannot read the version in {text:?}"))
    })
}

/// Whether `pg_stat_statements` ships with these binaries (Debian's
/// `postgresql-15` package has it; other layouts may need the contrib one).
pub fn has_pg_stat_statements() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        bin_dir()
            .parent()
            .map(|d| d.join("lib").join("pg_stat_statements.so").exists())
            .unwrap_or(false)
    })
}

/// The uid and gid the server runs as: the `postgres` user's when this
/// process is root, else `None` (run as ourselves).
fn server_user() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    static USER: OnceLock<(u32, u32)> = OnceLock::new();
    Some(*USER.get_or_init(|| {
        let name = std::ffi::CString::new("postgres").unwrap();
        // SAFETY: getpwnam returns a pointer into static storage or null;
        // we read two integers from it at once, before any other call.
        let pw = unsafe { libc::getpwnam(name.as_ptr()) };
        assert!(
            !pw.is_null(),
            "the tests run as root and PostgreSQL refuses root: create a `postgres` user \
             (the Debian packages do: scripts/install-postgres.sh)"
        );
        // SAFETY: non-null, as checked.
        unsafe { ((*pw).pw_uid, (*pw).pw_gid) }
    }))
}

/// A command run as the server's user.
fn as_server_user(program: impl AsRef<std::ffi::OsStr>) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(program);
    if let Some((uid, gid)) = server_user() {
        cmd.uid(uid).gid(gid);
    }
    // The server's user may not be able to read our working directory.
    cmd.current_dir("/");
    cmd
}

/// Make `dir` (a fresh directory) the server user's.
fn give_to_server_user(dir: &Path) {
    if let Some((uid, gid)) = server_user() {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid)).expect("chown the temp dir");
    }
}

fn run(mut cmd: Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fresh directory under the temp dir, owned by the server's user.
fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    give_to_server_user(&dir);
    dir
}

/// The template data directory, made once per machine: `initdb`, then
/// `pg_stat_statements` created in `template1` and `postgres` (so every
/// database has it).
fn template() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let uid = server_user().map_or_else(|| unsafe { libc::geteuid() }, |(u, _)| u);
        let dir = std::env::temp_dir().join(format!(
            "lock-test-pg-template-v{TEMPLATE_VERSION}-{}-uid{uid}",
            major_version()
        ));
        if dir.join("ready").exists() {
            return dir;
        }
        let tmp = fresh_dir(&format!(
            "lock-test-pg-template-tmp-{}-{}",
            std::process::id(),
            free_port()
        ));
        let mut initdb = as_server_user(bin("initdb"));
        initdb
            .arg("-D")
            .arg(tmp.join("data"))
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8"])
            .args(["--locale=C", "--no-sync", "--no-instructions"]);
        run(initdb, "initdb");
        let mut server = PostgresServer {
            child: None,
            port: free_port(),
            dir: tmp.clone(),
            options: PgOptions::default(),
            owned: false,
        };
        server.spawn();
        if has_pg_stat_statements() {
            for db in ["template1", "postgres"] {
                server.psql_in(db, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
            }
        }
        server.stop_fast();
        File::create(tmp.join("ready")).expect("template marker");
        // Another test binary may have made it meanwhile: keep theirs.
        if std::fs::rename(&tmp, &dir).is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
            assert!(dir.join("ready").exists(), "template at {dir:?}");
        }
        dir
    })
}

/// How a [`PostgresServer`] starts.
#[derive(Debug, Clone, Default)]
pub struct PgOptions {
    /// TCP connections must give this password (scram-sha-256) for every
    /// role; the unix socket the harness uses stays trusted. `None`: trust.
    pub password: Option<String>,
    /// `fsync` and `full_page_writes` on: for tests whose subject is
    /// durability across a crash, and for benchmarks.
    pub durable: bool,
    /// More `-c name=value` settings.
    pub settings: Vec<(String, String)>,
    /// The port, chosen beforehand (for a proxy in front); else a free one.
    pub port: Option<u16>,
}

impl PgOptions {
    pub fn password(mut self, password: &str) -> Self {
        self.password = Some(password.into());
        self
    }

    pub fn durable(mut self) -> Self {
        self.durable = true;
        self
    }

    pub fn setting(mut self, name: &str, value: &str) -> Self {
        self.settings.push((name.into(), value.into()));
        self
    }

    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    pub fn start(self) -> PostgresServer {
        PostgresServer::start_with(self)
    }
}

/// A `postgres` server owned by one test (or one test binary), in a temp
/// dir removed on drop. Its processes die with the test process.
pub struct PostgresServer {
    child: Option<Child>,
    port: u16,
    /// Holds `data/` (the data directory), the unix socket and `server.log`.
    dir: PathBuf,
    options: PgOptions,
    /// Whether drop removes `dir` (not for the template being built).
    owned: bool,
}

impl PostgresServer {
    /// A server with trust auth and the fast settings.
    pub fn start() -> Self {
        Self::start_with(PgOptions::default())
    }

    /// Options for [`PgOptions::start`].
    pub fn options() -> PgOptions {
        PgOptions::default()
    }

    pub fn start_with(options: PgOptions) -> Self {
        let port = options.port.unwrap_or_else(free_port);
        let dir = fresh_dir(&format!("lock-test-pg-{}-{port}", std::process::id()));
        let mut cp = as_server_user("cp");
        cp.arg("-a")
            .arg(template().join("data"))
            .arg(dir.join("data"));
        run(cp, "copying the template data directory");
        let mut server = PostgresServer {
            child: None,
            port,
            dir,
            options,
            owned: true,
        };
        server.write_hba();
        server.spawn();
        if let Some(password) = server.options.password.clone() {
            server.psql(&format!(
                "ALTER ROLE postgres PASSWORD {}",
                quote_literal(&password)
            ));
        }
        server
    }

    /// One server for the whole test binary, stopped and removed when the
    /// process exits. Give each test its own database
    /// ([`PostgresServer::fresh_database`]).
    pub fn shared() -> &'static PostgresServer {
        static SHARED: OnceLock<PostgresServer> = OnceLock::new();
        extern "C" fn remove_shared() {
            if let Some(server) = SHARED.get() {
                server.signal_all(libc::SIGKILL);
                let _ = std::fs::remove_dir_all(&server.dir);
            }
        }
        SHARED.get_or_init(|| {
            let server = PostgresServer::start();
            // SAFETY: registers a plain function; it only reads the static.
            unsafe { libc::atexit(remove_shared) };
            server
        })
    }

    /// A streaming standby of `primary` (`pg_basebackup`, `standby.signal`),
    /// named `name` (its `application_name`). With `synchronous`, the
    /// primary then waits for it on every commit
    /// (`synchronous_standby_names`), and this returns once it is `sync`.
    pub fn standby_of(primary: &PostgresServer, name: &str, synchronous: bool) -> Self {
        let port = free_port();
        let dir = fresh_dir(&format!("lock-test-pg-{}-{port}", std::process::id()));
        let mut backup = as_server_user(bin("pg_basebackup"));
        backup
            .arg("-D")
            .arg(dir.join("data"))
            .arg("-h")
            .arg(&primary.dir)
            .args(["-p", &primary.port.to_string(), "-U", "postgres"])
            .args(["-X", "stream", "-c", "fast", "--no-sync"]);
        run(backup, "pg_basebackup");
        let conninfo = format!(
            "host={} port={} user=postgres application_name={name}",
            primary.dir.display(),
            primary.port
        );
        let auto = dir.join("data").join("postgresql.auto.conf");
        let mut conf = std::fs::read_to_string(&auto).unwrap_or_default();
        let _ = writeln!(conf, "primary_conninfo = {}", quote_literal(&conninfo));
        std::fs::write(&auto, conf).expect("postgresql.auto.conf");
        File::create(dir.join("data").join("standby.signal")).expect("standby.signal");
        let mut standby = PostgresServer {
            child: None,
            port,
            dir,
            options: PgOptions {
                port: Some(port),
                ..primary.options.clone()
            },
            owned: true,
        };
        standby.spawn();
        if synchronous {
            primary.psql(&format!(
                "ALTER SYSTEM SET synchronous_standby_names = {}",
                quote_literal(name)
            ));
            primary.psql("SELECT pg_reload_conf()");
            let deadline = Instant::now() + Duration::from_secs(30);
            while primary
                .scalar(&format!(
                    "SELECT count(*) FROM pg_stat_replication \
                     WHERE application_name = {} AND sync_state = 'sync'",
                    quote_literal(name)
                ))
                .as_str()
                != "1"
            {
                assert!(
                    Instant::now() < deadline,
                    "standby {name} never became sync"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        standby
    }

    /// Promote a standby (`pg_promote`), waiting until it takes writes.
    pub fn promote(&self) {
        assert_eq!(self.scalar("SELECT pg_promote(true, 60)"), "t");
    }

    /// The unix socket directory (also the `host` for `psql`).
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The server's log so far (its stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of the `postgres` database over TCP (with the password when
    /// there is one).
    pub fn url(&self) -> String {
        self.url_for("postgres")
    }

    /// The URL of database `db` over TCP.
    pub fn url_for(&self, db: &str) -> String {
        url("127.0.0.1", self.port, db, self.options.password.as_deref())
    }

    /// The postmaster's pid, `None` when it is down.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    fn write_hba(&self) {
        let tcp = if self.options.password.is_some() {
            "scram-sha-256"
        } else {
            "trust"
        };
        let hba = format!(
            "local all all trust\n\
             local replication all trust\n\
             host replication all 127.0.0.1/32 trust\n\
             host all all 127.0.0.1/32 {tcp}\n"
        );
        std::fs::write(self.data_dir().join("pg_hba.conf"), hba).expect("pg_hba.conf");
    }

    fn spawn(&mut self) {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("server.log"))
            .expect("server log");
        give_to_server_user(&self.dir.join("server.log"));
        let on_off = |on: bool| if on { "on" } else { "off" };
        let mut settings: Vec<(String, String)> = [
            ("listen_addresses", "127.0.0.1".to_string()),
            ("port", self.port.to_string()),
            ("unix_socket_directories", self.dir.display().to_string()),
            ("fsync", on_off(self.options.durable).into()),
            ("full_page_writes", on_off(self.options.durable).into()),
            ("synchronous_commit", "on".into()),
            ("max_connections", "300".into()),
            ("shared_buffers", "64MB".into()),
            ("dynamic_shared_memory_type", "posix".into()),
            ("huge_pages", "off".into()),
            ("max_wal_size", "1GB".into()),
            ("log_min_messages", "warning".into()),
            ("log_line_prefix", "%m [%p] ".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        if has_pg_stat_statements() {
            settings.push((
                "shared_preload_libraries".into(),
                "pg_stat_statements".into(),
            ));
            settings.push(("pg_stat_statements.track_utility".into(), "on".into()));
        }
        settings.extend(self.options.settings.iter().cloned());
        let mut cmd = as_server_user(bin("postgres"));
        cmd.arg("-D").arg(self.data_dir());
        for (k, v) in &settings {
            cmd.arg("-c").arg(format!("{k}={v}"));
        }
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().expect("server log"))
            .stderr(log);
        let child = spawn_tied(cmd).expect("cannot start postgres");
        self.child = Some(child);
        self.wait_ready();
    }

    /// Until `postmaster.pid` names our postmaster and says `ready` (it
    /// writes that once it accepts connections, recovery done).
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let pidfile = self.data_dir().join("postmaster.pid");
        loop {
            // A crashed server's file stays until the new one replaces it.
            let pid = self.pid().map(|p| p.to_string());
            let ready = std::fs::read_to_string(&pidfile)
                .map(|s| {
                    s.lines().next() == pid.as_deref()
                        && s.lines().nth(7).map(str::trim) == Some("ready")
                })
                .unwrap_or(false);
            if ready {
                return;
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.child = None;
                panic!(
                    "postgres on port {} exited ({status}) while starting:\n{}",
                    self.port,
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "postgres on port {} did not come up:\n{}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The postmaster and its children (the backends, the checkpointer,
    /// …): every process of this server.
    pub fn pids(&self) -> Vec<u32> {
        let Some(pm) = self.pid() else {
            return Vec::new();
        };
        let mut pids = vec![pm];
        pids.extend(children_of(pm));
        pids
    }

    fn signal_all(&self, sig: libc::c_int) {
        for pid in self.pids() {
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(pid as libc::pid_t, sig) };
        }
    }

    /// SIGKILL the postmaster and every backend at once: a crash. The data
    /// directory stays; [`PostgresServer::start_again`] recovers from it.
    pub fn kill(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pm = child.id();
        // SAFETY: kill has no memory preconditions.
        unsafe { libc::kill(pm as libc::pid_t, libc::SIGKILL) };
        let children = children_of(pm);
        for &pid in &children {
            // SAFETY: as above.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
        let _ = child.wait();
        wait_gone(&children);
    }

    /// Immediate shutdown (SIGQUIT, what `pg_ctl stop -m immediate` sends):
    /// no checkpoint, recovery on the next start.
    pub fn stop_immediate(&mut self) {
        self.stop(libc::SIGQUIT);
    }

    /// Fast shutdown (SIGINT): a clean stop with a checkpoint.
    pub fn stop_fast(&mut self) {
        self.stop(libc::SIGINT);
    }

    fn stop(&mut self, sig: libc::c_int) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let children = children_of(child.id());
        // SAFETY: kill has no memory preconditions.
        unsafe { libc::kill(child.id() as libc::pid_t, sig) };
        let _ = child.wait();
        wait_gone(&children);
    }

    /// Start again after [`kill`](Self::kill) or a stop, on the same port
    /// and data directory (crash recovery runs first if needed).
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "the server is still running");
        self.spawn();
    }

    /// Immediate stop, then start again.
    pub fn restart(&mut self) {
        self.stop_immediate();
        self.spawn();
    }

    /// SIGSTOP the postmaster, then its children: the server keeps its
    /// sockets and answers nothing, and no new backend starts. The
    /// harness's own queries hang until [`resume`](Self::resume).
    pub fn pause(&self) {
        let pm = self.pid().expect("server not running");
        // SAFETY: kill has no memory preconditions.
        unsafe { libc::kill(pm as libc::pid_t, libc::SIGSTOP) };
        for pid in children_of(pm) {
            // SAFETY: as above.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
        }
    }

    /// SIGCONT the children, then the postmaster.
    pub fn resume(&self) {
        let pm = self.pid().expect("server not running");
        for pid in children_of(pm) {
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGCONT) };
        }
        // SAFETY: as above.
        unsafe { libc::kill(pm as libc::pid_t, libc::SIGCONT) };
    }

    /// Run SQL in the `postgres` database through `psql` and return its
    /// output: rows on lines, fields split by `|`, no headers. Panics on
    /// an error.
    pub fn psql(&self, sql: &str) -> String {
        self.psql_in("postgres", sql)
    }

    /// [`psql`](Self::psql) in database `db`.
    pub fn psql_in(&self, db: &str, sql: &str) -> String {
        self.try_psql_in(db, sql)
            .unwrap_or_else(|e| panic!("psql {sql:?} in {db}: {e}"))
    }

    /// [`psql_in`](Self::psql_in), the error text on failure.
    pub fn try_psql_in(&self, db: &str, sql: &str) -> Result<String, String> {
        let out = Command::new(bin("psql"))
            .arg("-h")
            .arg(&self.dir)
            .args(["-p", &self.port.to_string(), "-U", "postgres", "-d", db])
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .env("PGCONNECT_TIMEOUT", "10")
            .env_remove("PGPASSWORD")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run psql: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }

    /// Rows of a query in `db`, each a list of fields.
    pub fn query_in(&self, db: &str, sql: &str) -> Vec<Vec<String>> {
        self.psql_in(db, sql)
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| l.split('|').map(str::to_string).collect())
            .collect()
    }

    /// The one value a query in `postgres` returns.
    pub fn scalar(&self, sql: &str) -> String {
        self.psql(sql)
    }

    /// A number a query in `db` returns (0 for NULL).
    pub fn number_in(&self, db: &str, sql: &str) -> i64 {
        let text = self.psql_in(db, sql);
        if text.is_empty() {
            return 0;
        }
        text.parse()
            .unwrap_or_else(|_| panic!("{sql:?} returned {text:?}, not a number"))
    }

    /// A new empty database (from `template1`, so with
    /// `pg_stat_statements`); its name.
    pub fn fresh_database(&self) -> String {
        let name = crate::unique("db").replace('-', "_");
        self.psql(&format!("CREATE DATABASE {name}"));
        name
    }

    /// A role that can log in (with `password` over TCP when the server
    /// asks for one), with more attributes (`"NOCREATEDB"`, …) in `attrs`.
    pub fn create_role(&self, name: &str, password: Option<&str>, attrs: &str) {
        let password = password
            .map(|p| format!(" PASSWORD {}", quote_literal(p)))
            .unwrap_or_default();
        self.psql(&format!("CREATE ROLE {name} LOGIN{password} {attrs}"));
    }

    /// `pg_terminate_backend` of every client connection but the one
    /// asking (in every database); how many.
    pub fn terminate_backends(&self) -> usize {
        self.terminate_backends_where("")
    }

    /// `pg_terminate_backend` of every client connection to database `db`
    /// (on a shared server: the other tests' sessions live on); how many.
    pub fn terminate_backends_in(&self, db: &str) -> usize {
        self.terminate_backends_where(&format!(" AND datname = {}", quote_literal(db)))
    }

    fn terminate_backends_where(&self, and: &str) -> usize {
        self.number_in(
            "postgres",
            &format!(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE backend_type = 'client backend' AND pid <> pg_backend_pid(){and}"
            ),
        ) as usize
    }

    /// Client connections to database `db`, less the one asking.
    pub fn connections_to(&self, db: &str) -> usize {
        self.number_in(
            "postgres",
            &format!(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' \
                 AND pid <> pg_backend_pid() AND datname = {}",
                quote_literal(db)
            ),
        ) as usize
    }

    /// The WAL insert position, in bytes from the start.
    pub fn wal_position(&self) -> u64 {
        self.number_in(
            "postgres",
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint",
        ) as u64
    }

    /// WAL written since [`wal_position`](Self::wal_position) returned
    /// `since` (by every database, and background work).
    pub fn wal_bytes_since(&self, since: u64) -> u64 {
        self.wal_position().saturating_sub(since)
    }

    /// Zero the statement counts ([`statements_in`](Self::statements_in)).
    pub fn reset_statements(&self) {
        if has_pg_stat_statements() {
            self.psql("SELECT pg_stat_statements_reset()");
        } else {
            self.psql("SELECT pg_stat_reset()");
        }
    }

    /// Statements run in database `db` since the last
    /// [`reset_statements`](Self::reset_statements), by
    /// `pg_stat_statements` (`BEGIN` and `COMMIT` count), less the
    /// harness's own; without that extension, the transactions committed
    /// there (`pg_stat_database.xact_commit`, a lower bound).
    pub fn statements_in(&self, db: &str) -> u64 {
        let sql = if has_pg_stat_statements() {
            format!(
                "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements s \
                 JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = {} \
                 AND s.query NOT LIKE '%pg_stat%' AND s.query NOT LIKE '%pg_backend_pid%'",
                quote_literal(db)
            )
        } else {
            // The statistics collector reports with a delay.
            self.psql("SELECT pg_stat_force_next_flush()");
            format!(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = {}",
                quote_literal(db)
            )
        };
        self.number_in("postgres", &sql) as u64
    }

    /// Statements by text in database `db` since the last reset, most
    /// called first: `(calls, query)`. Empty without `pg_stat_statements`.
    pub fn statement_counts_in(&self, db: &str) -> Vec<(u64, String)> {
        if !has_pg_stat_statements() {
            return Vec::new();
        }
        self.query_in(
            "postgres",
            &format!(
                "SELECT s.calls, regexp_replace(s.query, '\\s+', ' ', 'g') \
                 FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid \
                 WHERE d.datname = {} AND s.query NOT LIKE '%pg_stat%' ORDER BY 1 DESC",
                quote_literal(db)
            ),
        )
        .into_iter()
        .filter_map(|row| Some((row.first()?.parse().ok()?, row[1..].join("|"))))
        .collect()
    }

    /// `pg_total_relation_size` of `table` (qualified if need be) in `db`:
    /// the heap, its indexes and TOAST, in bytes.
    pub fn table_size_in(&self, db: &str, table: &str) -> u64 {
        self.number_in(
            db,
            &format!("SELECT pg_total_relation_size({})", quote_literal(table)),
        ) as u64
    }

    /// CPU time the server's processes have used: the live ones', and
    /// what the postmaster has reaped of exited backends.
    pub fn cpu_time(&self) -> Duration {
        let Some(pm) = self.pid() else {
            return Duration::ZERO;
        };
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        let mut ticks = 0;
        for pid in self.pids() {
            if let Some(fields) = stat_fields(pid) {
                // utime, stime (fields 14 and 15, 1-based).
                ticks +=
                    fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0);
                if pid == pm {
                    // cutime, cstime.
                    ticks +=
                        fields.get(13).copied().unwrap_or(0) + fields.get(14).copied().unwrap_or(0);
                }
            }
        }
        Duration::from_millis(ticks * 1000 / hz)
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        // A paused server dies on SIGKILL as well.
        self.kill();
        if self.owned {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `postgres://user[:password]@host:port/db`.
fn url(host: &str, port: u16, db: &str, password: Option<&str>) -> String {
    match password {
        Some(p) => format!("postgres://postgres:{p}@{host}:{port}/{db}"),
        None => format!("postgres://postgres@{host}:{port}/{db}"),
    }
}

/// `'text'`, quotes doubled.
pub fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The numeric fields of `/proc/<pid>/stat` after the command name (from
/// field 3, the state, which reads as 0), or `None` if it is gone.
fn stat_fields(pid: u32) -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    Some(
        rest.split_whitespace()
            .map(|f| f.parse().unwrap_or(0))
            .collect(),
    )
}

/// The state letter and parent of `pid`.
fn state_and_parent(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut rest = stat[stat.rfind(')')? + 2..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Live children of `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| matches!(state_and_parent(pid), Some((s, p)) if p == parent && s != 'Z'))
        .collect()
}

/// Until none of `pids` runs (a zombie no longer holds anything).
fn wait_gone(pids: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while pids
        .iter()
        .any(|&p| matches!(state_and_parent(p), Some((s, _)) if s != 'Z' && s != 'X'))
    {
        assert!(
            Instant::now() < deadline,
            "server processes {pids:?} linger"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A `pgbouncer` in transaction mode in front of a [`PostgresServer`]:
/// every transaction may run on a different server connection, so session
/// state (LISTEN, advisory locks, prepared statements before 1.21) does
/// not carry over.
pub struct PgBouncer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    password: Option<String>,
}

impl PgBouncer {
    /// Transaction mode, at most `pool_size` server connections per
    /// database and user.
    pub fn start(server: &PostgresServer, pool_size: u32) -> Self {
        let port = free_port();
        let dir = fresh_dir(&format!(
            "lock-test-pgbouncer-{}-{port}",
            std::process::id()
        ));
        let password = server.options.password.clone();
        let (auth_type, users) = match &password {
            Some(p) => ("scram-sha-256", format!("\"postgres\" \"{p}\"\n")),
            None => ("trust", "\"postgres\" \"\"\n".to_string()),
        };
        std::fs::write(dir.join("users.txt"), users).expect("pgbouncer users");
        let ini = format!(
            "[databases]\n\
             * = host=127.0.0.1 port={server_port}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = {auth_type}\n\
             auth_file = {dir}/users.txt\n\
             pool_mode = transaction\n\
             default_pool_size = {pool_size}\n\
             max_client_conn = 1000\n\
             server_reset_query =\n\
             ignore_startup_parameters = extra_float_digits\n\
             logfile = {dir}/pgbouncer.log\n\
             admin_users = postgres\n",
            server_port = server.port,
            dir = dir.display(),
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).expect("pgbouncer.ini");
        for f in ["users.txt", "pgbouncer.ini"] {
            give_to_server_user(&dir.join(f));
        }
        let mut cmd = as_server_user("pgbouncer");
        cmd.arg(dir.join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = spawn_tied(cmd).expect(
            "cannot start pgbouncer: install it (scripts/install-postgres.sh does) or put it on PATH",
        );
        let mut bouncer = PgBouncer {
            child: Some(child),
            port,
            dir,
            password,
        };
        bouncer.wait_ready();
        bouncer
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("pgbouncer exited ({status}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "pgbouncer on port {} did not come up:\n{}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }

    /// The URL of the `postgres` database through the pooler.
    pub fn url(&self) -> String {
        self.url_for("postgres")
    }

    /// The URL of database `db` through the pooler.
    pub fn url_for(&self, db: &str) -> String {
        url("127.0.0.1", self.port, db, self.password.as_deref())
    }

    /// SIGKILL it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
