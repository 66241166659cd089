// idem key derivation, version idem/v1: the reference for JavaScript (Node, no packages).
//
//   import { derive } from "./idem_key.mjs";
//   derive("turn_9f3a", "charge_card", { customer: "cus_8g2k", amount: 4900 });
//   // 'turn_9f3a-charge_card-...'
//
// The algorithm is specified in docs/key-derivation.md; docs/key-vectors.json holds the vectors
// every implementation reproduces byte for byte. Copy this one file into your agent runtime.

import { createHash, createHmac } from "node:crypto";

export const VERSION = "idem/v1";
const MAX_SAFE = 2 ** 53;
const LABEL_MAX = 48;
const DIGEST_BYTES = 20; // 160 bits, 32 base32 characters
const B32 = "abcdefghijklmnopqrstuvwxyz234567";

export class DeriveError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = "DeriveError";
  }
}

function number(x) {
  if (!Number.isFinite(x)) throw new DeriveError(`number ${x} is not finite`);
  if (Number.isInteger(x) && Math.abs(x) > MAX_SAFE) {
    throw new DeriveError(`number ${x} is an integer beyond 2^53; JCS cannot carry it exactly (send it as a string)`);
  }
  return JSON.stringify(x); // ECMAScript Number.prototype.toString; -0 becomes "0"
}

const LONE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

function string(s) {
  const lone = s.match(LONE);
  if (lone) {
    const hex = lone[0].charCodeAt(0).toString(16);
    throw new DeriveError(`a string has a lone surrogate (\\u${hex}); it is not Unicode text`);
  }
  return JSON.stringify(s); // escapes as RFC 8785 requires
}

/** RFC 8785 (JCS) serialisation of a JSON value. */
export function canonical(value) {
  if (value === null) return "null";
  switch (typeof value) {
    case "boolean":
      return value ? "true" : "false";
    case "number":
      return number(value);
    case "bigint":
      throw new DeriveError(`integer ${value} is beyond 2^53; JCS cannot carry it exactly (send it as a string)`);
    case "string":
      return string(value);
    case "object": {
      if (Array.isArray(value)) {
        const items = [];
        for (let i = 0; i < value.length; i++) {
          if (!(i in value) || value[i] === undefined) throw new DeriveError(`array item ${i} is missing or undefined, not a JSON value`);
          items.push(canonical(value[i]));
        }
        return "[" + items.join(",") + "]";
      }
      // A JSON object only: a Date, Map, Set, Buffer or class instance is not one (each was
      // written "{}" here, while the package's deriveKey refuses them or uses toJSON()).
      const proto = Object.getPrototypeOf(value);
      if (proto !== Object.prototype && proto !== null) {
        throw new DeriveError(`${value.constructor?.name ?? "this object"} is not a JSON value; pass plain data`);
      }
      return (
        "{" +
        Object.keys(value)
          .filter((k) => value[k] !== undefined) // absent, as JSON.stringify leaves it
          .sort() // UTF-16 code units, as RFC 8785 requires
          .map((k) => string(k) + ":" + canonical(value[k]))
          .join(",") +
        "}"
      );
    }
    default:
      throw new DeriveError(`${typeof value} is not a JSON value`);
  }
}

function label(s) {
  let out = "";
  for (const ch of s) out += /^[A-Za-z0-9_.:]$/.test(ch) ? ch : "_";
  return out.slice(0, LABEL_MAX);
}

function base32(bytes) {
  let bits = 0n;
  for (const b of bytes) bits = (bits << 8n) | BigInt(b);
  let out = "";
  for (let shift = bytes.length * 8 - 5; shift >= 0; shift -= 5) out += B32[Number((bits >> BigInt(shift)) & 31n)];
  return out;
}

/** The bytes that are hashed: JCS of ["idem/v1", scope, tool, ordinal, args without idempotency_key]. */
export function canonicalBytes(scope, tool, args, ordinal = 0) {
  if (typeof scope !== "string" || scope === "") throw new DeriveError("scope must be a non-empty string");
  if (typeof tool !== "string" || tool === "") throw new DeriveError("tool must be a non-empty string");
  if (!Number.isInteger(ordinal) || ordinal < 0 || ordinal > MAX_SAFE) {
    throw new DeriveError("ordinal must be an integer from 0 to 2^53");
  }
  if (args !== null && typeof args === "object" && !Array.isArray(args) && "idempotency_key" in args) {
    const { idempotency_key: _, ...rest } = args;
    args = rest;
  }
  return Buffer.from(canonical([VERSION, scope, tool, ordinal, args]), "utf8");
}

/**
 * The idempotency key of one intent. `secret` (string or bytes) makes it an HMAC-SHA256.
 * Positional, with no keyFields: derive(scope, tool, args, ordinal, secret).
 */
export function derive(scope, tool, args, ordinal = 0, secret = undefined) {
  if (ordinal !== null && typeof ordinal === "object") {
    throw new DeriveError(
      "derive(scope, tool, args, ordinal = 0, secret) takes positional arguments, not an options object; " +
        "it has no keyFields (pass only the arguments that make the intent, or use deriveKey from idem-runtime)",
    );
  }
  const data = canonicalBytes(scope, tool, args, ordinal);
  const digest =
    secret === undefined || secret === null
      ? createHash("sha256").update(data).digest()
      : createHmac("sha256", secret).update(data).digest();
  return `${label(scope)}-${label(tool)}-${base32(digest.subarray(0, DIGEST_BYTES))}`;
}

/**
 * Parses JSON text for derive(). JSON.parse rounds integers beyond 2^53 silently, so number
 * tokens are checked in the text first: such an integer is an error, not a rounding.
 */
export function parseArgs(text) {
  const token = /"(?:[^"\\]|\\.)*"|-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?/g;
  for (const m of text.matchAll(token)) {
    const t = m[0];
    if (t.startsWith('"')) continue;
    const big = !/[.eE]/.test(t) && (BigInt(t) > BigInt(MAX_SAFE) || BigInt(t) < -BigInt(MAX_SAFE));
    if (big) throw new DeriveError(`integer ${t} is beyond 2^53; JCS cannot carry it exactly (send it as a string)`);
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new DeriveError(`args are not JSON: ${e.message}`);
  }
}
