// idem as Hono 4 middleware: a service's own keyed endpoints executed at most once per
// Idempotency-Key, decided by the same HTTP core as `idem serve` and the Rust tower layer
// (design §3). On Web-standard Request and Response, so on @hono/node-server and any server
// Node can run Hono on.
//
//   import { Hono } from "hono";
//   import { idempotency } from "idem-runtime/hono";
//   const app = new Hono();
//   app.use(await idempotency({ config: "idem.toml" }));
//
// The request target is the one the client sent where the server has it (@hono/node-server's
// `c.env.incoming`), else the URL's path and query. A keyed request's body is buffered and the
// handler gets a Request with the same bytes; its Response is buffered, kept, and replaced by
// what the core says. Hono's own error responses (onError, its 500) are responses, and kept.
// Routes are matched on the whole path, as Hono writes a sub-app's routes (app.route("/api",
// sub): `/api/v1/charges`).
import { openFront, joinHeaders, joinRaw, pairsOf, bodyRefusal, begin, finish, readNodeBody, watchClose } from "./http.js";

/** Resolves to the middleware; rejects at once on a bad setting or a store that cannot be opened. */
export async function idempotency(options = {}) {
  const front = await openFront(options);
  return async function idempotencyMiddleware(c, next) {
    // On @hono/node-server the Node request is at hand: its raw target and headers, and its
    // body, read here and left as `incoming.rawBody`, which the server's Request reads
    // directly when the handler asks for the body (its fast path for a body already read).
    const incoming = c.env?.incoming;
    const raw = c.req.raw;
    let target;
    let headers;
    if (incoming) {
      target = incoming.url;
      headers = joinRaw(incoming.rawHeaders);
    } else {
      const url = new URL(raw.url);
      target = url.pathname + url.search;
      headers = joinHeaders(raw.headers);
    }
    const admission = front.admit(raw.method, target, headers);
    if (admission.kind === "pass") return next();
    if (admission.kind === "reply") return response(admission.reply);
    const outcome = incoming
      ? await readNodeBody(incoming, admission.maxBody, front.bodyReadMs, { putBack: false })
      : await readBody(raw.body, admission.maxBody, front.bodyReadMs);
    if (outcome.gone) return response({ status: 400, headers: [], body: Buffer.alloc(0) });
    if (!outcome.body) return response(bodyRefusal(admission.keyed, front, outcome));
    const body = Buffer.isBuffer(outcome.body) ? outcome.body : Buffer.from(outcome.body);
    const begun = await begin(admission, body);
    if (begun.reply) return response(begun.reply);
    // On @hono/node-server, a response whose client left before it was complete is waited
    // for for the route's lease, then marked unknown (watchClose).
    const settle = c.env?.outgoing ? watchClose(c.env.outgoing, begun) : () => true;
    if (incoming) {
      incoming.rawBody = body;
    } else {
      c.req.raw = new Request(raw.url, {
        method: raw.method,
        headers: raw.headers,
        body: body.length > 0 ? body : null,
        signal: raw.signal,
      });
    }
    await next();
    const res = c.res;
    const limit = begun.maxResponse;
    const declaredOut = Number(res.headers.get("content-length") ?? NaN);
    // A declared length within the bound is read whole (the fast path of a body made in
    // memory); anything else through a bounded reader.
    const read =
      declaredOut <= limit
        ? { body: new Uint8Array(await res.arrayBuffer()) }
        : res.body
          ? await readBody(res.body, limit, 0)
          : { body: new Uint8Array(0) };
    // The client left and the lease ran out: the execution was settled as unknown.
    if (!settle()) return;
    const kept = read.body
      ? await finish(begun, res.status, joinHeaders(res.headers), Buffer.from(read.body.buffer, read.body.byteOffset, read.body.length))
      : await begun.execution.failed();
    c.res = undefined;
    c.res = response(kept);
  };
}

function response(reply) {
  // Headers as pairs, not a Headers object: @hono/node-server writes such a Response on its
  // fast path, and pairs keep repeated headers (Set-Cookie) apart.
  const headers = pairsOf(reply.headers);
  const status = reply.status;
  const empty = status === 204 || status === 304;
  return new Response(empty ? null : reply.body, { status, headers });
}

/** A Web stream's bytes, at most `max`, within `ms`: { body } or { tooLarge } / { timeout } / { error }. */
async function readBody(stream, max, ms) {
  if (!stream) return { body: new Uint8Array(0) };
  const reader = stream.getReader();
  const chunks = [];
  let size = 0;
  let timer = null;
  const late = new Promise((resolve) => {
    if (ms) timer = setTimeout(() => resolve({ timeout: true }), ms);
  });
  try {
    for (;;) {
      const step = await Promise.race([reader.read(), late]);
      if (step.timeout) {
        reader.cancel().catch(() => {});
        return step;
      }
      if (step.done) break;
      size += step.value.length;
      if (size > max) {
        reader.cancel().catch(() => {});
        return { tooLarge: true };
      }
      chunks.push(step.value);
    }
  } catch (error) {
    return { error };
  } finally {
    clearTimeout(timer);
  }
  const body = new Uint8Array(size);
  let at = 0;
  for (const c of chunks) {
    body.set(c, at);
    at += c.length;
  }
  return { body };
}
