#!/usr/bin/env node
// A small LLM-serving scheduler in plain Node.js that speaks schedconf's
// JSON-lines protocol (conformance/PROTOCOL.md) and follows the rules of the
// vllm-0.33 profile, without prefix caching.
//
// It is meant to be read: what a third party needs to write to conform. Each
// section below is one concept:
//
//   1. protocol plumbing: errors and canonical JSON
//   2. init: config validation and what we do not support
//   3. a request: validation, counters, the stop check
//   4. the waiting queue (FCFS or priority)
//   5. the block pool and its free list
//   6. schedule(): the running loop, preemption, the waiting loop, the output
//   7. update(): draft rejection, the stop check, freeing, next drafts
//   8. the main loop: one JSON request per line in, one response per line out
//
// Vocabulary: a request's "tokens" are its prompt plus the tokens sampled so
// far; "computed" is how many of them have KV in the cache. Every step the
// scheduler lets computed catch up with tokens (plus drafts). There is no
// prefill or decode phase, just tokens still to compute.
//
// No dependencies: run it as `node examples/js-scheduler/scheduler.js`.

'use strict';

const readline = require('readline');

// ============================================================ 1. plumbing

/** An input we refuse: becomes {"error": {"code", "message"}} on the wire. */
class ProtocolError extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

function check(condition, code, message) {
  if (!condition) throw new ProtocolError(code, message);
}

// JSON booleans are not numbers in JS, so this also refuses true/false.
const isInt = (v) => Number.isInteger(v);
const MAX_TOKEN_ID = 2147483647; // int32, as the spec (spec/v1/request.py MAX_TOKEN_ID)
const isTokenId = (v) => Number.isInteger(v) && v >= 0 && v <= MAX_TOKEN_ID;
const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);
const ownValue = (obj, key) => (Object.hasOwn(obj, key) ? obj[key] : undefined);
const cdiv = (a, b) => Math.floor((a + b - 1) / b);

/** Python's string order (by code point), used for every sorted id list. */
function compareIds(a, b) {
  let i = 0;
  while (i < a.length && i < b.length) {
    const ca = a.codePointAt(i);
    const cb = b.codePointAt(i);
    if (ca !== cb) return ca < cb ? -1 : 1;
    i += ca > 0xffff ? 2 : 1;
  }
  return a.length === b.length ? 0 : a.length < b.length ? -1 : 1;
}

/**
 * JSON.parse reads `4.0` as the integer 4, but the spec (Python) sees a float
 * and refuses it where an integer is due. So before parsing, wrap every number
 * literal written with a fraction or an exponent as {"__float__": "4.0"}: it
 * reaches validation as a non-integer, and floatValue() reads it back where a
 * float is allowed (arrival_time). (String literals are matched first and left
 * alone.)
 */
function parseKeepingFloats(line) {
  const marked = line.replace(/"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?/g,
    (token) => (token[0] !== '"' && /[.eE]/.test(token) ? `{"__float__":"${token}"}` : token));
  return JSON.parse(marked);
}

/** A JSON number (integer or marked float) as a JS number; NaN for anything else. */
function floatValue(v) {
  if (typeof v === 'number') return v;
  if (isObject(v) && typeof v.__float__ === 'string' && Object.keys(v).length === 1) return Number(v.__float__);
  return NaN;
}

/** JSON with sorted keys and no spaces, as the protocol asks. */
function canonicalJson(value) {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  if (isObject(value)) {
    const keys = Object.keys(value).sort(compareIds);
    return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(value[k])}`).join(',')}}`;
  }
  return JSON.stringify(value === undefined ? null : value);
}

// ============================================================ 2. init

// Every config field, in the order the spec validates them, with the default
// used when a field is absent (spec/v1/config.py). The last four came with vLLM
// 0.32 (optional in traces: absent means the default).
const CONFIG_DEFAULTS = {
  block_size: 16,
  num_gpu_blocks: 10000,
  max_num_batched_tokens: 8192,
  max_num_seqs: 16,
  max_model_len: 8192,
  enable_chunked_prefill: true,
  long_prefill_token_threshold: 0,
  enable_prefix_caching: true,
  policy: 'fcfs',
  num_spec_tokens: 0,
  num_lookahead_tokens: 0,
  scheduler_reserve_full_isl: null,
  max_concurrent_batches: 1,
  max_num_active_seqs: null,
  long_prefill_token_threshold_adaptive: false,
  use_v2_model_runner: false,
  pipeline_parallel_size: 1,
  prefill_schedule_interval: 1,
  log_stats: true,
};
const BOOLEAN_FIELDS = ['enable_chunked_prefill', 'enable_prefix_caching', 'long_prefill_token_threshold_adaptive',
  'use_v2_model_runner', 'log_stats'];
const NULLABLE_FIELDS = ['scheduler_reserve_full_isl', 'max_num_active_seqs']; // null means "the default"

// Every v1 profile the spec knows (spec/v1/profiles.py), with the start-up rules
// that differ between their releases. We implement vllm-0.33 only; a config
// for another one is still checked, so a config the release refuses gets the
// release's error code, and only a valid one gets `unsupported`.
//   thresholdLimit: long_prefill_token_threshold <= max_model_len is required
//   lateKnobs:      the 0.32 knobs (max_num_active_seqs, ...) exist
//   inFlight:       steps in flight are modelled; async: AsyncScheduler
//   stagger:        AsyncScheduler's pipeline-parallel decode stagger exists (0.32+)
//   cadence:        prefill_schedule_interval exists (0.33+)
const V1_PROFILES = {
  'vllm-0.33': { thresholdLimit: true, lateKnobs: true, inFlight: true, async: false, stagger: true, cadence: true },
  'vllm-0.32': { thresholdLimit: true, lateKnobs: true, inFlight: true, async: false, stagger: true, cadence: false },
  'vllm-0.33-async': { thresholdLimit: true, lateKnobs: true, inFlight: true, async: true, stagger: true, cadence: true },
  'vllm-0.32-async': { thresholdLimit: true, lateKnobs: true, inFlight: true, async: true, stagger: true, cadence: false },
  'vllm-0.11': { thresholdLimit: false, lateKnobs: false, inFlight: false, async: false, stagger: false, cadence: false },
  'aphrodite-0.24': { thresholdLimit: true, lateKnobs: false, inFlight: false, async: false, stagger: true, cadence: false },
};
// Profiles of vLLM's legacy v0 scheduler: another scheduler with another
// config (spec/v0/), not implemented here.
const V0_PROFILES = ['vllm-0.10'];
const SUPPORTED_PROFILE = 'vllm-0.33';

/** Validate an init request; returns the full config or throws the spec's code (or `unsupported`). */
function readConfig(params) {
  // A v0 config has other fields and rules: we cannot even check it.
  check(!V0_PROFILES.includes(params.profile), 'unsupported',
    `${params.profile} is vLLM's legacy v0 scheduler; only the v1 scheduler of ${SUPPORTED_PROFILE} is implemented`);
  const c = checkConfig(params.config);
  const rules = V1_PROFILES[params.profile];
  check(rules !== undefined, 'unknown_profile', `unknown profile ${JSON.stringify(params.profile)}`);
  checkConfigForProfile(c, params.profile, rules);

  // A valid config and profile that this small scheduler does not implement:
  // the harness records the verdict as "unknown", not as a failure. Decided
  // here, at init: `unsupported` is no answer to any later call.
  check(params.profile === SUPPORTED_PROFILE, 'unsupported', `only the ${SUPPORTED_PROFILE} profile is implemented`);
  check(!c.enable_prefix_caching, 'unsupported', 'prefix caching is not implemented');
  check(c.max_concurrent_batches === 1, 'unsupported', 'steps in flight (max_concurrent_batches > 1) are not implemented');
  check(c.prefill_schedule_interval === 1, 'unsupported', 'the local prefill cadence is not implemented');
  return c;
}

/** The rules every profile shares (spec/v1/config.py), in the spec's order of checks. */
function checkConfig(raw) {
  check(isObject(raw), 'invalid_config_type', 'config must be an object');
  const unknown = Object.keys(raw).filter((k) => !Object.hasOwn(CONFIG_DEFAULTS, k)).sort(compareIds);
  check(unknown.length === 0, 'unknown_config_field', `unknown config field(s): ${unknown.join(', ')}`);
  const c = { ...CONFIG_DEFAULTS };
  for (const k of Object.keys(raw)) c[k] = raw[k];

  for (const [name, value] of Object.entries(c)) { // CONFIG_DEFAULTS' order
    if (BOOLEAN_FIELDS.includes(name)) {
      check(typeof value === 'boolean', 'invalid_config_type', `${name} must be a boolean`);
    } else if (name === 'scheduler_reserve_full_isl') {
      check(value === null || typeof value === 'boolean', 'invalid_config_type', `${name} must be a boolean or null`);
    } else if (name === 'policy') {
      check(value === 'fcfs' || value === 'priority', 'invalid_policy', "policy must be 'fcfs' or 'priority'");
    } else {
      check(isInt(value) || (NULLABLE_FIELDS.includes(name) && value === null), 'invalid_config_type',
        `${name} must be an integer${NULLABLE_FIELDS.includes(name) ? ' or null' : ''}`);
    }
  }
  check(c.block_size >= 1, 'invalid_block_size', 'block_size must be >= 1');
  check(c.num_gpu_blocks >= 2, 'invalid_num_gpu_blocks', 'num_gpu_blocks must be >= 2 (block 0 is the null block)');
  check(c.max_num_batched_tokens >= 1, 'invalid_token_budget', 'max_num_batched_tokens must be >= 1');
  check(c.max_num_seqs >= 1, 'invalid_max_num_seqs', 'max_num_seqs must be >= 1');
  check(c.max_model_len >= 1, 'invalid_max_model_len', 'max_model_len must be >= 1');
  check(c.long_prefill_token_threshold >= 0, 'invalid_threshold', 'long_prefill_token_threshold must be >= 0');
  check(c.num_spec_tokens >= 0, 'invalid_num_spec_tokens', 'num_spec_tokens must be >= 0');
  check(c.max_num_active_seqs === null || (c.max_num_active_seqs >= 1 && c.max_num_active_seqs <= c.max_num_seqs),
    'invalid_max_num_active_seqs', 'max_num_active_seqs must be null or in [1, max_num_seqs]');
  check(c.max_concurrent_batches >= 1, 'invalid_max_concurrent_batches', 'max_concurrent_batches must be >= 1');
  check(c.pipeline_parallel_size >= 1, 'invalid_pipeline_parallel_size', 'pipeline_parallel_size must be >= 1');
  check(c.prefill_schedule_interval >= 1, 'invalid_prefill_schedule_interval', 'prefill_schedule_interval must be >= 1');
  check(c.num_lookahead_tokens >= 0, 'invalid_num_lookahead_tokens', 'num_lookahead_tokens must be >= 0');
  check(c.enable_chunked_prefill || c.max_num_batched_tokens >= c.max_model_len,
    'budget_below_max_model_len', 'without chunked prefill, max_num_batched_tokens must be >= max_model_len');
  check(c.max_num_batched_tokens >= c.max_num_seqs, 'budget_below_max_num_seqs',
    'max_num_batched_tokens must be >= max_num_seqs');
  check(cdiv(c.max_model_len, c.block_size) <= c.num_gpu_blocks - 1,
    'pool_below_max_model_len', 'num_gpu_blocks - 1 usable blocks must hold max_model_len tokens');
  return c;
}

/** The profile's own start-up checks (spec/v1/profiles.py check_config_for_profile), after the config's. */
function checkConfigForProfile(c, profile, rules) {
  check(!rules.thresholdLimit || c.long_prefill_token_threshold <= c.max_model_len, 'threshold_above_max_model_len',
    'long_prefill_token_threshold cannot exceed max_model_len');
  // A threshold of at most num_spec_tokens is accepted, as vLLM does; vLLM then
  // dies in schedule() when it cuts a padded admission, and so do we (6b).
  const lateKnobs = ['max_num_active_seqs', 'long_prefill_token_threshold_adaptive', 'use_v2_model_runner']
    .filter((k) => c[k] !== CONFIG_DEFAULTS[k]);
  check(rules.lateKnobs || lateKnobs.length === 0, 'knob_not_in_release',
    `${lateKnobs.join(', ')}: not a knob of ${profile}'s release`);
  check(rules.cadence || c.prefill_schedule_interval === 1, 'knob_not_in_release',
    `prefill_schedule_interval: not a knob of ${profile}'s release`);
  check(c.max_concurrent_batches === 1 || (rules.inFlight && (c.num_spec_tokens === 0 || rules.async)),
    'in_flight_not_modelled', `steps in flight (max_concurrent_batches=${c.max_concurrent_batches}) are not modelled`);
  check(c.pipeline_parallel_size === 1 || (rules.async && rules.stagger), 'pipeline_parallel_not_modelled',
    `pipeline_parallel_size=${c.pipeline_parallel_size} is modelled only under an async profile`);
}

// ============================================================ 3. a request

class Request {
  constructor(p) {
    this.id = p.request_id;
    this.numPromptTokens = p.prompt_token_ids.length;
    this.tokens = [...p.prompt_token_ids]; // prompt, then every sampled token
    this.maxTokens = p.max_tokens;
    this.priority = p.priority;
    this.arrivalTime = p.arrival_time;
    this.eos = p.ignore_eos ? null : p.eos_token_id; // ignore_eos: EOS never stops it
    this.stopTokenIds = [...p.stop_token_ids];
    this.status = 'WAITING'; // WAITING, RUNNING, PREEMPTED or FINISHED
    this.finishReason = null; // 'stop', 'length' or 'abort' once FINISHED
    this.stopReason = null; // the stop token id that ended it
    this.numComputed = 0; // tokens with KV in the cache
    this.drafts = []; // draft tokens proposed for the next step
    this.blocks = []; // its block table: block ids in token order
    // Did the last step that scheduled it stop short of its last token?
    // (Such a step samples nothing.)
    this.isPrefillChunk = false;
  }

  get numTokens() { return this.tokens.length; }
  get numOutputTokens() { return this.tokens.length - this.numPromptTokens; }
  get numTokensWithDrafts() { return this.tokens.length + this.drafts.length; }

  /** Append one sampled token; return the finish reason it causes, or null. */
  appendAndCheckStop(token, maxModelLen) {
    this.tokens.push(token);
    // vllm-0.33 order: EOS, stop ids, then length. min_tokens plays no part
    // here (the model masks EOS while below it), so a sampled EOS stops.
    if (this.eos !== null && token === this.eos) return 'stop';
    if (this.stopTokenIds.includes(token)) {
      this.stopReason = token;
      return 'stop';
    }
    if (this.numTokens >= maxModelLen || this.numOutputTokens >= this.maxTokens) return 'length';
    return null;
  }
}

const REQUEST_FIELDS = ['request_id', 'prompt_token_ids', 'max_tokens', 'priority', 'arrival_time',
  'eos_token_id', 'stop_token_ids', 'ignore_eos', 'min_tokens'];

/** Refuse a bad add_request with the spec's code, in the spec's order. */
function validateRequest(p, liveRequests, maxModelLen) {
  for (const f of REQUEST_FIELDS) check(Object.hasOwn(p, f), 'invalid_field_type', `missing field ${f}`);
  for (const f of ['prompt_token_ids', 'stop_token_ids']) {
    check(Array.isArray(p[f]), 'invalid_field_type', `${f} must be a list`);
  }
  check(typeof p.ignore_eos === 'boolean', 'invalid_field_type', 'ignore_eos must be a boolean');
  const id = p.request_id;
  check(typeof id === 'string' && id !== '', 'invalid_request_id', 'request id must be a non-empty string');
  check(!liveRequests.has(id), 'duplicate_request_id', `request ${id} is already known`);
  const promptLen = p.prompt_token_ids.length;
  check(promptLen > 0, 'empty_prompt', 'the prompt has no tokens');
  check(promptLen < maxModelLen, 'prompt_too_long',
    `a prompt of ${promptLen} tokens leaves no room to generate within max_model_len=${maxModelLen}`);
  for (const f of ['max_tokens', 'min_tokens', 'priority']) {
    check(isInt(p[f]), 'invalid_field_type', `${f} must be an integer`);
  }
  // vLLM's arrival times are floats (time.time()): any finite number.
  check(Number.isFinite(floatValue(p.arrival_time)), 'invalid_field_type', 'arrival_time must be a finite number');
  p.arrival_time = floatValue(p.arrival_time);
  check(p.max_tokens >= 1, 'invalid_max_tokens', 'max_tokens must be >= 1');
  check(p.min_tokens >= 0 && p.min_tokens <= p.max_tokens, 'invalid_min_tokens', 'min_tokens must be in [0, max_tokens]');
  const eos = p.eos_token_id === null ? [] : [p.eos_token_id];
  for (const t of [...p.prompt_token_ids, ...p.stop_token_ids, ...eos]) {
    check(isTokenId(t), 'invalid_token_id', 'token ids must be non-negative integers');
  }
}

// ============================================================ 4. waiting queue

// Holds requests without blocks: new (WAITING) and preempted (PREEMPTED).
// FCFS: arrival order, and a preempted request goes back to the head.
class FcfsQueue {
  constructor() { this.items = []; }
  get length() { return this.items.length; }
  peek() { return this.items[0]; }
  pop() { return this.items.shift(); }
  add(r) { this.items.push(r); }
  addPreempted(r) { this.items.unshift(r); }
  remove(r) { this.items.splice(this.items.indexOf(r), 1); }
}

// Priority: always ordered by (priority, arrival_time, request id), lower
// first; a preempted request goes back to its place by that key.
function priorityKeyLess(a, b) {
  if (a.priority !== b.priority) return a.priority < b.priority;
  if (a.arrivalTime !== b.arrivalTime) return a.arrivalTime < b.arrivalTime;
  return compareIds(a.id, b.id) < 0;
}

class PriorityQueue extends FcfsQueue {
  add(r) {
    let i = 0;
    while (i < this.items.length && priorityKeyLess(this.items[i], r)) i++;
    this.items.splice(i, 0, r);
  }
  addPreempted(r) { this.add(r); }
}

// ============================================================ 5. block pool

// Blocks 1..N-1 are usable; block 0 is vLLM's null block and never handed out.
// vLLM keeps free blocks in a queue whose front is reused first. Initially it
// reads 1, 2, ..., N-1. Freed blocks that hold no cached prefix (always the
// case here: no prefix caching) go to the FRONT, the request's tail block
// first. So without prefix caching the queue is a stack: keep it in an array
// whose END is the front, pop to allocate, push a freed table head to tail
// (the tail block lands on top and is reused first).
class BlockPool {
  constructor(numGpuBlocks) {
    this.stack = [];
    for (let id = numGpuBlocks - 1; id >= 1; id--) this.stack.push(id);
  }
  get numFree() { return this.stack.length; }
  take(n) {
    const ids = [];
    for (let i = 0; i < n; i++) ids.push(this.stack.pop());
    return ids;
  }
  free(table) { for (const id of table) this.stack.push(id); }
  /** The free queue as the protocol's observe shows it: front first. */
  frontFirst() { return [...this.stack].reverse(); }
}

// ============================================================ 6. schedule()

class Scheduler {
  constructor(config) {
    this.cfg = config;
    this.pool = new BlockPool(config.num_gpu_blocks);
    // A waiting request is admitted only if the free blocks cover its whole
    // current sequence (default on in vllm-0.33).
    this.reserveFullSequence = config.scheduler_reserve_full_isl ?? true;
    this.requests = new Map(); // live (not finished) requests by id
    this.everSeen = new Set(); // aborting an id never added is an error
    this.waiting = config.policy === 'priority' ? new PriorityQueue() : new FcfsQueue();
    this.running = []; // admission order; the running loop walks it front to back
    this.finishedIds = new Set(); // finished / preempted since the last schedule()
    this.preemptedIds = new Set();
    this.pending = null; // the last step, until its update() arrives
    this.crashed = null; // the engine crash that killed us: every later call is refused
  }

  addRequest(p) {
    validateRequest(p, this.requests, this.cfg.max_model_len);
    // An id aborted during the pending step may not come back until that
    // step's output is applied: the output would be taken for the new request.
    check(this.pending === null || !this.pending.order.includes(p.request_id), 'request_id_in_flight',
      `request ${p.request_id} was aborted in the pending step; apply its model output first`);
    const r = new Request(p);
    this.requests.set(r.id, r);
    this.everSeen.add(r.id);
    this.waiting.add(r);
  }

  abort(id) {
    check(this.everSeen.has(id), 'unknown_request_id', `abort of request ${id}, which was never added`);
    const r = this.requests.get(id);
    if (r === undefined) return; // already finished: nothing to do
    if (r.status === 'RUNNING') this.running.splice(this.running.indexOf(r), 1);
    else this.waiting.remove(r);
    this.finish(r, 'abort');
  }

  finish(r, reason) {
    r.status = 'FINISHED';
    r.finishReason = reason;
    this.pool.free(r.blocks);
    r.blocks = [];
    this.requests.delete(r.id);
    this.finishedIds.add(r.id);
  }

  /**
   * Give `r` slots for `n` more tokens plus `lookahead`, capped at max_model_len.
   * Returns the newly taken block ids, or null (and changes nothing) if the
   * free blocks do not cover them. With `fullSequence` the free blocks must
   * also cover the request's whole current sequence (the admission gate).
   */
  allocateSlots(r, n, lookahead, fullSequence) {
    const { block_size: bs, max_model_len: maxLen } = this.cfg;
    const blocksNeeded = (numTokens) => Math.max(cdiv(numTokens, bs) - r.blocks.length, 0);
    if (fullSequence && blocksNeeded(Math.min(r.numTokens, maxLen)) > this.pool.numFree) return null;
    const needed = blocksNeeded(Math.min(r.numComputed + n + lookahead, maxLen));
    if (needed > this.pool.numFree) return null;
    const ids = this.pool.take(needed);
    r.blocks.push(...ids);
    return ids;
  }

  schedule() {
    check(this.pending === null, 'output_not_processed', 'schedule() before the previous step was updated');
    const st = {
      budget: this.cfg.max_num_batched_tokens,
      runningScheduled: [], // from the running loop, in loop order
      admitted: [], // new requests admitted from waiting
      resumed: [], // preempted requests admitted from waiting
      tokens: new Map(), // request id -> tokens scheduled (Map keeps order)
      newBlocks: new Map(), // request id -> block ids for the output
      drafts: new Map(), // request id -> draft tokens scheduled
      preempted: false,
      prefillScheduled: false, // scheduled a running request whose last step was a prefill chunk
    };
    // The long-prefill threshold caps one request's tokens per step, unless
    // it is the only request around (nobody to starve). Adaptive (0.32+): the
    // cap is at least a fair share of the budget among the requests present.
    const numPresent = this.running.length + this.waiting.length;
    let threshold = numPresent <= 1 ? 0 : this.cfg.long_prefill_token_threshold;
    if (threshold > 0 && this.cfg.long_prefill_token_threshold_adaptive) {
      threshold = Math.max(threshold, Math.floor(this.cfg.max_num_batched_tokens / numPresent));
    }

    this.runningLoop(st, threshold);
    // A step that preempted admits nobody: freed blocks go to running requests.
    if (!st.preempted) this.waitingLoop(st, threshold);
    return this.makeOutput(st);
  }

  // ---- 6a. the running loop: top up each running request, preempt on no space
  runningLoop(st, threshold) {
    let i = 0;
    while (i < this.running.length && st.budget > 0) {
      const r = this.running[i];
      let n = r.numTokensWithDrafts - r.numComputed;
      if (threshold > 0 && n > threshold) n = threshold;
      // Keep the position of the token sampled after this step below max_model_len.
      n = Math.min(n, st.budget, this.cfg.max_model_len - 1 - r.numComputed);
      if (n <= 0) { i++; continue; } // nothing to do now; later requests may run

      let ids = this.allocateSlots(r, n, this.cfg.num_lookahead_tokens, false);
      while (ids === null) {
        const victim = this.pickVictim();
        i = this.preempt(st, victim, i);
        if (victim === r) break;
        ids = this.allocateSlots(r, n, this.cfg.num_lookahead_tokens, false);
      }
      if (ids === null) {
        // `r` preempted itself. FCFS: it was the tail, stop. Priority: the
        // requests behind it shifted into its slot and may still fit.
        if (this.cfg.policy === 'priority') continue;
        break;
      }
      st.runningScheduled.push(r);
      st.prefillScheduled ||= r.isPrefillChunk;
      st.tokens.set(r.id, n);
      st.newBlocks.set(r.id, ids);
      st.budget -= n;
      i++;
      // Hand over the drafts this step's tokens reach past the sequence end;
      // the request's own list is cleared either way.
      const numDrafts = n + r.numComputed - r.numTokens;
      if (r.drafts.length && numDrafts > 0) st.drafts.set(r.id, r.drafts.slice(0, numDrafts));
      r.drafts = [];
    }
  }

  // FCFS: the last running request. Priority: the least important one, i.e.
  // the first with the largest (priority, arrival_time).
  pickVictim() {
    if (this.cfg.policy === 'fcfs') return this.running[this.running.length - 1];
    let victim = this.running[0];
    for (const r of this.running) {
      if (r.priority > victim.priority || (r.priority === victim.priority && r.arrivalTime > victim.arrivalTime)) {
        victim = r;
      }
    }
    return victim;
  }

  /** Preempt `victim` by recompute; returns the running loop's index, repaired. */
  preempt(st, victim, i) {
    const at = this.running.indexOf(victim);
    this.running.splice(at, 1);
    if (at < i) i--; // only a priority victim can stand before the cursor
    const k = st.runningScheduled.indexOf(victim);
    if (k >= 0) { // it was scheduled earlier this step: take that back
      st.runningScheduled.splice(k, 1);
      st.budget += st.tokens.get(victim.id);
      st.tokens.delete(victim.id);
      st.newBlocks.delete(victim.id);
      st.drafts.delete(victim.id);
    }
    this.pool.free(victim.blocks);
    victim.blocks = [];
    victim.status = 'PREEMPTED';
    victim.numComputed = 0; // it keeps its outputs and re-prefills them later
    victim.drafts = [];
    this.waiting.addPreempted(victim);
    this.preemptedIds.add(victim.id);
    st.preempted = true;
    return i;
  }

  // ---- 6b. the waiting loop: admit from the head while budget, seats, blocks last
  waitingLoop(st, threshold) {
    const { num_spec_tokens: numSpec, max_model_len: maxLen } = this.cfg;
    while (st.budget > 0 && this.waiting.length > 0) {
      // Seats: max_num_active_seqs (0.32+; null means max_num_seqs) may run at once.
      if (this.running.length >= (this.cfg.max_num_active_seqs ?? this.cfg.max_num_seqs)) break;
      const r = this.waiting.peek();
      let n = r.numTokens; // a resumed request re-prefills its outputs too
      // Spec-decode padding (0.32+): a one-token admission joining a batch of
      // decodes is scheduled at the uniform size 1 + num_spec_tokens, with
      // placeholder drafts (-1), so the batch keeps one shape.
      let padded = false;
      if (numSpec > 0 && n === 1 && !st.prefillScheduled && st.runningScheduled.length > 0
          && 1 + numSpec + 1 <= maxLen) {
        if (1 + numSpec > st.budget) break; // rather not schedule than unpadded
        n = 1 + numSpec;
        padded = true;
      }
      if (threshold > 0 && n > threshold) n = threshold;
      // Without chunked prefill a prompt runs whole or waits; nobody passes it.
      if (!this.cfg.enable_chunked_prefill && n > st.budget) break;
      n = Math.min(n, st.budget);
      if (this.allocateSlots(r, n, this.cfg.num_lookahead_tokens, this.reserveFullSequence) === null) break;

      this.waiting.pop();
      this.running.push(r);
      (r.status === 'WAITING' ? st.admitted : st.resumed).push(r);
      r.status = 'RUNNING';
      st.tokens.set(r.id, n);
      st.newBlocks.set(r.id, [...r.blocks]); // an admitted request reports all its blocks
      st.budget -= n;
      if (padded && n !== 1 + numSpec) {
        // vLLM 0.32/0.33 pad before the threshold cuts, then assert the
        // admission kept all 1 + num_spec_tokens tokens: the assertion fails
        // and the engine core dies in schedule() (a vLLM bug the reference
        // models). We die here too; every later call is refused (engine_dead).
        this.crashed = 'engine_assertion_padded_admission';
        throw new ProtocolError(this.crashed, `${r.id} was padded to ${1 + numSpec} tokens and cut to ${n}`);
      }
      if (padded) st.drafts.set(r.id, new Array(numSpec).fill(-1));
    }
  }

  // ---- 6c. the output, then count the scheduled tokens as computed
  makeOutput(st) {
    const sortedEntries = (map) => [...map.entries()].sort((a, b) => compareIds(a[0], b[0]));
    const cached = (r, resumed) => ({
      req_id: r.id,
      resumed,
      new_block_ids: st.newBlocks.get(r.id),
      num_computed_tokens: r.numComputed,
      num_output_tokens: r.numOutputTokens,
    });
    // The V2 model runner's layout (use_v2_model_runner, 0.32+) lists resumed
    // requests after the new ones, as new requests with all their blocks.
    const v2 = this.cfg.use_v2_model_runner;
    const output = {
      scheduled_new_reqs: [...st.admitted, ...(v2 ? st.resumed : [])].map((r) => ({
        req_id: r.id, block_ids: st.newBlocks.get(r.id), num_computed_tokens: r.numComputed,
      })),
      scheduled_cached_reqs: [
        ...st.runningScheduled.map((r) => cached(r, false)),
        ...(v2 ? [] : st.resumed.map((r) => cached(r, true))),
      ],
      num_scheduled_tokens: Object.fromEntries(sortedEntries(st.tokens)),
      total_num_scheduled_tokens: [...st.tokens.values()].reduce((a, b) => a + b, 0),
      scheduled_spec_decode_tokens: Object.fromEntries(sortedEntries(st.drafts)),
      finished_req_ids: [...this.finishedIds].sort(compareIds),
      preempted_req_ids: [...this.preemptedIds].sort(compareIds),
    };
    // Optimistic: scheduled tokens count as computed now; update() rolls
    // back rejected drafts.
    const samples = new Map();
    for (const [id, n] of st.tokens) {
      const r = this.requests.get(id);
      r.numComputed += n;
      r.isPrefillChunk = r.numComputed < r.numTokens;
      samples.set(id, !r.isPrefillChunk); // reaching the end of the sequence samples
    }
    this.finishedIds = new Set();
    this.preemptedIds = new Set();
    this.pending = { order: [...st.tokens.keys()], drafts: st.drafts, samples };
    return output;
  }

  // ============================================================ 7. update()

  update(params) {
    const step = this.pending;
    check(step !== null, 'unexpected_model_output', 'model output without a pending step');
    const sampled = params.sampled_token_ids;
    const proposed = params.draft_token_ids;
    check(isObject(sampled) && isObject(proposed), 'invalid_field_type', 'sampled/draft token ids must be objects');
    this.validateModelOutput(step, sampled, proposed);
    this.pending = null;

    const outputs = [];
    for (const id of step.order) {
      const r = this.requests.get(id);
      if (r === undefined) continue; // aborted while the step ran
      const generated = ownValue(sampled, id) ?? [];
      // Drafts the model rejected: it samples one token per accepted draft
      // plus one; the slots of the rejected ones are computed again later.
      const drafts = step.drafts.get(id) ?? [];
      if (drafts.length && generated.length && r.numComputed > 0) {
        r.numComputed -= drafts.length - Math.max(generated.length - 1, 0);
      }
      // Append token by token; tokens after a stopping one are dropped.
      let kept = generated;
      let reason = null;
      for (let i = 0; i < generated.length && reason === null; i++) {
        reason = r.appendAndCheckStop(generated[i], this.cfg.max_model_len);
        if (reason !== null) {
          r.numComputed -= generated.length - (i + 1);
          kept = generated.slice(0, i + 1);
        }
      }
      if (reason !== null) {
        const list = r.status === 'RUNNING' ? this.running : this.waiting.items;
        list.splice(list.indexOf(r), 1);
        this.finish(r, reason);
      }
      if (kept.length || reason !== null) {
        outputs.push({ req_id: id, new_token_ids: kept, finish_reason: reason, stop_reason: r.stopReason });
      }
    }
    // Drafts proposed for the next step; none after a prefill chunk (nothing
    // was sampled to draft from).
    for (const [id, drafts] of Object.entries(proposed)) {
      const r = this.requests.get(id);
      if (r !== undefined) r.drafts = r.isPrefillChunk ? [] : [...drafts];
    }
    return { outputs };
  }

  /** Refuse model output no model could produce for this step (before any change). */
  validateModelOutput(step, sampled, proposed) {
    const scheduled = new Set(step.order);
    for (const [id, tokens] of Object.entries(sampled)) {
      check(scheduled.has(id), 'unscheduled_model_output', `sampled tokens for ${id}, not scheduled this step`);
      check(Array.isArray(tokens), 'invalid_field_type', 'sampled token ids must be lists');
      check(tokens.every(isTokenId), 'invalid_token_id', 'sampled token ids must be non-negative integers');
    }
    for (const id of step.order) {
      if (!this.requests.has(id)) continue;
      const got = (ownValue(sampled, id) ?? []).length;
      const maxGot = 1 + (step.drafts.get(id) ?? []).length;
      if (step.samples.get(id)) {
        // An empty list is skipped, as vLLM does (no token, no stop check); with
        // drafts scheduled they stay computed and the request is never scheduled
        // again (its next count is not positive), as in vLLM 0.32/0.33.
        check(got <= maxGot, 'bad_num_sampled_tokens',
          `request ${id} reached the end of its sequence and may sample 0 to ${maxGot} tokens, got ${got}`);
      } else {
        check(got === 0, 'bad_num_sampled_tokens', `request ${id} ran a prefill chunk and samples nothing, got ${got}`);
      }
    }
    for (const [id, drafts] of Object.entries(proposed)) {
      check(this.cfg.num_spec_tokens > 0, 'drafts_without_spec_decode', 'draft tokens but num_spec_tokens is 0');
      check(scheduled.has(id), 'unscheduled_draft_tokens', `draft tokens for ${id}, not scheduled this step`);
      check(Array.isArray(drafts), 'invalid_field_type', 'draft token ids must be lists');
      check(drafts.length <= this.cfg.num_spec_tokens, 'too_many_draft_tokens',
        `${drafts.length} drafts exceed num_spec_tokens=${this.cfg.num_spec_tokens}`);
      check(drafts.every(isTokenId), 'invalid_token_id', 'draft token ids must be non-negative integers');
    }
  }

  observe() {
    return { free_block_queue: this.pool.frontFirst(), num_free_blocks: this.pool.numFree };
  }
}

// ============================================================ 8. main loop

let scheduler = null;

function handle(method, params) {
  if (method === 'init') {
    scheduler = null;
    check(params.protocol_version === 1, 'unsupported', 'only protocol version 1 is implemented');
    scheduler = new Scheduler(readConfig(params));
    return { name: 'js-scheduler', capabilities: { observe: true } };
  }
  if (method === 'shutdown') return null;
  if (scheduler === null) throw new Error(`${method} before a successful init`);
  check(scheduler.crashed === null, 'engine_dead', `the engine died (${scheduler.crashed}); it takes no more calls`);
  switch (method) {
    case 'add_request': scheduler.addRequest(params); return null;
    case 'abort': scheduler.abort(params.request_id); return null;
    case 'schedule': return scheduler.schedule();
    case 'update': return scheduler.update(params);
    case 'observe': return scheduler.observe();
    default: throw new Error(`unknown method ${JSON.stringify(method)}`);
  }
}

function main() {
  const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  lines.on('line', (line) => {
    if (!line.trim()) return;
    let msg;
    try {
      msg = parseKeepingFloats(line);
    } catch (err) {
      process.stderr.write(`js-scheduler: not JSON: ${line.slice(0, 200)}\n`);
      return;
    }
    const reply = { id: msg.id };
    try {
      reply.result = handle(msg.method, isObject(msg.params) ? msg.params : {});
    } catch (err) {
      if (err instanceof ProtocolError) {
        reply.error = { code: err.code, message: err.message };
      } else { // a bug in here: the harness records a failure with our stderr
        process.stderr.write(`${err.stack}\n`);
        reply.error = { code: 'internal', message: String(err) };
      }
    }
    process.stdout.write(`${canonicalJson(reply)}\n`); // synchronous on a pipe
    if (msg.method === 'shutdown') process.exit(0);
  });
  lines.on('close', () => process.exit(0));
}

main();
