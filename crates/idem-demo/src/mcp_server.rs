//! An example MCP server whose tools are deliberately not idempotent: `charge_card` charges
//! again on every call, `send_email` sends again, `get_balance` only reads. Charges and e-mails
//! are rows in a SQLite file, so a test (or a curious reader) counts what really happened.
//!
//! `idem example-mcp --db charges.db` serves it over stdio; `--listen ADDR` over streamable
//! HTTP at `/mcp`. Put `idem mcp` in front and a retried charge is charged once.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData, JsonObject,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler, ServiceExt};
use rusqlite::{Connection, params};
use serde_json::{Value, json};

/// The example server.
#[derive(Debug, Clone)]
pub struct ExampleServer {
    db: Arc<Mutex<Connection>>,
}

impl ExampleServer {
    /// Opens (or creates) the SQLite file that holds charges and e-mails.
    pub fn open(path: &Path) -> Result<Self> {
        let conn = Connection::open(path)
            .with_context(|| format!("cannot open the example database {}", path.display()))?;
        conn.busy_timeout(Duration::from_secs(5))?;
        conn.execute_batch(
            "PRAGMA journal_mode=WAL;
             CREATE TABLE IF NOT EXISTS charges (
               id INTEGER PRIMARY KEY AUTOINCREMENT,
               customer TEXT NOT NULL,
               amount_cents INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS emails (
               id INTEGER PRIMARY KEY AUTOINCREMENT,
               recipient TEXT NOT NULL,
               subject TEXT NOT NULL,
               body TEXT NOT NULL);",
        )?;
        Ok(ExampleServer {
            db: Arc::new(Mutex::new(conn)),
        })
    }

    /// How many charges exist (for tests and the README's walkthrough).
    pub fn count_charges(path: &Path) -> Result<u64> {
        let conn = Connection::open(path)?;
        let n: i64 = conn.query_row("SELECT COUNT(*) FROM charges", [], |r| r.get(0))?;
        Ok(u64::try_from(n).unwrap_or_default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.db.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn charge(&self, args: &JsonObject) -> Result<CallToolResult, ErrorData> {
        let customer = string(args, "customer")?;
        let amount = args
            .get("amount_cents")
            .and_then(Value::as_i64)
            .filter(|a| *a > 0)
            .ok_or_else(|| {
                ErrorData::invalid_params("amount_cents must be a positive integer", None)
            })?;
        let delay = args.get("delay_ms").and_then(Value::as_u64).unwrap_or(0);
        if delay > 0 {
            // A slow payment processor: the charge lands at the end.
            tokio::time::sleep(Duration::from_millis(delay.min(60_000))).await;
        }
        if amount > 1_000_000 {
            // Declined: a tool error, and no charge.
            return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                "card declined: {amount} cents is over the limit"
            ))]));
        }
        let id = {
            let db = self.lock();
            db.execute(
                "INSERT INTO charges (customer, amount_cents) VALUES (?1, ?2)",
                params![customer, amount],
            )
            .map_err(internal)?;
            db.last_insert_rowid()
        };
        Ok(structured(json!({
            "charge_id": format!("ch_{id}"),
            "customer": customer,
            "amount_cents": amount,
        })))
    }

    fn send_email(&self, args: &JsonObject) -> Result<CallToolResult, ErrorData> {
        let to = string(args, "to")?;
        let subject = string(args, "subject")?;
        let body = string(args, "body")?;
        let db = self.lock();
        db.execute(
            "INSERT INTO emails (recipient, subject, body) VALUES (?1, ?2, ?3)",
            params![to, subject, body],
        )
        .map_err(internal)?;
        Ok(structured(
            json!({ "email_id": format!("em_{}", db.last_insert_rowid()), "to": to }),
        ))
    }

    fn balance(&self, args: &JsonObject) -> Result<CallToolResult, ErrorData> {
        let customer = string(args, "customer")?;
        let (charges, total): (i64, i64) = self
            .lock()
            .query_row(
                "SELECT COUNT(*), COALESCE(SUM(amount_cents), 0) FROM charges WHERE customer = ?1",
                params![customer],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(internal)?;
        Ok(structured(json!({
            "customer": customer,
            "charges": charges,
            "total_cents": total,
        })))
    }

    /// Serves on this process's stdin and stdout until the client goes away.
    pub async fn serve_stdio(self) -> Result<()> {
        let running = self
            .serve(rmcp::transport::io::stdio_pipes())
            .await
            .context("the MCP client did not initialize")?;
        let _ = running.waiting().await;
        Ok(())
    }
}

fn string(args: &JsonObject, name: &str) -> Result<String, ErrorData> {
    args.get(name)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| {
            ErrorData::invalid_params(format!("{name} must be a non-empty string"), None)
        })
}

fn internal(e: rusqlite::Error) -> ErrorData {
    ErrorData::internal_error(format!("database error: {e}"), None)
}

/// A result with the JSON both as text (for models) and as structured content.
fn structured(v: Value) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(v.to_string())]);
    r.structured_content = Some(v);
    r
}

fn tool(
    name: &'static str,
    description: &'static str,
    schema: Value,
    hints: ToolAnnotations,
) -> Tool {
    let mut t = Tool::default();
    t.name = name.into();
    t.description = Some(description.into());
    t.input_schema = Arc::new(match schema {
        Value::Object(m) => m,
        _ => JsonObject::new(),
    });
    t.annotations = Some(hints);
    t
}

/// The three tools, with honest annotations.
pub fn tools() -> Vec<Tool> {
    vec![
        tool(
            "charge_card",
            "Charges a customer's card. Every call creates a new charge.",
            json!({
                "type": "object",
                "properties": {
                    "customer": {"type": "string", "description": "Customer id, e.g. cus_8g2k"},
                    "amount_cents": {"type": "integer", "minimum": 1},
                    "delay_ms": {"type": "integer", "minimum": 0, "description": "Simulated processing time"}
                },
                "required": ["customer", "amount_cents"]
            }),
            ToolAnnotations::new()
                .read_only(false)
                .destructive(false)
                .idempotent(false)
                .open_world(true),
        ),
        tool(
            "send_email",
            "Sends an e-mail. Every call sends another one.",
            json!({
                "type": "object",
                "properties": {
                    "to": {"type": "string"},
                    "subject": {"type": "string"},
                    "body": {"type": "string"}
                },
                "required": ["to", "subject", "body"]
            }),
            ToolAnnotations::new()
                .read_only(false)
                .destructive(false)
                .idempotent(false)
                .open_world(true),
        ),
        tool(
            "get_balance",
            "A customer's charges: how many, and their total in cents.",
            json!({
                "type": "object",
                "properties": {"customer": {"type": "string"}},
                "required": ["customer"]
            }),
            ToolAnnotations::new().read_only(true),
        ),
    ]
}

impl ServerHandler for ExampleServer {
    fn get_info(&self) -> ServerConfig {
        let mut config = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        config.server_info =
            rmcp::model::Implementation::new("idem-example-mcp", env!("CARGO_PKG_VERSION"));
        config.instructions =
            Some("An example payment service: charge_card is not idempotent.".into());
        config
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        let result = match request.name.as_ref() {
            "charge_card" => self.charge(&args).await,
            "send_email" => self.send_email(&args),
            "get_balance" => self.balance(&args),
            other => Err(ErrorData::invalid_params(
                format!("no tool named {other}"),
                None,
            )),
        };
        result.map(Into::into)
    }
}
