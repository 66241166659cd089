// idem-runtime: retry-safe tool calls for Node.js, over idem's Rust engine and stores.
import { DeriveError } from "./errors.js";
import { deriveFromJson } from "./derive.js";

export * from "./errors.js";
export { Scope, withScope, currentScope } from "./scope.js";
export { idempotent, openStore, jsonCodec, DEFAULT_STORE, RETURNED, RAISED } from "./idempotent.js";
export { idemFetch, RetryPolicy } from "./fetch.js";

/**
 * The key of one intent (idem/v1, docs/key-derivation.md), by the Rust derivation.
 * `keyFields` derives it from only the named arguments.
 */
export function deriveKey(scope, tool, args, options) {
  let text;
  try {
    text = JSON.stringify(args);
  } catch (e) {
    throw new DeriveError(`args are not JSON: ${e.message}`);
  }
  if (text === undefined) throw new DeriveError("args are not JSON: undefined");
  return deriveFromJson(String(scope), String(tool), text, options);
}

/** As deriveKey, from JSON text (integers beyond 2^53 in the text are an error, not a rounding). */
export function deriveKeyFromJson(scope, tool, argsJson, options) {
  return deriveFromJson(scope, tool, argsJson, options);
}
