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
// leaves the key abandoned, never released.
import { openFront, fromNodeHeaders, nodeHeaders, bodyRefusal, begin, finish, readNodeBody } from "./http.js";
import { ConfigurationError } from "./errors.js";

/** Resolves to the middleware; rejects at once on a bad setting or a store that cannot be opened. */
export async function idempotency(options = {}) {
  const front = await openFront(options);
  return function idempotencyMiddleware(req, res, next) {
    handle(front, req, res, next).catch(next);
  };
}

async function handle(front, req, res, next) {
  const admission = front.admit(req.method, req.originalUrl ?? req.url, req.rawHeaders);
  if (admission.kind === "pass") return next();
  if (admission.kind === "reply") return send(res, admission.reply());
  if (req._body || req.readableEnded) {
    throw new ConfigurationError(
      "idempotency() must come before body parsers (express.json(), multer, ...): this request's body was already read, so it cannot be fingerprinted",
    );
  }
  const declared = req.headers["content-length"];
  const tooLong = admission.declared(declared === undefined ? null : Number(declared));
  if (tooLong) return send(res, tooLong);
  const outcome = await readNodeBody(req, admission.maxBody, front.bodyReadMs);
  if (outcome.gone) return;
  if (!outcome.body) return send(res, bodyRefusal(admission, front, outcome));
  const execution = await begin(admission, outcome.body);
  if (execution.reply) return send(res, execution.reply);
  capture(res, execution);
  next();
}

/**
 * Holds the handler's response: nothing reaches the socket until it is stored. `writeHead`,
 * `write` and `end` are taken over; at `end` the response is kept and what the core says
 * (the response, with its per-caller headers in the anonymous scope) is sent.
 */
function capture(res, execution) {
  const original = { writeHead: res.writeHead, write: res.write, end: res.end };
  const chunks = [];
  let size = 0;
  let tooLarge = false;
  const limit = execution.maxResponse;
  const add = (chunk, encoding) => {
    if (chunk === undefined || chunk === null || typeof chunk === "function") return;
    const b = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk, typeof encoding === "string" ? encoding : "utf8");
    size += b.length;
    if (size > limit) tooLarge = true;
    else chunks.push(b);
  };
  res.writeHead = function writeHead(status, message, headers) {
    res.statusCode = status;
    const given = typeof message === "object" ? message : headers;
    if (Array.isArray(given)) {
      for (let i = 0; i + 1 < given.length; i += 2) res.setHeader(given[i], given[i + 1]);
    } else if (given) {
      for (const [name, value] of Object.entries(given)) res.setHeader(name, value);
    }
    return res;
  };
  res.write = function write(chunk, encoding, cb) {
    add(chunk, encoding);
    if (typeof encoding === "function") encoding();
    else if (typeof cb === "function") cb();
    return true;
  };
  res.end = function end(chunk, encoding, cb) {
    add(chunk, encoding);
    Object.assign(res, original);
    const done = typeof chunk === "function" ? chunk : typeof encoding === "function" ? encoding : cb;
    const kept = tooLarge
      ? execution.failed()
      : finish(execution, res.statusCode, fromNodeHeaders(res.getHeaders()), chunks.length === 1 ? chunks[0] : Buffer.concat(chunks));
    Promise.resolve(kept).then(
      (reply) => {
        for (const name of res.getHeaderNames()) res.removeHeader(name);
        send(res, reply, done);
      },
      (e) => res.destroy(e),
    );
    return res;
  };
}

function send(res, reply, done) {
  res.writeHead(reply.status, nodeHeaders(reply));
  res.end(reply.body, done);
}
