"""Configs one unit past a limit vLLM accepts, as traces that expect the refusal.

A scheduler must refuse such a config at start with the rule's stable code
(``init`` answers the error), as vLLM refuses to start. Each trace is a header
whose ``expect_error`` names the code and no events; the golden corpus holds
one per rule and profile (``refused-<rule>``), and ``replay`` passes a
scheduler that refuses with exactly that code.

The accepted side of each limit (the config exactly at it) is drawn by the
seeded generator (``conformance/workloads/generate.py`` ``BOUNDARIES``); both sides of
every rule are checked in ``tests/harness/test_generator_boundaries.py``.

Not a start-up rule: a ``long_prefill_token_threshold`` of at most
``num_spec_tokens``. vLLM 0.32/0.33 accept it and fail an assertion later, in
``schedule()``, when the threshold cuts a padded one-token admission
(reports/findings.md, divergence 3); the model accepts it too and crashes at
that step (``engine_assertion_padded_admission``): generated traces end with a
``step`` expecting that error (``conformance/workloads/generate.py``
``SPEC_CUT_THRESHOLD_RATE``).

The v0 scheduler (profile ``vllm-0.10``) has its own limits
(:data:`V0_PAST_THE_LIMIT`, vLLM 0.10.2's ``SchedulerConfig._verify_args`` and
the worker's pool check), in the v0 corpus.

Campaigns check the same rules on the configs they draw
(:func:`get_refused_variants`): :func:`make_at_the_limit` moves a drawn config
exactly onto a rule's limit (still accepted) and names the one field whose next
step passes it; the config one step further is refused with the rule's code.
A share of generated workloads carries such a config
(``conformance/workloads/generate.py`` ``REFUSED_CONFIG_RATE``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from schedconf.conformance.traces.trace import Trace, make_header
from schedconf.spec.errors import InvalidConfig
from schedconf.spec.v1.config import OPTIONAL_FIELDS, SchedulerConfig
from schedconf.spec.v1.profiles import check_config_for_profile, get_profile

BASE_CONFIG = SchedulerConfig(
    block_size=4,
    num_gpu_blocks=9,
    max_num_batched_tokens=16,
    max_num_seqs=4,
    max_model_len=32,
    enable_prefix_caching=False,
)
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
    (
        "budget_vs_max_model_len",
        {"enable_chunked_prefill": False, "max_num_batched_tokens": 31},
        "budget_below_max_model_len",
    ),
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
        header = make_header(
            config,
            profile,
            seed=0,
            origin="config-limits",
            expect_error=code,
            description=f"config one unit past the {rule} limit: refused at start with {code}",
        )
        out.append((rule, Trace(header=header, events=[])))
    return out


# ----------------------------------------------------------------- v0

V0_BASE_CONFIG: dict[str, Any] = {
    "block_size": 4,
    "num_gpu_blocks": 8,
    "num_cpu_blocks": 8,
    "max_num_batched_tokens": 32,
    "max_num_seqs": 4,
    "max_model_len": 32,
    "enable_chunked_prefill": False,
    "enable_prefix_caching": False,
    "policy": "fcfs",
    "preemption_mode": None,
    "max_num_partial_prefills": 1,
    "max_long_partial_prefills": 1,
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
    (
        "budget_vs_max_num_seqs",
        {"enable_chunked_prefill": True, "max_num_batched_tokens": 4, "max_num_seqs": 5},
        "budget_below_max_num_seqs",
    ),
    ("max_num_partial_prefills", {"max_num_partial_prefills": 0}, "invalid_max_num_partial_prefills"),
    ("partial_prefills_vs_chunking", {"max_num_partial_prefills": 2}, "partial_prefills_without_chunked_prefill"),
    (
        "threshold_vs_max_model_len",
        {"enable_chunked_prefill": True, "max_num_partial_prefills": 2, "long_prefill_token_threshold": 33},
        "threshold_above_max_model_len",
    ),
    ("max_long_partial_prefills", {"max_long_partial_prefills": 2}, "invalid_max_long_partial_prefills"),
    # one token short: 8 blocks of 4 hold 32 < 33 tokens (the worker refuses to start)
    ("pool_tokens", {"max_model_len": 33, "max_num_batched_tokens": 33}, "pool_below_max_model_len"),
)


def get_v0_refusal(config: dict[str, Any], profile: str) -> str | None:
    """The code the v0 model refuses ``config`` with under ``profile``, or None if it accepts it."""
    from schedconf.spec.schedulers import make_config

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
        header = make_header(
            config,
            profile,
            seed=0,
            origin="config-limits",
            expect_error=code,
            scheduler="v0",
            description=f"v0 config one unit past the {rule} limit: refused at start with {code}",
        )
        out.append((rule, Trace(header=header, events=[])))
    return out


# ------------------------------------------------- the limits of any config

LimitStep = tuple[dict[str, Any], str, int]
"""(a config exactly at a rule's limit, the field whose next step passes it, that step: -1 or +1)."""


def _get_without_active_seqs(c: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in c.items() if k != "max_num_active_seqs"}


def make_at_the_limit(rule: str, config: Mapping[str, Any]) -> LimitStep | None:
    """``config`` (v1, accepted) moved exactly onto the limit of ``rule`` (a rule of :data:`PAST_THE_LIMIT`),
    with the field and step that take it one unit past; None where no such config is near it.

    The other fields move only as far as the config at the limit needs to be
    accepted (a pool that holds max_model_len tokens of one-token blocks, a
    max_model_len that one usable block holds, a seat per token, ...), so one
    step of the field breaks the rule and, where the rules allow it, no other.
    """
    c = dict(config)
    bs, ngb, mml = c["block_size"], c["num_gpu_blocks"], c["max_model_len"]
    budget, seqs = c["max_num_batched_tokens"], c["max_num_seqs"]
    active = c.get("max_num_active_seqs")
    if rule == "block_size":
        return {**c, "block_size": 1, "num_gpu_blocks": max(ngb, mml + 1)}, "block_size", -1
    if rule == "num_gpu_blocks":
        small = min(mml, bs)
        at = {
            **c,
            "num_gpu_blocks": 2,
            "max_model_len": small,
            "long_prefill_token_threshold": min(c["long_prefill_token_threshold"], small),
        }
        return at, "num_gpu_blocks", -1
    if rule == "max_num_batched_tokens":
        at = {**c, "max_num_batched_tokens": 1, "max_num_seqs": 1, "enable_chunked_prefill": True}
        if active is not None:
            at["max_num_active_seqs"] = 1
        return at, "max_num_batched_tokens", -1
    if rule == "max_num_seqs":
        return {**_get_without_active_seqs(c), "max_num_seqs": 1}, "max_num_seqs", -1
    if rule == "max_model_len":
        return {**c, "max_model_len": 1, "long_prefill_token_threshold": 0}, "max_model_len", -1
    if rule in ("long_prefill_token_threshold", "num_spec_tokens", "num_lookahead_tokens"):
        return {**c, rule: 0}, rule, -1
    if rule == "budget_vs_max_model_len":
        if mml < 2:
            return None
        at = {**c, "enable_chunked_prefill": False, "max_num_batched_tokens": mml, "max_num_seqs": min(seqs, mml - 1)}
        if active is not None:
            at["max_num_active_seqs"] = min(active, at["max_num_seqs"])
        return at, "max_num_batched_tokens", -1
    if rule == "budget_vs_max_num_seqs":
        return {**c, "max_num_seqs": budget}, "max_num_seqs", +1
    if rule == "pool_blocks":
        return {**c, "num_gpu_blocks": -(-mml // bs) + 1}, "num_gpu_blocks", -1
    if rule == "pool_tokens":
        at = {**c, "max_model_len": (ngb - 1) * bs}
        if not c["enable_chunked_prefill"]:
            at["max_num_batched_tokens"] = max(budget, at["max_model_len"] + 1)
        return at, "max_model_len", +1
    if rule == "threshold_vs_max_model_len":
        return {**c, "long_prefill_token_threshold": mml}, "long_prefill_token_threshold", +1
    raise ValueError(f"unknown config limit {rule!r}; known: {', '.join(r for r, _, _ in PAST_THE_LIMIT)}")


def make_v0_at_the_limit(rule: str, config: Mapping[str, Any]) -> LimitStep | None:
    """As :func:`make_at_the_limit`, for a v0 config and a rule of :data:`V0_PAST_THE_LIMIT`."""
    c = dict(config)
    bs, ngb, mml = c["block_size"], c["num_gpu_blocks"], c["max_model_len"]
    budget, seqs = c["max_num_batched_tokens"], c["max_num_seqs"]
    partial = c["max_num_partial_prefills"]
    single = {"max_num_partial_prefills": 1, "max_long_partial_prefills": 1}
    if rule == "block_size":
        return {**c, "block_size": 1, "num_gpu_blocks": max(ngb, mml)}, "block_size", -1
    if rule == "num_gpu_blocks":
        small = min(mml, bs)
        at = {
            **c,
            "num_gpu_blocks": 1,
            "max_model_len": small,
            "long_prefill_token_threshold": min(c["long_prefill_token_threshold"], small),
        }
        return at, "num_gpu_blocks", -1
    if rule in ("num_cpu_blocks", "long_prefill_token_threshold"):
        return {**c, rule: 0}, rule, -1
    if rule == "max_num_batched_tokens":
        return {**c, "max_num_batched_tokens": 1, "max_num_seqs": 1, "enable_chunked_prefill": True}, rule, -1
    if rule == "max_num_seqs":
        return {**c, "max_num_seqs": 1}, rule, -1
    if rule == "max_model_len":
        return {**c, "max_model_len": 1, "long_prefill_token_threshold": 0}, rule, -1
    if rule == "budget_vs_max_model_len":
        if mml < 2:
            return None
        at = {
            **c,
            **single,
            "enable_chunked_prefill": False,
            "max_num_batched_tokens": mml,
            "max_num_seqs": min(seqs, mml - 1),
        }
        return at, "max_num_batched_tokens", -1
    if rule == "budget_vs_max_num_seqs":
        return {**c, "max_num_seqs": budget}, "max_num_seqs", +1
    if rule == "max_num_partial_prefills":
        return {**c, **single}, rule, -1
    if rule == "partial_prefills_vs_chunking":
        at = {**c, **single, "enable_chunked_prefill": False, "max_num_batched_tokens": max(budget, mml)}
        return at, "max_num_partial_prefills", +1
    if rule == "threshold_vs_max_model_len":
        at = {
            **c,
            "enable_chunked_prefill": True,
            "max_num_partial_prefills": max(partial, 2),
            "long_prefill_token_threshold": mml,
        }
        return at, "long_prefill_token_threshold", +1
    if rule == "max_long_partial_prefills":
        return {**c, "max_long_partial_prefills": partial}, rule, +1
    if rule == "pool_tokens":
        at = {**c, "max_model_len": bs * ngb}
        if not c["enable_chunked_prefill"]:
            at["max_num_batched_tokens"] = max(budget, at["max_model_len"] + 1)
        return at, "max_model_len", +1
    raise ValueError(f"unknown v0 config limit {rule!r}; known: {', '.join(r for r, _, _ in V0_PAST_THE_LIMIT)}")


def get_refused_variants(
    config: Mapping[str, Any], profile: str, overrides: Mapping[str, Any] | None = None
) -> list[tuple[str, dict[str, Any], str]]:
    """``(rule, refused config, code)`` for each rule of the profile's table (:data:`PAST_THE_LIMIT`, or
    :data:`V0_PAST_THE_LIMIT` for a v0 profile) that ``config`` can be taken one step past.

    The config at the limit (:func:`make_at_the_limit`, with ``overrides``
    applied: a campaign's ``--set`` values and the fields its scheduler
    forces) must be accepted under ``profile``, and one step of the rule's
    field past it, the overrides applied again, refused with the rule's code;
    a rule the profile does not enforce, or one the overrides undo, yields
    nothing. Optional fields at their defaults are left out (as in any
    header: a scheduler that predates them never sees them).
    """
    from schedconf.conformance.workloads.workload import is_v0_profile

    v0 = is_v0_profile(profile)
    table = V0_PAST_THE_LIMIT if v0 else PAST_THE_LIMIT
    at_the_limit = make_v0_at_the_limit if v0 else make_at_the_limit
    refusal = get_v0_refusal if v0 else get_refusal
    out = []
    for rule, _, code in table:
        step = at_the_limit(rule, config)
        if step is None:
            continue
        at, name, delta = step
        at = _get_without_defaults({**at, **(overrides or {})})
        if refusal(at, profile) is not None:
            continue
        past = _get_without_defaults({**at, name: at[name] + delta, **(overrides or {})})
        if refusal(past, profile) == code:
            out.append((rule, past, code))
    return out


def _get_without_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` without the optional fields at their defaults, as ``SchedulerConfig.to_dict`` writes a header."""
    return {k: v for k, v in config.items() if k not in OPTIONAL_FIELDS or v != OPTIONAL_FIELDS[k]}
