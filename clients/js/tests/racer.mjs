// One racer for the race tests: run as a child process (argv: JSON) or a worker thread
// (workerData). It takes the scope handed to it (Scope.from), calls the tool once, and reports
// the result.
import { isMainThread, parentPort, workerData } from "node:worker_threads";

import { Scope, idempotent, withScope } from "../index.js";
import { rows } from "./helpers.mjs";

const job = isMainThread ? JSON.parse(process.argv[2]) : workerData;
const effects = rows(job.db);
const addRow = idempotent(
  async ({ customer }) => {
    effects.add(customer);
    // Widen the window in which the other racers arrive while this call is in flight.
    await new Promise((r) => setTimeout(r, 300));
    return { added: customer, by: job.who };
  },
  { tool: "add_row", store: job.store },
);

const result = await withScope(Scope.from(job.scope), () => addRow({ customer: job.customer }));
if (isMainThread) process.stdout.write(JSON.stringify(result));
else parentPort.postMessage(result);
