// A streamrl environment worker in Node.js, written from docs/protocol.md ("Environment steps") alone.
//
//   cd examples/node && npm ci
//   STREAMRL_BROKER_URL=redis://:PW@127.0.0.1:6379/0 node env.mjs --run tiny-multiturn
//
// The env is the charclass dialog of configs/tiny-multiturn-cpu.yaml (task.name=charclass_dialog):
// whatever the model says first, the env names the character class from the task item's meta
// ("\ndigits:"); the second turn is scored as the fraction of its first meta.length characters
// that are in meta.chars, and the episode is done. It is stateless: every step is computed from the
// request's item and actions, so a step taken over from a dead worker needs no replay at all.
// Raw Redis commands, one per protocol line: group `env` on env_steps, own pending first,
// XAUTOCLAIM of a dead worker's steps, observation XADD before XACK, dead-letters, heartbeat.
// Sticky ("Sticky routing"): the heartbeat says `sticky: 1`, so generators send an episode's later
// steps to this worker's own stream env_steps:<id>, read here before the shared one; the own streams
// of workers whose heartbeat is gone are taken over. Stateless, it gains no cache from that, but it
// is what a caching env in another language does.
// Steps take well under claim_idle_ms, so it sends no XCLAIM keepalive for steps in progress.
import os from "node:os";
import { parseArgs } from "node:util";
import { createClient } from "redis";
import { decode, encode } from "@msgpack/msgpack";

const SCHEMA = 1;
const GROUP = "env";
const { values: opt } = parseArgs({
  options: {
    run: { type: "string", default: process.env.STREAMRL_RUN ?? "tiny-multiturn" },
    "claim-idle-ms": { type: "string", default: "30000" },
    "latency-ms": { type: "string", default: "20,200" },
    id: { type: "string" },
  },
});
const url = process.env.STREAMRL_BROKER_URL;
if (!url) {
  console.error("set STREAMRL_BROKER_URL=redis://USER:PASSWORD@HOST:PORT/0 (RUN_DIR/broker/url of a `streamrl up`)");
  process.exit(2);
}
const consumer = opt.id ?? `env-node-${os.hostname()}-${process.pid}`;
const claimIdleMs = Number(opt["claim-idle-ms"]);
const [latLow, latHigh] = opt["latency-ms"].split(",").map(Number);
const k = (suffix) => `streamrl:${opt.run}:${suffix}`;
const STEPS = k("env_steps"), OWN = k(`env_steps:${consumer}`), DEADLETTER = k("deadletter");
const HEARTBEAT = k(`workers:env:${consumer}`);
const REQUIRED = ["episode_id", "group_id", "sample", "turn", "item", "actions", "reply_to"];

const log = (event, fields = {}) => console.log(JSON.stringify({ ts: new Date().toISOString(), event, consumer, ...fields }));
const client = createClient({ url, disableOfflineQueue: true });
client.on("error", (err) => log("redis_error", { error: String(err) }));
const cmd = (args) => client.sendCommand(args, { returnBuffers: true });
const str = (b) => (Buffer.isBuffer(b) ? b.toString("utf8") : String(b));
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function decodeStep(fields) {
  let payload = null;
  for (let i = 0; i + 1 < fields.length; i += 2) if (str(fields[i]) === "d") payload = fields[i + 1];
  if (payload === null) throw new Error("entry has no 'd' field");
  const msg = decode(payload);
  if (typeof msg !== "object" || msg === null) throw new Error("payload must be a msgpack map");
  if (msg.schema !== SCHEMA) throw new Error(`unknown schema version ${msg.schema} (this env reads ${SCHEMA})`);
  if (msg.kind !== "step_request") throw new Error(`a ${msg.kind} message does not belong on env_steps`);
  const missing = REQUIRED.filter((f) => !(f in msg));
  if (missing.length) throw new Error(`step_request is missing required field(s) ${missing.join(", ")}`);
  if (!Array.isArray(msg.actions) || msg.turn !== msg.actions.length - 1) throw new Error("step_request: turn must equal len(actions) - 1");
  if (typeof msg.reply_to !== "string" || typeof msg.episode_id !== "string") throw new Error("step_request: bad ids");
  return msg;
}

// The env itself: a pure function of (item, actions) -> [observation, reward, done].
function step(item, actions) {
  const meta = item.meta ?? {};
  if (typeof meta.cls !== "string" || typeof meta.chars !== "string") throw new Error("item.meta needs cls and chars");
  if (actions.length === 1) return [`\n${meta.cls}:`, 0.0, false];
  const length = Number(meta.length);
  const text = [...actions[actions.length - 1]].slice(0, length);
  const hits = text.filter((c) => meta.chars.includes(c)).length;
  return ["", hits / length, true];
}

async function deadLetter(stream, id, payload, reason) {
  const record = JSON.stringify({ stream, entry_id: id, reason, worker: consumer, ts: Date.now() / 1000 });
  await cmd(["XADD", DEADLETTER, "MAXLEN", "~", "100000", "*", "d",
             Buffer.concat([Buffer.from(record + "\n"), payload ?? Buffer.alloc(0)])]);
  log("dead_letter", { entry_id: id, reason });
}

let steps = 0;
async function handle(stream, id, fields) {
  let req;
  try {
    req = decodeStep(fields);
  } catch (err) {
    await deadLetter(stream, id, fields?.[1], String(err.message ?? err));
    await cmd(["XACK", stream, GROUP, id]);
    return;
  }
  const t0 = performance.now();
  await sleep(latLow + Math.random() * (latHigh - latLow));  // like a tool call
  let obs;
  try {
    const [text, reward, done] = step(req.item, req.actions);
    obs = { text, reward, done, error: "" };
  } catch (err) {
    obs = { text: "", reward: 0.0, done: false, error: `env raised: ${err.message ?? err}` };
    await deadLetter(stream, id, fields[1], `episode ${req.episode_id} turn ${req.turn}: ${obs.error}`);
  }
  const message = { schema: SCHEMA, kind: "observation", episode_id: req.episode_id, turn: req.turn, text: obs.text,
                    reward: obs.reward, done: obs.done, error: obs.error, error_kind: "", env_worker: consumer,
                    step_s: (performance.now() - t0) / 1000 };
  await cmd(["XADD", k(`observations:${req.reply_to}`), "MAXLEN", "~", "100000", "*", "d",
             Buffer.from(encode(message))]);
  await cmd(["XACK", stream, GROUP, id]);  // only after the observation is written
  steps += 1;
}

const inflight = new Set();
function launch(stream, entries) {
  for (const entry of entries) {
    if (!entry) continue;  // Redis 6.2 XAUTOCLAIM: an entry deleted meanwhile comes back as nil
    const [rawId, fields] = entry;
    const id = str(rawId);
    if (!fields) continue;
    const p = handle(stream, id, fields).catch((err) => log("step_failed", { entry_id: id, error: String(err.message ?? err) }));
    inflight.add(p);
    p.finally(() => inflight.delete(p));
  }
}

let stopping = false;
for (const sig of ["SIGINT", "SIGTERM"]) process.on(sig, () => { stopping = true; log("stopping", { signal: sig }); });

await client.connect();
for (const stream of [STEPS, OWN]) {
  try {
    await cmd(["XGROUP", "CREATE", stream, GROUP, "0", "MKSTREAM"]);
  } catch (err) {
    if (!String(err.message ?? err).includes("BUSYGROUP")) throw err;
  }
}

// [[stream, entries], ...] from an XREADGROUP reply over one or more streams.
const byStream = (reply) => (reply ?? []).map(([name, entries]) => [str(name), entries ?? []]);

// Steps routed to env workers whose heartbeat is gone: their own pending (XAUTOCLAIM) and the
// steps sent there before the generators saw the heartbeat go (XREADGROUP >).
async function orphaned(free) {
  const out = [];
  let cursor = "0";
  do {
    const [next, names] = await cmd(["SCAN", cursor, "MATCH", `${STEPS}:*`, "COUNT", "100"]);
    cursor = str(next);
    for (const raw of names) {
      const stream = str(raw), owner = stream.slice(STEPS.length + 1);
      if (owner === consumer || (await cmd(["GET", k(`workers:env:${owner}`)])) !== null) continue;
      const claimed = await cmd(["XAUTOCLAIM", stream, GROUP, consumer, String(claimIdleMs), "0-0", "COUNT", free]);
      out.push([stream, claimed[1] ?? []]);
      try {
        const reply = await cmd(["XREADGROUP", "GROUP", GROUP, consumer, "COUNT", free, "STREAMS", stream, ">"]);
        out.push(...byStream(reply));
      } catch (err) {  // its group is gone (the stream was deleted meanwhile): nothing to take
        if (!String(err.message ?? err).includes("NOGROUP")) throw err;
      }
    }
  } while (cursor !== "0");
  return out;
}

let pendingDone = false, lastClaim = 0, lastBeat = 0;
log("started", { run: opt.run, own: OWN });
while (!stopping) {
  try {
    if (Date.now() - lastBeat > 5000) {
      lastBeat = Date.now();
      const beat = { pid: process.pid, host: os.hostname(), ts: Date.now() / 1000, steps, sticky: 1 };
      await cmd(["SET", HEARTBEAT, JSON.stringify(beat), "PX", "15000"]);
    }
    const free = String(Math.max(1, 64 - inflight.size));
    let got = [];
    if (!pendingDone) {  // read once at start: later pending entries are our own steps in flight
      got = byStream(await cmd(["XREADGROUP", "GROUP", GROUP, consumer, "COUNT", free, "STREAMS", OWN, STEPS, "0", "0"]));
      pendingDone = true;
    }
    if (!got.some(([, e]) => e.length) && Date.now() - lastClaim > claimIdleMs / 4) {
      lastClaim = Date.now();
      const reply = await cmd(["XAUTOCLAIM", STEPS, GROUP, consumer, String(claimIdleMs), "0-0", "COUNT", free]);
      got = [[STEPS, reply[1] ?? []], ...(await orphaned(free))];
    }
    if (!got.some(([, e]) => e.length)) {  // the own stream first: those episodes were answered here
      const reply = await cmd(["XREADGROUP", "GROUP", GROUP, consumer, "COUNT", free, "BLOCK", "200",
                               "STREAMS", OWN, STEPS, ">", ">"]);
      got = byStream(reply);
    }
    for (const [stream, entries] of got) launch(stream, entries);
    if (inflight.size >= 64) await Promise.race(inflight);
  } catch (err) {
    log("broker_error", { error: String(err.message ?? err) });
    await sleep(1000);
  }
}
await Promise.allSettled([...inflight]);  // finish (and ack) what was taken
await cmd(["DEL", HEARTBEAT]).catch(() => {});
await client.disconnect().catch(() => {});
log("stopped", { steps });
