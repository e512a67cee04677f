"""The engine drivers' self-check, written once (standard library only).

``schedconf env ENGINE VERSION`` ends by running ``<driver> --self-check``:
the driver imports its engine, builds one scheduler, runs two steps of one
request and compares what the engine scheduled with what that engine must
schedule. Each driver supplies how to load its engine, the two steps and the
expected outputs; this module owns the rest: the version check, the timing,
and the one line ``self-check ok: ...`` (exit 0) or ``self-check failed: ...``
(exit 1) that ``engine_env`` reads. Like every module the drivers import, it
never imports ``spec/``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from schedconf.conformance.protocol_server import take_protocol_stdout

SELF_CHECK_CONFIG: dict[str, Any] = {
    "block_size": 4,
    "num_gpu_blocks": 16,
    "max_num_batched_tokens": 32,
    "max_num_seqs": 4,
    "max_model_len": 32,
    "enable_chunked_prefill": False,
    "long_prefill_token_threshold": 0,
    "enable_prefix_caching": True,
    "policy": "fcfs",
    "num_spec_tokens": 0,
    "num_lookahead_tokens": 0,
    "scheduler_reserve_full_isl": None,
}
"""A v1 config every engine runs: 15 usable blocks of 4 tokens, a 32-token budget, no chunking."""

SPEC_DECODE_SELF_CHECK_CONFIG = {
    **SELF_CHECK_CONFIG,
    "max_num_batched_tokens": 16,
    "enable_chunked_prefill": True,
    "num_spec_tokens": 2,
}
"""The same with chunked prefill and two draft tokens a step (vLLM's own and Aphrodite's self-check)."""


def get_self_check_request(**overrides: Any) -> dict[str, Any]:
    """The one request of a self-check: a 10-token prompt, 3 tokens to generate (``overrides`` replace fields)."""
    request = {
        "request_id": "a",
        "prompt_token_ids": list(range(10)),
        "max_tokens": 3,
        "priority": 0,
        "arrival_time": 0,
        "eos_token_id": 1,
        "stop_token_ids": [],
        "ignore_eos": False,
        "min_tokens": 0,
    }
    request.update(overrides)
    return request


def run_two_steps(
    sut: Any,
    profile: str,
    config: dict[str, Any] | None = None,
    request: dict[str, Any] | None = None,
    draft_token_ids: dict[str, list[int]] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Start ``sut``, add the request, schedule, sample token 5 for it, schedule again; the two step outputs."""
    sut.start(dict(config or SELF_CHECK_CONFIG), profile)
    sut.add_request(request or get_self_check_request())
    first = sut.schedule()
    sut.update_from_output({"a": [5]}, draft_token_ids or {})
    return first, sut.schedule()


def run_self_check(
    engine: str,
    expect_version: str | None,
    load: Callable[[], Any],
    exercise: Callable[[Any], str | None],
    describe: Callable[[Any], str],
) -> int:
    """Load the engine (``load()`` returns an object with ``version``), check its version, run ``exercise``.

    ``exercise(api)`` returns None when the engine scheduled what it must, else
    what it saw; ``describe(api)`` names what ran, for the ``ok`` line. A local
    version suffix (``0.33.0+cpu``) does not count against ``expect_version``.
    """
    out = take_protocol_stdout()
    started = time.monotonic()
    api = load()
    if expect_version and api.version.split("+")[0] != expect_version:
        print(f"self-check failed: expected {engine} {expect_version}, this environment has {api.version}", file=out)
        return 1
    problem = exercise(api)
    if problem is not None:
        print(f"self-check failed: {problem}", file=out)
        return 1
    print(f"self-check ok: {describe(api)}, {time.monotonic() - started:.1f} s", file=out)
    return 0
