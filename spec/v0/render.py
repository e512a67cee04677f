"""Deterministic text views of v0 outputs and state, for golden files and humans."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from schedconf.spec.v0.output import V0SchedulerOutput


def _ids(xs: Sequence[int]) -> str:
    return "[" + " ".join(str(x) for x in xs) + "]"


def _pairs(xs: Sequence[tuple[int, int]]) -> str:
    return "[" + " ".join(f"{a}->{b}" for a, b in xs) + "]"


def render_v0_scheduler_output(output: V0SchedulerOutput) -> str:
    """A header, one line per scheduled group, then swaps, ignores, preemptions and finishes.

    Example::

        step 2: 1 group(s) (0 prefill), 1 token(s), running=1
          decode r0 +1 blocks=[0 1]
          preempted: 1
    """
    lines = [
        f"step {output.step}: {len(output.scheduled_seq_groups)} group(s) ({output.num_prefill_groups} prefill), "
        f"{output.num_batched_tokens} token(s), running={output.running_queue_size}"
    ]
    for g in output.scheduled_seq_groups:
        kind = "prompt" if g.is_prompt else "decode"
        line = f"  {kind} {g.request_id} +{g.token_chunk_size}{'' if g.do_sample else ' no-sample'} blocks={_ids(g.block_table)}"
        if g.computed_block_nums:
            line += f" computed={_ids(g.computed_block_nums)}"
        lines.append(line)
    if output.blocks_to_swap_in:
        lines.append(f"  swap-in cpu->gpu: {_pairs(output.blocks_to_swap_in)}")
    if output.blocks_to_swap_out:
        lines.append(f"  swap-out gpu->cpu: {_pairs(output.blocks_to_swap_out)}")
    if output.blocks_to_copy:
        lines.append(f"  copy: {_pairs(output.blocks_to_copy)}")
    if output.ignored_seq_groups:
        lines.append(f"  ignored: {' '.join(output.ignored_seq_groups)}")
    if output.preempted:
        lines.append(f"  preempted: {output.preempted}")
    if output.finished_requests_ids:
        lines.append(f"  finished: {' '.join(output.finished_requests_ids)}")
    return "\n".join(lines)


def render_v0_blocks(observation: dict[str, Any], evictor: Sequence[int] | None = None) -> str:
    """Free block counts, every GPU then CPU block table, and (prefix caching) the evictor order."""
    lines = [f"gpu free={observation['num_free_gpu_blocks']} cpu free={observation['num_free_cpu_blocks']}"]
    for rid, table in observation["block_tables"].items():
        lines.append(f"{rid}: gpu {_ids(table)}")
    for rid, table in observation["cpu_block_tables"].items():
        lines.append(f"{rid}: cpu {_ids(table)}")
    if evictor is not None:
        lines.append(f"evictor (next first): {_ids(evictor)}")
    return "\n".join(lines)


def render_v0_queues(queues: dict[str, Any]) -> str:
    """The three queues in order, then each live group's counters."""
    lines = [f"{name}: {' '.join(queues[name]) or '-'}" for name in ("waiting", "running", "swapped")]
    for rid, g in queues["groups"].items():
        lines.append(
            f"{rid}: {g['status']} {g['stage']} computed={g['num_computed_tokens']} len={g['len']} outputs={g['outputs']}"
        )
    return "\n".join(lines)
