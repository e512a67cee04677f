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
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from hypothesis import strategies as st

from conformance.workload import AbortSpec, HashOracle, InvalidInput, RequestSpec, Workload
from spec.config import SchedulerConfig, cdiv

T = TypeVar("T")
EOS = 1


class Chooser(Protocol):
    """Where a builder's choices come from."""

    def integer(self, lo: int, hi: int, label: str) -> int: ...
    def boolean(self, p_true: float, label: str) -> bool: ...
    def choice(self, options: Sequence[T], label: str) -> T: ...


class RandomChooser:
    """Choices from a seeded ``random.Random``: reproducible across library versions."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

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


FAMILIES = ("mixed", "pressure", "burst")
"""mixed: anything. pressure: a pool that holds about one sequence, long outputs,
often spec decode (preemption, resumption, drafts across a preemption).
burst: chunked prefill off, requests arriving together with mixed sizes
(skipped and re-queued waiting requests under older releases)."""


def build_config(c: Chooser, family: str = "mixed") -> SchedulerConfig:
    """A small config whose pool and budget sit close to the prompt sizes."""
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
    threshold = min(max_model_len, c.choice([0, 0, 0, num_spec + 1, num_spec + 2 + block_size], "long_prefill_threshold"))
    return SchedulerConfig(
        block_size=block_size,
        num_gpu_blocks=1 + min_blocks + tightness,
        max_num_batched_tokens=budget,
        max_num_seqs=c.integer(1, min(6, budget), "max_num_seqs"),
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=threshold,
        enable_prefix_caching=c.boolean(0.8, "prefix_caching"),
        policy=c.choice(["fcfs", "priority"], "policy"),
        num_spec_tokens=num_spec,
        num_lookahead_tokens=c.choice([0, 0, 0, 1, 2], "lookahead"),
        scheduler_reserve_full_isl=c.choice([None, None, None, False, True], "reserve_full_isl"),
    )


def build_workload(c: Chooser, profile: str = "vllm-0.33", seed: int = 0, invalid_inputs: bool = True,
                   config: SchedulerConfig | None = None) -> Workload:
    """Draw one workload (see the module docstring for what it aims at)."""
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
            length = min(max_prompt, config.block_size * c.integer(1, max(1, max_prompt // config.block_size), "blocks"))
        elif shape == "tiny":
            length = c.integer(1, min(2, max_prompt), "len")
        elif shape == "long":
            length = c.integer(max(1, max_prompt // 2), max_prompt, "len")
        else:
            length = c.integer(1, max(1, max_prompt // 3), "len")
        if shape in ("shared", "block_multiple") or c.boolean(0.3, "shares_prefix"):
            base = c.choice(bases, "base")
            shared = c.choice([length, length - 1, length // config.block_size * config.block_size,
                               c.integer(0, length, "shared_any")], "shared_len")
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
        requests.append(RequestSpec(
            request_id=rid, prompt_token_ids=prompt, max_tokens=max_tokens,
            priority=(c.choice([0, 0, 1, 2], "priority") if priority_mode == "random"
                      else num_requests - i if priority_mode == "rising" else 0),
            arrival_time=arrival,
            eos_token_id=eos, stop_token_ids=stops, ignore_eos=c.boolean(0.15, "ignore_eos"),
            min_tokens=min(max_tokens, c.choice([0, 0, 0, 1, 3], "min_tokens")), at_step=step,
        ))
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
    return Workload(config=config, profile=profile, requests=tuple(requests), aborts=tuple(aborts),
                    invalid_inputs=tuple(invalid), oracle=oracle, seed=seed, origin="generate")


def workloads(profile: str = "vllm-0.33", invalid_inputs: bool = True) -> st.SearchStrategy[Workload]:
    """A Hypothesis strategy of workloads for ``profile``."""

    @st.composite
    def strategy(draw: Callable[..., Any]) -> Workload:
        return build_workload(HypothesisChooser(draw), profile=profile, invalid_inputs=invalid_inputs)

    return strategy()


def random_workload(seed: int, profile: str = "vllm-0.33", invalid_inputs: bool = True) -> Workload:
    """A workload from a seeded PRNG (stable bytes: used for the vector corpus)."""
    return build_workload(RandomChooser(seed), profile=profile, seed=seed, invalid_inputs=invalid_inputs)
