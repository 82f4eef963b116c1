//! A throwaway PostgreSQL server for the demo's `--postgres` variant and
//! its test: `initdb` in a temporary directory, then `postgres` on a port
//! of [`server_port`], killed and its directory removed on drop.
//!
//! PostgreSQL refuses to run as root: when this process is root, `initdb`
//! and `postgres` run as the `postgres` system user (the Debian packages
//! create it), and the temporary directory is made its own.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::spawn::{server_port, spawn_tied, stop_child_with};

/// A `postgres` server with trust authentication on 127.0.0.1, `fsync`
/// off (nothing in it outlives the demo).
pub struct TempPostgres {
    child: Option<Child>,
    port: u16,
    /// Holds `data/`, the unix socket and `server.log`.
    dir: PathBuf,
}

impl TempPostgres {
    /// Start one; `Ok(None)` if the server binaries are not installed
    /// ([`bin_dir`]).
    ///
    /// The port is picked free, then handed to `postgres`: if another
    /// program took it in between, the server exits and this tries again
    /// on another.
    pub fn start() -> io::Result<Option<TempPostgres>> {
        let Some(bin) = bin_dir() else {
            return Ok(None);
        };
        let user = server_user()?;
        let mut server = TempPostgres {
            child: None,
            port: 0,
            dir: fresh_dir(user)?,
        };
        let mut initdb = as_user(bin.join("initdb"), user);
        initdb
            .arg("-D")
            .arg(server.data_dir())
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8"])
            .args(["--locale=C", "--no-sync", "--no-instructions"]);
        let out = initdb.output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "initdb failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let mut attempt = 1;
        loop {
            match server.spawn(&bin, user) {
                Err(e) if attempt < 3 => {
                    tracing::debug!(error = %e, "postgres did not start; trying another port");
                    attempt += 1;
                }
                Err(e) => return Err(e),
                Ok(()) => return Ok(Some(server)),
            }
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn spawn(&mut self, bin: &Path, user: Option<(u32, u32)>) -> io::Result<()> {
        // An earlier attempt that never became ready.
        self.stop();
        self.port = server_port()?;
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("server.log"))?;
        let mut cmd = as_user(bin.join("postgres"), user);
        cmd.arg("-D").arg(self.data_dir());
        for setting in [
            "listen_addresses=127.0.0.1".to_owned(),
            format!("port={}", self.port),
            format!("unix_socket_directories={}", self.dir.display()),
            "fsync=off".to_owned(),
            "full_page_writes=off".to_owned(),
            "max_connections=200".to_owned(),
            "shared_buffers=64MB".to_owned(),
            "dynamic_shared_memory_type=posix".to_owned(),
            "huge_pages=off".to_owned(),
            "log_min_messages=warning".to_owned(),
        ] {
            cmd.arg("-c").arg(setting);
        }
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        self.child = Some(spawn_tied(cmd)?);
        self.wait_ready()
    }

    /// Until `postmaster.pid` names our postmaster and says `ready` (it
    /// writes that once it accepts connections, so it holds the port).
    fn wait_ready(&mut self) -> io::Result<()> {
        let limit = Duration::from_secs(30);
        let deadline = Instant::now() + limit;
        let pidfile = self.data_dir().join("postmaster.pid");
        let Some(pid) = self.child.as_ref().map(|c| c.id().to_string()) else {
            return Err(io::Error::other("postgres is not running"));
        };
        loop {
            let ready = std::fs::read_to_string(&pidfile).is_ok_and(|s| {
                s.lines().next() == Some(pid.as_str())
                    && s.lines().nth(7).map(str::trim) == Some("ready")
            });
            if ready {
                return Ok(());
            }
            let exited = match self.child.as_mut() {
                Some(child) => child.try_wait()?,
                None => None,
            };
            if let Some(status) = exited {
                self.child = None;
                return Err(io::Error::other(format!(
                    "postgres on port {} exited at start-up ({status}): {}",
                    self.port,
                    self.log_tail()
                )));
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "postgres on port {} was not ready within {limit:?}: {}",
                    self.port,
                    self.log_tail()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The last lines of the server's log, for error messages.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(5)..].join("\n")
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl TempPostgres {
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Immediate shutdown: the postmaster stops its backends, then
            // exits (a SIGKILL would leave them to notice on their own).
            #[cfg(unix)]
            let signal = libc::SIGQUIT;
            #[cfg(not(unix))]
            let signal = 3;
            stop_child_with(&mut child, signal, Duration::from_secs(5));
        }
    }
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Where `initdb` and `postgres` are: `LOCK_TEST_PG_BIN` (as for the test
/// suite), else the newest `/usr/lib/postgresql/<version>/bin` (Debian's
/// layout, not on `PATH`), else a directory on `PATH` that has both.
pub fn bin_dir() -> Option<PathBuf> {
    let has_both = |d: &Path| d.join("initdb").exists() && d.join("postgres").exists();
    if let Some(dir) = std::env::var_os("LOCK_TEST_PG_BIN").map(PathBuf::from) {
        return has_both(&dir).then_some(dir);
    }
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            has_both(&bin).then_some((version, bin))
        })
        .max_by_key(|(version, _)| *version);
    if let Some((_, bin)) = newest {
        return Some(bin);
    }
    std::env::split_paths(&std::env::var_os("PATH")?).find(|d| has_both(d))
}

/// The uid and gid the server runs as: the `postgres` user's when this
/// process is root, else `None` (as ourselves).
#[cfg(unix)]
fn server_user() -> io::Result<Option<(u32, u32)>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    // SAFETY: getpwnam returns null or a pointer into static storage, read
    // at once, before any other call that could overwrite it.
    let pw = unsafe { libc::getpwnam(c"postgres".as_ptr()) };
    if pw.is_null() {
        return Err(io::Error::other(
            "this runs as root and PostgreSQL refuses root: create a `postgres` user \
             (the Debian packages do)",
        ));
    }
    // SAFETY: non-null, as checked.
    Ok(Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) }))
}

#[cfg(not(unix))]
fn server_user() -> io::Result<Option<(u32, u32)>> {
    Ok(None)
}

/// `program` run as `user` (if any), from `/`: that user may not be able
/// to read our working directory.
fn as_user(program: PathBuf, user: Option<(u32, u32)>) -> Command {
    let mut cmd = Command::new(program);
    #[cfg(unix)]
    if let Some((uid, gid)) = user {
        use std::os::unix::process::CommandExt;
        cmd.uid(uid).gid(gid);
    }
    #[cfg(not(unix))]
    let _ = user;
    cmd.current_dir("/");
    cmd
}

/// A new directory under the temp dir, owned by the server's user.
fn fresh_dir(user: Option<(u32, u32)>) -> io::Result<PathBuf> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static SERIAL: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "flash-sale-postgres-{}-{}",
        std::process::id(),
        SERIAL.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    #[cfg(unix)]
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid))?;
    }
    #[cfg(not(unix))]
    let _ = user;
    Ok(dir)
}
