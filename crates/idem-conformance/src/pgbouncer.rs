//! A private PgBouncer for tests: its own process on a free loopback port, pooling the
//! shared PostgreSQL (127.0.0.1:5432 unless `IDEM_TEST_POSTGRES_ADDR` says otherwise, trust
//! authentication) in transaction or session mode, with its configuration in a directory of
//! its own.
//!
//! One per mode per test process ([`PgBouncer::shared`]), started on first use. PgBouncer
//! refuses to run as root, so it runs as the `postgres` user when the tests run as root. A
//! watchdog shell stops it when the test process ends, since a process-wide value is never
//! dropped. Without `pgbouncer` on PATH the tests that need it skip, unless
//! `IDEM_REQUIRE_SERVICES=1`.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How PgBouncer hands server connections to clients (its `pool_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolMode {
    /// A server connection per transaction: nothing may outlive one.
    Transaction,
    /// A server connection per client session.
    Session,
    /// Transaction mode told to drop the `options` startup parameter silently
    /// (`ignore_startup_parameters = options`): the settings idem sends never arrive.
    TransactionIgnoringOptions,
}

impl PoolMode {
    fn pool_mode(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction | PoolMode::TransactionIgnoringOptions => "transaction",
        }
    }
}

/// A PgBouncer [`PgBouncer::shared`] started, or why it could not.
type Started = (PoolMode, Result<PgBouncer, String>);

/// The roles a test may connect through PgBouncer as (its `auth_file`; authentication is
/// `trust`): `postgres`, and [`PROBE_ROLE`].
const USERS: &str = "\"postgres\" \"\"\n\"idem_probe\" \"\"\n";

/// A role a test makes on the server for itself, with settings of its own (`ALTER ROLE`),
/// which the other tests must not see.
pub const PROBE_ROLE: &str = "idem_probe";

/// A running PgBouncer; stopped and its directory removed when dropped.
#[derive(Debug)]
pub struct PgBouncer {
    child: Child,
    /// The loopback port it listens on.
    pub port: u16,
    dir: PathBuf,
}

/// The PostgreSQL server the tests' PgBouncers pool.
pub fn postgres_addr() -> String {
    std::env::var("IDEM_TEST_POSTGRES_ADDR").unwrap_or_else(|_| "127.0.0.1:5432".to_owned())
}

impl PgBouncer {
    /// Starts one in `mode` in front of the shared server ([`postgres_addr`]), or says why it
    /// cannot.
    pub fn start(mode: PoolMode) -> Result<PgBouncer, String> {
        Self::start_in_front_of(mode, &postgres_addr())
    }

    /// Starts one in `mode` in front of the server at `pg` (`host:port`), or says why it
    /// cannot.
    pub fn start_in_front_of(mode: PoolMode, pg: &str) -> Result<PgBouncer, String> {
        TcpStream::connect(pg).map_err(|e| format!("no PostgreSQL at {pg}: {e}"))?;
        let (pg_host, pg_port) = pg.rsplit_once(':').unwrap_or((pg, "5432"));
        let port = free_port()?;
        let dir = std::env::temp_dir().join(format!(
            "idem-pgbouncer-{}-{port}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let ignore = match mode {
            PoolMode::TransactionIgnoringOptions => "extra_float_digits, options",
            PoolMode::Transaction | PoolMode::Session => "extra_float_digits",
        };
        let config = format!(
            "[databases]\n* = host={pg_host} port={pg_port}\n\n[pgbouncer]\n\
             listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {users}\npool_mode = {pool_mode}\n\
             max_client_conn = 1000\ndefault_pool_size = 20\nmin_pool_size = 0\n\
             ignore_startup_parameters = {ignore}\nlog_connections = 0\nlog_disconnections = 0\n\
             server_login_retry = 1\n",
            users = dir.join("users.txt").display(),
            pool_mode = mode.pool_mode(),
        );
        let ini = dir.join("pgbouncer.ini");
        let written = std::fs::write(dir.join("users.txt"), USERS)
            .and_then(|()| std::fs::write(&ini, config))
            .and_then(|()| readable_by_all(&dir));
        if let Err(e) = written {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(format!("{}: {e}", dir.display()));
        }
        let mut cmd = Command::new("pgbouncer");
        if is_root() {
            // PgBouncer will not run as root.
            cmd.args(["-u", "postgres"]);
        }
        let child = cmd
            .arg(&ini)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(format!("cannot run pgbouncer: {e}"));
            }
        };
        let mut bouncer = PgBouncer { child, port, dir };
        watchdog(bouncer.child.id(), &bouncer.dir);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = bouncer.child.try_wait() {
                return Err(format!("pgbouncer exited at start: {status}"));
            }
            if Instant::now() > deadline {
                return Err(format!("pgbouncer did not listen on 127.0.0.1:{port}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(bouncer)
    }

    /// The one PgBouncer in `mode` of this test process, started on first use; its port.
    pub fn shared(mode: PoolMode) -> Result<u16, String> {
        static RUNNING: OnceLock<Mutex<Vec<Started>>> = OnceLock::new();
        let mut running = RUNNING
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some((_, found)) = running.iter().find(|(m, _)| *m == mode) {
            return found.as_ref().map(|b| b.port).map_err(Clone::clone);
        }
        let started = PgBouncer::start(mode);
        let port = started.as_ref().map(|b| b.port).map_err(Clone::clone);
        running.push((mode, started));
        port
    }

    /// A store URL for database `test` through this PgBouncer's `port`.
    pub fn url(port: u16) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/test")
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

pub(crate) fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// Lets the `postgres` user read the directory and its files (they are a test's, with no
/// secret: trust authentication).
fn readable_by_all(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    for entry in std::fs::read_dir(dir)? {
        std::fs::set_permissions(entry?.path(), std::fs::Permissions::from_mode(0o644))?;
    }
    Ok(())
}

/// Stops process `pid` and removes `dir` once this test process has ended (while it runs,
/// the value that started them cleans up when dropped).
pub(crate) fn watchdog(pid: u32, dir: &std::path::Path) {
    let me = std::process::id();
    let script = format!(
        "while kill -0 {me} 2>/dev/null && kill -0 {pid} 2>/dev/null; do sleep 0.5; done; \
         if ! kill -0 {me} 2>/dev/null; then kill -9 {pid} 2>/dev/null; rm -rf '{}'; fi",
        dir.display()
    );
    let _ = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}
