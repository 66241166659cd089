// Key derivation through the native module (Rust idem-keys), with its errors mapped to
// DeriveError / TypeError: one place for index.js, fetch.js and mcp.js.
import { native } from "./native.js";
import { fromNative } from "./errors.js";

/** The key of (scope, tool, arguments as JSON text). */
export function deriveFromJson(scope, tool, argsJson, { ordinal = 0, secret, keyFields } = {}) {
  try {
    return native.deriveKey(scope, tool, argsJson, ordinal, secret === undefined ? undefined : Buffer.from(secret), keyFields);
  } catch (e) {
    throw fromNative(e);
  }
}
