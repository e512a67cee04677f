"""The JSON Schema check of events and replies: the library's verdict, the format's messages and its two own rules.

Each expected triple is written from the format's message shape
(``field: expected X, found Y``, FORMAT.md) and the schema line it breaks,
not copied from a run.
"""

from __future__ import annotations

import collections

import pytest

from schedconf.conformance.protocol import validate_reply
from schedconf.conformance.traces.json_schema import find_float, validate_value
from schedconf.conformance.traces.trace import SCHEMA, TraceError, parse_trace_text

SHAPE = {
    "type": "object",
    "properties": {
        "count": {"type": "integer"},
        "arrival_time": {"type": "number"},
        "kind": {"enum": ["a", "b"]},
        "pair": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2},
        "tables": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "integer"}}},
    },
    "required": ["count"],
    "additionalProperties": False,
}
FLOAT_NOTE = "(floats are allowed only in arrival_time)"


class Float64(float):
    """Stands for numpy's float64: a float subclass an in-process SUT may answer with."""


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"count": 3}, None),
        ({"count": 3, "arrival_time": 0.25}, None),
        # JSON Schema since draft 6 counts 1.0 as an integer; the format does not.
        ({"count": 1.0}, ("r.count", "integer", f"float 1.0 {FLOAT_NOTE}")),
        ({"count": 1.5}, ("r.count", "integer", f"float 1.5 {FLOAT_NOTE}")),
        ({"count": Float64(2.0)}, ("r.count", "integer", f"float 2.0 {FLOAT_NOTE}")),
        ({"count": True}, ("r.count", "integer", "boolean true")),
        ({}, ("r.count", "a value (required field)", "nothing")),
        (
            {"count": 1, "extra": 7},
            ("r.extra", "no such field (known fields: arrival_time, count, kind, pair, tables)", "7"),
        ),
        ({"count": 1, "kind": "c"}, ("r.kind", 'one of "a", "b"', '"c"')),
        ({"count": 1, "pair": [1]}, ("r.pair", "2 items", "[1]")),
        ({"count": 1, "pair": [1, "x"]}, ("r.pair[1]", "integer", '"x"')),
        ({"count": 1, "tables": {"req-1": [1, 2.0]}}, ("r.tables.req-1[1]", "integer", f"float 2.0 {FLOAT_NOTE}")),
        # A dict subclass is looked into as well.
        (
            {"count": 1, "tables": collections.OrderedDict({"q": [0, 3.0]})},
            ("r.tables.q[1]", "integer", f"float 3.0 {FLOAT_NOTE}"),
        ),
    ],
)
def test_first_problem_is_named_in_the_formats_words(value, expected):
    assert validate_value(value, SHAPE, "r", {}) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"count": 1, "arrival_time": 0.5}, None),
        ({"count": 1, "arrival_time": float("inf")}, ("r.arrival_time", "a finite number", f"float inf {FLOAT_NOTE}")),
        # Where the schema types nothing, a trace still holds no float.
        ({"count": 1, "tables": {"q": {"deep": 2.5}}}, ("r.tables.q.deep", "integer", f"float 2.5 {FLOAT_NOTE}")),
    ],
)
def test_a_trace_holds_floats_only_in_number_fields(value, expected):
    assert find_float(value, "r", SHAPE, {}) == expected


def test_trace_line_with_a_whole_float_token_count_is_refused_at_its_line():
    header = (
        '{"kind": "header", "format": "schedconf-trace", "version": 1, "profile": "vllm-0.33", "seed": 0, '
        '"origin": "test", "config": {"block_size": 4, "num_gpu_blocks": 16, "max_num_batched_tokens": 32, '
        '"max_num_seqs": 4, "max_model_len": 32, "enable_chunked_prefill": false, '
        '"long_prefill_token_threshold": 0, "enable_prefix_caching": true, "policy": "fcfs", '
        '"num_spec_tokens": 0, "num_lookahead_tokens": 0, "scheduler_reserve_full_isl": null}}'
    )
    bad = (
        '{"kind": "add_request", "request_id": "a", "prompt_token_ids": [1, 2.0], "max_tokens": 2, "priority": 0, '
        '"arrival_time": 0.5, "eos_token_id": 1, "stop_token_ids": [], "ignore_eos": false, "min_tokens": 0}'
    )
    with pytest.raises(TraceError) as caught:
        parse_trace_text(header + "\n" + bad + "\n", "t.jsonl")
    assert (caught.value.line, caught.value.field, caught.value.expected) == (2, "prompt_token_ids[1]", "integer")


def test_v0_trace_shapes_replace_the_v1_ones():
    """A v0 config is valid under v0's shapes and refused under v1's (the schema's schedulers table)."""
    v0_config = {
        "block_size": 4,
        "num_gpu_blocks": 8,
        "num_cpu_blocks": 4,
        "max_num_batched_tokens": 32,
        "max_num_seqs": 4,
        "max_model_len": 32,
        "enable_chunked_prefill": False,
        "enable_prefix_caching": True,
        "policy": "fcfs",
        "preemption_mode": None,
        "max_num_partial_prefills": 1,
        "max_long_partial_prefills": 1,
        "long_prefill_token_threshold": 0,
    }
    config_ref = {"$ref": "#/$defs/config"}
    replace = SCHEMA["schedulers"]["v0"]["replace"]
    assert validate_value(v0_config, config_ref, "config", SCHEMA["$defs"], replace) is None
    # Under v1's shape the first of v1's required fields (FORMAT.md's order) a v0 config lacks.
    assert validate_value(v0_config, config_ref, "config", SCHEMA["$defs"]) == (
        "config.num_spec_tokens",
        "a value (required field)",
        "nothing",
    )


def test_protocol_reply_with_a_float_count_is_refused():
    """A schedule() answer of the reference, one count spoiled to 3.0: refused where the old validator refused it."""
    from schedconf.conformance.adapters.reference import ReferenceSut
    from schedconf.conformance.traces.examples import EXAMPLES
    from schedconf.conformance.workloads.workload import run_workload

    trace = run_workload(EXAMPLES["mixed"]())
    sut = ReferenceSut()
    sut.start(trace.header["config"], trace.header["profile"])
    for event in trace.events:
        if event["kind"] == "add_request":
            sut.add_request({k: v for k, v in event.items() if k not in ("kind", "expect_error")})
        if event["kind"] == "step":
            break
    result = dict(sut.schedule())
    assert validate_reply("schedule", {"id": 1, "result": result}) is None
    spoiled = {**result, "total_num_scheduled_tokens": float(result["total_num_scheduled_tokens"])}
    assert validate_reply("schedule", {"id": 1, "result": spoiled}) == (
        f"result.total_num_scheduled_tokens: expected integer, found float "
        f"{spoiled['total_num_scheduled_tokens']!r} {FLOAT_NOTE}"
    )
