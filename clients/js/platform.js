// Where this machine's native parts come from: the per-platform package npm installed beside
// idem-runtime (one of its optionalDependencies, napi-rs's layout: `os`, `cpu` and `libc` pick
// the one that fits), holding the native module (idem_node.node) and the `idem` binary.
import { createRequire } from "node:module";
import { dirname, join } from "node:path";

const require = createRequire(import.meta.url);

/** The platform packages built for each release (packaging/README.md), by platform id. */
export const PLATFORMS = {
  "linux-x64-gnu": "idem-runtime-linux-x64-gnu",
};

const SOURCE_BUILD =
  "To build from source (needs Rust, https://rustup.rs): in a checkout of the idem repository, " +
  "`cd clients/js && npm install` builds the native module, `cargo build --release -p idem-cli` the " +
  "binary; then `npm install /path/to/idem/clients/js` in your project, and set " +
  "IDEM_BINARY=/path/to/idem/target/release/idem for the `idem` command.";

/**
 * This machine as the platform packages name it: `linux-x64-gnu`, `darwin-arm64`, ... .
 * IDEM_RUNTIME_PLATFORM overrides it (to check what another platform gets).
 */
export function platformId() {
  const forced = process.env.IDEM_RUNTIME_PLATFORM;
  if (forced) return forced;
  const { platform, arch } = process;
  if (platform !== "linux") return `${platform}-${arch}`;
  // glibc reports its version; musl (Alpine) does not. The report is made once, without its
  // network section (which can take seconds to gather).
  if (libc === undefined) {
    if (process.report) process.report.excludeNetwork = true;
    libc = process.report?.getReport?.()?.header?.glibcVersionRuntime ? "gnu" : "musl";
  }
  return `linux-${arch}-${libc}`;
}

let libc;

/** The platform package's name for a platform id, or undefined. */
const packageOf = (id) => (Object.hasOwn(PLATFORMS, id) ? PLATFORMS[id] : undefined);

/** An error naming the platforms that have packages and how to build for this one. */
export function unsupported(what, cause) {
  const id = platformId();
  const built = Object.keys(PLATFORMS).join(", ");
  const why = packageOf(id)
    ? `its package ${packageOf(id)} is not installed (npm skips optional dependencies when asked to: reinstall without --omit=optional or --no-optional)`
    : `no prebuilt package exists for ${id}; prebuilt: ${built}`;
  return new Error(`idem-runtime: ${what} is missing for this machine: ${why}. ${SOURCE_BUILD}`, cause ? { cause } : undefined);
}

/** The installed platform package's directory, or null. */
export function platformDir() {
  const name = packageOf(platformId());
  if (!name) return null;
  try {
    return dirname(require.resolve(`${name}/package.json`));
  } catch {
    return null;
  }
}

/**
 * The size of the binary the installed platform package shipped (its package.json's
 * `idemBinarySize`, written by packaging/build.py), or null: a file of another size was cut
 * short or replaced.
 */
export function expectedBinarySize() {
  const dir = platformDir();
  if (!dir) return null;
  try {
    const size = require(join(dir, "package.json")).idemBinarySize;
    return Number.isInteger(size) ? size : null;
  } catch {
    return null;
  }
}

/** The `idem` binary's path: $IDEM_BINARY, else the platform package's; throws `unsupported`. */
export function binaryPath() {
  if (process.env.IDEM_BINARY) return process.env.IDEM_BINARY;
  const dir = platformDir();
  if (!dir) throw unsupported("the idem binary");
  return join(dir, "bin", process.platform === "win32" ? "idem.exe" : "idem");
}
