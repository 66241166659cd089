// What the Express, Fastify and Hono middleware share: the HTTP core (idem-embed's, in Rust)
// opened from `idem serve`'s TOML file and settings given in code, and the replies it makes.
// Every decision a keyed request gets is the core's: these adapters only move a framework's
// request and response in and out (design §3).
import { readFileSync } from "node:fs";

import { fromNative } from "./errors.js";
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
    file = readFileSync(config, "utf8");
  }
  const given = Object.keys(settings).length > 0 ? JSON.stringify(snake(settings)) : null;
  try {
    return await native.openHttpFront(file, given, store ?? process.env.IDEM_STORE ?? null);
  } catch (e) {
    throw fromNative(e);
  }
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

/** Header values as the core takes them: strings of one byte per character. */
export function flatHeaders(pairs) {
  const out = [];
  for (const [name, value] of pairs) {
    for (const v of Array.isArray(value) ? value : [value]) {
      if (v === undefined || v === null) continue;
      out.push(String(name).toLowerCase(), String(v));
    }
  }
  return out;
}

/** A flat [name, value, ...] array as [[name, value], ...]. */
export function pairsOf(flat) {
  const out = [];
  for (let i = 0; i + 1 < flat.length; i += 2) out.push([flat[i], flat[i + 1]]);
  return out;
}

/** A reply's headers as an object for Node's `writeHead`, with its Content-Length. */
export function nodeHeaders(reply) {
  const headers = {};
  for (const [name, value] of pairsOf(reply.headers)) {
    if (name === "content-length") continue;
    if (headers[name] === undefined) headers[name] = value;
    else headers[name] = [].concat(headers[name], value);
  }
  headers["content-length"] = String(reply.body.length);
  return headers;
}

/** Node's `getHeaders()` (values strings, numbers or arrays) as a flat array. */
export function fromNodeHeaders(object) {
  return flatHeaders(Object.entries(object));
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

/** The reply to a body that could not be buffered. */
export function bodyRefusal(admission, front, outcome) {
  if (outcome.tooLarge) return admission.bodyFailed("too_large");
  if (outcome.timeout) return admission.bodyFailed("timeout", null, front.bodyReadMs ?? 0);
  return admission.bodyFailed("unreadable", String(outcome.error?.message ?? outcome.error));
}

/** Claims a keyed request's key: on this thread for an inline one (a memory: store, a route that does not wait), else off the event loop. */
export function begin(admission, body) {
  return admission.inline ? admission.beginNow(body) : admission.begin(body);
}

/** Keeps the handler's response: on this thread for a memory: store, else off the event loop. */
export function finish(execution, status, headers, body) {
  return execution.inline ? execution.finishNow(status, headers, body) : execution.finish(status, headers, body);
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
