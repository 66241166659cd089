// idemFetch: fetch with the Rust tool client's retry semantics (crates/idem-client,
// docs/design.md §7): the key is derived once per intent and sent on every attempt as the
// `Idempotency-Key` header (an RFC 8941 sf-string, or bare on request; in the JSON body's
// `idempotency_key` too only when asked); exponential backoff with full
// jitter; Retry-After honoured; 400/422 and other 4xx never retried; a side-effecting call
// without a key never retried once it may have been sent.
import { deriveFromJson } from "./derive.js";
import { IdemError, KeyDerivationError } from "./errors.js";
import { intentJson } from "./intent.js";
import { resolveScope } from "./scope.js";

/** Attempts, backoff bound (doubling from `baseMs` up to `capMs`), and no attempt started after `maxTotalMs`. */
export const RetryPolicy = Object.freeze({ maxAttempts: 5, baseMs: 100, capMs: 10_000, maxTotalMs: 60_000 });

/** Failure codes that mean the request surely did not reach the server. */
const NOT_SENT = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "UND_ERR_CONNECT"]);

function notSent(err) {
  for (let e = err; e; e = e.cause) {
    if (NOT_SENT.has(e.code)) return true;
  }
  return false;
}

/** Whether a status is worth another attempt (crates/idem-client `retryable_status`). */
export function retryableStatus(status, repeatable) {
  if (status === 429) return true;
  if (status === 409 || status === 503) return repeatable;
  return status >= 500 && repeatable;
}

function retryAfterMs(headers) {
  const v = headers.get("retry-after");
  if (v === null || !/^\s*\d+\s*$/.test(v)) return null; // seconds only; an HTTP date is treated as absent
  return Math.min(Number(v), 86_400) * 1000;
}

/** The wait after `failed` attempts: uniform in [0, bound], but never less than Retry-After. */
export function backoffMs(policy, failed, retryAfter) {
  const bound = Math.min(policy.baseMs * 2 ** (failed - 1), policy.capMs);
  const jitter = bound * Math.random();
  return retryAfter === null ? jitter : Math.max(retryAfter, jitter);
}

/** `key` as an RFC 8941 sf-string (a key is visible ASCII: only `\` and `"` are escaped). */
export const sfString = (key) => `"${key.replace(/[\\"]/g, (c) => `\\${c}`)}"`;

export const sleepMs = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * `fetch(input, init)` for one tool call. `init.idem`: { tool, args, scope, key, ordinal,
 * secret, keyFields, class: "effect" | "idempotent" | "read", retry, onAttempt, keyHeader,
 * keyInBody, and for tests sleep, now, fetch }.
 * An effect gets a key (derived from scope, tool and args unless `key` is given; `key: null`
 * sends it unkeyed), sent as the `Idempotency-Key` header: an RFC 8941 sf-string (`"k"`, as
 * the IETF draft writes it), or with `keyHeader: "bare"` unquoted, for a service that compares
 * raw header values. The body is `args` as JSON; `keyInBody: true` adds `idempotency_key` to
 * it (off by default: a service whose model forbids extra fields would refuse the call).
 * Answers with the last Response (check `ok`); throws when no attempt got an answer.
 */
/**
 * An HTTP call's intent (docs/key-derivation.md, "HTTP requests"): the method, the URL
 * (without its fragment) and the JSON arguments, `{"method","url","args"}`. Two customers'
 * URLs (`/v1/customers/cus_1/charges`, `?customer=cus_2`) with the same arguments are two
 * intents; the Python transports key a request the same way.
 */
export function requestIntent(input, method, args) {
  const url = new URL(typeof input === "string" || input instanceof URL ? String(input) : input.url);
  url.hash = "";
  return intentJson({ method: String(method ?? "POST").toUpperCase(), url: url.href, args }, "request");
}

/**
 * Key fields named over the arguments (`order.id`, `/order/id`), as they stand in
 * `requestIntent`'s object (`args.order.id`, `/args/order/id`), with the method and the URL:
 * a key from some of the arguments is still a key of this request's target.
 */
export function requestKeyFields(fields) {
  if (fields === undefined || fields === null) return fields;
  const list = typeof fields === "string" ? [fields] : fields;
  return ["method", "url", ...list.map((f) => (f.startsWith("/") ? `/args${f}` : `args.${f}`))];
}

/** A `body` given without `idem.args`, as the arguments its key is derived from. */
function bodyArgs(body, tool) {
  if (body === undefined || body === null) return null;
  if (typeof body === "string") {
    try {
      return JSON.parse(body);
    } catch {
      // Not JSON: refused below.
    }
  }
  throw new KeyDerivationError(
    `${tool}: the key is derived from a JSON body, and this body is not one (a form, bytes or a stream); ` +
      "give the JSON as idem.args, or the key as idem.key; nothing was sent",
  );
}

export async function idemFetch(input, init = {}) {
  const { idem = {}, ...rest } = init;
  const cls = idem.class ?? "effect";
  if (!["effect", "idempotent", "read"].includes(cls)) throw new TypeError(`class is effect, idempotent or read, not ${cls}`);
  const keyHeader = idem.keyHeader ?? "sf-string";
  if (keyHeader !== "sf-string" && keyHeader !== "bare") {
    throw new TypeError(`keyHeader is "sf-string" (the key quoted, as the IETF draft writes it) or "bare" (unquoted), not ${JSON.stringify(keyHeader)}`);
  }
  const retry = { ...RetryPolicy, ...(idem.retry ?? {}) };
  const doFetch = idem.fetch ?? globalThis.fetch;
  const sleep = idem.sleep ?? sleepMs;
  const now = idem.now ?? Date.now;
  const tool = idem.tool ?? new URL(String(input)).pathname.split("/").filter(Boolean).pop() ?? "request";
  if (idem.args !== undefined && rest.body !== undefined && rest.body !== null) {
    throw new TypeError("idemFetch: give the request's JSON as idem.args (it is sent as the body and keyed) or as body, not both");
  }

  // The key: once per intent, here, before the first attempt.
  let key = null;
  if (cls === "effect") {
    if (idem.key !== undefined) key = idem.key;
    else {
      // A bodiless request (POST /orders/o_1/cancel) is keyed on its method and URL alone; a
      // body given as `body` is keyed as its JSON, and one that is not JSON is refused: a key
      // that left it out would be one key for every body sent to the URL.
      const args = idem.args !== undefined ? idem.args : bodyArgs(rest.body, tool);
      const scope = resolveScope(idem.scope, args, [], tool);
      key = deriveFromJson(scope.id, tool, requestIntent(input, rest.method, args), {
        ...idem,
        keyFields: requestKeyFields(idem.keyFields),
      });
    }
  }
  const headers = new Headers(rest.headers);
  let body = rest.body;
  if (idem.args !== undefined) {
    const args = idem.keyInBody && key !== null && idem.args && typeof idem.args === "object" && !Array.isArray(idem.args)
      ? { ...idem.args, idempotency_key: key }
      : idem.args;
    body = JSON.stringify(args);
    if (!headers.has("content-type")) headers.set("content-type", "application/json");
  }
  if (key !== null) headers.set("idempotency-key", keyHeader === "bare" ? key : sfString(key));
  const repeatable = key !== null || cls !== "effect";
  const request = { method: "POST", ...rest, headers, body, redirect: "manual" };

  const start = now();
  for (let number = 1; ; number++) {
    let response = null;
    let failure = null;
    try {
      const r = await doFetch(input, request);
      // A body cut off midway is an answer we did not get: the call may have happened.
      const bytes = await r.arrayBuffer();
      response = new Response(r.status === 204 || r.status === 304 ? null : bytes, {
        status: r.status,
        statusText: r.statusText,
        headers: r.headers,
      });
    } catch (e) {
      failure = e;
    }
    let retryAfter = null;
    let again;
    if (response) {
      again = response.status >= 400 && retryableStatus(response.status, repeatable);
      if (again) retryAfter = retryAfterMs(response.headers);
    } else {
      again = repeatable || notSent(failure);
    }
    const delay = again ? backoffMs(retry, number, retryAfter) : 0;
    const giveUp = !again || number >= retry.maxAttempts || now() - start + delay > retry.maxTotalMs;
    idem.onAttempt?.({ tool, key, number, status: response?.status ?? null, error: failure, retryInMs: giveUp ? null : delay });
    if (giveUp) {
      if (response) return response;
      const why = again ? `gave up after ${number} attempts` : "it may have been sent, and an unkeyed effect is not repeated";
      throw new IdemError(`${tool}: no answer (${failure?.cause?.code ?? failure?.message}); ${why}`, { key: key ?? undefined, cause: failure });
    }
    await sleep(delay);
  }
}
