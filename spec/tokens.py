"""Token ids and arrival times: the input vocabulary both models (v1 and v0) check the same way."""

from __future__ import annotations

import math

MAX_TOKEN_ID = 2**31 - 1
"""The largest token id the model accepts. vLLM checks prompt ids against the
tokenizer's vocabulary (``vllm/v1/engine/input_processor.py``, "out of
vocabulary") and feeds ids to the model as int32 tensors; without a tokenizer
the int32 range is the only bound, so we use it. Larger ids are refused with
``invalid_token_id`` (an id of 10**30 used to crash the block hash)."""


def is_token_id(value: object) -> bool:
    """True for an integer (not a boolean) in ``[0, MAX_TOKEN_ID]``."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKEN_ID


def is_arrival_time(value: object) -> bool:
    """True for a finite real number: an int or a float, not a boolean, NaN or infinity.

    vLLM's ``arrival_time`` is a float (``time.time()`` by default) and any
    float is accepted; NaN would break the priority order (it compares false
    with everything) and infinities are no time, so those are refused.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)
