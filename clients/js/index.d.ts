// Types of idem-runtime (ESM, Node.js >= 20).

export { DeriveError } from "./idem_key.js";

/** Every error idem itself raises; `key` is the idempotency key, where known. */
export class IdemError extends Error {
  constructor(message: string, options?: { key?: string; cause?: unknown });
  readonly key: string | undefined;
}
/** Another call with this key is running and did not finish within the wait: retry later with the same key. */
export class InFlightError extends IdemError {}
/** An earlier call's outcome is unknown, so nothing ran: check, then `idem resolve KEY --store URL`. */
export class OutcomeUnknownError extends IdemError {}
/** The key was used before with other arguments: nothing ran. */
export class KeyMismatchError extends IdemError {}
/** The store could not be used: nothing ran. */
export class StoreUnavailableError extends IdemError {}
/** No scope was given and none is in context. */
export class ScopeMissingError extends IdemError {}
/** A store URL (unknown scheme, bad parameter), policy value or option is invalid: nothing ran. */
export class ConfigurationError extends IdemError {}
/** No key could be derived from the arguments (not JSON: a BigInt, a cycle; an integer beyond 2^53): nothing ran. */
export class KeyDerivationError extends IdemError {}
/**
 * The call's first argument is not a plain object (an object literal or a null-prototype
 * object): idempotent(fn) keys a call on its first argument only, so it is refused before it runs.
 */
export class ToolArgumentsError extends KeyDerivationError {}
/** The stored result was over `maxResultBytes` and kept as a digest only: it cannot be replayed. */
export class ResultTooLargeError extends IdemError {}

/** A run, thread, task or business id: with the tool and arguments, it makes the key. */
export class Scope {
  constructor(id: string);
  readonly id: string;
  /** The form both languages write and read (Python's `Scope.dumps()`). */
  toJSON(): { format: "idem-scope/v1"; id: string };
  /** From `toJSON()`'s value or its JSON text (also the older `{ idem_scope }`), or a bare id; anything else is a TypeError. */
  static from(value: ScopeLike): Scope;
}
export type ScopeLike = Scope | string | { format: "idem-scope/v1"; id: string } | { idem_scope: string };
/** Runs `fn` with `scope` as the current scope (AsyncLocalStorage: it survives every await). */
export function withScope<T>(scope: ScopeLike, fn: () => T): T;
export function currentScope(): Scope | undefined;

export interface DeriveOptions {
  ordinal?: number;
  secret?: string | Uint8Array;
  /** Derive from these arguments only: names, dotted paths (order.id, items.0.sku) or JSON Pointers. */
  keyFields?: string[];
}
/**
 * The key of one intent (idem/v1, docs/key-derivation.md), by the Rust derivation. A value
 * JSON would not carry as it is (a Set, a Map, a Promise, a class instance, NaN, an invalid
 * Date, bytes, a function) is refused with DeriveError naming where it is, never coerced.
 */
export function deriveKey(scope: ScopeLike, tool: string, args: unknown, options?: DeriveOptions): string;
/** As deriveKey, from JSON text: integers beyond 2^53 in it are an error, not a rounding. */
export function deriveKeyFromJson(scope: string, tool: string, argsJson: string, options?: DeriveOptions): string;

export interface Codec {
  mediaType: string;
  encode(value: unknown): Uint8Array | string;
  decode(bytes: Uint8Array): unknown;
}
export const jsonCodec: Codec;
/** `sqlite:idem.db`, the CLI's default. */
export const DEFAULT_STORE: string;
export const RETURNED: 200;
export const RAISED: 500;

export interface IdempotentOptions<A extends unknown[]> extends Omit<DeriveOptions, "ordinal"> {
  /** The tool's name (default: the function's name); part of every key. */
  tool?: string;
  /** memory:, sqlite:PATH, postgres://..., redis://... (default sqlite:idem.db). */
  store?: string;
  /** The scope, or a function of the call's arguments that returns it (default: the context's). */
  scope?: ScopeLike | ((...args: A) => ScopeLike);
  ordinal?: number;
  /** Claim duration without a heartbeat, in milliseconds (Python's lease is in seconds; default 30 000). */
  lease?: number;
  /** How long a result is replayed, in milliseconds (default 24 h). */
  retention?: number;
  /** How long a duplicate waits for a call in flight, in milliseconds (default 30 000; null: not at all). */
  wait?: number | null;
  /** After a crash mid-call: "reject" (default; OutcomeUnknownError until resolved) or "retry". */
  onAbandoned?: "reject" | "retry";
  /** Larger results are kept as a digest only (default 1 MiB). */
  maxResultBytes?: number;
  /**
   * Errors (classes or names) that are stored and replayed; any other error releases the key.
   * A listed class is rebuilt on replay (matched by name), so `instanceof` holds.
   */
  keepErrors?: Array<(new (...args: any[]) => Error) | string>;
  codec?: Codec;
}
/**
 * Makes `fn` retry-safe: a repeated call with the same scope, tool and arguments gets the first result.
 *
 * Only the FIRST argument is keyed: `fn` is a tool's `execute(args, options)`, and the rest
 * (a framework's call options: toolCallId, messages) are passed through but are not part of
 * the key. The first argument must be a plain object of every argument that makes the intent,
 * `charge({ customer, amount })`; a call whose first argument is anything else (a string, a
 * number, an array, a class instance, null) is refused with `ToolArgumentsError` before it
 * runs, since `pay("cus_1", 4900)` then `pay("cus_1", 9900)` would otherwise replay the first.
 * A call with no arguments at all is keyed as `null`. A value in them that JSON would not carry
 * as it is (a Set, a Map, a Promise, a class instance, NaN, bytes) is refused with
 * `KeyDerivationError` naming where it is.
 *
 * The runtime owns the key: an `idempotency_key` in the arguments (a model writes a new one on
 * each retry) is left out of the intent and never used as the key; `fn` gets the derived key
 * there instead.
 *
 * A thrown error in `keepErrors` is stored and replayed: as an instance of the listed class
 * of its name (built with the stored message), else as an Error of that name.
 */
export function idempotent<A extends unknown[], R>(
  fn: (...args: A) => Promise<R> | R,
  options?: IdempotentOptions<A>,
): IdempotentFunction<A, Awaited<R>>;

/** How one call of an `idempotent()` function was answered (Python's `Outcome`). */
export interface Outcome {
  /** The call's key: the one given, or the one derived (for `idem inspect`). */
  key: string;
  /** true: a stored result (the function did not run); false: this call ran it. */
  replayed: boolean;
  /** How many times an executor took the key (a replay: the record's count; an execution: 1). */
  attempts: number;
  /** How many replays of the result the store had counted when it answered (a store that counts in batches, SQLite or PostgreSQL, may lag). */
  replays: number;
  /** An execution's record: "stored", "released", "unknown" or "lost: <why>" (a replay: "stored"). */
  saved: string;
}

/** An `idempotent()` function: call it as `fn`, or with `callWithOutcome` to learn how it was answered. */
export interface IdempotentFunction<A extends unknown[], R> {
  (...args: A): Promise<R>;
  /** As the function, answering `{ value, outcome }` (for a service that writes `Idempotent-Replayed` itself, or logs the key). */
  callWithOutcome(...args: A): Promise<{ value: R; outcome: Outcome }>;
}

/** An open store (opened once per URL per process). */
export interface Store {
  readonly redacted: string;
}
export function openStore(url?: string): Promise<Store>;

export interface RetryPolicyShape {
  maxAttempts: number;
  baseMs: number;
  capMs: number;
  maxTotalMs: number;
}
/** 5 attempts, 100 ms doubling to 10 s, no attempt started after 60 s. */
export const RetryPolicy: Readonly<RetryPolicyShape>;
export interface Attempt {
  tool: string;
  key: string | null;
  number: number;
  status: number | null;
  error: unknown;
  retryInMs: number | null;
}
export interface IdemFetchOptions extends DeriveOptions {
  tool?: string;
  /** JSON arguments: the body (with `idempotency_key` added under `keyInBody`). */
  args?: unknown;
  /** The header's key quoted as an RFC 8941 sf-string (default), or bare, for a service that compares raw header values. */
  keyHeader?: "sf-string" | "bare";
  /** Also add the key to a JSON object body as `idempotency_key` (default false). */
  keyInBody?: boolean;
  scope?: ScopeLike | ((args: unknown) => ScopeLike);
  /** An explicit key; null sends an effect unkeyed (never repeated once it may have been sent). */
  key?: string | null;
  class?: "effect" | "idempotent" | "read";
  retry?: Partial<RetryPolicyShape>;
  onAttempt?: (attempt: Attempt) => void;
  sleep?: (ms: number) => Promise<void>;
  /** The clock the total bound is measured on (tests). */
  now?: () => number;
  fetch?: typeof fetch;
}
/** fetch with the tool client's retry semantics; answers with the last Response. */
export function idemFetch(input: string | URL, init?: RequestInit & { idem?: IdemFetchOptions }): Promise<Response>;

/** Where an adapter logs idem's refusals no model can fix (default console): console, pino, Mastra's logger. */
export interface AdapterLogger {
  error(message: string, ...rest: unknown[]): void;
}
