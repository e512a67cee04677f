"""Read a ``schedconf.spec.v0`` scheduler into a :class:`~schedconf.spec.symbolic.v0.state.State` (Python values).

What is read (``spec/v0/scheduler.py``, ``spec/v0/block_manager.py``,
``spec/v0/block_allocator.py``): the queues, each group's token counts,
status and ``num_computed_tokens``, its block table (``physical_block_ids``,
``num_full_slots``; CPU ids are absolute ``B..B+C-1`` in the model and
relative here), both allocators' free deques and ref counts, the pending
step's chunks, and the step's counts from its output. Groups the model
leaked (``leaked_seq_groups``) are read as dead slots still holding tables.

Only configurations inside the encoding's scope are read (chunked prefill
off, prefix caching off, FCFS or priority; priority not with
``preemption_mode="swap"``; integer arrival times): others raise ``ValueError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schedconf.spec.symbolic.v0.state import (
    CRASHED,
    DEAD,
    IDLE,
    PENDING,
    Shape,
    State,
    empty_state,
)

LIVE_STATUS = {0: 0, 1: 1, 2: 2}
"""vLLM's SequenceStatus values of WAITING, RUNNING, SWAPPED are the encoding's codes."""


@dataclass
class Snapshot:
    """A state read from a model, and the slot naming it was read with."""

    state: State
    slot_ids: list[str | None]


def check_in_scope(sched: Any) -> None:
    """Raise ValueError for a configuration the encoding does not cover."""
    cfg = sched.config
    if cfg.enable_chunked_prefill or cfg.enable_prefix_caching or cfg.policy not in ("fcfs", "priority"):
        raise ValueError("the v0 encoding covers _schedule_default with the naive allocator, FCFS or priority, only")
    if cfg.policy == "priority" and cfg.preemption_mode == "swap":
        raise ValueError("the v0 encoding covers policy priority with recompute preemption only")


def shape_of(sched: Any, num_reqs: int) -> Shape:
    """The shape of a model's pools, with ``num_reqs`` slots."""
    cfg = sched.config
    return Shape(num_reqs, cfg.num_gpu_blocks, cfg.num_cpu_blocks, cfg.block_size)


def assign_slots(sched: Any, shape: Shape, extra_ids: tuple[str, ...] = ()) -> list[str | None]:
    """Slots in request-id order for every group the model holds, plus ``extra_ids``."""
    ids = {sg.request_id for q in (sched.waiting, sched.running, sched.swapped) for sg in q}
    ids |= {sg.request_id for sg in sched.leaked_seq_groups}
    if sched.pending is not None:
        ids |= {sg.request_id for sg, _ in sched.pending.groups}
    ids |= set(extra_ids)
    ordered: list[str | None] = sorted(ids)
    if len(ordered) > shape.num_reqs:
        raise ValueError(f"{len(ordered)} request ids do not fit {shape.num_reqs} slots")
    return ordered + [None] * (shape.num_reqs - len(ordered))


def from_scheduler(sched: Any, shape: Shape, slot_ids: list[str | None] | None = None) -> Snapshot:
    """The state of a live ``schedconf.spec.v0`` scheduler (between events: IDLE, PENDING or CRASHED)."""
    check_in_scope(sched)
    cfg = sched.config
    assert (cfg.num_gpu_blocks, cfg.num_cpu_blocks, cfg.block_size) == (
        shape.num_blocks,
        shape.num_cpu_blocks,
        shape.block_size,
    )
    slot_ids = slot_ids or assign_slots(sched, shape)
    B, C = shape.num_blocks, shape.num_cpu_blocks
    s = empty_state(
        shape,
        cfg.max_num_batched_tokens,
        cfg.max_num_seqs,
        cfg.max_model_len,
        cfg.preemption_mode == "swap",
        cfg.policy == "priority",
    )
    bm = sched.block_manager
    gpu, cpu = bm.gpu_allocator, bm.cpu_allocator
    gpu_free = list(gpu.free_block_ids)
    cpu_free = [b - B for b in cpu.free_block_ids]
    record = sched.pending
    phase = CRASHED if sched.crashed is not None else PENDING if record is not None else IDLE
    chunks = {sg.request_id: meta.token_chunk_size for sg, meta in record.groups} if record is not None else {}
    fields: dict[str, Any] = {
        "phase": phase,
        "step": sched.current_step,
        "num_free_gpu": len(gpu_free),
        "gpu_free_lo": -1,
        "num_free_cpu": len(cpu_free),
        "cpu_free_lo": -1,
        "gpu_ref_cnt": [gpu.refcounts[b] for b in range(B)],
        "gpu_in_free": [b in gpu_free for b in range(B)],
        "gpu_free_key": [gpu_free.index(b) if b in gpu_free else 0 for b in range(B)],
        "cpu_ref_cnt": [cpu.refcounts[B + c] for c in range(C)],
        "cpu_in_free": [c in cpu_free for c in range(C)],
        "cpu_free_key": [cpu_free.index(c) if c in cpu_free else 0 for c in range(C)],
    }
    if record is not None:
        out = record.output
        preempted = out.preempted
        fields.update(
            num_prefills=out.num_prefill_groups,
            num_preempted=0 if cfg.preemption_mode == "swap" else preempted,
            num_swapped_out=preempted if cfg.preemption_mode == "swap" else 0,
            num_swapped_in=1 if out.blocks_to_swap_in else 0,
        )
    groups = {sg.request_id: sg for q in (sched.waiting, sched.running, sched.swapped) for sg in q}
    leaked = {sg.request_id: sg for sg in sched.leaked_seq_groups}
    queues = {name: [sg.request_id for sg in getattr(sched, name)] for name in ("waiting", "running", "swapped")}
    per: dict[str, list[Any]] = {
        name: list(getattr(s, name))
        for name in (
            "status",
            "num_tokens",
            "num_prompt_tokens",
            "max_tokens",
            "num_computed_tokens",
            "num_seen",
            "in_waiting",
            "waiting_pos",
            "in_running",
            "running_pos",
            "in_swapped",
            "swapped_pos",
            "num_scheduled",
            "num_blocks",
            "num_cpu_blocks",
            "priority",
            "arrival",
        )
    }
    held = [[False] * B for _ in shape.slots]
    table_pos = [[0] * B for _ in shape.slots]
    cpu_held = [[False] * C for _ in shape.slots]
    cpu_table_pos = [[0] * C for _ in shape.slots]
    for r, rid in enumerate(slot_ids):
        if rid is None:
            continue
        sg = groups.get(rid) or leaked.get(rid)
        for name, ids in queues.items():
            per[f"in_{name}"][r] = rid in ids
            per[f"{name}_pos"][r] = ids.index(rid) if rid in ids else 0
        per["num_scheduled"][r] = chunks.get(rid, 0)
        if sg is None:
            continue
        live = rid in groups and int(sg.status) in LIVE_STATUS
        per["status"][r] = LIVE_STATUS[int(sg.status)] if live else DEAD
        per["num_tokens"][r] = sg.get_len()
        per["num_prompt_tokens"][r] = len(sg.prompt_token_ids)
        per["max_tokens"][r] = sg.sampling_params.max_tokens
        if isinstance(sg.arrival_time, float) and not sg.arrival_time.is_integer():
            raise ValueError(f"{rid} has a non-integer arrival_time: the encoding keeps arrival times as ints")
        per["priority"][r], per["arrival"][r] = sg.priority, int(sg.arrival_time)
        per["num_computed_tokens"][r] = sg.num_computed_tokens
        table = bm.block_tables.get(sg.seq_id)
        ids = table.physical_block_ids if table is not None else []
        per["num_seen"][r] = table.num_full_slots if table is not None else 0
        gpu_ids = [b for b in ids if b < B]
        cpu_ids = [b - B for b in ids if b >= B]
        if gpu_ids and cpu_ids:
            raise ValueError(f"{rid} holds blocks on both devices: the encoding cannot represent it")
        if len(set(ids)) != len(ids):
            raise ValueError(f"{rid} holds a block twice: the position map cannot represent it")
        per["num_blocks"][r] = len(gpu_ids)
        per["num_cpu_blocks"][r] = len(cpu_ids)
        for i, b in enumerate(gpu_ids):
            held[r][b], table_pos[r][b] = True, i
        for i, c in enumerate(cpu_ids):
            cpu_held[r][c], cpu_table_pos[r][c] = True, i
    fields.update(per, held=held, table_pos=table_pos, cpu_held=cpu_held, cpu_table_pos=cpu_table_pos)
    return Snapshot(s.replace(**fields), slot_ids)
