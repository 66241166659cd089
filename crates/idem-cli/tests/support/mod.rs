//! What the end-to-end tests of `idem serve` share: the real binary started on loopback, and
//! (from idem-gateway's own tests, so both suites send the same traffic) a small upstream in
//! the test process that counts how often it really executes, and a client.
// Each test binary uses part of this.
#![allow(dead_code, unreachable_pub)]
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

#[path = "../../../idem-gateway/tests/support/traffic.rs"]
mod traffic;
pub use traffic::*;

pub struct Gateway {
    pub child: Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub db: PathBuf,
    _dir: tempfile::TempDir,
}

impl Listens for Gateway {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Gateway {
    /// Sends the gateway SIGTERM (a graceful stop), as an orchestrator would.
    pub fn terminate(&self) {
        let killed = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(killed.success());
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start_gateway(upstream: &str, extra_config: &str) -> Gateway {
    start_gateway_limited(upstream, extra_config, None)
}

/// With `file_size_kib`, the gateway runs under `ulimit -f`: writes past that size fail with
/// EFBIG, as on a full disk (SIGXFSZ is ignored so the write fails instead of killing it).
pub fn start_gateway_limited(
    upstream: &str,
    extra_config: &str,
    file_size_kib: Option<u32>,
) -> Gateway {
    spawn_gateway(
        upstream,
        &format!("{CONFIG}\n{extra_config}"),
        file_size_kib,
        None,
        &[],
    )
}

/// A gateway configured by `config` alone (TOML text), not [`CONFIG`].
pub fn start_gateway_with(upstream: &str, config: &str) -> Gateway {
    spawn_gateway(upstream, config, None, None, &[])
}

/// A gateway on a shared store (postgres://..., redis://...).
pub fn start_gateway_on(upstream: &str, extra_config: &str, store: &str) -> Gateway {
    spawn_gateway(
        upstream,
        &format!("{CONFIG}\n{extra_config}"),
        None,
        Some(store),
        &[],
    )
}

/// A gateway configured as [`start_gateway`]'s, with these environment variables (`OTEL_*`).
pub fn start_gateway_env(upstream: &str, env: &[(&str, &str)]) -> Gateway {
    spawn_gateway(upstream, CONFIG, None, None, env)
}

fn spawn_gateway(
    upstream: &str,
    config_text: &str,
    file_size_kib: Option<u32>,
    store: Option<&str>,
    env: &[(&str, &str)],
) -> Gateway {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let db = dir.path().join("idem.db");
    let store = store.map_or_else(|| format!("sqlite:{}", db.display()), str::to_owned);
    let config = dir.path().join("idem.toml");
    std::fs::write(&config, config_text).unwrap_or_else(|e| panic!("{e}"));
    let mut command = match file_size_kib {
        None => Command::new(env!("CARGO_BIN_EXE_idem")),
        Some(kib) => {
            let mut c = Command::new("bash");
            c.arg("-c")
                .arg(format!("trap '' XFSZ; ulimit -f {kib}; exec \"$0\" \"$@\""))
                .arg(env!("CARGO_BIN_EXE_idem"))
                // Every refused request logs an error; hundreds of them are noise here.
                .env("IDEM_LOG", "off");
            c
        }
    };
    let mut child = command
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--upstream",
            upstream,
        ])
        .arg("--store")
        .arg(&store)
        .arg("--config")
        .arg(&config)
        .env("TEST_ADMIN_TOKEN", ADMIN_TOKEN)
        .envs(env.iter().copied())
        .env_remove("IDEM_STORE")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn idem serve: {e}"));
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .unwrap_or_else(|e| panic!("{e}"));
    // "idem serve: listening on A; admin on B; ..."
    let addr_after = |marker: &str| -> SocketAddr {
        let rest = line
            .split(marker)
            .nth(1)
            .unwrap_or_else(|| panic!("no {marker:?} in {line:?}"));
        let text = rest.split(';').next().unwrap_or("").trim();
        text.parse().unwrap_or_else(|e| panic!("{text:?}: {e}"))
    };
    let (addr, admin) = (addr_after("listening on "), addr_after("admin on "));
    Gateway {
        child,
        addr,
        admin,
        db,
        _dir: dir,
    }
}
