// An external streamrl reward producer in Node.js, written from docs/protocol.md alone.
//
//   cd examples/node && npm ci
//   STREAMRL_BROKER_URL=redis://judge:PW@127.0.0.1:6379/0 node producer.mjs --run tiny --key judge
//
// It scores each rollout with a toy "length judge" (completion tokens / --max-tokens, from the
// packed little-endian int32 `completion_ids`), writes one annotation per rollout under --key and
// acks. Raw Redis commands (sendCommand) so every step maps onto a line of the protocol doc:
// own group on `rollouts`, own pending entries first, XAUTOCLAIM of a dead replica's entries,
// dead-lettering of undecodable input, heartbeats with a TTL, a clean stop on SIGTERM/SIGINT and
// when the run ends (`run:end` is set: docs/protocol.md, "Run end").
import os from "node:os";
import { parseArgs } from "node:util";
import { createClient } from "redis";
import { decode, encode } from "@msgpack/msgpack";

const SCHEMA = 1;
const { values: opt } = parseArgs({
  options: {
    run: { type: "string", default: process.env.STREAMRL_RUN ?? "tiny" },
    key: { type: "string", default: "judge" },
    name: { type: "string" },
    "max-tokens": { type: "string", default: "16" },
    "batch-size": { type: "string", default: "32" },
    "claim-idle-ms": { type: "string", default: "30000" },
  },
});
const url = process.env.STREAMRL_BROKER_URL;
if (!url) {
  console.error("set STREAMRL_BROKER_URL=redis://USER:PASSWORD@HOST:PORT/0 (see `streamrl producer add`)");
  process.exit(2);
}
const name = opt.name ?? opt.key;
const consumer = `${name}-${os.hostname()}-${process.pid}`;
const maxTokens = Number(opt["max-tokens"]);
const count = String(Number(opt["batch-size"]));
const claimIdleMs = Number(opt["claim-idle-ms"]);
const k = (suffix) => `streamrl:${opt.run}:${suffix}`;
const ROLLOUTS = k("rollouts"), ANNOTATIONS = k("annotations"), DEADLETTER = k("deadletter");
const HEARTBEAT = k(`workers:producer:${consumer}`);
const RUN_END = k("run:end");

const log = (event, fields = {}) =>
  console.log(JSON.stringify({ ts: new Date().toISOString(), event, producer: name, consumer, ...fields }));

const client = createClient({ url, disableOfflineQueue: true });  // fail fast while disconnected
client.on("error", (err) => log("redis_error", { error: String(err) }));
const cmd = (args) => client.sendCommand(args, { returnBuffers: true });
const str = (b) => (Buffer.isBuffer(b) ? b.toString("utf8") : String(b));

// Packed little-endian int32 -> numbers (docs/protocol.md, "Arrays").
function unpackI32(bytes) {
  if (!(bytes instanceof Uint8Array) || bytes.length % 4) throw new Error("int32 array must be bytes, length % 4 == 0");
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  return Array.from({ length: bytes.length / 4 }, (_, i) => view.getInt32(4 * i, true));
}

function decodeRollout(fields) {
  // fields: [name, value, name, value, ...]; streamrl entries have exactly one field, `d`.
  let payload = null;
  for (let i = 0; i + 1 < fields.length; i += 2) if (str(fields[i]) === "d") payload = fields[i + 1];
  if (payload === null) throw new Error("entry has no 'd' field");
  const msg = decode(payload);
  if (typeof msg !== "object" || msg === null) throw new Error("payload must be a msgpack map");
  if (msg.schema !== SCHEMA) throw new Error(`unknown schema version ${msg.schema} (this producer reads ${SCHEMA})`);
  if (msg.kind !== "rollout") throw new Error(`a ${msg.kind} message does not belong on rollouts`);
  if (typeof msg.rollout_id !== "string") throw new Error("rollout.rollout_id must be a string");
  return { ...msg, completion_ids: unpackI32(msg.completion_ids) };
}

const score = (rollout) => Math.min(1, rollout.completion_ids.length / maxTokens);

async function deadLetter(id, payload, reason) {
  const record = JSON.stringify({ stream: ROLLOUTS, entry_id: id, reason, worker: consumer, ts: Date.now() / 1000 });
  await cmd(["XADD", DEADLETTER, "MAXLEN", "~", "100000", "*", "d",
             Buffer.concat([Buffer.from(record + "\n"), payload ?? Buffer.alloc(0)])]);
  log("dead_letter", { entry_id: id, reason });
}

let scored = 0;
async function handle(entries) {
  // entries: [[id, [field, value, ...]], ...]; a nil field list is an entry deleted meanwhile.
  const ids = [];
  for (const entry of entries) {
    if (!entry) continue;  // Redis 6.2 XAUTOCLAIM: an entry deleted meanwhile comes back as nil
    const [rawId, fields] = entry;
    const id = str(rawId);
    ids.push(id);
    if (!fields) continue;
    let rollout;
    try {
      rollout = decodeRollout(fields);
    } catch (err) {
      await deadLetter(id, fields[1], String(err.message ?? err));
      continue;
    }
    const annotation = { schema: SCHEMA, kind: "annotation", rollout_id: rollout.rollout_id, key: opt.key,
                         value: score(rollout), producer: consumer, error: "" };
    await cmd(["XADD", ANNOTATIONS, "*", "d", Buffer.from(encode(annotation))]);
    scored += 1;
  }
  // Ack only after the annotations are written: a crash before this line means redelivery, and
  // the assembler ignores a second annotation for the same (rollout_id, key).
  if (ids.length) await cmd(["XACK", ROLLOUTS, name, ...ids]);
  return ids.length;
}

async function heartbeat() {
  const info = JSON.stringify({ pid: process.pid, host: os.hostname(), ts: Date.now() / 1000, scored });
  try {
    await cmd(["SET", HEARTBEAT, info, "PX", "15000"]);
    return true;
  } catch (err) {
    log("heartbeat_not_permitted", { error: String(err.message ?? err) });  // Redis 6.2 ACL users (see docs)
    return false;
  }
}

let stopping = false, endReason = null;
for (const sig of ["SIGINT", "SIGTERM"]) process.on(sig, () => { stopping = true; log("stopping", { signal: sig }); });

await client.connect();
try {
  await cmd(["XGROUP", "CREATE", ROLLOUTS, name, "0", "MKSTREAM"]);
} catch (err) {
  const text = String(err.message ?? err);
  if (!text.includes("BUSYGROUP") && !text.includes("NOPERM")) throw err;
}
let beats = await heartbeat();
let lastBeat = Date.now(), lastClaim = 0, lastEndCheck = 0, pendingDone = false;
log("started", { run: opt.run, key: opt.key, group: name });
async function runEnded() {
  // The end mark is a string; WRONGTYPE (a stream someone created there) reads as "not ended".
  try {
    const raw = await cmd(["GET", RUN_END]);
    return raw === null ? null : JSON.parse(str(raw));
  } catch (err) {
    if (String(err.message ?? err).includes("WRONGTYPE")) return null;
    throw err;
  }
}

async function poll() {
  if (Date.now() - lastEndCheck > 1000) {
    lastEndCheck = Date.now();
    const end = await runEnded();
    if (end) {
      endReason = `run ${opt.run} ended: ${end.reason}`;
      stopping = true;
      return;
    }
  }
  let entries = [];
  if (!pendingDone) {
    // Own pending entries first (delivered to this consumer id before a restart, never acked).
    const reply = await cmd(["XREADGROUP", "GROUP", name, consumer, "COUNT", count, "STREAMS", ROLLOUTS, "0"]);
    entries = reply?.[0]?.[1] ?? [];
    pendingDone = entries.length === 0;
  }
  if (!entries.length && Date.now() - lastClaim > claimIdleMs / 4) {
    // Entries another replica took and did not ack for claimIdleMs: it died, take them over.
    lastClaim = Date.now();
    const reply = await cmd(["XAUTOCLAIM", ROLLOUTS, name, consumer, String(claimIdleMs), "0-0", "COUNT", count]);
    entries = reply[1] ?? [];
  }
  if (!entries.length) {
    const reply = await cmd(["XREADGROUP", "GROUP", name, consumer, "COUNT", count, "BLOCK", "500",
                             "STREAMS", ROLLOUTS, ">"]);
    entries = reply?.[0]?.[1] ?? [];
  }
  if (entries.length) await handle(entries);
  if (beats && Date.now() - lastBeat > 5000) {
    beats = await heartbeat();
    lastBeat = Date.now();
  }
}

while (!stopping) {
  try {
    await poll();
  } catch (err) {
    // Broker restarts and network blips: the client reconnects by itself; un-acked entries stay
    // pending on this consumer and are read again (own pending first) once it is back.
    log("broker_error", { error: String(err.message ?? err) });
    pendingDone = false;
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}
if (beats) await cmd(["DEL", HEARTBEAT]).catch(() => {});
await client.disconnect().catch(() => {});
log("stopped", { scored, ...(endReason ? { reason: endReason } : {}) });
