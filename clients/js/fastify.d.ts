import type { HttpOptions } from "./http.js";
export type { HttpOptions, HttpRoute } from "./http.js";

/** A Fastify 5 plugin: `await app.register(idempotency, options)`; it applies to the whole instance. */
export function idempotency(fastify: any, options?: HttpOptions): Promise<void>;
