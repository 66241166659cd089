// The scope of a run, thread or task, carried on AsyncLocalStorage through every await, and
// serialisable so a worker (worker_threads, another process) derives the same keys.
import { AsyncLocalStorage } from "node:async_hooks";

import { ScopeMissingError } from "./errors.js";

const context = new AsyncLocalStorage();

/** A scope id: the run, thread, task or business id that, with the arguments, makes a key. */
export class Scope {
  constructor(id) {
    if (typeof id !== "string" || id === "" || !id.isWellFormed()) {
      throw new TypeError(`a scope is a non-empty string (a run, thread, task or order id), not ${JSON.stringify(id)}`);
    }
    this.id = id;
    Object.freeze(this);
  }

  /**
   * `{ "format": "idem-scope/v1", "id": id }`, for postMessage, a job payload or an
   * environment variable: the form the Python package writes and reads too, so a scope
   * crosses between the languages.
   */
  toJSON() {
    return { format: "idem-scope/v1", id: this.id };
  }

  /**
   * From `toJSON()`'s value or its JSON text (also the older `{ "idem_scope": id }`), a
   * Scope, or a bare id. Anything else (null, undefined, a number, another object) is
   * refused: a scope named "null" or "[object Object]" would put unrelated runs' intents in
   * one scope.
   */
  static from(value) {
    if (value instanceof Scope) return value;
    if (typeof value === "string") {
      if (value.startsWith("{")) {
        let parsed;
        try {
          parsed = JSON.parse(value);
        } catch {
          return new Scope(value);
        }
        return Scope.from(parsed);
      }
      return new Scope(value);
    }
    if (value && typeof value === "object") {
      // Exactly these members: another member would be a form this code does not know.
      const keys = Object.keys(value).sort().join(",");
      if (keys === "format,id" && value.format === "idem-scope/v1" && typeof value.id === "string") return new Scope(value.id);
      if (keys === "idem_scope" && typeof value.idem_scope === "string") return new Scope(value.idem_scope);
    }
    throw new TypeError(
      `not an idem scope: ${value === undefined ? "undefined" : JSON.stringify(value)}; a scope is a Scope, a non-empty id, or { "format": "idem-scope/v1", "id": "<id>" }`,
    );
  }

  toString() {
    return this.id;
  }
}

/** Runs `fn` with `scope` (a Scope, an id, or a serialised scope) as the current scope. */
export function withScope(scope, fn) {
  return context.run(Scope.from(scope), fn);
}

/** The current scope, or undefined outside any `withScope`. */
export function currentScope() {
  return context.getStore();
}

/**
 * The scope of a call: `given` (a Scope, an id, or a function of the call's arguments that
 * returns one), else the context's. Never invented: a key with a made-up scope would make
 * every retry a new intent.
 */
export function resolveScope(given, args, rest, tool) {
  let s = typeof given === "function" ? given(args, ...rest) : given;
  if (s === undefined || s === null) s = currentScope();
  if (s === undefined || s === null) {
    throw new ScopeMissingError(
      `no scope for a call of ${tool}: pass { scope } when wrapping it, or call it inside withScope(runId, ...) ` +
        "(the run, thread or task id; never a tool-call id alone, which changes when the model asks again)",
    );
  }
  return Scope.from(s);
}
