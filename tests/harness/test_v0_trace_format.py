"""v0 traces in format version 1: the header's ``scheduler``, the v0 shapes, refusals with file:line:field."""

import json

import pytest

from schedconf.conformance.protocol import validate_reply
from schedconf.conformance.traces.trace import TraceError, parse_trace_text, render_trace
from schedconf.conformance.traces.vectors import iter_corpus
from schedconf.conformance.workloads.workload import run_workload, workload_from_trace
from schedconf.conformance.workloads.workload_v0 import example_v0_swap

V0_CONFIG = {
    "block_size": 4,
    "num_gpu_blocks": 4,
    "num_cpu_blocks": 4,
    "max_num_batched_tokens": 16,
    "max_num_seqs": 2,
    "max_model_len": 16,
    "enable_chunked_prefill": False,
    "enable_prefix_caching": False,
    "policy": "fcfs",
    "preemption_mode": "swap",
    "max_num_partial_prefills": 1,
    "max_long_partial_prefills": 1,
    "long_prefill_token_threshold": 0,
}


def _header(**changes):
    header = {
        "kind": "header",
        "format": "schedconf-trace",
        "version": 1,
        "profile": "vllm-0.10",
        "scheduler": "v0",
        "config": dict(V0_CONFIG),
        "seed": 0,
        "origin": "hand",
    }
    header.update(changes)
    return {k: v for k, v in header.items() if v is not None}


def _refusal(lines) -> TraceError:
    text = "\n".join(json.dumps(x) for x in lines) + "\n"
    with pytest.raises(TraceError) as info:
        parse_trace_text(text, "t.jsonl")
    return info.value


@pytest.fixture(scope="module")
def swap_trace():
    return run_workload(example_v0_swap())


def test_a_v0_trace_round_trips(swap_trace):
    text = render_trace(swap_trace)
    again = parse_trace_text(text, "swap.jsonl")
    assert again.scheduler == "v0" and again.header["scheduler"] == "v0"
    assert render_trace(again) == text
    # The trace rebuilds into a workload whose rerun is byte-identical (the shrinker relies on it).
    rebuilt = run_workload(workload_from_trace(again))
    rebuilt.header = again.header
    assert render_trace(rebuilt) == text


def test_old_traces_read_as_v1():
    _, path, _ = iter_corpus("vllm-0.33")[0]
    trace = parse_trace_text(path.read_text(), str(path))
    assert "scheduler" not in trace.header and trace.scheduler == "v1"


@pytest.mark.parametrize(
    ("header", "field", "words"),
    [
        # a v0 header with a v1 profile, and a v0 profile without "scheduler": "v0"
        (_header(profile="vllm-0.33"), "profile", "a v0 profile"),
        (_header(scheduler=None), "scheduler", '"v0" (profile vllm-0.10 is a v0 profile)'),
        (_header(scheduler="v2"), "scheduler", '"v0"'),
        # the v0 config's own shape: a v1 field, a missing field, a wrong type
        (_header(config={**V0_CONFIG, "num_spec_tokens": 0}), "config.num_spec_tokens", "no such field"),
        (
            _header(config={k: v for k, v in V0_CONFIG.items() if k != "num_cpu_blocks"}),
            "config.num_cpu_blocks",
            "required field",
        ),
        (_header(config={**V0_CONFIG, "preemption_mode": "drop"}), "config.preemption_mode", "one of"),
        # refused by the model as vLLM 0.10.2 refuses it (the code named)
        (_header(config={**V0_CONFIG, "num_cpu_blocks": -1}), "config.num_cpu_blocks", "invalid_num_cpu_blocks"),
        (
            _header(config={**V0_CONFIG, "max_num_partial_prefills": 2}),
            "config",
            "partial_prefills_without_chunked_prefill",
        ),
        (
            _header(config={**V0_CONFIG, "max_model_len": 17, "max_num_batched_tokens": 17}),
            "config",
            "pool_below_max_model_len",
        ),
    ],
)
def test_a_bad_v0_header_is_refused_with_its_line_and_field(header, field, words):
    err = _refusal([header])
    assert (err.path, err.line, err.field) == ("t.jsonl", 1, field)
    assert words in str(err)
    assert str(err).startswith(f"t.jsonl:1: {field}: expected")


def test_a_v1_config_under_a_v0_header_names_the_missing_v0_field():
    v1_config = json.loads(iter_corpus("vllm-0.33")[0][1].read_text().splitlines()[0])["config"]
    err = _refusal([_header(config=v1_config)])
    # required fields are checked first: num_cpu_blocks is the first v0 field a v1 config lacks
    assert str(err) == "t.jsonl:1: config.num_cpu_blocks: expected a value (required field), found nothing"


def test_a_bad_v0_step_is_refused_with_its_line_and_field(swap_trace):
    lines = [json.loads(x) for x in render_trace(swap_trace).splitlines()]
    step = next(i for i, x in enumerate(lines) if x["kind"] == "step" and x["expect"]["blocks_to_swap_out"])
    # line numbers are 1-based: the header is line 1
    bad = [dict(x) for x in lines]
    bad[step] = dict(bad[step], expect=dict(bad[step]["expect"], blocks_to_swap_out=[[2, 0, 9]]))
    err = _refusal(bad)
    assert (err.line, err.field) == (step + 1, "expect.blocks_to_swap_out[0]") and "2 items" in str(err)
    bad[step] = dict(lines[step], expect={"scheduled_new_reqs": []})  # a v1 output in a v0 trace
    err = _refusal(bad)
    assert err.line == step + 1 and err.field == "expect.scheduled_seq_groups"
    bad[step] = dict(lines[step], observe={"free_block_queue": [], "num_free_blocks": 0})  # a v1 observation
    err = _refusal(bad)
    assert err.line == step + 1 and err.field.startswith("observe.")
    groups = lines[step]["expect"]["scheduled_seq_groups"]
    bad[step] = dict(
        lines[step], expect=dict(lines[step]["expect"], scheduled_seq_groups=[dict(groups[0], block_table=[1.0])])
    )
    err = _refusal(bad)
    assert err.field == "expect.scheduled_seq_groups[0].block_table[0]"


def test_the_protocol_checks_v0_replies_against_the_v0_shapes(swap_trace):
    step = next(x for x in swap_trace.events if x["kind"] == "step")
    assert validate_reply("schedule", {"id": 3, "result": step["expect"]}) is None
    assert validate_reply("schedule", {"id": 3, "result": step["expect"]}, scheduler="v0") is None
    assert validate_reply("observe", {"id": 4, "result": step["observe"]}) is None
    broken = dict(step["expect"], preempted=1.0)
    assert (
        validate_reply("schedule", {"id": 3, "result": broken})
        == "result.preempted: expected integer, found float 1.0 (floats are allowed only in arrival_time)"
    )
    missing = {k: v for k, v in step["expect"].items() if k != "finished_requests_ids"}
    assert "result.finished_requests_ids" in validate_reply("schedule", {"id": 3, "result": missing})
    # told it talks to a v0 scheduler, a v1-shaped reply is off the schema
    assert validate_reply("schedule", {"id": 3, "result": {"scheduled_new_reqs": []}}, scheduler="v0").startswith(
        "result.scheduled_seq_groups"
    )
