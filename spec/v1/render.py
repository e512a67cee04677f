"""Deterministic text views of scheduler outputs and state, for golden files and humans."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from schedconf.spec.output import RequestOutput, SchedulerOutput


def _ids(xs: Sequence[int]) -> str:
    return "[" + " ".join(str(x) for x in xs) + "]"


def render_scheduler_output(output: SchedulerOutput) -> str:
    """One line per scheduled request, then drafts, preemptions and finishes.

    Example::

        step 2: 1 token(s)
          running r0 +1 computed=80 outputs=1 new-blocks=[8]
          preempted: r1
    """
    n = output.num_scheduled_tokens
    lines = [f"step {output.step}: {output.total_num_scheduled_tokens} token(s)"]
    for r in output.scheduled_new_reqs:
        lines.append(f"  new     {r.req_id} +{n[r.req_id]} computed={r.num_computed_tokens} blocks={_ids(r.block_ids)}")
    for c in output.scheduled_cached_reqs:
        kind = "resumed" if c.resumed else "running"
        blocks = "blocks" if c.resumed else "new-blocks"
        lines.append(
            f"  {kind} {c.req_id} +{n[c.req_id]} computed={c.num_computed_tokens} "
            f"outputs={c.num_output_tokens} {blocks}={_ids(c.new_block_ids)}"
        )
    listed = {r.req_id for r in output.scheduled_new_reqs} | {c.req_id for c in output.scheduled_cached_reqs}
    for rid in sorted(set(n) - listed):
        # Only the vllm-0.11 un-repaired priority victim gets here.
        lines.append(f"  unlisted {rid} +{n[rid]}")
    for rid, drafts in sorted(output.scheduled_spec_decode_tokens.items()):
        lines.append(f"  drafts {rid}={_ids(drafts)}")
    if output.preempted_req_ids:
        lines.append(f"  preempted: {' '.join(sorted(output.preempted_req_ids))}")
    if output.finished_req_ids:
        lines.append(f"  finished: {' '.join(sorted(output.finished_req_ids))}")
    return "\n".join(lines)


def render_request_outputs(outputs: Sequence[RequestOutput]) -> str:
    """One line per request that gained tokens or stopped."""
    if not outputs:
        return "no output"
    lines = []
    for o in outputs:
        line = f"{o.req_id} +{_ids(o.new_token_ids)}"
        if o.finish_reason is not None:
            line += f" finished={o.finish_reason}"
            if o.stop_reason is not None:
                line += f" stop_reason={o.stop_reason}"
        lines.append(line)
    return "\n".join(lines)


def render_blocks(observation: dict) -> str:
    """The free queue (front = evicted first) and every block table."""
    lines = [f"free ({observation['num_free_blocks']}): {_ids(observation['free_block_queue'])}"]
    for rid, table in observation["block_tables"].items():
        lines.append(f"{rid}: {_ids(table)}")
    return "\n".join(lines)


def render_queues(observation: dict) -> str:
    """The running list and the waiting queue in order, with each request's counters."""
    lines = [
        f"running: {' '.join(observation['running']) or '-'}",
        f"waiting: {' '.join(observation['waiting']) or '-'}",
    ]
    for rid, r in observation["requests"].items():
        lines.append(
            f"{rid}: {r['status']} computed={r['num_computed_tokens']} tokens={r['num_tokens']} outputs={r['num_output_tokens']}"
        )
    return "\n".join(lines)


def render_in_flight(scheduler: Any) -> str:
    """The in-flight counters of the requests that have any, after a leading newline.

    Empty for a synchronous scheduler (max_concurrent_batches 1, no async).

    ``placeholders`` (async), ``in-flight`` tokens and their ``stale`` share,
    then the steps in flight.
    """
    if scheduler.config.max_concurrent_batches == 1 and not scheduler.profile.async_scheduling:
        return ""  # synchronous: the one pending step says it all
    lines = []
    for rid, r in sorted(scheduler.requests.items()):
        if r.num_output_placeholders or r.num_in_flight_tokens or r.num_stale_output_tokens:
            lines.append(
                f"{rid}: placeholders={r.num_output_placeholders} in-flight={r.num_in_flight_tokens} "
                f"stale={r.num_stale_output_tokens}"
            )
    if scheduler.in_flight:
        lines.append("steps in flight: " + " ".join(str(record.step) for record in scheduler.in_flight))
    return "".join("\n" + line for line in lines)


@dataclass
class StepTable:
    """Accumulates a per-step, per-request table of what the scheduler did."""

    request_ids: list[str] = field(default_factory=list)
    rows: list[tuple[int, dict[str, str], int, str]] = field(default_factory=list)

    def add_step(self, output: SchedulerOutput, outputs: Sequence[RequestOutput], num_free_blocks: int) -> None:
        """Record one step: per request what happened, plus free blocks and events."""
        self.add_canonical_step(
            output.step, output.to_canonical(), [o.to_canonical() for o in outputs], num_free_blocks
        )

    def add_canonical_step(self, step: int, expect: dict, outputs: Sequence[dict], num_free_blocks: int) -> None:
        """Record one step from its canonical (trace) form."""
        cells: dict[str, str] = {}
        new_ids = {r["req_id"] for r in expect["scheduled_new_reqs"]}
        resumed = {c["req_id"] for c in expect["scheduled_cached_reqs"] if c["resumed"]}
        for rid, n in expect["num_scheduled_tokens"].items():
            kind = "new" if rid in new_ids else "resume" if rid in resumed else "run"
            cells[rid] = f"{kind} {n}"
        for rid in expect["preempted_req_ids"] or ():
            cells[rid] = "PREEMPTED"
        for o in outputs:
            if o["finish_reason"] is not None:
                cells[o["req_id"]] = cells.get(o["req_id"], "") + f" ->{o['finish_reason']}"
        for rid in cells:
            if rid not in self.request_ids:
                self.request_ids.append(rid)
        notes = []
        if expect["finished_req_ids"]:
            notes.append("freed " + ",".join(expect["finished_req_ids"]))
        self.rows.append((step, cells, num_free_blocks, "; ".join(notes)))

    def render(self) -> str:
        """Return the table as aligned text."""
        headers = ["step", *self.request_ids, "free blocks", "notes"]
        body = [
            [str(step), *(cells.get(r, "") for r in self.request_ids), str(free), notes]
            for step, cells, free, notes in self.rows
        ]
        widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(headers)]
        fmt = lambda row: " | ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()  # noqa: E731
        return "\n".join([fmt(headers), "-+-".join("-" * w for w in widths), *(fmt(r) for r in body)])
