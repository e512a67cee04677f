"""The stop check run after every appended token (§5.1, ``vllm/v1/core/sched/utils.py``).

The rules, in the order 0.29+ applies them, for the last appended token:

1. it is the EOS token (never under ``ignore_eos``): FINISHED_STOPPED;
2. it is one of ``stop_token_ids``: FINISHED_STOPPED, ``stop_reason`` = it;
3. ``num_tokens >= max_model_len`` or ``num_output_tokens >= max_tokens``:
   FINISHED_LENGTH_CAPPED;
4. fewer than ``min_tokens`` outputs: keep going.

So a *sampled* EOS stops a request even below ``min_tokens`` (vLLM enforces
``min_tokens`` by masking logits, not here), and an EOS sampled exactly at
``max_tokens`` is reported as ``stop``. Other releases order the rules
differently (profile knob ``stop_check_order``).
"""

from __future__ import annotations

from schedconf.spec.v1.profiles import StopCheckOrder
from schedconf.spec.v1.request import Request, RequestStatus


def _check_stop_token(request: Request) -> RequestStatus | None:
    """Rules 1-2: EOS (unless ignored), then the stop token ids."""
    last = request.output_token_ids[-1]
    if last == request.sampling_params.effective_eos_token_id:
        return RequestStatus.FINISHED_STOPPED
    if last in request.sampling_params.stop_token_ids:
        request.stop_reason = last
        return RequestStatus.FINISHED_STOPPED
    return None


def _check_length(request: Request, max_model_len: int) -> RequestStatus | None:
    """Rule 3: the sequence reached max_model_len or the outputs reached max_tokens."""
    if request.num_tokens >= max_model_len or request.num_output_tokens >= request.max_tokens:
        return RequestStatus.FINISHED_LENGTH_CAPPED
    return None


def compute_stop_status(request: Request, max_model_len: int, order: StopCheckOrder) -> RequestStatus | None:
    """Return the FINISHED_* status the last appended token leads to, or None.

    Sets ``request.stop_reason`` when a stop token id matched.
    """
    below_min_tokens = request.num_output_tokens < request.sampling_params.min_tokens
    if order == "eos_first":  # 0.29+
        return _check_stop_token(request) or _check_length(request, max_model_len)
    if order == "min_tokens_first":  # 0.12-0.25
        if below_min_tokens:
            return None
        return _check_stop_token(request) or _check_length(request, max_model_len)
    # "length_first": <=0.11, no min_tokens rule at all.
    return _check_length(request, max_model_len) or _check_stop_token(request)
