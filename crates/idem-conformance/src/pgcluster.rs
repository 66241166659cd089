//! A private PostgreSQL primary and streaming standby for failover tests, each on a free
//! loopback port, in a directory of their own: `initdb`, then `pg_basebackup -R` for the
//! standby. The shared server on 5432 allows no replication connections and is not touched.
//!
//! PostgreSQL will not run as root, so when the tests run as root every command runs as the
//! `postgres` OS user (`runuser`). [`Cluster::crash_primary`] stops every process of the
//! primary at once (SIGSTOP, then SIGKILL: no backend finishes a commit after the postmaster
//! died), as a machine that loses power would; [`Cluster::promote`] promotes the standby. A
//! watchdog stops both servers and removes the directory once the test process ends;
//! dropping the [`Cluster`] does the same at once.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::pgbouncer::{is_root, watchdog};

/// How the primary replicates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// `synchronous_standby_names` empty: a commit does not wait for the standby.
    Asynchronous,
    /// `synchronous_standby_names = '*'`: a commit with `synchronous_commit = on` waits for
    /// the standby to flush it. Given on the primary's command line only, so the promoted
    /// standby does not wait for a standby it does not have.
    Synchronous,
}

/// A primary and its standby.
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    /// The primary's port.
    pub primary: u16,
    /// The standby's port.
    pub standby: u16,
    primary_down: bool,
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// Runs `program args` as the `postgres` user when this process is root.
fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let mut cmd = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", program]);
        c
    } else {
        Command::new(program)
    };
    let out = cmd
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {args:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A PostgreSQL program from the installed server's own directory (`pg_config --bindir`),
/// or the one on PATH.
fn program(name: &str) -> String {
    Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .map(|dir| Path::new(&dir).join(name))
        .filter(|p| p.exists())
        .map_or_else(|| name.to_owned(), |p| p.display().to_string())
}

impl Cluster {
    /// Makes and starts a primary and a standby streaming from it. Takes a few seconds.
    pub fn start(replication: Replication) -> Result<Cluster, String> {
        let dir = std::env::temp_dir().join(format!(
            "idem-pgcluster-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut cluster = Cluster {
            dir,
            primary: free_port()?,
            standby: free_port()?,
            primary_down: false,
        };
        cluster.make(replication)?;
        Ok(cluster)
    }

    fn make(&mut self, replication: Replication) -> Result<(), String> {
        let dir = self.dir.display().to_string();
        if is_root() {
            let out = Command::new("chown")
                .args(["-R", "postgres:", &dir])
                .output()
                .map_err(|e| format!("chown: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "chown postgres {dir}: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        let primary = self.dir.join("primary").display().to_string();
        let standby = self.dir.join("standby").display().to_string();
        run(
            &program("initdb"),
            &["-D", &primary, "-U", "postgres", "-A", "trust", "--no-sync"],
        )?;
        let sync = match replication {
            Replication::Asynchronous => "",
            // Quoted: pg_ctl hands the options to a shell, which would expand `*`.
            Replication::Synchronous => " -c 'synchronous_standby_names=*'",
        };
        self.pg_ctl_start(&primary, self.primary, sync)?;
        // The watchdog holds the postmaster's pid; the standby's gets its own below.
        self.watch(&primary);
        run(
            &program("pg_basebackup"),
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &self.primary.to_string(),
                "-U",
                "postgres",
                "-D",
                &standby,
                "-R",
                "-X",
                "stream",
                "--no-sync",
            ],
        )?;
        self.pg_ctl_start(&standby, self.standby, "")?;
        self.watch(&standby);
        // Streaming before the test starts: the standby is attached to the primary.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let attached = self.psql(
                self.primary,
                "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'",
            )?;
            if attached.trim() == "1" {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err("the standby did not start streaming within 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn pg_ctl_start(&self, data: &str, port: u16, extra: &str) -> Result<(), String> {
        let options = format!(
            "-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={dir} \
             -c fsync=on -c wal_level=replica -c max_wal_senders=4 -c max_connections=100 \
             -c shared_buffers=16MB -c wal_writer_delay=200ms{extra}",
            dir = self.dir.display()
        );
        let log = format!("{data}.log");
        run(
            &program("pg_ctl"),
            &[
                "-D", data, "-l", &log, "-w", "-t", "30", "-o", &options, "start",
            ],
        )
        .map(drop)
    }

    fn watch(&self, data: &str) {
        if let Some(pid) = postmaster_pid(data) {
            watchdog(pid, &self.dir);
        }
    }

    /// Runs `sql` on the server at `port` with psql; its unaligned output.
    pub fn psql(&self, port: u16, sql: &str) -> Result<String, String> {
        run(
            &program("psql"),
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-Atc",
                sql,
            ],
        )
    }

    /// The store URL naming both servers, primary first, that connects to whichever is
    /// writable.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
            self.primary, self.standby
        )
    }

    /// Every process of the primary stopped, then killed, at once: nothing it had not
    /// flushed (and, asynchronously, sent) survives.
    pub fn crash_primary(&mut self) -> Result<(), String> {
        let data = self.dir.join("primary").display().to_string();
        let pid = postmaster_pid(&data).ok_or("no postmaster.pid for the primary")?;
        let mut pids = vec![pid];
        pids.extend(children(pid));
        let list: Vec<String> = pids.iter().map(u32::to_string).collect();
        for signal in ["-STOP", "-KILL"] {
            let _ = Command::new("kill")
                .arg(signal)
                .args(&list)
                .stderr(Stdio::null())
                .status();
        }
        self.primary_down = true;
        Ok(())
    }

    /// Stops (SIGSTOP) or resumes (SIGCONT) the primary's WAL sender: the standby then lags
    /// as across a slow or broken link. While it is stopped, an asynchronous primary goes on
    /// acknowledging commits the standby never receives; a synchronous one makes them wait.
    /// (Stopping the standby's receiver instead loses nothing: what was sent waits in its
    /// socket and is read after.)
    pub fn stall_replication(&self, stalled: bool) -> Result<(), String> {
        let data = self.dir.join("primary").display().to_string();
        let pid = postmaster_pid(&data).ok_or("no postmaster.pid for the primary")?;
        let sender = children(pid)
            .into_iter()
            .find(|child| {
                std::fs::read_to_string(format!("/proc/{child}/cmdline"))
                    .is_ok_and(|c| c.contains("walsender"))
            })
            .ok_or("the primary has no WAL sender")?;
        let signal = if stalled { "-STOP" } else { "-CONT" };
        let _ = Command::new("kill")
            .args([signal, &sender.to_string()])
            .status();
        Ok(())
    }

    /// Promotes the standby and waits until it accepts writes.
    pub fn promote(&self) -> Result<(), String> {
        let answer = self.psql(self.standby, "SELECT pg_promote(true, 30)")?;
        if answer.trim() == "t" {
            Ok(())
        } else {
            Err(format!("pg_promote answered {answer:?}"))
        }
    }
}

fn postmaster_pid(data: &str) -> Option<u32> {
    std::fs::read_to_string(Path::new(data).join("postmaster.pid"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

fn children(pid: u32) -> Vec<u32> {
    Command::new("ps")
        .args(["-o", "pid=", "--ppid", &pid.to_string()])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (name, down) in [("standby", false), ("primary", self.primary_down)] {
            if down {
                continue;
            }
            let data = self.dir.join(name).display().to_string();
            let _ = run(
                &program("pg_ctl"),
                &["-D", &data, "-m", "immediate", "-w", "stop"],
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
