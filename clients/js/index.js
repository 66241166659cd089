// idem-runtime: retry-safe tool calls for Node.js, over idem's Rust engine and stores.
import { deriveFromJson } from "./derive.js";
import { DeriveError } from "./errors.js";
import { intentJson } from "./intent.js";
import { Scope } from "./scope.js";

export * from "./errors.js";
export { Scope, withScope, currentScope } from "./scope.js";
export { idempotent, openStore, jsonCodec, DEFAULT_STORE, RETURNED, RAISED } from "./idempotent.js";
export { idemFetch, RetryPolicy } from "./fetch.js";

/**
 * The key of one intent (idem/v1, docs/key-derivation.md), by the Rust derivation.
 * `keyFields` derives it from only the named arguments.
 */
export function deriveKey(scope, tool, args, options) {
  if (typeof tool !== "string") throw new TypeError(`deriveKey(scope, tool, args): tool is a string, not ${typeof tool}`);
  // A string is the id itself (the derivation says which are valid); any other form is read
  // as a Scope (`{ format: "idem-scope/v1", id }`, `{ idem_scope }`) or refused: never
  // String(scope), which named every object scope "[object Object]".
  // A string is the id itself, unless it is a serialised scope (JSON.stringify(scope), Python's
  // Scope.dumps()), which is read as one rather than taken for an id.
  const id = typeof scope === "string" && !isSerialisedScope(scope) ? scope : Scope.from(scope).id;
  // napi would turn a lone surrogate into U+FFFD: two scopes, one key.
  if (!id.isWellFormed() || !tool.isWellFormed()) throw new DeriveError("the scope or tool has a lone surrogate, which is not Unicode text");
  let text;
  try {
    text = intentJson(args);
  } catch (e) {
    throw new DeriveError(e.message);
  }
  return deriveFromJson(id, tool, text, options);
}

function isSerialisedScope(text) {
  if (!text.startsWith("{")) return false;
  try {
    Scope.from(JSON.parse(text));
    return true;
  } catch {
    return false;
  }
}

/** As deriveKey, from JSON text (integers beyond 2^53 in the text are an error, not a rounding). */
export function deriveKeyFromJson(scope, tool, argsJson, options) {
  return deriveFromJson(scope, tool, argsJson, options);
}
