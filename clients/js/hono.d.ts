import type { HttpOptions } from "./http.js";
export type { HttpOptions, HttpRoute } from "./http.js";

/** Hono 4 middleware: `app.use(await idempotency(options))`. */
export function idempotency(options?: HttpOptions): Promise<(c: any, next: () => Promise<void>) => Promise<Response | void>>;
