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


def validate_config(config: Any) -> dict[str, Any]:
    """Refuse a config with the protocol's codes, in the model's order; return a copy (every field present)."""
    require(isinstance(config, dict), "invalid_config_type", "config must be an object")
    missing = [f for f in CONFIG_FIELDS if f not in config]
    unknown = sorted(set(config) - set(CONFIG_FIELDS))
    require(not unknown, "unknown_config_field", f"unknown config field(s): {', '.join(unknown)}")
    require(not missing, "invalid_config_type", f"missing config field(s): {', '.join(missing)}")
    for name in CONFIG_FIELDS:
        value = config[name]
        if name in ("enable_chunked_prefill", "enable_prefix_caching"):
            require(isinstance(value, bool), "invalid_config_type", f"{name} must be a boolean")
        elif name == "scheduler_reserve_full_isl":
            require(
                value is None or isinstance(value, bool), "invalid_config_type", f"{name} must be a boolean or null"
            )
        elif name == "policy":
            require(value in ("fcfs", "priority"), "invalid_policy", "policy must be 'fcfs' or 'priority'")
        else:
            require(is_int(value), "invalid_config_type", f"{name} must be an integer")
    c = config
    require(c["block_size"] >= 1, "invalid_block_size", "block_size must be >= 1")
    require(
        c["num_gpu_blocks"] >= 2, "invalid_num_gpu_blocks", "num_gpu_blocks must be >= 2 (block 0 is the null block)"
    )
    require(c["max_num_batched_tokens"] >= 1, "invalid_token_budget", "max_num_batched_tokens must be >= 1")
    require(c["max_num_seqs"] >= 1, "invalid_max_num_seqs", "max_num_seqs must be >= 1")
    require(c["max_model_len"] >= 1, "invalid_max_model_len", "max_model_len must be >= 1")
    require(c["long_prefill_token_threshold"] >= 0, "invalid_threshold", "long_prefill_token_threshold must be >= 0")
    require(c["num_spec_tokens"] >= 0, "invalid_num_spec_tokens", "num_spec_tokens must be >= 0")
    require(c["num_lookahead_tokens"] >= 0, "invalid_num_lookahead_tokens", "num_lookahead_tokens must be >= 0")
    require(
        c["enable_chunked_prefill"] or c["max_num_batched_tokens"] >= c["max_model_len"],
        "budget_below_max_model_len",
        "with chunked prefill disabled, max_num_batched_tokens must be >= max_model_len",
    )
    require(
        c["max_num_batched_tokens"] >= c["max_num_seqs"],
        "budget_below_max_num_seqs",
        "max_num_batched_tokens must be >= max_num_seqs",
    )
    require(
        cdiv(c["max_model_len"], c["block_size"]) <= c["num_gpu_blocks"] - 1,
        "pool_below_max_model_len",
        "num_gpu_blocks - 1 usable blocks must hold max_model_len tokens",
    )
    return dict(config)


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
