"""Workloads for vLLM's legacy v0 scheduler: generation, the engine loop, coverage, shrinking.

The v0 scheduler (``vllm/core/scheduler.py``, last shipped in vLLM 0.10.2,
profile ``vllm-0.10``) is modelled by ``spec/v0/``; this module is its
``conformance/workloads/generate.py`` and ``conformance/workloads/workload.py`` in one, reusing
their pieces (the :class:`~schedconf.conformance.workloads.workload.Workload` record, the request,
abort and invalid-input specs, the hash oracle, the choosers):

* :func:`build_v0_config` and :func:`build_v0_workload` draw configs and
  workloads biased to v0's hard cases (:data:`V0_FAMILIES`): swapping
  (``preemption_mode`` ``"swap"`` with CPU blocks, small GPU pools, long
  outputs), recompute preemption, concurrent partial prefills (chunked prefill
  with ``max_num_partial_prefills > 1`` and long prompts), prompts over the
  prompt limit (ignored, :data:`OUTGROW_RATE`: never by pool size, every pool
  holds one ``max_model_len`` sequence), priority preemption (policy
  ``priority`` with chunked prefill off), prefix hits (shared prefixes) and
  aborts reaching every queue (swapped ones aimed at: :func:`add_abort_of_swapped`).
  Only configs the model accepts are drawn (it refuses what vLLM 0.10.2
  refuses).
* :func:`make_random_workload` and :func:`make_workload_strategy` draw a
  workload of any profile's scheduler (campaigns call them): v0's here, v1's
  from ``conformance/workloads/generate.py``, whose draws stay byte-identical.
* The engine loop is ``conformance/workloads/workload.py``'s
  (``run_workload`` runs a v0 workload with ``run_v0_workload``).
* :func:`get_v0_features` names the hard cases a trace reaches, from the trace
  alone (coverage; :data:`V0_COVERAGE` are the shares every v0 run summary
  states).
* :func:`get_v0_config_candidates` are the smaller configs the shrinker tries.

The v1 generator is untouched: v1 workloads keep their bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from hypothesis import strategies as st

from schedconf.conformance.traces.trace import Trace
from schedconf.conformance.workloads.generate import (
    EOS,
    Chooser,
    HypothesisChooser,
    RandomChooser,
    random_workload,
    workloads,
)
from schedconf.conformance.workloads.workload import (
    OBSERVE_MAX_BLOCKS,
    AbortSpec,
    HashOracle,
    InvalidInput,
    RequestSpec,
    Workload,
    WorkloadError,
    is_engine_crash_code,
    is_v0_profile,
    run_v0_workload,
)
from schedconf.spec.errors import InvalidConfig, InvalidEvent
from schedconf.spec.v1.config import cdiv

V0_PROFILE = "vllm-0.10"
"""The v0 profile: vLLM 0.10.2's legacy scheduler."""

V0_FAMILIES = ("mixed", "swap", "partial", "priority", "prefix")
"""mixed: anything. swap: preemption_mode "swap" with CPU blocks, a GPU pool of
about one sequence, long outputs (swap-out, swap-in, aborts of swapped
requests). partial: chunked prefill with max_num_partial_prefills > 1 and long
prompts. priority: policy priority with chunked prefill off, later requests more
important, a tight pool (forced preemption of running requests). prefix: prefix
caching on, shared prefixes."""

FAMILY_DRAWS = ("mixed", "swap", "swap", "partial", "partial", "priority", "prefix")
"""The families as drawn: swapping and partial prefills twice as often (their cases are the rarest)."""

ABORT_SWAPPED_RATE = 0.5
"""Share of swap-mode workloads that get one more abort, aimed at a request while it is swapped out
(found by running the workload once: see :func:`add_abort_of_swapped`)."""

V0_COVERAGE = ("swap_out", "swap_in", "recompute", "ignored", "partial_prefills", "prefix_hit")
"""The coverage shares every v0 run summary states (see :func:`get_v0_features`)."""

OUTGROW_RATE = 0.2
"""Per request, under recompute preemption: the share of requests whose ``min_tokens`` (the v0
stop checker defers every stop, the length cap included, until then) grows them past the GPU
pool. Preempted (recomputed), they come back as a prompt over the limit (``max_model_len``) and
the scheduler finishes them as ignored. A prompt over the limit at ``add_request`` is refused
by the engine (``prompt_too_long``), so this is how 0.10.2 ignores a prompt; never by pool size
(every pool holds one ``max_model_len`` sequence, and swap mode gets no such request: it would
come back too big for the pool, ``can_swap_in`` NEVER)."""

SWAP_SPACE_EXHAUSTED = "engine_swap_space_exhausted"


# ------------------------------------------------------------- configs


def make_v0_config(fields: dict[str, Any], profile: str = V0_PROFILE) -> Any:
    """The model's v0 config for ``fields``; raises InvalidConfig for what vLLM 0.10.2 refuses."""
    from schedconf.spec.schedulers import make_config

    return make_config(fields, profile)


def draw_v0_config_fields(c: Chooser, family: str) -> dict[str, Any]:
    """One draw of v0 config fields (the model may still refuse them: see :func:`build_v0_config`)."""
    block_size = c.choice([4, 2, 8, 1, 16], "block_size")
    max_model_len = c.integer(max(4, block_size + 1), 12 * block_size, "max_model_len")
    min_blocks = cdiv(max_model_len, block_size)
    if family in ("swap", "priority"):
        slack = c.choice([0, 1, 0, 2], "pool_slack")
    elif family == "partial":
        slack = c.choice([2, 4, min_blocks, 3 * min_blocks], "pool_slack")
    else:
        slack = c.choice([0, 1, 0, 2, 4, 3 * min_blocks], "pool_slack")
    num_gpu_blocks = min_blocks + slack
    if family not in ("swap", "priority") and c.boolean(0.05, "watermark_pool"):
        # 100+ blocks: vLLM's watermark (int(0.01 * num_gpu_blocks)) is 1 block, not 0.
        num_gpu_blocks = max(num_gpu_blocks, 100 + c.integer(0, 30, "watermark_pool_extra"))
        # Fill it: sequences of one-token blocks up to (about) the whole pool, so that
        # the watermark block decides admissions (a mutant ignoring it survived
        # 3,000 traces of pools it never filled).
        block_size = 1
        max_model_len = num_gpu_blocks - c.choice([0, 0, 1, 2], "watermark_pool_gap")
        min_blocks = max_model_len
    if family == "swap":
        preemption_mode = c.choice(["swap", "swap", "swap", None], "preemption_mode")
    elif family == "priority":
        preemption_mode = c.choice([None, "recompute", "swap"], "preemption_mode")
    else:
        preemption_mode = c.choice(["swap", None, "recompute", "swap"], "preemption_mode")
    if preemption_mode == "swap":
        # Mostly room for every swapped request; sometimes too little (the engine crashes).
        num_cpu_blocks = c.choice(
            [
                2 * num_gpu_blocks,
                3 * num_gpu_blocks,
                num_gpu_blocks + min_blocks,
                4 * num_gpu_blocks,
                2 * num_gpu_blocks,
                num_gpu_blocks,
                3 * num_gpu_blocks,
                2 * num_gpu_blocks,
                4 * num_gpu_blocks,
                3 * num_gpu_blocks,
                max(1, min_blocks // 2),
                0,
            ],
            "num_cpu_blocks",
        )
    else:
        num_cpu_blocks = c.choice([0, 0, num_gpu_blocks, min_blocks], "num_cpu_blocks")
    if family == "partial":
        chunked = True
    elif family == "priority":
        chunked = c.boolean(0.2, "chunked_prefill")
    else:
        chunked = c.boolean(0.6, "chunked_prefill")
    policy = "priority" if family == "priority" else c.choice(["fcfs", "fcfs", "priority"], "policy")
    partial = chunked and (family == "partial" or c.boolean(0.3, "partial_prefills"))
    if family == "partial":
        budget = c.integer(2, max(2, max_model_len // 2 + block_size), "budget")
    elif chunked:
        budget = c.integer(2, max_model_len + 2 * block_size, "budget")
    else:
        budget = c.integer(max_model_len, 2 * max_model_len, "budget")
    max_num_seqs = c.integer(2 if family == "swap" else 1, max(1, min(6, budget)), "max_num_seqs")
    if partial:
        max_num_partial_prefills = c.integer(2, 4, "max_num_partial_prefills")
        max_long_partial_prefills = c.integer(1, max_num_partial_prefills, "max_long_partial_prefills")
        # 0: vLLM's int(0.04 * max_model_len) (0 for short models: every prompt is long).
        threshold = c.choice(
            [0, block_size, max(1, max_model_len // 4), max_model_len // 2, 1], "long_prefill_threshold"
        )
        threshold = min(threshold, max_model_len)
    else:
        max_num_partial_prefills = max_long_partial_prefills = 1
        threshold = c.choice([0, 0, 0, block_size], "long_prefill_threshold")
    prefix_caching = family == "prefix" or c.boolean(0.3 if family == "swap" else 0.5, "prefix_caching")
    if chunked and c.boolean(0.95, "no_zero_chunks"):
        # A prefill slot gets budget // max_num_partial_prefills tokens, and prefix caching rounds
        # a chunk down to whole blocks: a slot of 0 tokens schedules nothing, forever (vLLM
        # livelocks too). Mostly give each slot a token (a block under prefix caching).
        budget = max(budget, (block_size if prefix_caching else 1) * max_num_partial_prefills)
    return {
        "block_size": block_size,
        "num_gpu_blocks": num_gpu_blocks,
        "num_cpu_blocks": num_cpu_blocks,
        "max_num_batched_tokens": budget,
        "max_num_seqs": max_num_seqs,
        "max_model_len": max_model_len,
        "enable_chunked_prefill": chunked,
        "enable_prefix_caching": prefix_caching,
        "policy": policy,
        "preemption_mode": preemption_mode,
        "max_num_partial_prefills": max_num_partial_prefills,
        "max_long_partial_prefills": max_long_partial_prefills,
        "long_prefill_token_threshold": threshold,
    }


def build_v0_config(c: Chooser, family: str = "mixed", profile: str = V0_PROFILE) -> Any:
    """A small v0 config the model accepts (a refused draw is drawn again)."""
    last: InvalidConfig | None = None
    for attempt in range(20):
        fields = draw_v0_config_fields(c if attempt == 0 else c.fork(f"config_retry_{attempt}"), family)
        try:
            return make_v0_config(fields, profile)
        except InvalidConfig as exc:
            last = exc
    raise WorkloadError(f"no v0 config the model accepts in 20 draws: {last}")


# ----------------------------------------------------------- workloads


def build_v0_workload(
    c: Chooser, profile: str = V0_PROFILE, seed: int = 0, invalid_inputs: bool = True, config: Any = None
) -> Workload:
    """Draw one v0 workload (see the module docstring for what it aims at)."""
    family = c.choice(FAMILY_DRAWS, "family")
    config = config or build_v0_config(c, family, profile)
    cfg = config.to_dict()
    block_size, max_model_len = cfg["block_size"], cfg["max_model_len"]
    oracle = HashOracle(
        seed=c.integer(0, 2**16, "oracle_seed"),
        vocab_size=c.choice([64, 8, 512], "vocab"),
        eos_token_id=EOS,
        eos_per_mille=c.choice([0, 20] if family == "swap" else [0, 20, 100], "eos_rate"),
    )
    max_prompt = max_model_len - 1
    bases = [tuple(range(1000 * (i + 1), 1000 * (i + 1) + max_model_len + block_size)) for i in range(2)]
    num_requests = c.integer(3 if family == "swap" else 2, 7, "num_requests")
    if family == "partial":
        shapes = ["long", "near_max", "long", "short", "shared"]
    elif family == "prefix":
        shapes = ["shared", "shared", "block_multiple", "short", "long"]
    else:
        shapes = ["short", "shared", "short", "near_max", "block_multiple", "tiny", "long"]
    requests: list[RequestSpec] = []
    arrival = 0
    step = 0
    capacity = cfg["num_gpu_blocks"] * block_size
    for i in range(num_requests):
        rid = f"r{i}"
        # Only where the pool is about one sequence: the request then needs few tokens past it.
        outgrow = (
            cfg["preemption_mode"] != "swap"
            and capacity <= max_model_len + 4 * block_size
            and c.boolean(OUTGROW_RATE, "outgrow")
        )
        shape = c.choice(shapes, "prompt_shape")
        if shape == "near_max":
            length = c.choice([max_prompt, max_model_len], "near_max_len")
        elif shape == "block_multiple":
            length = min(max_prompt, block_size * c.integer(1, max(1, max_prompt // block_size), "blocks"))
        elif shape == "tiny":
            length = c.integer(1, min(2, max_prompt), "len")
        elif shape == "long":
            length = c.integer(max(1, max_prompt // 2), max_prompt, "len")
        else:
            length = c.integer(1, max(1, max_prompt // 3), "len")
        length = max(1, length)
        if shape in ("shared", "block_multiple") or c.boolean(0.3, "shares_prefix"):
            base = c.choice(bases, "base")
            shared = min(
                len(base),
                c.choice(
                    [length, length - 1, length // block_size * block_size, c.integer(0, length, "shared_any")],
                    "shared_len",
                ),
            )
            prompt = base[:shared] + tuple(5000 + 100 * i + j for j in range(length - shared))
        else:
            prompt = tuple(5000 + 100 * i + j for j in range(length))
        if family == "priority":
            step += c.choice([0, 1, 1, 2], "arrival_gap")  # staggered: a newcomer meets a full running queue
        elif family in ("swap", "partial"):
            step += c.choice([0, 0, 0, 1], "arrival_gap")  # together: decodes compete for blocks, prompts for slots
        else:
            step += c.choice([0, 0, 0, 1, 2, 5], "arrival_gap")
        arrival += c.choice([0, 1, 1, 3], "clock_gap")
        eos_mode = c.choice(["oracle", "none", "oracle", "oracle", "first_token"], "eos_mode")
        if family == "swap" and eos_mode == "first_token":
            eos_mode = "none"  # long outputs: preemption
        eos = None if eos_mode == "none" else (oracle.token(rid, 0) if eos_mode == "first_token" else EOS)
        stops: tuple[int, ...] = ()
        if c.boolean(0.15, "has_stop"):
            stops = (oracle.token(rid, c.integer(0, 3, "stop_at")),)
        if family in ("swap", "priority"):
            # Up to the length cap: two sequences of max_model_len do not fit a pool of about one.
            max_tokens = c.choice([max_model_len, max_model_len, 3 * block_size, 16, 2 * max_model_len], "max_tokens")
        else:
            max_tokens = c.choice([8, 16, 3 * block_size, 4, 1, 2], "max_tokens")
        min_tokens = min(max_tokens, c.choice([0, 0, 0, 1, 3], "min_tokens"))
        if outgrow:
            # Past the pool: it preempts itself (recompute) and comes back over the limit.
            max_tokens = min_tokens = capacity - length + c.integer(1, block_size + 1, "outgrow_by")
        if family == "priority":
            priority = c.choice([num_requests - i, num_requests - i, 0, c.integer(0, 2, "priority_any")], "priority")
        else:
            priority = c.choice([0, 0, 1, 2], "priority") if cfg["policy"] == "priority" else 0
        requests.append(
            RequestSpec(
                request_id=rid,
                prompt_token_ids=prompt,
                max_tokens=max_tokens,
                priority=priority,
                arrival_time=arrival,
                eos_token_id=eos,
                stop_token_ids=stops,
                ignore_eos=c.boolean(0.15, "ignore_eos"),
                min_tokens=min_tokens,
                at_step=step,
            )
        )
    aborts: list[AbortSpec] = []
    for r in requests:
        if c.boolean(0.2, "abort"):
            # At arrival (waiting), a few steps on (running), later (often swapped in the swap family).
            late = 10 if family == "swap" else 6
            aborts.append(AbortSpec(r.request_id, r.at_step + c.integer(0, late, "abort_delay")))
    invalid: list[InvalidInput] = []
    if invalid_inputs and c.boolean(0.1, "invalid_input"):
        kind = c.choice(["duplicate", "unknown_abort", "empty", "zero_max_tokens", "too_long"], "invalid_kind")
        first = requests[0]
        event = first.to_event()
        if kind == "unknown_abort":
            event = {"kind": "abort", "request_id": "never-added"}
        elif kind == "empty":
            event.update(request_id="bad", prompt_token_ids=[])
        elif kind == "zero_max_tokens":
            event.update(request_id="bad", max_tokens=0)
        elif kind == "too_long":  # the v0 engine refuses a prompt over max_model_len at add (prompt_too_long)
            event.update(request_id="bad", prompt_token_ids=list(range(10, 11 + max_model_len)))
        invalid.append(InvalidInput(event, first.at_step))
    workload = Workload(
        config=config,
        profile=profile,
        requests=tuple(requests),
        aborts=tuple(aborts),
        invalid_inputs=tuple(invalid),
        oracle=oracle,
        seed=seed,
        origin="generate",
        description=f"v0 family {family}",
    )
    x = c.fork("abort_swapped")
    if cfg["preemption_mode"] == "swap" and x.boolean(ABORT_SWAPPED_RATE, "abort_swapped"):
        workload = add_abort_of_swapped(x, workload)
    return workload


def add_abort_of_swapped(c: Chooser, workload: Workload) -> Workload:
    """The workload plus an abort of a request at a step when it is swapped out, if it ever is.

    A swapped request is swapped in as soon as the GPU has room, so a blind
    abort rarely finds one: the workload is run once on the model, a moment
    ``(k, request)`` with the request in the step-k observation's
    ``cpu_block_tables`` is drawn, and the abort comes after step k (before
    step k + 1, when it is still swapped). Deterministic: the run is.
    """
    if workload.config.to_dict()["num_gpu_blocks"] > OBSERVE_MAX_BLOCKS:
        return workload
    times: list[int] = []
    try:
        trace = run_v0_workload(workload, max_steps=500, step_times=times)
    except (WorkloadError, InvalidEvent, InvalidConfig):
        return workload
    # After step k (time times[k - 1]), before step k + 1: time times[k - 1] + 1.
    moments = [
        (times[event["step"] - 1] + 1, rid)
        for event in trace.events
        if event["kind"] == "step" and "observe" in event
        for rid in event["observe"]["cpu_block_tables"]
    ]
    if not moments:
        return workload
    at, rid = c.choice(moments, "abort_swapped_moment")
    return workload.replace(aborts=(*workload.aborts, AbortSpec(rid, at)))


def random_v0_workload(seed: int, profile: str = V0_PROFILE, invalid_inputs: bool = True) -> Workload:
    """A v0 workload from a seeded PRNG (stable bytes: used for the v0 vector corpus)."""
    return build_v0_workload(RandomChooser(seed), profile=profile, seed=seed, invalid_inputs=invalid_inputs)


def make_random_workload(seed: int, profile: str, invalid_inputs: bool = True) -> Workload:
    """A seeded workload of ``profile``'s scheduler: v0's generator for a v0 profile, else v1's (unchanged)."""
    if is_v0_profile(profile):
        return random_v0_workload(seed, profile, invalid_inputs)
    return random_workload(seed, profile, invalid_inputs)


def make_workload_strategy(profile: str, invalid_inputs: bool = True) -> st.SearchStrategy[Workload]:
    """The Hypothesis strategy of ``profile``'s scheduler (see :func:`make_random_workload`)."""
    if is_v0_profile(profile):
        return v0_workloads(profile, invalid_inputs)
    return workloads(profile, invalid_inputs)


def v0_workloads(profile: str = V0_PROFILE, invalid_inputs: bool = True) -> st.SearchStrategy[Workload]:
    """A Hypothesis strategy of v0 workloads."""

    @st.composite
    def strategy(draw: Callable[..., Any]) -> Workload:
        return build_v0_workload(HypothesisChooser(draw), profile=profile, invalid_inputs=invalid_inputs)

    return strategy()


# ------------------------------------------------------------- coverage


def get_v0_features(trace: Trace) -> list[str]:
    """The hard cases a v0 trace reaches, from the trace alone.

    * ``swap_out`` / ``swap_in``: a step with ``blocks_to_swap_out`` /
      ``blocks_to_swap_in`` pairs;
    * ``recompute``: a step preempts (``preempted > 0``) while
      ``preemption_mode`` is not ``"swap"`` (one sequence per group: vLLM
      recomputes), or a request that has sampled tokens is scheduled as a
      prompt again (its re-prefill after a recompute, priority preemptions
      included);
    * ``priority_preemption``: a step's observation shows more requests losing
      their GPU blocks (live ones, neither finished nor aborted) or moving to
      CPU than the step's ``preempted`` counts: the priority policy's forced
      preemptions, which ``preempted`` leaves out;
    * ``ignored``: a step with ``ignored_seq_groups``;
    * ``chunked_prefill``: a prompt chunk that does not sample (ends before its
      sequence); ``partial_prefills``: two or more such chunks in one step
      (``max_num_partial_prefills > 1``);
    * ``prefix_hit``: a request's first scheduled chunk has computed blocks;
    * ``abort`` (any accepted abort) and ``abort_waiting`` /
      ``abort_running`` / ``abort_swapped``: the queue of the aborted request,
      from the last step's observation (``cpu_block_tables``: swapped;
      ``block_tables``: running; else waiting; a request added since: waiting);
    * ``invalid_input``: a refused input; ``swap_space_exhausted``: the engine
      crashed on a swap-out without CPU space; ``engine_crash``: another crash
      of vLLM 0.10.2 the model reproduces (an abort of a swapped request under
      prefix caching, a swapped group reaching the head of waiting).
    """
    out: set[str] = set()
    swap_mode = trace.config.get("preemption_mode") == "swap"
    state: dict[str, str] = {}  # live request -> waiting / running / swapped
    sampled: set[str] = set()  # live requests that have sampled tokens
    seen: set[str] = set()  # live requests scheduled at least once
    holders: set[str] = set()  # requests holding GPU blocks at the last observation
    for event in trace.events:
        kind = event["kind"]
        code = event.get("expect_error")
        if code is not None:
            if code == SWAP_SPACE_EXHAUSTED:
                out.add("swap_space_exhausted")
            elif is_engine_crash_code(code):
                out.add("engine_crash")
            else:
                out.add("invalid_input")
            if not (kind == "abort" and is_engine_crash_code(code)):
                continue
        if kind == "add_request":
            rid = event["request_id"]
            state[rid] = "waiting"
            sampled.discard(rid)
            seen.discard(rid)
        elif kind == "abort":
            out.add("abort")
            where = state.pop(event["request_id"], None)
            if where is not None:
                out.add(f"abort_{where}")
        elif kind == "step":
            x = event["expect"]
            groups = x["scheduled_seq_groups"]
            if x["blocks_to_swap_out"]:
                out.add("swap_out")
            if x["blocks_to_swap_in"]:
                out.add("swap_in")
            if x["preempted"] and not swap_mode:
                out.add("recompute")
            if x["ignored_seq_groups"]:
                out.add("ignored")
            chunks = [g for g in groups if g["is_prompt"] and not g["do_sample"]]
            if chunks:
                out.add("chunked_prefill")
            if len(chunks) >= 2:
                out.add("partial_prefills")
            for g in groups:
                rid = g["request_id"]
                if g["is_prompt"] and rid in sampled:
                    out.add("recompute")
                if rid not in seen and g["computed_block_nums"]:
                    out.add("prefix_hit")
                seen.add(rid)
                state[rid] = "running"
            for rid in x["ignored_seq_groups"]:
                state.pop(rid, None)
            if "observe" in event:
                obs = event["observe"]
                now_gpu = {rid for rid, blocks in obs["block_tables"].items() if blocks}
                now_cpu = {rid for rid, blocks in obs["cpu_block_tables"].items() if blocks}
                lost = {rid for rid in holders if rid in state and rid not in now_gpu and rid not in now_cpu}
                swapped_now = {rid for rid in holders if rid in state and rid in now_cpu}
                if len(lost) + len(swapped_now) > x["preempted"]:
                    out.add("priority_preemption")
                for rid in state:
                    state[rid] = "swapped" if rid in now_cpu else "running" if rid in now_gpu else "waiting"
                holders = now_gpu
        elif kind == "model_output":
            sampled.update(rid for rid, toks in event["sampled_token_ids"].items() if toks)
            for o in event["expect"]["outputs"]:
                if o["finish_reason"] is not None:
                    state.pop(o["req_id"], None)
    return sorted(out)


# ------------------------------------------------------------- shrinking


def get_v0_config_candidates(w: Workload) -> Iterator[Workload]:
    """Smaller v0 machines for the shrinker: the pools, the budgets, then features off."""
    cfg = w.config.to_dict()
    reqs = w.requests
    longest = max((len(r.prompt_token_ids) for r in reqs), default=1)
    min_blocks = cdiv(cfg["max_model_len"], cfg["block_size"])
    tweaks: list[dict[str, Any]] = []
    for nb in sorted({min_blocks, (cfg["num_gpu_blocks"] + min_blocks) // 2, cfg["num_gpu_blocks"] - 1}):
        if min_blocks <= nb < cfg["num_gpu_blocks"]:
            tweaks.append({"num_gpu_blocks": nb})
    for nc in sorted({0, cfg["num_cpu_blocks"] // 2, cfg["num_cpu_blocks"] - 1}):
        if 0 <= nc < cfg["num_cpu_blocks"]:
            tweaks.append({"num_cpu_blocks": nc})
    for mml in sorted({longest + 1, (cfg["max_model_len"] + longest + 1) // 2, cfg["max_model_len"] - 1}):
        if 1 <= mml < cfg["max_model_len"]:
            blocks = max(cfg["num_gpu_blocks"], cdiv(mml, cfg["block_size"]))
            tweaks.append({"max_model_len": mml, "num_gpu_blocks": blocks})
    for budget in sorted({1, cfg["max_num_batched_tokens"] // 2, cfg["max_num_batched_tokens"] - 1}):
        if 0 < budget < cfg["max_num_batched_tokens"]:
            tweaks.append({"max_num_batched_tokens": budget})
    for seqs in sorted({1, cfg["max_num_seqs"] - 1}):
        if 0 < seqs < cfg["max_num_seqs"]:
            tweaks.append({"max_num_seqs": seqs})
    if cfg["max_num_partial_prefills"] > 1:
        tweaks.append({"max_num_partial_prefills": 1, "max_long_partial_prefills": 1})
    if cfg["long_prefill_token_threshold"]:
        tweaks.append({"long_prefill_token_threshold": 0})
    if cfg["policy"] == "priority":
        tweaks.append({"policy": "fcfs"})
    if cfg["enable_prefix_caching"]:
        tweaks.append({"enable_prefix_caching": False})
    if cfg["enable_chunked_prefill"]:
        tweaks.append(
            {
                "enable_chunked_prefill": False,
                "max_num_partial_prefills": 1,
                "max_long_partial_prefills": 1,
                "max_num_batched_tokens": max(cfg["max_num_batched_tokens"], cfg["max_model_len"]),
            }
        )
    if cfg["preemption_mode"] is not None:
        tweaks.append({"preemption_mode": None})
    for bs in (1, 2, 4):
        if bs < cfg["block_size"]:
            tweaks.append(
                {
                    "block_size": bs,
                    "num_gpu_blocks": cdiv(cfg["num_gpu_blocks"] * cfg["block_size"], bs),
                    "num_cpu_blocks": cdiv(cfg["num_cpu_blocks"] * cfg["block_size"], bs),
                }
            )
    for tweak in tweaks:
        try:
            new = make_v0_config({**cfg, **tweak}, w.profile)
        except InvalidConfig:
            continue
        yield replace(w, config=new)


# -------------------------------------------------------------- examples


def _example_config(**fields: Any) -> Any:
    base = {
        "block_size": 4,
        "num_gpu_blocks": 4,
        "num_cpu_blocks": 4,
        "max_num_batched_tokens": 16,
        "max_num_seqs": 2,
        "max_model_len": 16,
        "enable_chunked_prefill": False,
        "enable_prefix_caching": False,
        "policy": "fcfs",
        "preemption_mode": "swap",
        "max_num_partial_prefills": 1,
        "max_long_partial_prefills": 1,
        "long_prefill_token_threshold": 0,
    }
    return make_v0_config({**base, **fields})


def example_v0_swap() -> Workload:
    """Two 7-token prompts fill 4 GPU blocks of 4; at the first decode the tail (r2) is swapped out, then back in."""
    return Workload(
        config=_example_config(),
        profile=V0_PROFILE,
        requests=(
            RequestSpec("r1", (1, 2, 3, 4, 5, 6, 7), max_tokens=3, eos_token_id=0),
            RequestSpec("r2", (8, 9, 10, 11, 12, 13, 14), max_tokens=3, eos_token_id=0),
        ),
        oracle=HashOracle(seed=1, eos_per_mille=0),
        origin="example",
        description="two requests of 7 tokens in 4 GPU blocks: the second is swapped out, then in",
    )


def example_v0_recompute() -> Workload:
    """The swap example under vLLM's default mode: r2 is preempted by recompute and re-prefilled with its output."""
    return example_v0_swap().replace(
        config=_example_config(preemption_mode=None, num_cpu_blocks=0),
        description="two requests of 7 tokens in 4 GPU blocks: the second is recomputed (prompt + its output)",
    )


def example_v0_ignored() -> Workload:
    """A request whose min_tokens grows it past the pool preempts itself and comes back over the limit: ignored."""
    config = _example_config(preemption_mode=None, num_cpu_blocks=0)
    requests = (RequestSpec("grow", tuple(range(100, 110)), max_tokens=8, min_tokens=8, ignore_eos=True),)
    return Workload(
        config=config,
        profile=V0_PROFILE,
        requests=requests,
        oracle=HashOracle(seed=2, eos_per_mille=0),
        origin="example",
        description="10 prompt tokens and min_tokens 8 in a pool of 16 tokens (max_model_len 16): at 17 tokens it "
        "preempts itself (recompute) and its 17-token re-prefill is over the limit: ignored",
    )


def example_v0_aborts() -> Workload:
    """Aborts hit a waiting, a running and a swapped request."""
    requests = (
        RequestSpec("r1", (1, 2, 3, 4, 5, 6, 7), max_tokens=6, eos_token_id=0),
        RequestSpec("r2", (8, 9, 10, 11, 12, 13, 14), max_tokens=6, eos_token_id=0),
        RequestSpec("r3", (15, 16, 17), max_tokens=4, eos_token_id=0, at_step=1),
    )
    return Workload(
        config=_example_config(num_cpu_blocks=8),
        profile=V0_PROFILE,
        requests=requests,
        aborts=(AbortSpec("r3", 1), AbortSpec("r2", 3), AbortSpec("r1", 4)),
        oracle=HashOracle(seed=2, eos_per_mille=0),
        origin="example",
        description="r2 swapped out, then aborted while swapped; r3 aborted while waiting, r1 while running",
    )


def example_v0_partial_prefills() -> Workload:
    """Chunked prefill with two concurrent partial prefills: two 12-token prompts share a budget of 8."""
    config = _example_config(
        enable_chunked_prefill=True,
        max_num_batched_tokens=8,
        num_gpu_blocks=8,
        max_num_partial_prefills=2,
        max_long_partial_prefills=2,
        preemption_mode=None,
    )
    requests = (
        RequestSpec("a", tuple(range(200, 212)), max_tokens=2, eos_token_id=0),
        RequestSpec("b", tuple(range(300, 312)), max_tokens=2, eos_token_id=0),
    )
    return Workload(
        config=config,
        profile=V0_PROFILE,
        requests=requests,
        oracle=HashOracle(seed=3, eos_per_mille=0),
        origin="example",
        description="two 12-token prompts prefilled concurrently in chunks of 4 (budget 8 / 2 slots)",
    )


def example_v0_prefix_hit() -> Workload:
    """Prefix caching: b arrives after a's 8-token prompt is computed and reuses its first two blocks."""
    config = _example_config(enable_prefix_caching=True, num_gpu_blocks=8, preemption_mode=None)
    shared = tuple(range(400, 408))
    requests = (
        RequestSpec("a", shared + (1, 2), max_tokens=2, eos_token_id=0),
        RequestSpec("b", shared + (3,), max_tokens=2, eos_token_id=0, at_step=1),
    )
    return Workload(
        config=config,
        profile=V0_PROFILE,
        requests=requests,
        oracle=HashOracle(seed=4, eos_per_mille=0),
        origin="example",
        description="b shares a's first 8 tokens (two full blocks): a prefix hit",
    )


V0_EXAMPLES: dict[str, Callable[[], Workload]] = {
    "prefix_hit": example_v0_prefix_hit,
    "swap": example_v0_swap,
    "recompute": example_v0_recompute,
    "ignored": example_v0_ignored,
    "aborts": example_v0_aborts,
    "partial_prefills": example_v0_partial_prefills,
}
"""Small hand-made v0 workloads (the v0 corpus's ``example-*`` traces; FORMAT.md shows the first)."""
