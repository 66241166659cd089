// idempotent(fn): an async function made retry-safe. The key is derived (natively, the same
// derivation as idem_key.mjs) from the scope, the tool's name and the arguments; the engine
// (idem-embed, in Rust) claims it, and a repeated call gets the first call's result.
import { native } from "./native.js";
import {
  ConfigurationError,
  DeriveError,
  InFlightError,
  KeyDerivationError,
  KeyMismatchError,
  OutcomeUnknownError,
  ResultTooLargeError,
  StoreUnavailableError,
  ToolArgumentsError,
  fromNative,
} from "./errors.js";
import { intentJson } from "./intent.js";
import { resolveScope } from "./scope.js";
import * as otel from "./otel.js";

/** The argument a model may write a key into: never the key, never part of the intent. */
const KEY_ARGUMENT = "idempotency_key";

function withoutKey(args) {
  const { [KEY_ARGUMENT]: _written, ...rest } = args;
  return rest;
}

/** The CLI's default store (idem_stores::DEFAULT_STORE), so `idem inspect KEY` finds records with no flag. */
export const DEFAULT_STORE = "sqlite:idem.db";

/** Status of a stored return value, and of a kept error (the vocabulary of idem-embed and the Python package). */
export const RETURNED = 200;
export const RAISED = 500;

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** JSON: `undefined` is stored as an empty body and replayed as `undefined`. */
export const jsonCodec = Object.freeze({
  mediaType: "application/json",
  encode: (value) => (value === undefined ? new Uint8Array() : encoder.encode(JSON.stringify(value))),
  decode: (bytes) => (bytes.length === 0 ? undefined : JSON.parse(decoder.decode(bytes))),
});

const stores = new Map();

/** Opens (once per URL per process) the store at `url`. */
export function openStore(url = DEFAULT_STORE) {
  let p = stores.get(url);
  if (!p) {
    p = native.openStore(url).catch((e) => {
      stores.delete(url);
      throw fromNative(e);
    });
    stores.set(url, p);
  }
  return p;
}

function ms(name, value, fallback) {
  const v = value === undefined ? fallback : value;
  if (v === null) return null;
  if (typeof v !== "number" || !Number.isFinite(v) || v < 0) {
    throw new ConfigurationError(`${name} is a number of milliseconds (or null where allowed), not ${String(v)}`);
  }
  return v;
}

function keeper(keepErrors) {
  const kinds = keepErrors ?? [];
  if (!Array.isArray(kinds)) throw new ConfigurationError("keepErrors is a list of error classes or names");
  return {
    keeps: (err) => kinds.some((k) => (typeof k === "function" ? err instanceof k : err?.name === k)),
    /** The listed class of this name, to rebuild a replayed error as (Python's binding does the same). */
    classOf: (name) => kinds.find((k) => typeof k === "function" && k.name === name),
  };
}

/** The error's name, or its class's where the class does not set one (`class Declined extends Error {}`). */
function typeName(err) {
  const name = err?.name;
  if (typeof name === "string" && name !== "" && name !== "Error") return name;
  return typeof err?.constructor?.name === "string" && err.constructor.name !== "" ? err.constructor.name : "Error";
}

function errorBody(err) {
  const message = String(err?.message ?? err);
  return encoder.encode(JSON.stringify({ type: typeName(err), message, args: [message] }));
}

/** A kept error, replayed: an instance of its keepErrors class if one has its name, else an Error of that name. */
function replayError(body, key, classOf) {
  let parsed = {};
  try {
    parsed = JSON.parse(decoder.decode(body));
  } catch {
    // A body not written by a binding: report it as it is.
  }
  const message = parsed.message ?? decoder.decode(body);
  const type = typeof parsed.type === "string" ? parsed.type : "Error";
  const Kind = classOf(type);
  let e = null;
  if (Kind) {
    try {
      e = new Kind(message);
    } catch {
      // A constructor that needs more than the message: fall back to a plain Error of that name.
    }
  }
  if (!(e instanceof Error)) {
    e = new Error(message);
    e.name = type;
  }
  e.idempotencyKey = key;
  e.replayed = true;
  return e;
}

/**
 * Wraps `fn(args, ...rest)`. Options: tool (default fn.name), store (URL, default
 * sqlite:idem.db), scope (Scope | id | (args, ...rest) => scope; default the context's),
 * keyFields, secret, ordinal, lease / retention / wait (ms), onAbandoned, maxResultBytes,
 * keepErrors, codec.
 */
const OPTIONS = new Set([
  "tool", "store", "scope", "keyFields", "secret", "ordinal", "lease", "retention", "wait",
  "onAbandoned", "maxResultBytes", "keepErrors", "codec",
]);

/**
 * The key comes from the first argument only (a tool's `execute(args, options)`: the framework's
 * options, toolCallId and messages, must not be in it), so a call whose first argument is not an
 * arguments object (`pay("cus_1", 4900)`) would replay another call's result: it is refused.
 */
function plainArguments(tool, args) {
  const proto = args !== null && typeof args === "object" ? Object.getPrototypeOf(args) : undefined;
  if (proto === Object.prototype || proto === null) return;
  const what = args == null ? String(args) : Array.isArray(args) ? "an array" : typeof args === "object" ? `a ${args.constructor?.name ?? "class"} instance` : `a ${typeof args}`;
  throw new ToolArgumentsError(
    `${tool}: idempotent(fn) keys a call on its first argument, the tool's arguments object, and ignores the rest ` +
      `(a framework's call options); this call's first argument is ${what}. Call fn({ customer, amount }) with one ` +
      `plain object of every argument that makes the intent (an array or value goes in a member: fn({ items })); nothing ran`,
  );
}

export function idempotent(fn, options = {}) {
  if (typeof fn !== "function") throw new TypeError("idempotent(fn, options) wraps a function");
  const unknown = Object.keys(options).filter((k) => !OPTIONS.has(k));
  if (unknown.length > 0) {
    throw new ConfigurationError(`idempotent: unknown option ${unknown.join(", ")}; the options are ${[...OPTIONS].join(", ")}`);
  }
  const tool = options.tool ?? fn.name;
  if (!tool) throw new ConfigurationError("the function has no name: pass idempotent(fn, { tool: 'charge_card' })");
  if (typeof tool !== "string" || !tool.isWellFormed()) {
    throw new ConfigurationError(`the tool name ${JSON.stringify(tool)} is not a string of Unicode text (a lone surrogate?)`);
  }
  const fields = options.keyFields === undefined ? [] : [].concat(options.keyFields);
  if (fields.some((f) => String(f).replace(/^\//, "").split(/[./]/)[0] === KEY_ARGUMENT)) {
    // The key argument is never part of the intent: keyed on it, every call shares one key.
    throw new ConfigurationError(`keyFields name ${KEY_ARGUMENT}, which is never part of an intent; name the arguments that make it`);
  }
  const codec = options.codec ?? jsonCodec;
  if (typeof codec.encode !== "function" || typeof codec.decode !== "function" || typeof codec.mediaType !== "string") {
    throw new ConfigurationError("a codec is { mediaType, encode(value) -> Uint8Array | string, decode(Uint8Array) -> value }");
  }
  const url = options.store ?? DEFAULT_STORE;
  if (typeof url !== "string") throw new ConfigurationError("store is a URL: memory:, sqlite:PATH, postgres://..., redis://...");
  const keep = keeper(options.keepErrors);
  const ordinal = options.ordinal ?? 0;
  let spec;
  try {
    spec = new native.Tool({
      name: tool,
      leaseMs: ms("lease", options.lease, 30_000),
      retentionMs: ms("retention", options.retention, 24 * 3600_000),
      // undefined: answer "in flight" at once (napi reads null as no value only when undefined).
      waitMs: ms("wait", options.wait, 30_000) ?? undefined,
      onAbandoned: options.onAbandoned ?? "reject",
      maxResultBytes: options.maxResultBytes ?? 1024 * 1024,
      keyFields: options.keyFields,
      secret: options.secret === undefined ? undefined : Buffer.from(options.secret),
    });
  } catch (e) {
    throw fromNative(e);
  }

  let store = null; // the open store, once openStore has answered

  function call(...all) {
    return otel.withToolSpan(tool, all[1], (span) => run(span, all, false));
  }

  /** As `call`, answering `{ value, outcome }`: how the call was answered (see `Outcome`). */
  function callWithOutcome(...all) {
    return otel.withToolSpan(tool, all[1], (span) => run(span, all, true));
  }

  async function run(span, all, withOutcome) {
    let [args, ...rest] = all;
    if (all.length > 0) plainArguments(tool, args);
    // The runtime owns the key: an `idempotency_key` in the arguments (a model writes a new
    // one on each retry, and the same one in another run) is neither the key nor part of the
    // intent; the function is handed the derived key in its place.
    const written = args !== null && typeof args === "object" && Object.hasOwn(args, KEY_ARGUMENT);
    const intent = written ? withoutKey(args) : args;
    let argsJson;
    try {
      argsJson = intentJson(intent ?? null);
    } catch (e) {
      throw new KeyDerivationError(`${tool}: ${e.message}`, { cause: e });
    }
    let key;
    const scope = resolveScope(options.scope, intent, rest, tool);
    let outcome = null;
    try {
      store ??= await openStore(url);
      // A memory: store answers on this thread (no I/O); a store with I/O on libuv's thread
      // pool. A wait for a duplicate in flight goes to a thread of its own, not the pool:
      // waiting there, duplicates could hold every pool thread and starve the first call's
      // finish, the store write that would end their wait.
      if (store.inline) {
        outcome = spec.deriveAndBeginNow(store, scope.id, argsJson, ordinal);
        key = outcome.key;
        if (outcome.kind === "wait") outcome = null;
      } else {
        key = spec.derive(scope.id, argsJson, ordinal);
        outcome = await spec.begin(store, key, argsJson);
        if (outcome.kind === "wait") outcome = null;
      }
      outcome ??= await spec.beginWaiting(store, key, argsJson);
    } catch (e) {
      if (e instanceof StoreUnavailableError) throw Object.assign(e, { key });
      const typed = fromNative(e, key);
      throw typed instanceof DeriveError ? new KeyDerivationError(`${tool}: ${typed.message}; nothing ran`, { key, cause: e }) : typed;
    }
    otel.claimed(span, scope?.id, key);
    if (outcome.kind !== "execute") otel.outcome(span, outcome.kind);
    switch (outcome.kind) {
      case "execute":
        if (written) args = { ...intent, [KEY_ARGUMENT]: key };
        return execute(span, outcome.ticket, key, args, rest, withOutcome);
      case "replayed":
        if (outcome.body == null) {
          throw new ResultTooLargeError(
            `${tool}: the result of key ${key} was ${outcome.omittedLen} bytes, over maxResultBytes, and was kept as a digest only; it cannot be replayed`,
            { key },
          );
        }
        if (outcome.status === RAISED) throw replayError(outcome.body, key, keep.classOf);
        if (!withOutcome) return codec.decode(outcome.body);
        return {
          value: codec.decode(outcome.body),
          outcome: { key, replayed: true, attempts: outcome.attempts, replays: outcome.replays, saved: "stored" },
        };
      case "in_flight":
        throw new InFlightError(`${tool}: another call with key ${key} is running; retry later with the same key`, { key });
      case "mismatch":
        throw new KeyMismatchError(`${tool}: key ${key} was used before with other arguments; nothing ran`, { key });
      case "unknown":
        throw new OutcomeUnknownError(
          `${tool}: an earlier call with key ${key} may have acted but its outcome is unknown, so nothing ran; ` +
            `check whether it took effect, then \`idem resolve ${key} --store URL\``,
          { key },
        );
      default:
        throw new TypeError(`idem-runtime: unexpected answer ${outcome.kind}`);
    }
  }

  async function execute(span, ticket, key, args, rest, withOutcome) {
    let value;
    try {
      value = await fn(args, ...rest);
    } catch (err) {
      // The function's error is what the caller gets; a store failure meanwhile is a warning.
      otel.outcome(span, keep.keeps(err) ? "executed" : "not_sent");
      if (keep.keeps(err)) {
        const body = Buffer.from(errorBody(err));
        await keepOutcome(key, () => (ticket.inline ? ticket.finishNow(RAISED, body, "application/json") : ticket.finish(RAISED, body, "application/json")));
      } else {
        await keepOutcome(key, () => (ticket.inline ? ticket.releaseNow() : ticket.release()));
      }
      throw err;
    }
    let body;
    try {
      const encoded = codec.encode(value);
      body = typeof encoded === "string" ? Buffer.from(encoded) : Buffer.from(encoded.buffer, encoded.byteOffset, encoded.byteLength);
    } catch (err) {
      // The function acted; without its result a retry must not run it again.
      otel.outcome(span, "unknown");
      await keepOutcome(key, () => ticket.unknown());
      throw new TypeError(
        `${tool}: the result could not be encoded (${err.message}), so key ${key} is marked outcome-unknown; use a codec that can encode it`,
        { cause: err },
      );
    }
    otel.outcome(span, "executed");
    const saved = await keepOutcome(key, () => (ticket.inline ? ticket.finishNow(RETURNED, body, codec.mediaType) : ticket.finish(RETURNED, body, codec.mediaType)));
    return withOutcome ? { value, outcome: { key, replayed: false, attempts: 1, replays: 0, saved } } : value;
  }

  /** Finishes the ticket; the function already ran, so a failure here is a warning, not its result. */
  async function keepOutcome(key, finish) {
    let saved;
    try {
      saved = await finish();
    } catch (e) {
      saved = `lost: ${e.message}`;
    }
    if (saved.startsWith("lost")) {
      process.emitWarning(`idem: what ${tool} did (key ${key}) was not recorded (${saved}); a retry may meet an unknown outcome`);
    }
    return saved;
  }

  Object.defineProperty(call, "name", { value: tool });
  call.callWithOutcome = callWithOutcome;
  return call;
}
