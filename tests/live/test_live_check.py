"""Trace validation of live vLLM recordings: convert, check strictly, catch a tampered step, refuse a gap.

The samples in ``data/`` are real recordings (gzipped, 9-16 kB) of vLLM
0.32.0's CPU build serving a tiny seeded Llama with the recorder attached:

* ``vllm-0.32.0-server.jsonl.gz``: ``schedconf live --requests 12
  --num-gpu-blocks 10 --max-num-seqs 6`` (the OpenAI server; 13 engine requests,
  241 steps, 7 steps with preemptions, client disconnects and stop-string
  aborts, the free queue observed);
* ``vllm-0.32.0-async-offline.jsonl.gz``: ``LLM.generate`` of 10 prompts with
  async scheduling (the CPU platform's override undone): AsyncScheduler, two
  steps in flight, 123 steps, 5 with preemptions.

No vLLM is needed: the checks run the reference model only (about 2 s).
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from schedconf.conformance.cli import main
from schedconf.conformance.live.check import check_recording, render_outcome
from schedconf.conformance.live.convert import IncompleteRecording, RecordingError, read_recording, recording_to_trace
from schedconf.conformance.traces.trace import read_trace

DATA = Path(__file__).parent / "data"
SERVER = "vllm-0.32.0-server.jsonl.gz"
ASYNC = "vllm-0.32.0-async-offline.jsonl.gz"


def get_lines(name: str) -> list[str]:
    return gzip.decompress((DATA / name).read_bytes()).decode().splitlines()


def write_lines(tmp_path: Path, lines: list[str], name: str = "rec.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def edit_step(lines: list[str], step: int, edit) -> list[str]:  # noqa: ANN001
    out = []
    for line in lines:
        record = json.loads(line)
        if record.get("call") == "schedule" and record["step"] == step:
            edit(record["output"])
            line = json.dumps(record, sort_keys=True, separators=(",", ":"))
        out.append(line)
    return out


@pytest.mark.parametrize("name, profile", [(SERVER, "vllm-0.32"), (ASYNC, "vllm-0.32-async")])
def test_recording_converts_and_passes_strictly(tmp_path, name, profile):
    path = write_lines(tmp_path, get_lines(name))
    outcome = check_recording(path)
    assert outcome.comparison == "strict", outcome.scope_problems
    assert outcome.result.verdict == "pass", render_outcome(outcome, str(path))
    assert outcome.trace.profile == profile
    assert outcome.result.steps_run == outcome.trace.num_steps() > 100
    # the converted trace is an ordinary trace file: it reads back and replays with schedconf replay
    assert read_trace(outcome.trace_path).events == outcome.trace.events
    assert main(["replay", str(outcome.trace_path), "--sut", "reference"]) == 0


def test_server_recording_has_what_the_load_was_for():
    recording = read_recording_from(SERVER)
    calls = [r["call"] for r in recording.calls]
    assert {"add_request", "finish_requests", "schedule", "update_from_output"} <= set(calls)
    steps = [r for r in recording.calls if r["call"] == "schedule"]
    assert any(s["output"]["preempted_req_ids"] for s in steps), "the burst preempted"
    assert any(c["resumed"] for s in steps for c in s["output"]["scheduled_cached_reqs"])
    assert any(r["finished"] for r in recording.calls if r["call"] == "finish_requests"), "aborts"
    assert all("observe" in s for s in steps)


def test_async_recording_answers_older_steps():
    trace = recording_to_trace(read_recording_from(ASYNC))
    assert trace.config["max_concurrent_batches"] == 2
    steps_seen = 0
    lagging = 0
    for event in trace.events:
        if event["kind"] == "step":
            steps_seen = event["step"]
        elif event["kind"] == "model_output":
            lagging += event["step"] < steps_seen
    assert lagging > 50, "under async scheduling most outputs answer the step before the last one scheduled"


def read_recording_from(name: str):  # noqa: ANN201
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        return read_recording(write_lines(Path(folder), get_lines(name)))


@pytest.mark.parametrize("name", [SERVER, ASYNC])
def test_a_tampered_step_is_caught_at_that_step(tmp_path, name):
    lines = get_lines(name)

    def add_a_token(output):  # noqa: ANN001, ANN202
        rid = sorted(output["num_scheduled_tokens"])[0]
        output["num_scheduled_tokens"][rid] += 1
        output["total_num_scheduled_tokens"] += 1

    path = write_lines(tmp_path, edit_step(lines, 40, add_a_token))
    outcome = check_recording(path)
    assert outcome.result.verdict == "fail"
    assert outcome.result.divergence.step == 40
    assert outcome.result.divergence.kind == "scheduler_output"
    assert "num_scheduled_tokens" in {d.field.split(".")[0] for d in outcome.result.divergence.diffs}
    assert main(["check", str(path)]) == 1


def test_a_tampered_block_id_is_caught_strictly(tmp_path):
    lines = get_lines(SERVER)

    def swap_blocks(output):  # noqa: ANN001, ANN202
        new = output["scheduled_new_reqs"][0]
        new["block_ids"] = [new["block_ids"][0] + 1, *new["block_ids"][1:]]

    path = write_lines(tmp_path, edit_step(lines, 1, swap_blocks))
    outcome = check_recording(path)
    assert outcome.result.verdict == "fail" and outcome.result.divergence.step == 1


def test_a_missing_sequence_number_is_refused_as_incomplete(tmp_path, capsys):
    lines = get_lines(SERVER)
    path = write_lines(tmp_path, lines[:50] + lines[51:])
    with pytest.raises(IncompleteRecording, match="sequence number 51, expected 50: the recording is incomplete"):
        read_recording(path)
    assert main(["check", str(path)]) == 2
    assert "incomplete" in capsys.readouterr().err
    assert not (tmp_path / "rec.trace.jsonl").exists()


def test_a_recorder_error_line_is_refused_as_incomplete(tmp_path):
    lines = get_lines(SERVER)
    lines[30] = json.dumps({"seq": 30, "call": "schedule", "error": "TypeError: boom"})
    with pytest.raises(IncompleteRecording, match="lost call 30"):
        read_recording(write_lines(tmp_path, lines))


def test_a_torn_last_line_is_dropped_with_a_note(tmp_path):
    lines = get_lines(SERVER)
    path = write_lines(tmp_path, lines[:-1] + [lines[-1][:25]])
    recording = read_recording(path)
    assert len(recording.calls) == len(lines) - 2
    assert "torn" in recording.notes[0]


def test_out_of_scope_recording_is_checked_with_the_safety_properties(tmp_path):
    lines = get_lines(SERVER)
    start = json.loads(lines[0])
    start["engine"]["kv_connector"] = True
    lines[0] = json.dumps(start, sort_keys=True, separators=(",", ":"))
    outcome = check_recording(write_lines(tmp_path, lines))
    assert outcome.comparison == "safety"
    assert outcome.scope_problems == ["a KV connector"]
    assert outcome.result.verdict == "pass"


def test_safety_catches_a_budget_overrun_in_an_out_of_scope_recording(tmp_path):
    lines = get_lines(SERVER)
    start = json.loads(lines[0])
    budget = start["config"]["max_num_batched_tokens"]
    lines[0] = json.dumps({**start, "engine": {**start["engine"], "kv_connector": True}}, sort_keys=True)

    def overrun(output):  # noqa: ANN001, ANN202
        output["total_num_scheduled_tokens"] = budget + 1

    outcome = check_recording(write_lines(tmp_path, edit_step(lines, 3, overrun)))
    assert outcome.comparison == "safety"
    assert outcome.result.verdict == "fail" and outcome.result.divergence.diffs[0].field == "token_budget"


def test_a_device_or_a_fifo_is_refused_before_anything_is_read(tmp_path):
    """As for traces (docs/reference/bounds.md): /dev/zero used to be read until the memory ran out."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, words in (("/dev/zero", "a character device"), (str(fifo), "a FIFO")):
        with pytest.raises(RecordingError, match=words):
            read_recording(path)
