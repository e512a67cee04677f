"""Configs one unit past a limit vLLM accepts, as traces that expect the refusal.

A scheduler must refuse such a config at start with the rule's stable code
(``init`` answers the error), as vLLM refuses to start. Each trace is a header
whose ``expect_error`` names the code and no events; the golden corpus holds
one per rule and profile (``refused-<rule>``), and ``replay`` passes a
scheduler that refuses with exactly that code.

The accepted side of each limit (the config exactly at it) is drawn by the
seeded generator (``conformance/generate.py`` ``BOUNDARIES``); both sides of
every rule are checked in ``tests/harness/test_generator_boundaries.py``.

Not a start-up rule: a ``long_prefill_token_threshold`` of at most
``num_spec_tokens``. vLLM 0.32/0.33 accept it and fail an assertion later, in
``schedule()``, when the threshold cuts a padded one-token admission
(reports/findings.md, divergence 3); the model accepts it too and crashes at
that step (``engine_assertion_padded_admission``): generated traces end with a
``step`` expecting that error (``conformance/generate.py``
``SPEC_CUT_THRESHOLD_RATE``).

The v0 scheduler (profile ``vllm-0.10``) has its own limits
(:data:`V0_PAST_THE_LIMIT`, vLLM 0.10.2's ``SchedulerConfig._verify_args`` and
the worker's pool check), in the v0 corpus.
"""

from __future__ import annotations

from typing import Any

from conformance.trace import Trace, make_header
from spec.config import SchedulerConfig
from spec.errors import InvalidConfig
from spec.profiles import get_profile, check_config_for_profile

BASE_CONFIG = SchedulerConfig(block_size=4, num_gpu_blocks=9, max_num_batched_tokens=16, max_num_seqs=4,
                              max_model_len=32, enable_prefix_caching=False)
"""8 usable blocks of 4 tokens: exactly one sequence of max_model_len = 32 tokens. Prefix caching
off, so schedulers without it (the JS example) check these traces too."""

PAST_THE_LIMIT: tuple[tuple[str, dict[str, Any], str], ...] = (
    # (rule, the fields that take BASE_CONFIG one unit past the limit, the refusal's code)
    ("block_size", {"block_size": 0}, "invalid_block_size"),
    ("num_gpu_blocks", {"num_gpu_blocks": 1, "max_model_len": 4}, "invalid_num_gpu_blocks"),
    ("max_num_batched_tokens", {"max_num_batched_tokens": 0, "max_num_seqs": 1}, "invalid_token_budget"),
    ("max_num_seqs", {"max_num_seqs": 0}, "invalid_max_num_seqs"),
    ("max_model_len", {"max_model_len": 0}, "invalid_max_model_len"),
    ("long_prefill_token_threshold", {"long_prefill_token_threshold": -1}, "invalid_threshold"),
    ("num_spec_tokens", {"num_spec_tokens": -1}, "invalid_num_spec_tokens"),
    ("num_lookahead_tokens", {"num_lookahead_tokens": -1}, "invalid_num_lookahead_tokens"),
    # without chunking, one max_model_len prompt must fit the budget: 31 < 32
    ("budget_vs_max_model_len", {"enable_chunked_prefill": False, "max_num_batched_tokens": 31},
     "budget_below_max_model_len"),
    # a token per seat: 4 tokens for 5 seats
    ("budget_vs_max_num_seqs", {"max_num_batched_tokens": 4, "max_num_seqs": 5}, "budget_below_max_num_seqs"),
    # one block short of a sequence: 7 usable blocks hold 28 < 30 tokens
    ("pool_blocks", {"max_model_len": 30, "num_gpu_blocks": 8}, "pool_below_max_model_len"),
    # one token short: 8 usable blocks hold 32 < 33 tokens
    ("pool_tokens", {"max_model_len": 33}, "pool_below_max_model_len"),
    # 0.32/0.33 only (0.11 accepts it): a threshold one above max_model_len
    ("threshold_vs_max_model_len", {"long_prefill_token_threshold": 33}, "threshold_above_max_model_len"),
)


def get_refusal(config: dict[str, Any], profile: str) -> str | None:
    """The code the model refuses ``config`` with under ``profile``, or None if it accepts it."""
    try:
        parsed = SchedulerConfig.from_dict(config)
        check_config_for_profile(parsed, get_profile(profile))
    except InvalidConfig as exc:
        return exc.code
    return None


def make_refused_config_traces(profile: str) -> list[tuple[str, Trace]]:
    """``(rule, trace)`` for each limit the model enforces under ``profile`` (checked, not assumed)."""
    out = []
    for rule, fields, code in PAST_THE_LIMIT:
        config = {**BASE_CONFIG.to_dict(), **fields}
        if get_refusal(config, profile) != code:
            continue  # this release accepts it (e.g. 0.11 and a threshold above max_model_len)
        header = make_header(config, profile, seed=0, origin="config-limits", expect_error=code,
                             description=f"config one unit past the {rule} limit: refused at start with {code}")
        out.append((rule, Trace(header=header, events=[])))
    return out


# ----------------------------------------------------------------- v0

V0_BASE_CONFIG: dict[str, Any] = {
    "block_size": 4, "num_gpu_blocks": 8, "num_cpu_blocks": 8, "max_num_batched_tokens": 32, "max_num_seqs": 4,
    "max_model_len": 32, "enable_chunked_prefill": False, "enable_prefix_caching": False, "policy": "fcfs",
    "preemption_mode": None, "max_num_partial_prefills": 1, "max_long_partial_prefills": 1,
    "long_prefill_token_threshold": 0,
}
"""A v0 config of 8 GPU blocks of 4 tokens: exactly one sequence of max_model_len = 32 tokens."""

V0_PAST_THE_LIMIT: tuple[tuple[str, dict[str, Any], str], ...] = (
    # (rule, the fields that take V0_BASE_CONFIG one unit past the limit, the refusal's code): vLLM 0.10.2's
    # SchedulerConfig._verify_args and the worker's raise_if_cache_size_invalid (spec/v0/config.py)
    ("block_size", {"block_size": 0}, "invalid_block_size"),
    ("num_gpu_blocks", {"num_gpu_blocks": 0}, "invalid_num_gpu_blocks"),
    ("num_cpu_blocks", {"num_cpu_blocks": -1}, "invalid_num_cpu_blocks"),
    ("max_num_batched_tokens", {"max_num_batched_tokens": 0, "max_num_seqs": 1}, "invalid_token_budget"),
    ("max_num_seqs", {"max_num_seqs": 0}, "invalid_max_num_seqs"),
    ("max_model_len", {"max_model_len": 0}, "invalid_max_model_len"),
    ("long_prefill_token_threshold", {"long_prefill_token_threshold": -1}, "invalid_threshold"),
    # (an unknown policy or preemption mode is off the trace schema's enums: not a config a trace can hold)
    # without chunking, one max_model_len prompt must fit the budget: 31 < 32
    ("budget_vs_max_model_len", {"max_num_batched_tokens": 31}, "budget_below_max_model_len"),
    # a token per seat: 4 tokens for 5 seats
    ("budget_vs_max_num_seqs", {"enable_chunked_prefill": True, "max_num_batched_tokens": 4, "max_num_seqs": 5},
     "budget_below_max_num_seqs"),
    ("max_num_partial_prefills", {"max_num_partial_prefills": 0}, "invalid_max_num_partial_prefills"),
    ("partial_prefills_vs_chunking", {"max_num_partial_prefills": 2}, "partial_prefills_without_chunked_prefill"),
    ("threshold_vs_max_model_len", {"enable_chunked_prefill": True, "max_num_partial_prefills": 2,
                                    "long_prefill_token_threshold": 33}, "threshold_above_max_model_len"),
    ("max_long_partial_prefills", {"max_long_partial_prefills": 2}, "invalid_max_long_partial_prefills"),
    # one token short: 8 blocks of 4 hold 32 < 33 tokens (the worker refuses to start)
    ("pool_tokens", {"max_model_len": 33, "max_num_batched_tokens": 33}, "pool_below_max_model_len"),
)


def get_v0_refusal(config: dict[str, Any], profile: str) -> str | None:
    """The code the v0 model refuses ``config`` with under ``profile``, or None if it accepts it."""
    from spec.schedulers import make_config

    try:
        make_config(config, profile)
    except InvalidConfig as exc:
        return exc.code
    return None


def make_v0_refused_config_traces(profile: str) -> list[tuple[str, Trace]]:
    """``(rule, trace)`` for each v0 limit the model enforces (checked, not assumed)."""
    out = []
    for rule, fields, code in V0_PAST_THE_LIMIT:
        config = {**V0_BASE_CONFIG, **fields}
        if get_v0_refusal(config, profile) != code:
            continue
        header = make_header(config, profile, seed=0, origin="config-limits", expect_error=code, scheduler="v0",
                             description=f"v0 config one unit past the {rule} limit: refused at start with {code}")
        out.append((rule, Trace(header=header, events=[])))
    return out
