"""The trace reader: clear errors with file, line and field; never a traceback; fuzzed."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedconf.conformance.traces.examples import example_mixed
from schedconf.conformance.traces.trace import TraceError, parse_trace_text, read_trace, render_trace, write_trace
from schedconf.conformance.workloads.workload import run_workload


@pytest.fixture(scope="module")
def valid_text():
    return render_trace(run_workload(example_mixed()))


def test_roundtrip(tmp_path, valid_text):
    trace = parse_trace_text(valid_text, "x")
    write_trace(tmp_path / "t.jsonl", trace)
    again = read_trace(tmp_path / "t.jsonl")
    assert render_trace(again) == valid_text
    # canonical lines: sorted keys, no spaces
    first = valid_text.splitlines()[1]
    assert first == json.dumps(json.loads(first), sort_keys=True, separators=(",", ":"))


def _lines(text):
    return text.splitlines()


def test_error_names_file_line_and_field(tmp_path, valid_text):
    lines = _lines(valid_text)
    event = json.loads(lines[2])
    event["max_tokens"] = "four"  # line 3 is the second add_request of the built-in example
    assert event["kind"] == "add_request"
    lines[2] = json.dumps(event)
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines))
    with pytest.raises(TraceError) as e:
        read_trace(path)
    assert e.value.line == 3 and e.value.field == "max_tokens"
    assert str(path) in str(e.value) and "integer" in str(e.value)


def test_unknown_version_refused(valid_text):
    lines = _lines(valid_text)
    header = json.loads(lines[0])
    header["version"] = 2
    with pytest.raises(TraceError) as e:
        parse_trace_text("\n".join([json.dumps(header)] + lines[1:]), "v2.jsonl")
    assert e.value.field == "version" and "version 1" in str(e.value)


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda e: e.update(kind="teleport"), "kind"),
        (lambda e: e.update(extra_field=1), "extra_field"),
        (lambda e: e.pop("request_id"), "request_id"),
    ],
)
def test_structural_errors(valid_text, mutate, field):
    lines = _lines(valid_text)
    event = json.loads(lines[1])
    mutate(event)
    lines[1] = json.dumps(event)
    with pytest.raises(TraceError) as e:
        parse_trace_text("\n".join(lines), "t")
    assert e.value.line == 2 and e.value.field == field


def test_floats_and_bad_json_and_empty(valid_text):
    lines = _lines(valid_text)
    with pytest.raises(TraceError) as e:
        parse_trace_text("\n".join([lines[0], lines[1].replace('"priority":0', '"priority":0.5')]), "t")
    assert "float" in str(e.value)
    with pytest.raises(TraceError) as e:
        parse_trace_text(lines[0] + "\n{not json", "t")
    assert e.value.line == 2
    with pytest.raises(TraceError):
        parse_trace_text("", "t")
    with pytest.raises(TraceError) as e:
        parse_trace_text(lines[1], "t")  # no header first
    assert e.value.line == 1 and e.value.field == "kind"


@given(st.binary(max_size=400))
def test_fuzz_random_bytes_only_trace_errors(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "t.jsonl"
    path.write_bytes(data)
    try:
        read_trace(path)
    except TraceError:
        pass


@given(data=st.data())
def test_fuzz_mutated_valid_traces(valid_text, data):
    lines = _lines(valid_text)
    i = data.draw(st.integers(0, len(lines) - 1))
    mode = data.draw(st.sampled_from(["truncate", "flip", "drop", "dup", "junk"]))
    line = lines[i]
    if mode == "truncate":
        lines[i] = line[: data.draw(st.integers(0, len(line)))]
    elif mode == "flip":
        pos = data.draw(st.integers(0, len(line) - 1))
        lines[i] = line[:pos] + data.draw(st.sampled_from(list('0a"{}[],:-.e '))) + line[pos + 1 :]
    elif mode == "drop":
        del lines[i]
    elif mode == "dup":
        lines.insert(i, line)
    else:
        lines[i] = data.draw(st.text(max_size=30))
    try:
        parse_trace_text("\n".join(lines), "t")
    except TraceError:
        pass


@pytest.mark.parametrize(
    "field, value, code",
    [
        ("block_size", -1, "invalid_block_size"),
        ("num_gpu_blocks", 1, "invalid_num_gpu_blocks"),
    ],
)
def test_invalid_header_config_is_a_trace_error(valid_text, field, value, code):
    # Issue 10 item 4a: the model's config validation runs when a trace is read,
    # so `schedconf replay` reports line 1 and the field instead of a traceback.
    lines = _lines(valid_text)
    header = json.loads(lines[0])
    header["config"][field] = value
    with pytest.raises(TraceError) as e:
        parse_trace_text("\n".join([json.dumps(header)] + lines[1:]), "cfg.jsonl")
    assert e.value.line == 1 and e.value.field == f"config.{field}"
    assert code in e.value.expected and e.value.found == str(value)


def test_cross_field_and_profile_config_errors_are_trace_errors(valid_text):
    lines = _lines(valid_text)
    header = json.loads(lines[0])
    header["config"].update(max_num_seqs=header["config"]["max_num_batched_tokens"] + 1)
    with pytest.raises(TraceError) as e:
        parse_trace_text("\n".join([json.dumps(header)] + lines[1:]), "cfg.jsonl")
    assert e.value.line == 1 and e.value.field == "config" and "budget_below_max_num_seqs" in e.value.expected


def test_huge_token_id_in_a_trace_is_a_typed_refusal(valid_text):
    # Issue 10 item 4b: an id of 10**30 is read (JSON integers are unbounded)
    # and refused by the scheduler with invalid_token_id: expect_error passes.
    from schedconf.conformance.adapters.impl import make_scheduler_sut
    from schedconf.conformance.adapters.reference import ReferenceSut
    from schedconf.conformance.checking.replay import replay

    lines = _lines(valid_text)
    event = json.loads(lines[1])
    assert event["kind"] == "add_request"
    event.update(request_id="huge", prompt_token_ids=[1, 10**30], expect_error="invalid_token_id")
    trace = parse_trace_text("\n".join([lines[0], json.dumps(event)] + lines[1:]), "huge.jsonl")
    for sut in (ReferenceSut(), make_scheduler_sut()):
        assert replay(trace, sut).verdict == "pass"
