// idem as a Fastify 5 plugin: a service's own keyed endpoints executed at most once per
// Idempotency-Key, decided by the same HTTP core as `idem serve` and the Rust tower layer
// (design §3).
//
//   import Fastify from "fastify";
//   import { idempotency } from "idem-runtime/fastify";
//   const app = Fastify();
//   await app.register(idempotency, { config: "idem.toml" });
//
// The plugin applies to the whole instance (it is not encapsulated). onRequest admits the
// request; preParsing buffers a keyed body, claims its key and hands Fastify's parser the
// same bytes; onSend keeps the handler's response (Fastify's own error responses included:
// they are responses) and sends what the core says. Store calls run off the event loop. A
// response whose client left before it was complete is waited for for the route's lease,
// then marked unknown (watchClose). Routes are matched on the whole path (request.raw.url),
// as Fastify writes a prefixed plugin's routes: `/api/v1/charges` under `prefix: "/api"`.
import { Readable } from "node:stream";

import { openFront, fromNodeHeaders, joinRaw, pairsOf, readStream, bodyRefusal, begin, finish, watchClose } from "./http.js";

const state = Symbol("idem");

/** The plugin: `fastify.register(idempotency, options)`; options as `openFront`'s. */
export async function idempotency(fastify, options = {}) {
  const front = await openFront(options);
  fastify.addHook("onRequest", async (request, reply) => {
    const admission = front.admit(request.raw.method, request.raw.url, joinRaw(request.raw.rawHeaders));
    if (admission.kind === "pass") return;
    if (admission.kind === "reply") {
      request[state] = { answered: true };
      return respond(reply, admission.reply);
    }
    request[state] = { admission };
  });
  fastify.addHook("preParsing", async (request, reply, payload) => {
    const s = request[state];
    if (!s?.admission) return payload;
    const { admission } = s;
    const outcome = await readStream(payload, admission.maxBody, front.bodyReadMs);
    if (!outcome.body) return answer(request, reply, bodyRefusal(admission.keyed, front, outcome));
    const begun = await begin(admission, outcome.body);
    if (begun.reply) return answer(request, reply, begun.reply);
    s.begun = begun;
    s.settle = watchClose(reply.raw, begun);
    const again = Readable.from(outcome.body.length > 0 ? [outcome.body] : []);
    again.receivedEncodedLength = outcome.body.length;
    return again;
  });
  fastify.addHook("onSend", async (request, reply, payload) => {
    const s = request[state];
    if (!s?.begun) return payload;
    const begun = s.begun;
    s.begun = null;
    const body = await bytesOf(payload, begun.maxResponse);
    // The client left and the lease ran out: the execution was settled as unknown.
    if (!s.settle()) return payload;
    const kept = body
      ? await finish(begun, reply.statusCode, fromNodeHeaders(reply.getHeaders()), body)
      : await begun.execution.failed();
    reply.removeHeader("content-length");
    for (const name of Object.keys(reply.getHeaders())) reply.removeHeader(name);
    reply.code(kept.status);
    for (const [name, value] of pairsOf(kept.headers)) appendHeader(reply, name, value);
    return kept.body;
  });
}

// Applies to the instance it is registered on, as fastify-plugin's wrapper would say.
idempotency[Symbol.for("skip-override")] = true;
idempotency[Symbol.for("fastify.display-name")] = "idem-runtime";

/** Sends a reply from a hook, and marks the request as answered (onSend leaves it alone). */
function answer(request, reply, r) {
  request[state] = { answered: true };
  return respond(reply, r);
}

function respond(reply, r) {
  reply.code(r.status);
  for (const [name, value] of pairsOf(r.headers)) appendHeader(reply, name, value);
  return reply.send(r.body);
}

function appendHeader(reply, name, value) {
  const prior = reply.getHeader(name);
  reply.header(name, prior === undefined ? value : [].concat(prior, value));
}

/** The payload onSend is given (a string, a Buffer, a stream or nothing) as bytes of at most `max`, or null over it. */
async function bytesOf(payload, max) {
  if (payload === null || payload === undefined) return Buffer.alloc(0);
  if (typeof payload === "string" || Buffer.isBuffer(payload)) {
    const b = Buffer.from(payload);
    return b.length > max ? null : b;
  }
  if (typeof payload.pipe === "function") {
    const outcome = await readStream(payload, max, 0);
    return outcome.body ?? null;
  }
  return Buffer.from(String(payload));
}
