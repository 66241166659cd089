// What every framework adapter does with idem's own refusals (nothing ran), so that no framework
// that turns a tool's error into text for the model hides them, and the model reads an answer it
// can act on. The adapters (ai.js, openai-agents.js, langchain.js, mastra.js) share this; each
// decides, with what its framework allows, whether a "not configured" refusal fails the run.
import {
  ConfigurationError,
  IdemError,
  InFlightError,
  KeyDerivationError,
  KeyMismatchError,
  OutcomeUnknownError,
  ResultTooLargeError,
  ScopeMissingError,
  StoreUnavailableError,
} from "./errors.js";

/**
 * What a refusal means for a tool call: `kind`, the `text` the model reads (what happened and
 * what it may do), and `configured: false` for a refusal no model can fix (no scope, a bad
 * store URL or option, arguments no key can be derived from, a store that cannot be used): an
 * operator must see those, so `refusal` logs them at error level. `null` for any other error
 * (the tool's own, or a kept error replayed): the framework handles it as it would.
 */
export function refusal(tool, err, logger = console) {
  if (!(err instanceof IdemError)) return null;
  if (err instanceof ScopeMissingError || err instanceof ConfigurationError || err instanceof KeyDerivationError) {
    logError(logger, `idem: ${tool} was not run: idem is not configured for it: ${err.message}`, err);
    return { kind: "not_configured", configured: false, text: `${tool} was not run, and calling it again will not help: ${err.message}` };
  }
  if (err instanceof StoreUnavailableError) {
    // A mistyped URL and a store that is down look alike here; either way an operator must know.
    logError(logger, `idem: ${tool} was not run: idem's store cannot be used: ${err.message}`, err);
    return {
      kind: "store",
      configured: false,
      text: `${tool} was not run: its idempotency store cannot be used right now, so nothing ran; try again later. (${err.message})`,
    };
  }
  if (err instanceof InFlightError) {
    return {
      kind: "in_flight",
      configured: true,
      text: `${tool} is already in progress with these arguments (another call is still running); do not retry yet: wait, then call it again with the same arguments to get its result. (${err.message})`,
    };
  }
  if (err instanceof OutcomeUnknownError) {
    return {
      kind: "unknown",
      configured: true,
      text: `${tool} was not run: an earlier call with these arguments may have acted and its outcome is unknown; do not call it again: an operator must check and resolve it. (${err.message})`,
    };
  }
  if (err instanceof KeyMismatchError) {
    return { kind: "mismatch", configured: true, text: `${tool} was not run: its idempotency key was used before with other arguments. (${err.message})` };
  }
  if (err instanceof ResultTooLargeError) {
    return { kind: "too_large", configured: true, text: `${tool} ran before with these arguments, but its result was too large to keep; do not call it again. (${err.message})` };
  }
  return null;
}

/**
 * The error an adapter throws where its framework hands a tool's error to the model as text (the
 * AI SDK, Mastra): a "not configured" refusal as it was (logged at error level by `refusal`), an
 * answer the model can act on (in flight, unknown outcome, ...) as an error of the same class
 * whose message is `refusal`'s text (`key` and `cause` kept), anything else as it was.
 */
export function forModel(tool, err, logger) {
  const r = refusal(tool, err, logger);
  if (r === null || !r.configured) return err;
  const Kind = err.constructor;
  return new Kind(r.text, { key: err.key, cause: err });
}

function logError(logger, message, err) {
  try {
    (logger?.error ?? console.error).call(logger ?? console, message, err);
  } catch {
    console.error(message);
  }
}

/** An adapter's `logger` option: anything with `error(message, ...)` (console, pino, Mastra's logger). */
export function adapterLogger(logger) {
  if (logger === undefined) return console;
  if (typeof logger?.error !== "function") {
    throw new ConfigurationError("logger is an object with an error(message, ...) method (console, pino, Mastra's logger)");
  }
  return logger;
}
