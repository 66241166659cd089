// Types of idem_key.mjs: the pure-JavaScript key derivation (browsers, edge runtimes).
export const VERSION: "idem/v1";
export class DeriveError extends Error {}
export function canonical(value: unknown): string;
export function canonicalBytes(scope: string, tool: string, args: unknown, ordinal?: number): Uint8Array;
/** Positional, with no keyFields (an options object as `ordinal` is a DeriveError); the same key as idem-runtime's deriveKey without keyFields. */
export function derive(scope: string, tool: string, args: unknown, ordinal?: number, secret?: string | Uint8Array): string;
export function parseArgs(text: string): unknown;
