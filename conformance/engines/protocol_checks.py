"""The protocol's input refusals, written once for the engine drivers (standard library only).

Every driver must refuse a bad ``init`` or ``add_request`` with the stable
codes of PROTOCOL.md (the spec's table, FORMAT.md) before its engine sees the
input, in the model's order (``spec/v1/config.py``, ``Scheduler.add_request``),
so that one bad input gets one code whatever the engine. The drivers run
inside their engines' environments and never import ``spec/``: this module
restates those rules in the protocol's terms and is what each of them calls.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

CONFIG_FIELDS = (
    "block_size",
    "num_gpu_blocks",
    "max_num_batched_tokens",
    "max_num_seqs",
    "max_model_len",
    "enable_chunked_prefill",
    "long_prefill_token_threshold",
    "enable_prefix_caching",
    "policy",
    "num_spec_tokens",
    "num_lookahead_tokens",
    "scheduler_reserve_full_isl",
)
MAX_TOKEN_ID = 2**31 - 1
"""Token ids are int32, as the model's (spec/v1/request.py MAX_TOKEN_ID)."""


class DriverError(Exception):
    """An input the protocol refuses; ``code`` is the stable error code."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(message)


class SutUnsupported(Exception):  # noqa: N818 - protocol_server matches this class name
    """The engine cannot express this config or input (the verdict is unknown)."""


def require(condition: bool, code: str, message: str) -> None:
    if not condition:
        raise DriverError(code, message)


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_token_id(value: object) -> bool:
    return is_int(value) and 0 <= value <= MAX_TOKEN_ID  # type: ignore[operator]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


FieldKind = str
"""How a config field is typed: ``int`` (the default), ``bool``, ``int_or_null``,
``bool_or_null``, ``policy`` or ``preemption_mode``."""

FIELD_KINDS: dict[str, FieldKind] = {
    "enable_chunked_prefill": "bool",
    "enable_prefix_caching": "bool",
    "long_prefill_token_threshold_adaptive": "bool",
    "use_v2_model_runner": "bool",
    "log_stats": "bool",
    "max_num_active_seqs": "int_or_null",
    "scheduler_reserve_full_isl": "bool_or_null",
    "policy": "policy",
    "preemption_mode": "preemption_mode",
}
"""The v1 and v0 config fields that are not plain integers (spec/v1/config.py, spec/v0/config.py)."""


def validate_field_types(
    config: Any,
    fields: tuple[str, ...],
    optional: dict[str, Any] | None = None,
    missing_code: str = "invalid_config_type",
) -> dict[str, Any]:
    """Refuse a config that is not an object, names an unknown field, lacks one or mistypes one.

    ``fields`` are required; ``optional`` maps the fields a header may leave
    out to their defaults. Returns a copy with every field present.
    """
    optional = optional or {}
    require(isinstance(config, dict), "invalid_config_type", "config must be an object")
    unknown = sorted(set(config) - set(fields) - set(optional))
    require(not unknown, "unknown_config_field", f"unknown config field(s): {', '.join(unknown)}")
    missing = [f for f in fields if f not in config]
    require(not missing, missing_code, f"missing config field(s): {', '.join(missing)}")
    config = {**optional, **config}
    for name in (*fields, *optional):
        value = config[name]
        kind = FIELD_KINDS.get(name, "int")
        if kind == "bool":
            require(isinstance(value, bool), "invalid_config_type", f"{name} must be a boolean")
        elif kind == "int_or_null":
            require(value is None or is_int(value), "invalid_config_type", f"{name} must be an integer or null")
        elif kind == "bool_or_null":
            require(
                value is None or isinstance(value, bool), "invalid_config_type", f"{name} must be a boolean or null"
            )
        elif kind == "policy":
            require(value in ("fcfs", "priority"), "invalid_policy", "policy must be 'fcfs' or 'priority'")
        elif kind == "preemption_mode":
            require(
                value in (None, "swap", "recompute"),
                "invalid_preemption_mode",
                "preemption_mode must be null, 'swap' or 'recompute'",
            )
        else:
            require(is_int(value), "invalid_config_type", f"{name} must be an integer")
    return config


ConfigRule = tuple[tuple[str, ...], Callable[[dict[str, Any]], bool], str, str]
"""(the fields it reads, what must hold, the code, the message): one range rule of a config."""


def at_least(name: str, minimum: int, code: str, why: str = "") -> ConfigRule:
    return ((name,), lambda c: c[name] >= minimum, code, f"{name} must be >= {minimum}{why}")


V1_CONFIG_RULES: tuple[ConfigRule, ...] = (
    at_least("block_size", 1, "invalid_block_size"),
    at_least("num_gpu_blocks", 2, "invalid_num_gpu_blocks", " (block 0 is the null block)"),
    at_least("max_num_batched_tokens", 1, "invalid_token_budget"),
    at_least("max_num_seqs", 1, "invalid_max_num_seqs"),
    at_least("max_model_len", 1, "invalid_max_model_len"),
    at_least("long_prefill_token_threshold", 0, "invalid_threshold"),
    at_least("num_spec_tokens", 0, "invalid_num_spec_tokens"),
    (
        ("max_num_active_seqs", "max_num_seqs"),
        lambda c: c["max_num_active_seqs"] is None or 1 <= c["max_num_active_seqs"] <= c["max_num_seqs"],
        "invalid_max_num_active_seqs",
        "max_num_active_seqs must be null or in [1, max_num_seqs]",
    ),
    at_least("max_concurrent_batches", 1, "invalid_max_concurrent_batches", " (1 = synchronous)"),
    at_least("pipeline_parallel_size", 1, "invalid_pipeline_parallel_size"),
    at_least("prefill_schedule_interval", 1, "invalid_prefill_schedule_interval", " (1 admits prefill on every step)"),
    at_least("num_lookahead_tokens", 0, "invalid_num_lookahead_tokens"),
    (
        ("enable_chunked_prefill", "max_num_batched_tokens", "max_model_len"),
        lambda c: c["enable_chunked_prefill"] or c["max_num_batched_tokens"] >= c["max_model_len"],
        "budget_below_max_model_len",
        "with chunked prefill disabled, max_num_batched_tokens must be >= max_model_len",
    ),
    (
        ("max_num_batched_tokens", "max_num_seqs"),
        lambda c: c["max_num_batched_tokens"] >= c["max_num_seqs"],
        "budget_below_max_num_seqs",
        "max_num_batched_tokens must be >= max_num_seqs",
    ),
    (
        ("max_model_len", "block_size", "num_gpu_blocks"),
        lambda c: cdiv(c["max_model_len"], c["block_size"]) <= c["num_gpu_blocks"] - 1,
        "pool_below_max_model_len",
        "num_gpu_blocks - 1 usable blocks must hold max_model_len tokens",
    ),
)
"""The v1 model's range rules in its order (spec/v1/config.py): one bad config gets one code."""


def get_config_rule(code: str) -> ConfigRule:
    """The v1 rule that refuses with ``code`` (for a table that shares it, such as v0's)."""
    return next(rule for rule in V1_CONFIG_RULES if rule[2] == code)


def validate_config_rules(
    config: dict[str, Any], rules: tuple[ConfigRule, ...], left_to_engine: tuple[str, ...] = ()
) -> None:
    """Refuse the first rule ``config`` breaks, skipping rules on fields it lacks and codes in ``left_to_engine``."""
    for fields, holds, code, message in rules:
        if code in left_to_engine or any(f not in config for f in fields):
            continue
        require(holds(config), code, message)


def validate_config(
    config: Any, optional: dict[str, Any] | None = None, left_to_engine: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Refuse a v1 config with the protocol's codes, in the model's order; return a copy (every field present).

    ``optional``: the optional fields this driver takes, with their defaults
    (any other optional field is ``unknown_config_field``). ``left_to_engine``:
    codes the engine's own refusal answers (the driver maps its error).
    """
    checked = validate_field_types(config, CONFIG_FIELDS, optional)
    validate_config_rules(checked, V1_CONFIG_RULES, left_to_engine)
    return checked


def validate_add_request(
    event: dict[str, Any], live: Any, aborted_in_pending: Any, max_model_len: int
) -> dict[str, Any]:
    """Refuse a bad ``add_request`` with the protocol's codes, in the model's order; return its fields.

    ``live`` and ``aborted_in_pending`` answer ``in`` for request ids (the
    driver's live requests; those aborted while the pending step executes).
    """
    rid: Any = event.get("request_id")
    prompt: Any = event.get("prompt_token_ids")
    stops: Any = event.get("stop_token_ids", [])
    eos: Any = event.get("eos_token_id")
    max_tokens: Any = event.get("max_tokens")
    min_tokens: Any = event.get("min_tokens", 0)
    priority: Any = event.get("priority", 0)
    arrival: Any = event.get("arrival_time", 0)
    ignore_eos: Any = event.get("ignore_eos", False)
    require(isinstance(rid, str) and rid != "", "invalid_request_id", "request id must be a non-empty string")
    require(rid not in live, "duplicate_request_id", f"request {rid!r} is already live")
    require(isinstance(prompt, list), "invalid_field_type", "prompt_token_ids must be a list")
    require(isinstance(stops, list), "invalid_field_type", "stop_token_ids must be a list")
    require(isinstance(ignore_eos, bool), "invalid_field_type", "ignore_eos must be a boolean")
    require(len(prompt) > 0, "empty_prompt", "the prompt has no tokens")
    require(
        len(prompt) < max_model_len,
        "prompt_too_long",
        f"prompt of {len(prompt)} tokens leaves no room within max_model_len={max_model_len}",
    )
    for name, value in (("max_tokens", max_tokens), ("min_tokens", min_tokens), ("priority", priority)):
        require(is_int(value), "invalid_field_type", f"{name} must be an integer")
    require(
        (is_int(arrival) or isinstance(arrival, float)) and math.isfinite(arrival),
        "invalid_field_type",
        "arrival_time must be a finite number",
    )
    require(max_tokens >= 1, "invalid_max_tokens", "max_tokens must be >= 1")
    require(0 <= min_tokens <= max_tokens, "invalid_min_tokens", "min_tokens must be in [0, max_tokens]")
    for token in (*prompt, *stops, *(() if eos is None else (eos,))):
        require(is_token_id(token), "invalid_token_id", "token ids must be non-negative integers")
    require(
        rid not in aborted_in_pending,
        "request_id_in_flight",
        f"request {rid!r} was aborted in the pending step; apply its model output first",
    )
    return {
        "request_id": rid,
        "prompt_token_ids": prompt,
        "stop_token_ids": stops,
        "eos_token_id": eos,
        "max_tokens": max_tokens,
        "min_tokens": min_tokens,
        "priority": priority,
        "arrival_time": arrival,
        "ignore_eos": ignore_eos,
    }
