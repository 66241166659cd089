// Where a Node process's CPU went, from the .cpuprofile that `node --cpu-prof` writes: self time
// by part (idem-runtime's JavaScript, its native calls, the framework, Node's own, V8's garbage
// collector and other native work) and the heaviest functions. A service started with
// NODE_OPTIONS=--cpu-prof (e.g. examples/services/node under wrk) writes one when it exits.
//
//   node bench/cpuprofile_summary.mjs PROFILE.cpuprofile [--top 25]
import { readFileSync } from "node:fs";

const [file, ...rest] = process.argv.slice(2);
const top = Number(rest[rest.indexOf("--top") + 1]) || 25;
const profile = JSON.parse(readFileSync(file, "utf8"));

const byId = new Map(profile.nodes.map((n) => [n.id, n]));
const self = new Map();
// Sample i was taken timeDeltas[i + 1] before the next one: that long is charged to it.
for (let i = 0; i < profile.samples.length; i++) {
  const dt = profile.timeDeltas[i + 1] ?? 0;
  self.set(profile.samples[i], (self.get(profile.samples[i]) ?? 0) + dt);
}

/** Which part a frame belongs to. */
function part(node) {
  const { url, functionName } = node.callFrame;
  if (functionName === "(garbage collector)") return "V8 garbage collector";
  if (functionName === "(idle)") return "idle";
  if (functionName === "(program)") return "native, outside JavaScript (V8, libuv, napi)";
  if (/clients\/js\/|idem-runtime\//.test(url)) return "idem-runtime (JavaScript)";
  if (url.startsWith("node:")) return "Node's own JavaScript";
  if (url.includes("node_modules")) return `framework (${url.match(/node_modules\/((?:@[^/]+\/)?[^/]+)/)?.[1] ?? "?"})`;
  if (url === "") return "native calls (builtins, the idem module)";
  return "the service's own code";
}

const parts = new Map();
const fns = new Map();
let total = 0;
for (const [id, us] of self) {
  const node = byId.get(id);
  const p = part(node);
  if (p === "idle") continue;
  total += us;
  parts.set(p, (parts.get(p) ?? 0) + us);
  const { functionName, url, lineNumber } = node.callFrame;
  const name = `${functionName || "(anonymous)"} ${url ? `${url.replace(/^.*\/(node_modules|clients|examples)\//, "$1/")}:${lineNumber + 1}` : ""}`;
  fns.set(name, (fns.get(name) ?? 0) + us);
}

const pct = (us) => `${((100 * us) / total).toFixed(1)}%`;
console.log(`| part | share of busy samples |\n|---|---:|`);
for (const [p, us] of [...parts].sort((a, b) => b[1] - a[1])) console.log(`| ${p} | ${pct(us)} |`);
console.log(`\n| function (self time) | share |\n|---|---:|`);
for (const [f, us] of [...fns].sort((a, b) => b[1] - a[1]).slice(0, top)) console.log(`| \`${f.trim()}\` | ${pct(us)} |`);
console.log(`\nbusy: ${(total / 1e6).toFixed(2)} s of samples`);
