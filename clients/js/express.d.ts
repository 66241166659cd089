import type { HttpOptions } from "./http.js";
export type { HttpOptions, HttpRoute } from "./http.js";

/** Express (5 and 4) middleware; mount it before body parsers. Rejects on a bad setting or a store that cannot be opened. */
export function idempotency(options?: HttpOptions): Promise<(req: any, res: any, next: (error?: unknown) => void) => void>;
