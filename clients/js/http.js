// What the Express, Fastify and Hono middleware share: the HTTP core (idem-embed's, in Rust)
// opened from `idem serve`'s TOML file and settings given in code, and the replies it makes.
// Every decision a keyed request gets is the core's: these adapters only move a framework's
// request and response in and out (design §3).
import { readFileSync } from "node:fs";

import { ConfigurationError, fromNative } from "./errors.js";
import { native } from "./native.js";

/**
 * Opens the HTTP core: `config` names an `idem serve` TOML file; `store` a store URL (else
 * the file's `store`, else $IDEM_STORE, else sqlite:idem.db); every other option is a
 * top-level setting of that file (`routes`, `anonymous`, `scopeHeaders` or `scope_headers`,
 * `limits`, `timeouts`, `problems`, ...), winning over the file's. Rejects with
 * `ConfigurationError` on a bad setting, `StoreUnavailableError` when the store cannot be
 * opened.
 */
export async function openFront(options = {}) {
  const { config, store, ...settings } = options;
  let file = null;
  if (config !== undefined && config !== null) {
    try {
      file = readFileSync(config, "utf8");
    } catch (e) {
      throw new ConfigurationError(`the config file ${JSON.stringify(String(config))} cannot be read: ${e.message}`);
    }
  }
  const given = Object.keys(settings).length > 0 ? JSON.stringify(snake(settings)) : null;
  let native_;
  try {
    native_ = await native.openHttpFront(file, given, store ?? process.env.IDEM_STORE ?? null);
  } catch (e) {
    throw fromNative(e);
  }
  if (native_.store === "memory:") {
    process.emitWarning(
      "the memory: store keeps every record in this process until its retention ends (about 2 KB a key, not bounded by cacheBytes) and loses them all on a restart, when a retry would run again; it is for tests. A service wants sqlite:PATH or a shared store (docs/middleware.md)",
      { type: "IdemWarning", code: "IDEM_MEMORY_STORE" },
    );
  }
  // Read once: a getter is a call into the native module.
  return { admit: native_.admit.bind(native_), bodyReadMs: native_.bodyReadMs ?? 0, store: native_.store };
}

/** Settings as the file writes them: camelCase names in snake_case (`scopeHeaders`). */
function snake(value) {
  if (Array.isArray(value)) return value.map(snake);
  if (value && typeof value === "object") {
    return Object.fromEntries(
      Object.entries(value).map(([k, v]) => [
        // Problem names in `problems.statuses` stay as written ("key-reused").
        k.includes("-") ? k : k.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`),
        snake(v),
      ]),
    );
  }
  return value;
}

// Headers cross to the core as one string, `name\nvalue\nname\nvalue` (no field name or
// value may hold a line feed: HTTP forbids it, Node refuses it), each value one byte per
// character (Node's own decoding of header bytes), so no byte is reinterpreted; one string
// crosses where an array of them cost a crossing per element.

/** `[name, value]` pairs (a `Headers`, Object.entries of `getHeaders()`) as the core takes them. */
export function joinHeaders(pairs) {
  const out = [];
  for (const [name, value] of pairs) {
    if (Array.isArray(value)) {
      for (const v of value) out.push(name, String(v));
    } else if (value !== undefined && value !== null) {
      out.push(name, String(value));
    }
  }
  return out.join("\n");
}

/** Node's `rawHeaders` as the core takes them. */
export const joinRaw = (raw) => raw.join("\n");

/** A reply's headers as `[[name, value], ...]`. */
export function pairsOf(joined) {
  const out = [];
  if (!joined) return out;
  const parts = joined.split("\n");
  for (let i = 0; i + 1 < parts.length; i += 2) out.push([parts[i], parts[i + 1]]);
  return out;
}

/** A reply's headers as a flat array for Node's `writeHead` (repeated names kept), with its Content-Length. */
export function nodeHeaders(reply) {
  const out = reply.headers ? reply.headers.split("\n") : [];
  for (let i = 0; i + 1 < out.length; i += 2) {
    if (out[i] === "content-length") {
      out.splice(i, 2);
      i -= 2;
    }
  }
  out.push("content-length", String(reply.body.length));
  return out;
}

/** Node's `getHeaders()` (values strings, numbers or arrays) as the core takes them. */
export function fromNodeHeaders(object) {
  return joinHeaders(Object.entries(object));
}

/** Reads a Node stream into a Buffer of at most `max` bytes, within `ms`. */
export function readStream(stream, max, ms) {
  return new Promise((resolve) => {
    const chunks = [];
    let size = 0;
    let timer = null;
    const done = (v) => {
      clearTimeout(timer);
      stream.removeListener("data", onData);
      stream.removeListener("end", onEnd);
      stream.removeListener("error", onError);
      resolve(v);
    };
    const onData = (chunk) => {
      size += chunk.length;
      if (size > max) done({ tooLarge: true });
      else chunks.push(chunk);
    };
    const onEnd = () => done({ body: Buffer.concat(chunks) });
    const onError = (e) => done({ error: e });
    if (ms) timer = setTimeout(() => done({ timeout: true }), ms);
    stream.on("data", onData);
    stream.once("end", onEnd);
    stream.once("error", onError);
  });
}

/** The reply to a body that could not be buffered (`keyed`: an admission's). */
export function bodyRefusal(keyed, front, outcome) {
  if (outcome.tooLarge) return keyed.bodyFailed("too_large");
  if (outcome.timeout) return keyed.bodyFailed("timeout", null, front.bodyReadMs);
  return keyed.bodyFailed("unreadable", String(outcome.error?.message ?? outcome.error));
}

/**
 * Claims a keyed request's key: on this thread for an inline one (a memory: store, a route
 * that does not wait), else off the event loop unless the completed-record cache holds the
 * replay. Resolves to { reply } (send it) or { execution, maxResponse, inline }.
 */
export function begin(admission, body) {
  if (admission.inline) return admission.keyed.beginNow(body);
  const reply = admission.keyed.replay(body);
  return reply ? { reply } : admission.keyed.begin(body);
}

/** Keeps the handler's response (`begun`: what `begin` answered): on this thread for a memory: store, else off the event loop. */
export function finish(begun, status, headers, body) {
  return begun.inline ? begun.execution.finishNow(status, headers, body) : begun.execution.finish(status, headers, body);
}

/**
 * Reads a Node request's body without consuming it: chunks are read as they arrive, and once
 * the message is complete the whole body is put back (`unshift`) in the same tick the stream
 * would have ended (Node checks for "one last unshift" before it emits `end`), so whoever
 * reads the request next (a body parser, @hono/node-server's Request) reads it as if
 * untouched (with `putBack: false`, it is not put back). Resolves to { body } | { tooLarge } |
 * { timeout } | { gone } (the client left).
 */
export function readNodeBody(req, max, ms, { putBack = true } = {}) {
  return new Promise((resolve) => {
    const chunks = [];
    let size = 0;
    let timer = null;
    const done = (v) => {
      clearTimeout(timer);
      req.removeListener("readable", onReadable);
      req.removeListener("error", onGone);
      req.removeListener("aborted", onGone);
      resolve(v);
    };
    const onReadable = () => {
      let chunk;
      while ((chunk = req.read()) !== null) {
        size += chunk.length;
        if (size > max) return done({ tooLarge: true });
        chunks.push(chunk);
      }
      if (req.complete) {
        const body = chunks.length === 1 ? chunks[0] : Buffer.concat(chunks);
        if (putBack && body.length > 0) req.unshift(body);
        done({ body });
      }
    };
    const onGone = () => done({ gone: true });
    if (ms) timer = setTimeout(() => done({ timeout: true }), ms);
    req.on("readable", onReadable);
    req.once("error", onGone);
    req.once("aborted", onGone);
  });
}

/**
 * Watches a held response's connection (`res`: Node's ServerResponse): when it closes before
 * the handler completed the response (the client left), the handler is still given the
 * route's lease to complete it (a retry then gets it replayed); past that the execution is
 * settled as unknown, so a response that never completes (an event stream whose client left)
 * does not keep its key in flight for as long as the process lives. Returns `settle()`, true
 * for the first caller only: the adapter calls it before it finishes the execution, and
 * leaves the execution alone when it answers false.
 */
export function watchClose(res, begun) {
  let settled = false;
  let timer = null;
  const settle = () => {
    if (settled) return false;
    settled = true;
    clearTimeout(timer);
    res.removeListener("close", onClose);
    return true;
  };
  const onClose = () => {
    if (settled) return;
    timer = setTimeout(() => {
      if (settle()) Promise.resolve(begun.execution.unknown()).catch(() => {});
    }, begun.leaseMs);
    timer.unref?.();
  };
  res.once("close", onClose);
  return settle;
}
