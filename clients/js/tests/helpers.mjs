// Shared by the package's tests: paths, the idem binary, temporary directories, and a SQLite
// table the tools under test write to (through the sqlite3 CLI, so the tool's effect is a real
// row in a real file, beside idem's own records when they share it).
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, isAbsolute, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const pkg = resolve(dirname(fileURLToPath(import.meta.url)), "..");
/** The repository: where this package sits in a checkout, or $IDEM_REPO (the tests run beside an installed package). */
export const repo = process.env.IDEM_REPO ? resolve(process.env.IDEM_REPO) : resolve(pkg, "..", "..");

/** target/debug/idem under $CARGO_TARGET_DIR or the repository (cargo build -p idem-cli), or $IDEM_BIN. */
export function idemBinary() {
  if (process.env.IDEM_BIN) return process.env.IDEM_BIN;
  let target = process.env.CARGO_TARGET_DIR || join(repo, "target");
  if (!isAbsolute(target)) target = join(repo, target);
  const bin = join(target, "debug", "idem");
  if (!existsSync(bin)) throw new Error(`no idem binary at ${bin}: cargo build -p idem-cli, or set IDEM_BIN`);
  return bin;
}

export function tmp(t) {
  const dir = mkdtempSync(join(tmpdir(), "idem-node-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** `idem inspect KEY --store URL`'s output. */
export function inspect(key, store) {
  return execFileSync(idemBinary(), ["inspect", key, "--store", store], { encoding: "utf8" });
}

function sql(file, statement) {
  return execFileSync("sqlite3", ["-cmd", ".timeout 10000", file, statement], { encoding: "utf8" }).trim();
}

/** A table of effects in `file`: add(customer) inserts one row, count() counts them. */
export function rows(file) {
  sql(file, "CREATE TABLE IF NOT EXISTS effects (id INTEGER PRIMARY KEY, customer TEXT NOT NULL)");
  return {
    add: (customer) => sql(file, `INSERT INTO effects (customer) VALUES ('${customer.replaceAll("'", "''")}')`),
    count: () => Number(sql(file, "SELECT count(*) FROM effects")),
  };
}

export const REDIS = "redis://127.0.0.1:6379/?durability=volatile";
export const postgres = (schema) => `postgres://postgres@127.0.0.1:5432/test?schema=${schema}`;

/**
 * A payment service on loopback: POST /charges counts one charge and answers its id. The
 * effect the agent tests count is a real request to it, not a constant.
 */
export async function chargeService(t) {
  const { createServer } = await import("node:http");
  const charges = [];
  const server = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      const charge = { id: `ch_${charges.length + 1}`, ...JSON.parse(body || "{}") };
      charges.push(charge);
      res.writeHead(201, { "content-type": "application/json" }).end(JSON.stringify(charge));
    });
  });
  await new Promise((ok) => server.listen(0, "127.0.0.1", ok));
  t.after(() => new Promise((ok) => server.close(ok)));
  const url = `http://127.0.0.1:${server.address().port}/charges`;
  return {
    charges,
    /** One charge, through the network. */
    charge: async (args) => {
      const res = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(args) });
      return res.json();
    },
  };
}

/**
 * Holds a tool call in flight: `hold()` (in the tool) resolves `inside` and waits for `release()`,
 * so a duplicate meets the first call still running.
 */
export function gate() {
  let release;
  const held = new Promise((ok) => (release = ok));
  let entered;
  const inside = new Promise((ok) => (entered = ok));
  return {
    inside,
    release,
    hold: async () => {
      entered();
      await held;
    },
  };
}
