// An intent's arguments as the JSON text its key is derived from: one place for idempotent(),
// deriveKey, idemFetch and the adapters (docs/key-derivation.md, "Values").
//
// JSON.stringify is not faithful: it writes a Set, a Map, a Promise (a forgotten `await`), an
// Error, a RegExp or a class instance whose state is in #private fields as `{}`, NaN and
// Infinity as `null`, and drops functions, symbols and `undefined` members. Two different
// intents would then share one key, and the second would be answered with the first's
// result. So a value JSON does not carry as it is is refused, naming where it is; what does
// carry (plain objects, arrays, strings, finite numbers, booleans, null, a valid Date as its
// ISO string, an object's own toJSON()) is written as JSON.stringify writes it.
import { KeyDerivationError } from "./errors.js";

/**
 * `value` as JSON text, or KeyDerivationError naming the first value in it that JSON would
 * change (`args.skus: a Set`). `what` names the value in the message (`arguments`).
 */
export function intentJson(value, what = "arguments") {
  let plain;
  try {
    plain = faithful(value, what, new Set());
  } catch (e) {
    if (e instanceof KeyDerivationError) throw e;
    if (e instanceof RangeError) {
      throw new KeyDerivationError(`the ${what} are nested too deeply to be keyed; nothing ran`, { cause: e });
    }
    throw e;
  }
  return JSON.stringify(plain === undefined ? null : plain);
}

function refuse(path, why) {
  return new KeyDerivationError(`no key can be derived: ${path} is ${why}; nothing ran`);
}

/** What of a value JSON carries as it is, as plain data; throws at the first it would not. */
function faithful(value, path, seen) {
  switch (typeof value) {
    case "string":
    case "boolean":
      return value;
    case "number":
      if (!Number.isFinite(value)) throw refuse(path, `${value}, which JSON cannot hold (it would be written null)`);
      return value;
    case "undefined":
      return undefined;
    case "bigint":
      throw refuse(path, "a BigInt; pass it as a string");
    case "function":
      throw refuse(path, "a function, which JSON drops");
    case "symbol":
      throw refuse(path, "a symbol, which JSON drops");
    default:
      break;
  }
  if (value === null) return null;
  if (seen.has(value)) throw refuse(path, "a circular reference (a cycle)");
  if (value instanceof Date) {
    if (Number.isNaN(value.getTime())) throw refuse(path, "an invalid Date (JSON would write null)");
    return value.toJSON();
  }
  if (ArrayBuffer.isView(value) || value instanceof ArrayBuffer) {
    throw refuse(path, "bytes (a Buffer or typed array), which JSON writes as a list of numbers; pass them as a base64 string");
  }
  seen.add(value);
  try {
    if (Array.isArray(value)) {
      const out = new Array(value.length);
      for (let i = 0; i < value.length; i++) {
        if (!(i in value)) throw refuse(`${path}[${i}]`, "a hole in a sparse array (JSON would write null)");
        const item = faithful(value[i], `${path}[${i}]`, seen);
        if (item === undefined) throw refuse(`${path}[${i}]`, "undefined (JSON would write null)");
        out[i] = item;
      }
      return out;
    }
    const proto = Object.getPrototypeOf(value);
    if (proto !== Object.prototype && proto !== null) {
      if (typeof value.toJSON === "function") return faithful(value.toJSON(), path, seen);
      const kind = value.constructor?.name || "class";
      throw refuse(path, `${/^[AEIOU]/.test(kind) ? "an" : "a"} ${kind}${kind === "Promise" ? " (a missing await?)" : ""}, which JSON does not write as it is; pass its contents as plain data (an array, an object, a string)`);
    }
    if (Object.getOwnPropertySymbols(value).some((s) => Object.prototype.propertyIsEnumerable.call(value, s))) {
      throw refuse(path, "an object with symbol keys, which JSON drops");
    }
    const out = {};
    for (const k of Object.keys(value)) {
      const item = faithful(value[k], `${path}.${k}`, seen);
      if (item !== undefined) out[k] = item;
    }
    return out;
  } finally {
    seen.delete(value);
  }
}
