//! Child processes that never outlive the demo: a temporary `redis-server`
//! and the service instances (the temporary PostgreSQL server is in
//! [`super::temp_postgres`]).
//!
//! Each child is killed when its handle is dropped (also while a panic
//! unwinds) and, on Linux, by the kernel when the parent dies
//! (`PR_SET_PDEATHSIG`), so a demo killed with SIGKILL leaves nothing
//! behind either.

use std::io;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Start `cmd` so that the child gets SIGKILL when this process dies.
///
/// The parent-death signal fires when the *thread* that forked exits, so
/// every child is forked by one thread that lives as long as the process.
pub fn spawn_tied(cmd: Command) -> io::Result<Child> {
    use std::sync::mpsc;
    use std::sync::{Mutex, OnceLock};
    type Job = (Command, mpsc::Sender<io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("child-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    tie_to_parent(&mut cmd);
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("cannot start the child-spawner thread");
        Mutex::new(tx)
    });
    let (tx, rx) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, tx))
        .map_err(|_| io::Error::other("child-spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| io::Error::other("child-spawner thread is gone"))?
}

#[cfg(target_os = "linux")]
fn tie_to_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: between fork and exec only async-signal-safe calls (prctl,
    // getppid, kill), no allocation, no locks.
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            // The parent died before prctl took effect.
            if libc::getppid() != parent {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn tie_to_parent(_cmd: &mut Command) {}

/// A TCP port on 127.0.0.1 that nobody listens on right now.
pub fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A port for a server this process starts: one from the range
/// `LOCK_TEST_PORTS` names (`lo-hi`), which the test suite gives each test
/// binary it runs beside others so that no two pick the same port; else
/// any free one.
pub fn server_port() -> io::Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::OnceLock;
    static START: OnceLock<u32> = OnceLock::new();
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let Ok(range) = std::env::var("LOCK_TEST_PORTS") else {
        return free_port();
    };
    let bounds = range
        .split_once('-')
        .and_then(|(lo, hi)| {
            Some((
                lo.trim().parse::<u16>().ok()?,
                hi.trim().parse::<u16>().ok()?,
            ))
        })
        .filter(|(lo, hi)| lo <= hi);
    let Some((lo, hi)) = bounds else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("LOCK_TEST_PORTS={range:?}: expected `lo-hi`, e.g. 10000-15000"),
        ));
    };
    let span = u32::from(hi - lo) + 1;
    // Picks of one process step through the range from a random start, so
    // two of them never meet.
    let start = *START.get_or_init(|| fastrand::u32(..span));
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = lo + ((start + n) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(io::Error::other(format!(
        "no free port in LOCK_TEST_PORTS={range}"
    )))
}

/// Ask a child to stop with SIGTERM, give it `grace` to exit, then kill it.
pub fn stop_child(child: &mut Child, grace: Duration) {
    #[cfg(unix)]
    let signal = libc::SIGTERM;
    #[cfg(not(unix))]
    let signal = 15;
    stop_child_with(child, signal, grace);
}

/// Send a child `signal` (Unix only), give it `grace` to exit, then kill it.
pub fn stop_child_with(child: &mut Child, signal: i32, grace: Duration) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    #[cfg(unix)]
    // SAFETY: plain syscall on the pid of a child we have not reaped yet.
    unsafe {
        libc::kill(child.id() as libc::pid_t, signal);
    }
    #[cfg(not(unix))]
    let _ = signal;
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A `redis-server` in a temporary directory on a free port
/// ([`server_port`]), without persistence. Killed and its directory
/// removed on drop.
pub struct TempRedis {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl TempRedis {
    /// Start one if `redis-server` is on `PATH`; `Ok(None)` if it is not.
    ///
    /// The port is picked free, then handed to `redis-server`: if another
    /// program took it in between, this tries again on another.
    pub fn start() -> io::Result<Option<TempRedis>> {
        let mut attempt = 1;
        loop {
            match Self::start_once() {
                Err(e) if attempt < 3 => {
                    tracing::debug!(error = %e, "redis-server did not start; trying another port");
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    fn start_once() -> io::Result<Option<TempRedis>> {
        let port = server_port()?;
        let dir =
            std::env::temp_dir().join(format!("flash-sale-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = match spawn_tied(cmd) {
            Ok(child) => child,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let _ = std::fs::remove_dir_all(&dir);
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let mut redis = TempRedis { child, port, dir };
        redis.wait_ready()?;
        Ok(Some(redis))
    }

    fn wait_ready(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let client = redis::Client::open(self.url()).map_err(io::Error::other)?;
        loop {
            if let Ok(mut con) = client.get_connection_with_timeout(Duration::from_secs(1)) {
                if let Ok(info) = redis::cmd("INFO").arg("server").query::<String>(&mut con) {
                    // Ours, not another server that took the port first.
                    let ours = format!("process_id:{}", self.child.id());
                    if info.lines().any(|l| l.trim() == ours) {
                        return Ok(());
                    }
                    return Err(io::Error::other(format!(
                        "port {} is taken by another redis-server",
                        self.port
                    )));
                }
            }
            if let Some(status) = self.child.try_wait()? {
                return Err(io::Error::other(format!(
                    "redis-server exited at start-up ({status})"
                )));
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "redis-server on port {} did not answer within 10 s",
                    self.port
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for TempRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How to start the service instances as processes.
#[derive(Debug, Clone)]
pub struct InstanceSpec {
    /// The `flash-sale` binary (the demo passes `current_exe()`, the test
    /// `CARGO_BIN_EXE_flash-sale`).
    pub exe: PathBuf,
    /// Where stock, orders and locks live: a `redis://` URL, or a
    /// `postgres://` one (passed as `--database-url`).
    pub url: String,
    /// Take the lock (`false` adds `--unsafe`).
    pub locked: bool,
    /// `--race-delay-ms`.
    pub race_delay: Duration,
    /// `RUST_LOG` of the children when the caller has none set.
    pub log: String,
    /// Start the first instance with `--pause-before-write`.
    pub pause_first: bool,
}

/// Service instances running as separate processes (`flash-sale serve`).
/// Stopped with SIGTERM by [`Instances::stop`], killed on drop.
pub struct Instances {
    children: Vec<(String, Child)>,
    urls: Vec<String>,
    // Kept open so a late write to stdout never meets a closed pipe.
    _stdouts: Vec<tokio::process::ChildStdout>,
}

impl Instances {
    /// Start `n` instances named `flash-1`, `flash-2`, …, and wait until
    /// each answers `GET /health`.
    ///
    /// Each one listens on a port the OS picks (`--port 0`) and says which
    /// on its first line of stdout, so two programs can never race for the
    /// same port.
    pub async fn start(spec: &InstanceSpec, n: usize) -> io::Result<Instances> {
        use tokio::io::AsyncBufReadExt;
        let limit = Duration::from_secs(30);
        let mut instances = Instances {
            children: Vec::new(),
            urls: Vec::new(),
            _stdouts: Vec::new(),
        };
        for i in 1..=n {
            let name = format!("flash-{i}");
            let mut cmd = serve_command(spec, &name);
            if spec.pause_first && i == 1 {
                cmd.arg("--pause-before-write");
            }
            let mut child = spawn_tied(cmd)?;
            let stdout = child.stdout.take().expect("stdout is piped");
            instances.children.push((name.clone(), child));
            let mut stdout =
                tokio::io::BufReader::new(tokio::process::ChildStdout::from_std(stdout)?);
            let mut line = String::new();
            let read = tokio::time::timeout(limit, stdout.read_line(&mut line)).await;
            let url = match read {
                Ok(Ok(_)) => line.trim().strip_prefix("listening on ").map(str::to_owned),
                _ => None,
            };
            let Some(url) = url else {
                return Err(io::Error::other(format!(
                    "instance {name} did not say where it listens (got {line:?}); see its log above"
                )));
            };
            instances.urls.push(url);
            instances._stdouts.push(stdout.into_inner());
        }
        instances.wait_healthy(limit).await?;
        Ok(instances)
    }

    /// The process id of instance `i` (from 0).
    pub fn pid(&self, i: usize) -> u32 {
        self.children[i].1.id()
    }

    /// Base URLs, one per instance.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    async fn wait_healthy(&mut self, limit: Duration) -> io::Result<()> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .map_err(io::Error::other)?;
        let deadline = Instant::now() + limit;
        for i in 0..self.urls.len() {
            loop {
                let url = format!("{}/health", self.urls[i]);
                if let Ok(r) = http.get(&url).send().await {
                    if r.status().is_success() {
                        break;
                    }
                }
                let (name, child) = &mut self.children[i];
                if let Some(status) = child.try_wait()? {
                    return Err(io::Error::other(format!(
                        "instance {name} exited at start-up ({status})"
                    )));
                }
                if Instant::now() > deadline {
                    return Err(io::Error::other(format!(
                        "instance {name} did not answer {url} within {limit:?}"
                    )));
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }
        Ok(())
    }

    /// SIGTERM every instance (graceful shutdown), wait for them to exit.
    pub async fn stop(mut self) {
        let mut children = std::mem::take(&mut self.children);
        let _ = tokio::task::spawn_blocking(move || {
            for (_, child) in &mut children {
                #[cfg(unix)]
                // SAFETY: plain syscall on the pid of an unreaped child.
                unsafe {
                    libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
                }
            }
            for (_, child) in &mut children {
                stop_child(child, Duration::from_secs(5));
            }
        })
        .await;
    }
}

impl Drop for Instances {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn serve_command(spec: &InstanceSpec, name: &str) -> Command {
    let mut cmd = Command::new(&spec.exe);
    cmd.arg("serve")
        .args(["--port", "0"])
        .args(["--instance", name])
        .args([store_flag(&spec.url), &spec.url])
        .args(["--race-delay-ms", &spec.race_delay.as_millis().to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    if !spec.locked {
        cmd.arg("--unsafe");
    }
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", &spec.log);
    }
    cmd
}

/// The `serve` option that takes `url`.
fn store_flag(url: &str) -> &'static str {
    if super::store::is_postgres_url(url) {
        "--database-url"
    } else {
        "--redis-url"
    }
}
