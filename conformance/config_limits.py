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
