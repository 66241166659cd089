// idem as Express middleware (Express 5 and 4): a service's own keyed endpoints executed at
// most once per Idempotency-Key, decided by the same HTTP core as `idem serve` and the Rust
// tower layer (design §3).
//
//   import express from "express";
//   import { idempotency } from "idem-runtime/express";
//   const app = express();
//   app.use(await idempotency({ config: "idem.toml" }));   // before any body parser
//
// Mount it before body parsers (express.json(), multer): a keyed request's body is buffered
// here to be fingerprinted, then handed back to the stream unread, so they parse it as they
// would have. The handler's response is buffered (up to max_response_bytes) and sent once
// stored. Store calls run off the event loop. A response Express makes of a thrown error (its
// 500 page) is a response, and is kept; a response that never completes (the process dies)
// leaves the key abandoned, never released; one whose client left is waited for for the
// route's lease, then marked unknown (watchClose).
//
// Mounted under a path (app.use("/api", idempotency(...)), a Router), its routes are matched
// below the mount, as Express routes there.
import { ServerResponse } from "node:http";

import { ConfigurationError } from "./errors.js";
import { openFront, fromNodeHeaders, joinRaw, nodeHeaders, bodyRefusal, begin, finish, readNodeBody, watchClose } from "./http.js";

/** Resolves to the middleware; rejects at once on a bad setting or a store that cannot be opened. */
export async function idempotency(options = {}) {
  const front = await openFront(options);
  return function idempotencyMiddleware(req, res, next) {
    handle(front, req, res, next).catch(next);
  };
}

async function handle(front, req, res, next) {
  // Under a mount (app.use("/api", ...), a Router's use), Express routes what follows the
  // mount (req.url), and so do the routes here, as Express's users write paths there; the
  // fingerprint covers the whole target (req.originalUrl), so one key sent under two mounts
  // is two requests.
  const whole = req.originalUrl ?? req.url;
  const mounted = req.baseUrl ? req.url : undefined;
  if (mounted !== undefined) announceMount(req.baseUrl);
  const admission = front.admit(req.method, whole, joinRaw(req.rawHeaders), mounted);
  if (admission.kind === "pass") return next();
  if (admission.kind === "reply") return send(res, admission.reply);
  if (req._body || req.readableEnded) {
    throw new ConfigurationError(
      "idempotency() must come before body parsers (express.json(), multer, ...): this request's body was already read, so it cannot be fingerprinted",
    );
  }
  const outcome = await readNodeBody(req, admission.maxBody, front.bodyReadMs);
  if (outcome.gone) return;
  if (!outcome.body) return send(res, bodyRefusal(admission.keyed, front, outcome));
  const begun = await begin(admission, outcome.body);
  if (begun.reply) return send(res, begun.reply);
  capture(res, begun);
  next();
}

/** Where a response being held keeps its state (see `hold`). */
const held = Symbol("idem.held");

/**
 * Holds the handler's response: nothing reaches the socket until it is stored. `writeHead`,
 * `write` and `end` are taken over, on the responses' shared prototype, once: a response
 * marked `held` buffers, any other goes on as before.
 * Overriding them on each response object instead gave every response a shape of its own,
 * and the property lookups of Node's and Express's code on it went megamorphic: a new key
 * cost twice the bare handler's CPU, nearly all of it in V8's inline-cache misses.
 */
function capture(res, begun) {
  // Node's ServerResponse.prototype, the base of every app's `app.response`: a sub-app mounted
  // with app.use("/api", sub) sets its own prototype on the response and gives the parent's
  // back when it hands an error on, so a patch on one app's prototype missed the parent's
  // error page (a key then in flight for ever). Express's prototypes do not define these.
  patch(ServerResponse.prototype);
  res[held] = { begun, chunks: [], size: 0, tooLarge: false, limit: begun.maxResponse, settle: watchClose(res, begun) };
}

/** The mounts this process has said it protects below, once each (see `announceMount`). */
const announced = new Set();

/**
 * Says once, on stderr, where a mounted middleware's routes are matched: relative to the mount,
 * as Express routes there, so `[[routes]] path = "/v1/charges"` under `app.use("/api", ...)`
 * protects `/api/v1/charges`. Express tells a middleware its mount only on a request.
 */
function announceMount(base) {
  if (announced.has(base)) return;
  announced.add(base);
  console.error(`idem-runtime: mounted at ${base}: its routes are matched below it (a route /v1/charges protects ${base}/v1/charges)`);
}

function patch(proto) {
  if (Object.prototype.hasOwnProperty.call(proto, held)) return;
  const { writeHead, write, end } = proto;
  Object.defineProperty(proto, held, { value: null, writable: true });
  proto.writeHead = function (status, message, headers) {
    if (!this[held]) return writeHead.apply(this, arguments);
    this.statusCode = status;
    const given = typeof message === "object" ? message : headers;
    if (Array.isArray(given)) {
      for (let i = 0; i + 1 < given.length; i += 2) this.setHeader(given[i], given[i + 1]);
    } else if (given) {
      for (const [name, value] of Object.entries(given)) this.setHeader(name, value);
    }
    return this;
  };
  proto.write = function (chunk, encoding, cb) {
    const h = this[held];
    if (!h) return write.apply(this, arguments);
    add(h, chunk, encoding);
    if (typeof encoding === "function") encoding();
    else if (typeof cb === "function") cb();
    return true;
  };
  proto.end = function (chunk, encoding, cb) {
    const h = this[held];
    if (!h) return end.apply(this, arguments);
    add(h, chunk, encoding);
    this[held] = null;
    // The client left and the lease ran out: the execution was settled as unknown.
    if (!h.settle()) return end.call(this);
    const done = typeof chunk === "function" ? chunk : typeof encoding === "function" ? encoding : cb;
    const body = h.chunks.length === 1 ? h.chunks[0] : Buffer.concat(h.chunks);
    const kept = h.tooLarge
      ? h.begun.execution.failed()
      : finish(h.begun, this.statusCode, fromNodeHeaders(this.getHeaders()), body);
    Promise.resolve(kept).then(
      (reply) => {
        for (const name of this.getHeaderNames()) this.removeHeader(name);
        send(this, reply, done);
      },
      (e) => this.destroy(e),
    );
    return this;
  };
}

function add(h, chunk, encoding) {
  if (chunk === undefined || chunk === null || typeof chunk === "function") return;
  const b = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk, typeof encoding === "string" ? encoding : "utf8");
  h.size += b.length;
  if (h.size > h.limit) h.tooLarge = true;
  else h.chunks.push(b);
}

function send(res, reply, done) {
  res.writeHead(reply.status, nodeHeaders(reply));
  res.end(reply.body, done);
}
