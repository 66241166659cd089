// The MCP TypeScript SDK's Client (`@modelcontextprotocol/sdk`): idempotentClient(client, { scope })
// puts the runtime's key in `params._meta.idempotency_key` of every tools/call (derived once per
// intent, the same on every attempt), for `idem mcp` with `key = "runtime"` (crates/idem-mcp),
// and retries a call that failed in transport or met a call in flight, with the same key.
import { deriveFromJson } from "./derive.js";
import { IdemError } from "./errors.js";
import { RetryPolicy, backoffMs, sleepMs } from "./fetch.js";
import { resolveScope } from "./scope.js";

/**
 * A view of `client` whose callTool carries a key. Options: scope (Scope | id | (params) => scope;
 * default the context's), secret, keyFields ({ tool: [fields] }), tools ({ name: "read" |
 * "idempotent" | "effect" }; unknown tools are effects), retry, sleep, onAttempt.
 */
export function idempotentClient(client, options = {}) {
  const retry = { ...RetryPolicy, ...(options.retry ?? {}) };
  const sleep = options.sleep ?? sleepMs;

  async function callTool(params, resultSchema, requestOptions) {
    const cls = options.tools?.[params.name] ?? "effect";
    let meta = params._meta ?? {};
    if (cls === "effect" && typeof meta.idempotency_key !== "string") {
      const scope = resolveScope(options.scope, params, [], params.name);
      const key = deriveFromJson(scope.id, params.name, JSON.stringify(params.arguments ?? {}), {
        secret: options.secret,
        keyFields: options.keyFields?.[params.name],
      });
      meta = { ...meta, idempotency_key: key };
    }
    const keyed = { ...params, _meta: meta };
    const key = meta.idempotency_key;
    const start = Date.now();
    for (let number = 1; ; number++) {
      let result = null;
      let failure = null;
      try {
        result = await client.callTool(keyed, resultSchema, requestOptions);
      } catch (e) {
        failure = e;
      }
      const problem = result?._meta?.idem?.problem;
      // A keyed call may be repeated after any transport failure; one in flight is worth waiting for.
      const again = failure ? key !== undefined || cls !== "effect" : problem === "in-flight";
      const delay = again ? backoffMs(retry, number, null) : 0;
      const giveUp = !again || number >= retry.maxAttempts || Date.now() - start + delay > retry.maxTotalMs;
      options.onAttempt?.({ tool: params.name, key, number, problem, error: failure, retryInMs: giveUp ? null : delay });
      if (giveUp) {
        if (result) return result;
        throw new IdemError(`${params.name}: the tool call failed (${failure?.message}) after ${number} attempts`, { key, cause: failure });
      }
      await sleep(delay);
    }
  }

  return new Proxy(client, {
    get(target, prop, receiver) {
      if (prop === "callTool") return callTool;
      const v = Reflect.get(target, prop, receiver);
      return typeof v === "function" ? v.bind(target) : v;
    },
  });
}
