// The scope of a run, thread or task, carried on AsyncLocalStorage through every await, and
// serialisable so a worker (worker_threads, another process) derives the same keys.
import { AsyncLocalStorage } from "node:async_hooks";

import { ScopeMissingError } from "./errors.js";

const context = new AsyncLocalStorage();

/** A scope id: the run, thread, task or business id that, with the arguments, makes a key. */
export class Scope {
  constructor(id) {
    if (typeof id !== "string" || id === "") {
      throw new TypeError(`a scope is a non-empty string (a run, thread, task or order id), not ${JSON.stringify(id)}`);
    }
    this.id = id;
    Object.freeze(this);
  }

  /** `{ "idem_scope": id }`, for postMessage, a job payload or an environment variable. */
  toJSON() {
    return { idem_scope: this.id };
  }

  /** From `toJSON()`'s value, its JSON text, or a bare id. */
  static from(value) {
    if (value instanceof Scope) return value;
    if (typeof value === "string") {
      if (value.startsWith("{")) return Scope.from(JSON.parse(value));
      return new Scope(value);
    }
    if (value && typeof value === "object" && typeof value.idem_scope === "string") return new Scope(value.idem_scope);
    throw new TypeError(`not a serialised idem scope: ${JSON.stringify(value)}; expected { "idem_scope": "<id>" }`);
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
