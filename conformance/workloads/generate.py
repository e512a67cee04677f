"""Workload generation biased toward the scheduler's hard cases.

One builder, :func:`build_workload`, draws every choice through a small
:class:`Chooser` interface, so the same code serves two backends:

* :func:`workloads` — a Hypothesis strategy (campaigns, stateful tests; failures
  shrink through Hypothesis's own shrinker), and
* :func:`random_workload` — a seeded ``random.Random`` (the fixed vector corpus,
  whose bytes must not depend on the Hypothesis version).

The hard cases it aims at: pools and budgets close to prompt sizes (so
preemption and budget exhaustion happen), shared prefixes (prefix hits, hits on
block boundaries), equal priorities and arrival times (tie-breaks), aborts
mid-prefill, prompts near ``max_model_len``, EOS at the first token, drafts
(right and wrong), and occasional invalid inputs that must be refused.

Two more, drawn from a separate stream of choices (``Chooser.fork``) so that
the workloads that do not get them stay byte-identical to earlier releases of
this generator:

* configs exactly at a boundary of what vLLM accepts (:data:`BOUNDARIES`),
* a long-prefill threshold of at most ``num_spec_tokens``
  (:data:`SPEC_CUT_THRESHOLD_RATE`), on which vLLM 0.32/0.33 crash at the first
  padded admission it cuts (the trace then ends with that step's
  ``expect_error``), and
* inputs that arrive while a step executes, between ``schedule()`` and its
  model output: requests, aborts (of requests in the running batch too) and
  re-adds of an aborted id, including the refused re-add of an id aborted in
  the pending step (``request_id_in_flight``).

Campaigns add one more, to the workloads already drawn and overridden, from
a stream of the workload's seed of its own (:func:`choose_refused_config`):
configs one step past a limit vLLM enforces at start-up
(:data:`REFUSED_CONFIG_RATE`), whose trace is the header expecting the refusal.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from hypothesis import strategies as st

from schedconf.conformance.workloads.config_limits import get_refused_variants
from schedconf.conformance.workloads.workload import (
    AbortSpec,
    HashOracle,
    InvalidInput,
    RefusedConfigWorkload,
    RequestSpec,
    ResetSpec,
    Workload,
)
from schedconf.spec.v1.config import SchedulerConfig, cdiv
from schedconf.spec.v1.profiles import PROFILES

T = TypeVar("T")
EOS = 1


class Chooser(Protocol):
    """Where a builder's choices come from."""

    def integer(self, lo: int, hi: int, label: str) -> int: ...
    def boolean(self, p_true: float, label: str) -> bool: ...
    def choice(self, options: Sequence[T], label: str) -> T: ...
    def fork(self, label: str) -> Chooser:
        """A chooser for a group of later-added choices (see the module docstring)."""
        ...


class RandomChooser:
    """Choices from a seeded ``random.Random``: reproducible across library versions."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)

    def fork(self, label: str) -> RandomChooser:
        """An independent seeded stream: drawing from it leaves this one's draws unchanged."""
        digest = hashlib.sha256(f"{self.seed}\x1f{label}".encode()).digest()
        return RandomChooser(int.from_bytes(digest[:8], "little"))

    def integer(self, lo: int, hi: int, label: str) -> int:
        return self.rng.randint(lo, hi)

    def boolean(self, p_true: float, label: str) -> bool:
        return self.rng.random() < p_true

    def choice(self, options: Sequence[T], label: str) -> T:
        return options[self.rng.randrange(len(options))]


class HypothesisChooser:
    """Choices drawn by Hypothesis (they shrink toward the first option / the low end)."""

    def __init__(self, draw: Callable[..., Any]) -> None:
        self.draw = draw

    def integer(self, lo: int, hi: int, label: str) -> int:
        return self.draw(st.integers(lo, hi), label=label)

    def boolean(self, p_true: float, label: str) -> bool:
        # Shrinks toward False (the draw shrinks toward 0).
        return self.draw(st.integers(0, 999), label=label) >= 1000 - int(p_true * 1000)

    def choice(self, options: Sequence[T], label: str) -> T:
        return self.draw(st.sampled_from(list(options)), label=label)

    def fork(self, label: str) -> HypothesisChooser:
        # One Hypothesis stream: the forked choices are drawn inline (and shrink too).
        return self


FAMILIES = ("mixed", "pressure", "burst")
"""mixed: anything. pressure: a pool that holds about one sequence, long outputs,
often spec decode (preemption, resumption, drafts across a preemption).
burst: chunked prefill off, requests arriving together with mixed sizes
(skipped and re-queued waiting requests under older releases)."""


BOUNDARIES = (
    "min_pool",
    "budget_eq_max_num_seqs",
    "budget_one",
    "budget_eq_max_model_len_unchunked",
    "threshold_eq_max_model_len",
)
"""Configs exactly at a limit of what vLLM (and spec/v1/config.py) accepts, one unit
from a refusal: a pool of one usable block (``num_gpu_blocks == 2``, the
smallest pool, holding exactly one sequence of ``max_model_len <= block_size``);
``max_num_batched_tokens == max_num_seqs``; a budget of one token; chunked
prefill off with ``max_num_batched_tokens == max_model_len``;
``long_prefill_token_threshold == max_model_len``. The other limits are drawn
often enough by the ordinary choices: a pool of exactly ``cdiv(max_model_len,
block_size)`` usable blocks, ``block_size == 1``, a threshold of
``num_spec_tokens + 1``."""

BOUNDARY_RATE = 0.2
"""Share of workloads whose config sits on one of :data:`BOUNDARIES`."""

SPEC_CUT_THRESHOLD_RATE = 0.1
"""Share of spec-decode configs (``num_spec_tokens > 0``, about half of them)
whose ``long_prefill_token_threshold`` is drawn in ``[1, num_spec_tokens]``:
about 5% of all workloads. vLLM 0.32/0.33 accept such a config and crash in
``schedule()`` when the threshold cuts a padded one-token admission
(reports/findings.md, divergence 3); the model crashes at the same step
(``engine_assertion_padded_admission``), so campaigns check these configs up
to the crash. 0.11 runs them to the end."""


def build_config(c: Chooser, family: str = "mixed") -> SchedulerConfig:
    """A small config whose pool and budget sit close to the prompt sizes (sometimes on a boundary)."""
    block_size = c.choice([4, 2, 1, 8, 16], "block_size")
    max_model_len = c.integer(max(4, block_size + 1), 12 * block_size, "max_model_len")
    min_blocks = cdiv(max_model_len, block_size)
    if family == "pressure":
        tightness = c.choice([0, 1], "pool_slack")
    else:
        tightness = c.choice([0, 1, 0, 2, 4, 3 * min_blocks], "pool_slack")
    chunked = family != "burst" and c.boolean(0.8, "chunked_prefill")
    num_spec = c.choice([0, 2, 1, 3] if family == "pressure" else [0, 0, 0, 1, 2, 3], "num_spec_tokens")
    if chunked:
        budget = c.integer(max(2, num_spec + 2), max_model_len + 2 * block_size, "budget")
    else:
        budget = c.integer(max_model_len, 2 * max_model_len, "budget")
    threshold = min(
        max_model_len, c.choice([0, 0, 0, num_spec + 1, num_spec + 2 + block_size], "long_prefill_threshold")
    )
    max_num_seqs = c.integer(1, min(6, budget), "max_num_seqs")
    prefix_caching = c.boolean(0.8, "prefix_caching")
    policy = c.choice(["fcfs", "priority"], "policy")
    lookahead = c.choice([0, 0, 0, 1, 2], "lookahead")
    reserve_full_isl = c.choice([None, None, None, False, True], "reserve_full_isl")
    num_gpu_blocks = 1 + min_blocks + tightness

    x = c.fork("boundary")
    if x.boolean(BOUNDARY_RATE, "boundary_config"):
        boundary = x.choice(BOUNDARIES, "boundary")
        if boundary == "min_pool":
            block_size = max(block_size, x.choice([2, 4, 8], "min_pool_block_size"))
            max_model_len = x.integer(2, block_size, "min_pool_max_model_len")
            num_gpu_blocks = 2
        elif boundary == "budget_eq_max_num_seqs":
            if chunked:
                budget = x.integer(num_spec + 2 if num_spec else 1, 6, "seats")
            max_num_seqs = budget
        elif boundary == "budget_one":
            # One token a step: keep sequences short so the trace stays small.
            max_model_len = min(max_model_len, max(block_size + 1, 16))
            num_gpu_blocks = 1 + cdiv(max_model_len, block_size) + tightness
            chunked, num_spec, budget, max_num_seqs = True, 0, 1, 1
            threshold = x.choice([0, 1], "budget_one_threshold")
        elif boundary == "budget_eq_max_model_len_unchunked":
            chunked, budget = False, max_model_len
        else:  # threshold_eq_max_model_len
            threshold = max_model_len
        # Keep the other rules satisfied after the change.
        if not chunked:
            budget = max(budget, max_model_len)
        max_num_seqs = min(max_num_seqs, budget)
        threshold = min(threshold, max_model_len)
        if 0 < threshold <= num_spec:
            threshold = 0
    # Drawn from its own stream, so that configs without it keep their bytes.
    y = c.fork("spec_cut_threshold")
    if num_spec > 0 and y.boolean(SPEC_CUT_THRESHOLD_RATE, "spec_cut_threshold"):
        # At most max_model_len: 0.32/0.33 refuse a threshold above it (a boundary config may
        # have max_model_len below num_spec_tokens).
        threshold = y.integer(1, min(num_spec, max_model_len), "spec_cut_threshold_value")
    return SchedulerConfig(
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=threshold,
        enable_prefix_caching=prefix_caching,
        policy=policy,
        num_spec_tokens=num_spec,
        num_lookahead_tokens=lookahead,
        scheduler_reserve_full_isl=reserve_full_isl,
    )


def build_workload(
    c: Chooser,
    profile: str = "vllm-0.33",
    seed: int = 0,
    invalid_inputs: bool = True,
    config: SchedulerConfig | None = None,
    in_flight_batches: bool = True,
    multi_gpu_rules: bool = True,
) -> Workload:
    """Draw one workload (see the module docstring for what it aims at).

    ``multi_gpu_rules=False`` draws none of the rules of several GPUs (pipeline parallelism, the
    prefill throttle and cadence, log_stats off): the async corpus, built before they were in
    the model, keeps its bytes.

    ``in_flight_batches=False`` keeps a plain profile's workloads synchronous
    and without the knobs vLLM 0.32 added (the v2 corpus, built before either
    existed in the model, keeps its bytes).
    """
    family = c.choice(FAMILIES, "family")
    config = config or build_config(c, family)
    oracle = HashOracle(
        seed=c.integer(0, 2**16, "oracle_seed"),
        vocab_size=c.choice([64, 8, 512], "vocab"),
        eos_token_id=EOS,
        eos_per_mille=c.choice([0, 20, 100], "eos_rate"),
        draft_accuracy_per_mille=c.choice([600, 1000, 0, 300], "draft_accuracy"),
    )
    max_prompt = config.max_model_len - 1
    bases = [tuple(range(1000 * (i + 1), 1000 * (i + 1) + max_prompt)) for i in range(2)]
    num_requests = c.integer(2 if family != "mixed" else 1, 7, "num_requests")
    # "rising": later arrivals are more important, so a low-priority request
    # sits early in running and becomes the victim of one behind it.
    priority_mode = c.choice(["random", "rising", "equal"], "priority_mode")
    requests: list[RequestSpec] = []
    arrival = 0
    step = 0
    for i in range(num_requests):
        rid = f"r{i}"
        shape = c.choice(["short", "shared", "short", "near_max", "block_multiple", "tiny", "long"], "prompt_shape")
        if shape == "near_max":
            length = max_prompt
        elif shape == "block_multiple":
            length = min(
                max_prompt, config.block_size * c.integer(1, max(1, max_prompt // config.block_size), "blocks")
            )
        elif shape == "tiny":
            length = c.integer(1, min(2, max_prompt), "len")
        elif shape == "long":
            length = c.integer(max(1, max_prompt // 2), max_prompt, "len")
        else:
            length = c.integer(1, max(1, max_prompt // 3), "len")
        if shape in ("shared", "block_multiple") or c.boolean(0.3, "shares_prefix"):
            base = c.choice(bases, "base")
            shared = c.choice(
                [
                    length,
                    length - 1,
                    length // config.block_size * config.block_size,
                    c.integer(0, length, "shared_any"),
                ],
                "shared_len",
            )
            prompt = base[:shared] + tuple(5000 + 100 * i + j for j in range(length - shared))
        else:
            prompt = tuple(5000 + 100 * i + j for j in range(length))
        step += 0 if family == "burst" else c.choice([0, 0, 0, 1, 2, 5], "arrival_gap")
        arrival += c.choice([0, 1, 1, 3], "clock_gap")  # equal arrival times happen
        eos_mode = c.choice(["oracle", "none", "oracle", "oracle", "first_token"], "eos_mode")
        eos = None if eos_mode == "none" else (oracle.token(rid, 0) if eos_mode == "first_token" else EOS)
        stops: tuple[int, ...] = ()
        if c.boolean(0.15, "has_stop"):
            stops = (oracle.token(rid, c.integer(0, 3, "stop_at")),)
        if family == "pressure":
            max_tokens = c.choice([3 * config.block_size, 16, 8], "max_tokens")
        else:
            max_tokens = c.choice([8, 16, 3 * config.block_size, 4, 1, 2], "max_tokens")
        requests.append(
            RequestSpec(
                request_id=rid,
                prompt_token_ids=prompt,
                max_tokens=max_tokens,
                priority=(
                    c.choice([0, 0, 1, 2], "priority")
                    if priority_mode == "random"
                    else num_requests - i
                    if priority_mode == "rising"
                    else 0
                ),
                arrival_time=arrival,
                eos_token_id=eos,
                stop_token_ids=stops,
                ignore_eos=c.boolean(0.15, "ignore_eos"),
                min_tokens=min(max_tokens, c.choice([0, 0, 0, 1, 3], "min_tokens")),
                at_step=step,
            )
        )
    if 0 < config.long_prefill_token_threshold <= config.num_spec_tokens and len(requests) > 1:
        # A one-token prompt arriving later is what 0.32/0.33 pad (and the
        # threshold cuts) when a running request is scheduled in its step.
        y = c.fork("spec_cut_prompt")
        if y.boolean(0.5, "one_token_prompt"):
            i = y.integer(1, len(requests) - 1, "one_token_request")
            # The threshold chunks every prefill into pieces of T tokens, and no
            # admission is padded while a running prefill chunk is scheduled:
            # arrive about when the first request's prefill is done.
            done = cdiv(len(requests[0].prompt_token_ids), config.long_prefill_token_threshold)
            at_step = max(requests[i].at_step, requests[0].at_step + done + y.integer(0, 2, "one_token_delay"))
            requests[i] = replace(requests[i], prompt_token_ids=(5000 + 100 * i,), at_step=at_step)
    aborts: list[AbortSpec] = []
    for r in requests:
        if c.boolean(0.15, "abort"):
            # Soon after arrival: often while its prompt is still being prefilled.
            aborts.append(AbortSpec(r.request_id, r.at_step + c.integer(0, 3, "abort_delay")))
    invalid: list[InvalidInput] = []
    if invalid_inputs and c.boolean(0.15, "invalid_input"):
        kind = c.choice(["duplicate", "unknown_abort", "empty", "too_long", "zero_max_tokens"], "invalid_kind")
        first = requests[0]
        event = first.to_event()
        if kind == "unknown_abort":
            event = {"kind": "abort", "request_id": "never-added"}
        elif kind == "empty":
            event.update(request_id="bad", prompt_token_ids=[])
        elif kind == "too_long":
            event.update(request_id="bad", prompt_token_ids=list(range(config.max_model_len)))
        elif kind == "zero_max_tokens":
            event.update(request_id="bad", max_tokens=0)
        # "duplicate" keeps the first request's id, while it is still live.
        invalid.append(InvalidInput(event, first.at_step))
    add_in_flight_inputs(c.fork("in_flight"), requests, aborts, invalid)
    resets: tuple[ResetSpec, ...] = ()
    throttle_cadence = 0
    if in_flight_batches or (PROFILES.get(profile) is not None and PROFILES[profile].async_scheduling):
        config = choose_in_flight_batches(c.fork("in_flight_batches"), config, profile)
        config = choose_0_32_knobs(c.fork("knobs_0_32"), config, profile)
        resets = choose_resets(c.fork("resets"), requests, profile)
        if multi_gpu_rules:
            config = choose_parallel_knobs(c.fork("parallel"), config, profile)
            throttle_cadence = choose_throttle_cadence(c.fork("throttle"), profile)
    # Stats are recorded where the knobs are drawn (the v2 corpus keeps its bytes).
    record_stats = in_flight_batches or (PROFILES.get(profile) is not None and PROFILES[profile].async_scheduling)
    return Workload(
        config=config,
        profile=profile,
        requests=tuple(requests),
        aborts=tuple(aborts),
        invalid_inputs=tuple(invalid),
        resets=resets,
        record_stats=record_stats,
        throttle_cadence=throttle_cadence,
        oracle=oracle,
        seed=seed,
        origin="generate",
    )


IN_FLIGHT_BATCHES_RATE = 0.2
"""Share of plain 0.32/0.33 workloads without spec decode whose steps run in
flight (``max_concurrent_batches`` 2 or 3: pipeline parallelism's batch queue).
Every workload of an ``-async`` profile runs AsyncScheduler, mostly with two
steps in flight (vLLM's async engine), sometimes three, sometimes one."""


def choose_in_flight_batches(c: Chooser, config: SchedulerConfig, profile: str) -> SchedulerConfig:
    """Give the config its ``max_concurrent_batches`` for ``profile`` (drawn from its own stream).

    Async profiles keep the drawn spec decode (AsyncScheduler's draft
    placeholders); plain profiles get a batch queue only without it (not
    modelled: the model refuses it); profiles whose in-flight rules are not
    modelled stay synchronous.
    """
    rules = PROFILES.get(profile)
    if rules is None or not rules.models_in_flight or config.max_concurrent_batches != 1:
        return config
    if rules.async_scheduling:
        batches = c.choice([2, 2, 3, 1], "async_batches")
        return replace(config, max_concurrent_batches=batches)
    if config.num_spec_tokens == 0 and c.boolean(IN_FLIGHT_BATCHES_RATE, "in_flight_batches"):
        return replace(config, max_concurrent_batches=c.choice([2, 3], "batches"))
    return config


KNOBS_0_32_RATE = 0.15
"""Share of 0.32/0.33 workloads (async ones included) drawing each of
max_num_active_seqs, long_prefill_token_threshold_adaptive (only with a
threshold set) and use_v2_model_runner, independently."""


def choose_0_32_knobs(c: Chooser, config: SchedulerConfig, profile: str) -> SchedulerConfig:
    """Set the scheduler knobs vLLM 0.32 added, each at :data:`KNOBS_0_32_RATE` (from its own stream)."""
    rules = PROFILES.get(profile)
    if rules is None or not rules.has_0_32_scheduler_knobs:
        return config
    changes: dict[str, Any] = {}
    if config.max_num_seqs > 1 and c.boolean(KNOBS_0_32_RATE, "max_num_active_seqs"):
        changes["max_num_active_seqs"] = c.integer(1, config.max_num_seqs - 1, "active_seqs")
    if config.long_prefill_token_threshold > 0 and c.boolean(KNOBS_0_32_RATE, "adaptive_threshold"):
        changes["long_prefill_token_threshold_adaptive"] = True
    if c.boolean(KNOBS_0_32_RATE, "v2_layout"):
        changes["use_v2_model_runner"] = True
    return replace(config, **changes) if changes else config


PIPELINE_PARALLEL_RATE = 0.2
"""Share of async workloads (of releases with the decode stagger) run as vLLM runs them under
pipeline parallelism 2 or 3 with the V2 model runner: the stagger on, and the batch queue of
``VllmConfig.max_concurrent_batches`` (``pipeline_parallel_size + 1``)."""

PREFILL_CADENCE_RATE = 0.06
"""Share of 0.33 workloads with a local prefill cadence (``prefill_schedule_interval`` 2 to 4)."""

LOG_STATS_OFF_RATE = 0.08
"""Share of 0.32/0.33 workloads run without ``log_stats`` (no SchedulerStats reported)."""

THROTTLE_RATE = 0.12
"""Share of 0.32/0.33 workloads driven as vLLM's data-parallel coordinator drives a rank: every
step but each N-th (N 2 to 4) calls ``schedule(throttle_prefills=True)``."""


def choose_parallel_knobs(c: Chooser, config: SchedulerConfig, profile: str) -> SchedulerConfig:
    """Pipeline parallelism (async profiles), the local prefill cadence and log_stats (own streams)."""
    rules = PROFILES.get(profile)
    if rules is None or not rules.has_0_32_scheduler_knobs:
        return config
    changes: dict[str, Any] = {}
    if rules.async_scheduling and rules.pp_decode_stagger and c.boolean(PIPELINE_PARALLEL_RATE, "pipeline_parallel"):
        pp = c.choice([2, 3], "pipeline_parallel_size")
        changes.update(pipeline_parallel_size=pp, use_v2_model_runner=True, max_concurrent_batches=pp + 1)
    if rules.local_prefill_cadence and c.boolean(PREFILL_CADENCE_RATE, "prefill_cadence"):
        changes["prefill_schedule_interval"] = c.integer(2, 4, "prefill_schedule_interval")
    if c.boolean(LOG_STATS_OFF_RATE, "log_stats_off"):
        changes["log_stats"] = False
    return replace(config, **changes) if changes else config


def choose_throttle_cadence(c: Chooser, profile: str) -> int:
    """The data-parallel coordinator's prefill cadence for the workload (0: no throttle)."""
    rules = PROFILES.get(profile)
    if rules is None or not rules.prefill_throttle or not rules.has_0_32_scheduler_knobs:
        return 0
    return c.integer(2, 4, "throttle_cadence") if c.boolean(THROTTLE_RATE, "throttle") else 0


RESET_RATE = 0.12
"""Share of 0.32/0.33 workloads with one or two ``reset_prefix_cache`` calls,
at a random step (often while a step is in flight, often with requests
running: refused unless ``reset_running_requests``)."""


def choose_resets(c: Chooser, requests: list[RequestSpec], profile: str) -> tuple[ResetSpec, ...]:
    """Draw the workload's prefix-cache resets (from their own stream)."""
    rules = PROFILES.get(profile)
    if rules is None or not rules.has_0_32_scheduler_knobs or not c.boolean(RESET_RATE, "has_reset"):
        return ()
    last = max((r.at_step for r in requests), default=0)
    return tuple(
        ResetSpec(
            reset_running_requests=c.boolean(0.5, "reset_running"),
            at_step=c.integer(0, last + 6, "reset_at"),
            in_flight=c.boolean(0.5, "reset_in_flight"),
        )
        for _ in range(c.integer(1, 2, "num_resets"))
    )


IN_FLIGHT_RATES = {"arrivals": 0.2, "aborts": 0.2, "re_add": 0.25}
"""Share of workloads that get each kind of in-flight input (independently)."""


def _abort_after(at: int, in_flight: bool, arrival: RequestSpec) -> tuple[int, bool]:
    """The earliest abort slot at or after ``(at, in_flight)`` that comes after ``arrival``.

    The loop applies, at one step, arrivals then aborts before ``schedule()``,
    and aborts then arrivals in flight (schedconf.conformance.workloads.workload._timed_inputs).
    """
    if (at, in_flight) < (arrival.at_step, arrival.in_flight):
        at, in_flight = arrival.at_step, arrival.in_flight
    if arrival.in_flight and in_flight and at == arrival.at_step:
        at, in_flight = at + 1, False
    return at, in_flight


def add_in_flight_inputs(
    c: Chooser, requests: list[RequestSpec], aborts: list[AbortSpec], invalid: list[InvalidInput]
) -> None:
    """Move some inputs between a step's ``schedule()`` and its model output, and re-add an aborted id.

    Each kind is drawn independently (:data:`IN_FLIGHT_RATES`):

    * arrivals: later requests (never the first, whose id the "duplicate"
      invalid input reuses) arrive while the step of their ``at_step`` runs;
    * aborts: aborts arrive in flight, often of a request in the running batch
      (vLLM drops the output of a request aborted while its step executed);
    * re-add: an aborted id comes back as a new request, either after the
      abort's step is over (valid), or in the very step it was aborted in,
      which is refused with ``request_id_in_flight`` when the aborted request
      was scheduled in that step (and accepted otherwise), then again once the
      step's output is applied. Re-adds are :class:`InvalidInput` s, which the
      loop records as valid inputs when they are accepted.
    """
    if len(requests) > 1 and c.boolean(IN_FLIGHT_RATES["arrivals"], "in_flight_arrivals"):
        for i in range(1, len(requests)):
            if c.boolean(0.5, "arrives_in_flight"):
                requests[i] = replace(requests[i], in_flight=True)
        by_id = {r.request_id: r for r in requests}
        for j, a in enumerate(aborts):
            aborts[j] = replace(
                a, **dict(zip(("at_step", "in_flight"), _abort_after(a.at_step, a.in_flight, by_id[a.request_id])))
            )
    by_id = {r.request_id: r for r in requests}
    if c.boolean(IN_FLIGHT_RATES["aborts"], "in_flight_aborts"):
        for j, a in enumerate(aborts):
            if c.boolean(0.5, "abort_in_flight"):
                at, fl = _abort_after(a.at_step, True, by_id[a.request_id])
                aborts[j] = replace(a, at_step=at, in_flight=fl)
        if not aborts or c.boolean(0.5, "extra_in_flight_abort"):
            target = c.choice(requests, "in_flight_abort_target")
            # A step or two after arrival: often while the request is in the batch.
            at, fl = _abort_after(target.at_step + c.integer(0, 3, "in_flight_abort_delay"), True, target)
            aborts.append(AbortSpec(target.request_id, at, fl))
    if c.boolean(IN_FLIGHT_RATES["re_add"], "re_add"):
        same_step = c.boolean(0.5, "re_add_same_step")
        if aborts and not same_step and c.boolean(0.5, "re_add_existing_abort"):
            abort = c.choice(aborts, "re_add_abort")
        else:
            # Soon after arrival, in flight for a same-step re-add: the request is
            # then often in the pending step's batch.
            target = c.choice(requests, "re_add_target")
            at, fl = _abort_after(
                target.at_step + c.integer(0, 2, "re_add_abort_delay"),
                same_step or c.boolean(0.5, "re_add_abort_in_flight"),
                target,
            )
            abort = AbortSpec(target.request_id, at, fl)
            aborts.append(abort)
        old = by_id[abort.request_id]
        # The same prompt (prefix hits on the aborted request's freed blocks) or
        # one that leaves it after ``keep`` tokens.
        n = len(old.prompt_token_ids)
        keep = n if c.boolean(0.5, "re_add_same_prompt") else c.integer(0, n - 1, "re_add_keep")
        prompt = old.prompt_token_ids[:keep] + tuple(7000 + j for j in range(n - keep))
        again = replace(
            old,
            prompt_token_ids=prompt,
            in_flight=False,
            arrival_time=max(r.arrival_time for r in requests) + c.choice([0, 1], "re_add_clock"),
        )
        if abort.in_flight and same_step:
            # In the step the abort arrived in: refused while the aborted request's
            # output is pending, unless it was not scheduled in that step.
            invalid.append(InvalidInput(again.to_event(), abort.at_step, in_flight=True))
            later = abort.at_step + 1 + c.integer(0, 1, "re_add_retry_delay")
            # The retry is valid if the first try was refused; a duplicate if it was accepted.
            invalid.append(InvalidInput(again.to_event(), later, in_flight=c.boolean(0.5, "re_add_retry_in_flight")))
        else:
            # After the abort's step: valid (the first request is gone).
            if abort.in_flight:
                at = abort.at_step + 1 + c.integer(0, 2, "re_add_delay")
                fl = c.boolean(0.5, "re_add_in_flight")
            else:
                at = abort.at_step + c.integer(0, 2, "re_add_delay")
                # Before schedule() the re-add would precede the abort: it comes in flight then.
                fl = at == abort.at_step or c.boolean(0.5, "re_add_in_flight")
            # An InvalidInput all the same (recorded as a valid add_request when
            # accepted): a driver that ignores ``in_flight`` may apply it while the
            # first request is live, and then gets a refusal, not a crash.
            invalid.append(InvalidInput(again.to_event(), at, in_flight=fl))


REFUSED_CONFIG_RATE = 0.04
"""Share of a campaign's workloads (every profile and comparison) replaced by their config one step past
a start-up limit: one of the rules of ``conformance/workloads/config_limits.py`` that the drawn config can be taken
past under its profile and the campaign's overrides, chosen evenly. A scheduler that starts on a config
vLLM refuses (where a request that needs the missing room then waits forever) fails these at the header."""


def choose_refused_config(
    seed: int, workload: Workload, overrides: dict[str, Any] | None = None
) -> Workload | RefusedConfigWorkload:
    """``workload``, or at :data:`REFUSED_CONFIG_RATE` its config one step past a limit.

    ``seed`` is the example's (a campaign's ``seed * 1_000_003 + index``, the
    one the seeded generator draws it from); the choice comes from a stream of
    that seed of its own, so the workloads kept are unchanged.

    ``overrides`` (the campaign's ``--set`` values and forced fields) stay in
    force: a rule they undo is not chosen, and with no rule left the workload
    is kept.
    """
    c = RandomChooser(seed).fork("refused_config")
    if not c.boolean(REFUSED_CONFIG_RATE, "refused_config"):
        return workload
    variants = get_refused_variants(workload.config.to_dict(), workload.profile, overrides)
    if not variants:
        return workload
    rule, config, code = c.choice(variants, "refused_rule")
    return RefusedConfigWorkload(
        config=config, profile=workload.profile, rule=rule, code=code, seed=workload.seed, origin=workload.origin
    )


def workloads(profile: str = "vllm-0.33", invalid_inputs: bool = True) -> st.SearchStrategy[Workload]:
    """A Hypothesis strategy of workloads for ``profile``."""

    @st.composite
    def strategy(draw: Callable[..., Any]) -> Workload:
        return build_workload(HypothesisChooser(draw), profile=profile, invalid_inputs=invalid_inputs)

    return strategy()


def random_workload(
    seed: int,
    profile: str = "vllm-0.33",
    invalid_inputs: bool = True,
    in_flight_batches: bool = True,
    multi_gpu_rules: bool = True,
) -> Workload:
    """A workload from a seeded PRNG (stable bytes: used for the vector corpus)."""
    return build_workload(
        RandomChooser(seed),
        profile=profile,
        seed=seed,
        invalid_inputs=invalid_inputs,
        in_flight_batches=in_flight_batches,
        multi_gpu_rules=multi_gpu_rules,
    )
