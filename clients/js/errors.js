// The typed errors of idem-runtime: the same classes, names and meanings as the Python
// package's, so a tool's caller can tell "retry later" from "ask an operator" from "nothing ran".
import { DeriveError } from "./idem_key.mjs";

export { DeriveError };

/** Every error idem itself raises. `key` is the idempotency key, where known. */
export class IdemError extends Error {
  constructor(message, { key, cause } = {}) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = new.target.name;
    this.key = key;
  }
}

/** Another call with this key is running and did not finish within the wait: retry later with the same key. */
export class InFlightError extends IdemError {}

/** An earlier call with this key may have acted but its outcome is unknown: nothing ran now. */
export class OutcomeUnknownError extends IdemError {}

/** The key was used before with other arguments: nothing ran. */
export class KeyMismatchError extends IdemError {}

/** The store could not be used (opened, read or written): nothing ran. */
export class StoreUnavailableError extends IdemError {}

/** No scope was given and none is in context (`withScope`). */
export class ScopeMissingError extends IdemError {}

/** A store URL, policy value or option is invalid: nothing ran. */
export class ConfigurationError extends IdemError {}

/** No key could be derived from these arguments (not JSON: a BigInt, a cycle; an integer beyond 2^53): nothing ran. */
export class KeyDerivationError extends IdemError {}

/**
 * The call's first argument is not a plain object. idempotent(fn) keys a call on its first
 * argument only (a tool's arguments object); the rest (a framework's call options) are not part
 * of the key, so a positional call would replay another call's result: it is refused instead.
 */
export class ToolArgumentsError extends KeyDerivationError {}

/** The stored result was larger than `maxResultBytes` and was kept as a digest only: it cannot be replayed. */
export class ResultTooLargeError extends IdemError {}

/**
 * Maps an error from the native module ("<kind>: <message>") to a typed one: `store` is a
 * store failure (nothing ran), `derive` a derivation error, `invalid` a bad URL or option.
 */
export function fromNative(e, key) {
  const m = /^(store|derive|invalid): ([\s\S]*)$/.exec(e?.message ?? "");
  if (!m) return e;
  const [, kind, message] = m;
  if (kind === "store") {
    return new StoreUnavailableError(`the idem store could not be used, so the function did not run: ${message}`, { key, cause: e });
  }
  if (kind === "derive") return new DeriveError(message);
  return new ConfigurationError(message, { key, cause: e });
}
