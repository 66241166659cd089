// Builds the native module (crate idem-node, this directory's Cargo.toml) with cargo and copies
// the library to idem_node.node, where index.js loads it. `npm install` runs this (the package's
// "install" script), also for `npm install ./clients/js`, which links this folder.
//
// It builds in the Cargo workspace this package sits in, so it needs a Rust toolchain and the
// repository around it. CARGO_TARGET_DIR is honoured (cargo reads it); the profile is release,
// or IDEM_NODE_PROFILE (e.g. `dev`, for a quick build while working on the crate).
import { spawnSync } from "node:child_process";
import { copyFileSync, renameSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = join(dirname(fileURLToPath(import.meta.url)), "..");
const profile = process.env.IDEM_NODE_PROFILE || "release";
const cargo = process.env.CARGO || "cargo";
const args = ["build", "--profile", profile, "-p", "idem-node", "--message-format=json-render-diagnostics"];

const run = spawnSync(cargo, args, {
  cwd: here,
  stdio: ["ignore", "pipe", "inherit"],
  encoding: "utf8",
  maxBuffer: 256 * 1024 * 1024,
});
if (run.error) {
  console.error(`idem-runtime: could not run ${cargo} (${run.error.message}); install Rust (https://rustup.rs) and retry`);
  process.exit(1);
}
if (run.status !== 0) {
  console.error(`idem-runtime: \`${cargo} ${args.join(" ")}\` failed in ${here}`);
  process.exit(run.status ?? 1);
}

let library = null;
for (const line of run.stdout.split("\n")) {
  if (!line.startsWith("{")) continue;
  const msg = JSON.parse(line);
  if (msg.reason === "compiler-artifact" && msg.target?.name === "idem_node" && msg.target.kind.includes("cdylib")) {
    library = msg.filenames.find((f) => /\.(so|dylib|dll)$/.test(f));
  }
}
if (!library) {
  console.error("idem-runtime: cargo built no idem_node library (see its output above)");
  process.exit(1);
}
// Copied under a temporary name and renamed: a process that has the old module loaded keeps it.
const dest = join(here, "idem_node.node");
copyFileSync(library, `${dest}.tmp`);
renameSync(`${dest}.tmp`, dest);
console.error(`idem-runtime: built ${dest} (${profile}) from ${library}`);
