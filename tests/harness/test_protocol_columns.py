"""The protocol's column form (PROTOCOL.md, "Column form") and the harness's reading of reply lines.

A scheduler that lists ``capabilities.columns`` (asked for with ``"columns": true`` at ``init``) may send
the lists of requests of ``schedule`` and ``update`` results as one list per field. The harness turns them
back into lists of objects before any check, so every check and message is the one lists get;
``test_batch_protocol.py`` replays a corpus both ways. Here: the transposition itself, what is refused,
the agreement at ``init``, and the reader thread that splits the scheduler's stdout into reply lines.
"""

from __future__ import annotations

import io
import queue
import subprocess
import sys

import pytest

from schedconf.conformance.adapters import stdio
from schedconf.conformance.adapters.stdio import StdioSut
from schedconf.conformance.protocol import expand_columns, validate_reply

CACHED_ROWS = [
    {"req_id": "a", "resumed": False, "new_block_ids": [], "num_computed_tokens": 17, "num_output_tokens": 1},
    {"req_id": "b", "resumed": True, "new_block_ids": [4, 5], "num_computed_tokens": 32, "num_output_tokens": 9},
]
# The same two requests, a list per field: the first value of each list is request "a"'s.
CACHED_COLUMNS = {
    "req_id": ["a", "b"],
    "resumed": [False, True],
    "new_block_ids": [[], [4, 5]],
    "num_computed_tokens": [17, 32],
    "num_output_tokens": [1, 9],
}


def schedule_result(cached) -> dict:  # noqa: ANN001
    return {
        "scheduled_new_reqs": [],
        "scheduled_cached_reqs": cached,
        "num_scheduled_tokens": {"a": 1, "b": 1},
        "total_num_scheduled_tokens": 2,
        "scheduled_spec_decode_tokens": {},
        "finished_req_ids": [],
        "preempted_req_ids": [],
    }


def test_columns_become_the_lists_of_objects_they_stand_for():
    reply = {"id": 3, "result": schedule_result(CACHED_COLUMNS)}
    assert expand_columns("schedule", reply) is None
    assert reply["result"] == schedule_result(CACHED_ROWS)
    assert validate_reply("schedule", reply) is None


def test_update_outputs_in_columns_and_an_empty_column_form():
    reply = {
        "id": 4,
        "result": {
            "outputs": {
                "req_id": ["a", "b"],
                "new_token_ids": [[7], []],
                "finish_reason": [None, "length"],
                "stop_reason": [None, None],
            }
        },
    }
    assert expand_columns("update", reply) is None
    assert reply["result"]["outputs"] == [
        {"req_id": "a", "new_token_ids": [7], "finish_reason": None, "stop_reason": None},
        {"req_id": "b", "new_token_ids": [], "finish_reason": "length", "stop_reason": None},
    ]
    empty = {"id": 5, "result": {"outputs": {}}}
    assert expand_columns("update", empty) is None
    assert empty["result"]["outputs"] == []


def test_lists_of_objects_and_other_methods_are_left_as_they_are():
    reply = {"id": 3, "result": schedule_result(CACHED_ROWS)}
    assert expand_columns("schedule", reply) is None
    assert reply["result"] == schedule_result(CACHED_ROWS)
    observed = {"id": 6, "result": {"free_block_queue": {"a": [1]}, "num_free_blocks": 1}}
    assert expand_columns("observe", observed) is None
    assert observed["result"]["free_block_queue"] == {"a": [1]}
    error = {"id": 7, "error": {"code": "internal", "message": "x"}}
    assert expand_columns("schedule", error) is None


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (
            {**CACHED_COLUMNS, "resumed": False},
            "result.scheduled_cached_reqs.resumed: expected a list (one value per request, column form), "
            "found boolean false",
        ),
        (
            {**CACHED_COLUMNS, "num_output_tokens": [1]},
            "result.scheduled_cached_reqs: expected columns of one length (column form), found 2 values in "
            "req_id, resumed, new_block_ids, num_computed_tokens and 1 value in num_output_tokens",
        ),
    ],
)
def test_a_column_form_that_is_not_one_is_named(columns, message):
    assert expand_columns("schedule", {"id": 3, "result": schedule_result(columns)}) == message


def test_a_missing_field_in_columns_is_found_by_the_usual_checks():
    reply = {"id": 3, "result": schedule_result({k: v for k, v in CACHED_COLUMNS.items() if k != "resumed"})}
    assert expand_columns("schedule", reply) is None
    problem = validate_reply("schedule", reply)
    assert problem is not None and "resumed" in problem, problem


def test_without_the_agreement_a_column_form_is_refused_as_the_wrong_shape():
    problem = validate_reply("schedule", {"id": 3, "result": schedule_result(CACHED_COLUMNS)})
    assert problem is not None and problem.startswith("result.scheduled_cached_reqs: expected array"), problem


SERVED = f"{sys.executable} -m schedconf.conformance.protocol_server tests.harness.served_mutants"


@pytest.mark.parametrize(
    ("factory", "use_columns", "agreed"),
    [("reference_columns", True, True), ("reference_columns", False, False), ("reference", True, False)],
)
def test_the_column_form_is_used_only_where_asked_and_listed(factory, use_columns, agreed):
    """``capabilities.columns`` answers the harness's ``columns`` at ``init``; a scheduler asked but without it
    (the plain reference) answers in lists."""
    sut = StdioSut(f"{SERVED}:{factory}", timeout_s=30.0)
    sut.use_columns = use_columns
    try:
        config = {
            "block_size": 16,
            "num_gpu_blocks": 9,
            "max_num_batched_tokens": 64,
            "max_num_seqs": 4,
            "max_model_len": 128,
        }
        sut.start(config, "vllm-0.33")
        assert sut.columns is agreed
        assert sut.capabilities["columns"] is agreed
    finally:
        sut.close()


# ------------------------------------------------------------------ reading


class Looks:
    """Stands for the reader's ``wanted`` event: records each pause between looks into the pipe."""

    def __init__(self) -> None:
        self.pauses: list[float] = []

    def wait(self, timeout: float) -> bool:
        self.pauses.append(timeout)
        return False

    def clear(self) -> None:
        pass


def read_lines(monkeypatch, chunks: list[bytes], paced_lines: int = 0, ready: bool = True) -> tuple[list, list]:  # noqa: ANN001
    """What ``_read_replies`` queues for a stdout that yields ``chunks`` one read each, and the pauses it took
    between looks. ``ready``: whether a look finds something in the pipe."""
    monkeypatch.setattr(stdio.select, "select", lambda r, w, x, timeout=None: (r if ready else [], [], []))

    class Stream(io.BufferedReader):
        def __init__(self) -> None:
            super().__init__(io.BytesIO(b""))
            self.left = list(chunks)

        def read1(self, size: int = -1) -> bytes:
            return self.left.pop(0) if self.left else b""

    class Proc:
        stdout = Stream()

    child = stdio._Process(proc=Proc())  # type: ignore[arg-type]
    child.paced_lines = paced_lines
    looks = Looks()
    child.wanted = looks  # type: ignore[assignment]
    stdio._read_replies(child)
    items = []
    while True:
        try:
            items.append(child.replies.get_nowait())
        except queue.Empty:
            return items, looks.pauses


def test_lines_split_across_reads_keep_their_numbers(monkeypatch):
    chunks = [b'{"id":1,"res', b'ult":null}\n\n{"id":2', b',"result":1}\n{"id":3,"result":2}\n{"id":4']
    items, pauses = read_lines(monkeypatch, chunks)
    # Hand-counted: the blank second line is numbered but not queued; the last one has no end of line.
    assert items == [
        (1, b'{"id":1,"result":null}\n'),
        (3, b'{"id":2,"result":1}\n'),
        (4, b'{"id":3,"result":2}\n'),
        (5, b'{"id":4'),
        None,
    ]
    assert pauses == []  # no batch: each read waits for the next line


def test_the_reader_looks_between_pauses_while_a_batch_has_more_than_its_tail_to_come(monkeypatch):
    """Six lines to come, two per read: a pause before the first look (6 to come) and the second (4 to come);
    with 2 to come (the tail) it waits inside the read."""
    lines = [b'{"id":9,"index":%d,"result":null}\n' % i for i in range(5)] + [b'{"id":9,"result":{"calls_run":5}}\n']
    chunks = [lines[0] + lines[1], lines[2] + lines[3], lines[4] + lines[5]]
    items, pauses = read_lines(monkeypatch, chunks, paced_lines=6)
    assert [raw for _, raw in items[:-1]] == lines
    assert pauses == [stdio.READ_PAUSE_S] * 2
    assert stdio.PACED_TAIL == 2


def test_after_empty_looks_the_reader_waits_inside_the_read(monkeypatch):
    """A slow call: every look finds the pipe empty, so after EMPTY_LOOKS of them the reader reads anyway
    (and waits there); then it looks again, EMPTY_LOOKS times, before the read that finds the end."""
    items, pauses = read_lines(monkeypatch, [b'{"id":9,"index":0,"result":null}\n'], paced_lines=10, ready=False)
    assert items == [(1, b'{"id":9,"index":0,"result":null}\n'), None]
    assert pauses == [stdio.READ_PAUSE_S] * (2 * stdio.EMPTY_LOOKS)


def test_a_line_longer_than_the_limit_ends_the_reading(monkeypatch):
    monkeypatch.setattr(stdio, "MAX_REPLY_BYTES", 10)
    items, _ = read_lines(monkeypatch, [b'{"id":1}\n' + b"x" * 20 + b"\n", b'{"id":2}\n'])
    assert items == [(1, b'{"id":1}\n'), (2, b"x" * 20 + b"\n"), None]
    items, _ = read_lines(monkeypatch, [b"y" * 11])  # no end of line within the limit
    assert items == [(1, b"y" * 11), None]


def test_a_real_pipe_delivers_every_line_of_a_burst(tmp_path):
    """A child writes 2,000 lines at once; the reader, pausing as in a batch, queues each of them once."""
    script = tmp_path / "burst.py"
    script.write_text("import sys\nfor i in range(2000):\n    sys.stdout.write('{\"id\":%d}\\n' % i)\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE)
    child = stdio._Process(proc=proc)
    child.paced_lines = 2001
    stdio._read_replies(child)
    proc.wait()
    got = []
    while (item := child.replies.get_nowait()) is not None:
        got.append(item)
    assert got == [(i + 1, b'{"id":%d}\n' % i) for i in range(2000)]
    proc.stdout.close()
