// Loads the native module built by scripts/build-native.mjs (npm's install script).
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);

function load() {
  try {
    return require("./idem_node.node");
  } catch (e) {
    throw new Error(
      `idem-runtime: the native module idem_node.node could not be loaded (${e.message}). ` +
        "It is built when the package is installed; run `npm rebuild idem-runtime` " +
        "(or `node scripts/build-native.mjs` in clients/js), which needs a Rust toolchain.",
      { cause: e },
    );
  }
}

export const native = load();
