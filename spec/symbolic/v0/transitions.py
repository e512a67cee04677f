"""The v0 transitions over a :class:`~schedconf.spec.symbolic.v0.state.State`, mirroring vLLM 0.10.2's legacy scheduler.

Each transition maps a state and its inputs to an :class:`Outcome` (next
state, guard, the model's own assertions on the way, named facts), written
once with the helpers of ``spec/symbolic/z3ops.py`` so that it runs on Python
values (drift guard) and on Z3 terms (proofs). Each names, in ``mirrors``,
the ``spec/v0`` model function it follows; those carry vLLM 0.10.2's names
(``vllm/core/scheduler.py``, ``vllm/core/block_manager.py``,
``vllm/core/block/naive_block.py``; the update is ``LLMEngine._process_model_outputs``
and ``StopChecker.maybe_stop_sequence``), which the docstrings cite.

Scope (what is not here is fixed):

* ``Scheduler._schedule_default`` only: chunked prefill off (so no partial
  prefills, every prompt is scheduled whole, ``do_sample`` always true);
* policy FCFS or priority (``_schedule_priority_preemption``: ``priority_sort_running``,
  ``priority_force_preempt``, ``priority_end``), priority with recompute only
  (``lemma_config``: in swap mode vLLM puts a SWAPPED victim into ``waiting``);
* the naive block allocator on both devices (prefix caching off), one
  sequence per group (no fork, no copy-on-write: ``blocks_to_copy`` is empty),
  no LoRA, no prompt embeds, ``num_lookahead_slots = 0``, ``delay_factor = 0``,
  watermark 0 (``int(0.01 * B)`` for ``B < 100``);
* preemption mode RECOMPUTE or SWAP, a symbolic switch (``swap_mode``: the
  user's ``"swap"``; otherwise vLLM recomputes single-sequence groups);
* the stop check abstracted to an input "the sampled token is a stop token"
  (EOS without ``ignore_eos``, or a stop id), with ``min_tokens = 0``.

Granularity: each loop of ``_schedule_default`` is cut into its iterations
(``prefill_admit`` / ``prefill_ignore`` / ``prefill_stop``,
``running_append`` / ``running_preempt_*``, ``swapped_swap_in`` /
``swapped_ignore`` / ``swapped_stop``; under priority ``priority_sort_running``,
``priority_force_preempt`` per victim, ``priority_end``) and the joints between the loops;
the engine's update into one transition per scheduled group.

Where the groups are during the step: ``_schedule_default`` moves them to
their queues only at its end (``waiting.extendleft(preempted)``,
``running.extend(...)``, ``swapped.extend(swapped_out)``). The encoding puts
each group there at once. That gives the same queues at the end because
(1) the running loop takes victims from the tail and schedules from the
head, so the scheduled groups keep their order; (2) ``extendleft`` of the
preempted list puts the last one preempted first, as prepending each does;
(3) the prefill loop's admissions are appended after the groups already
running, and the running loop does not run in a step that admitted any;
(4) the swapped loop only runs when nothing was swapped out; (5) under
policy priority, ``_schedule_priority_preemption`` runs between the prefill
and the running loops and moves its victims to ``waiting`` itself (no
deferral), sorts ``running`` before the running loop reads it, and re-sorts
``waiting`` before the running loop's victims are put in front of it.
"""

# Size: one symbolic transition per v0 scheduler pass, side by side for the drift guard, as
# spec/symbolic/transitions.py is for v1.

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import z3

from schedconf.spec.symbolic.v0.state import (
    CONFIG_FIELDS,
    CPU_FIELDS,
    CRASHED,
    DEAD,
    GPU_FIELDS,
    IDLE,
    PENDING,
    PREFILL_LOOP,
    PRIORITY_LOOP,
    PRIORITY_SORT,
    REQUEST_CPU_FIELDS,
    REQUEST_FIELDS,
    REQUEST_GPU_FIELDS,
    RUNNING,
    RUNNING_LOOP,
    SCALAR_FIELDS,
    SWAPPED,
    SWAPPED_LOOP,
    UPDATING,
    WAITING,
    Shape,
    State,
    free_rank,
    theorem_rank,
)
from schedconf.spec.symbolic.z3ops import cdiv, count, eq, fdiv, is_z3, ite, land, limplies, lnot, lor, select

Check = tuple[str, Any]
PREMISE = "premise:"


@dataclass
class Outcome:
    """Next state, guard, the model's assertions (``checks``), named facts, and theorem instances (``premises``)."""

    post: State
    guard: Any
    checks: list[Check] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    premises: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.premises = self.premises + [c for name, c in self.checks if name.startswith(PREMISE)]
        self.checks = [(name, c) for name, c in self.checks if not name.startswith(PREMISE)]


# ------------------------------------------------------------------ helpers


def at(values: list[Any], q: Any, default: Any = 0) -> Any:
    """``values[q]`` for a possibly symbolic slot ``q``."""
    return select(values, q, default)


def put(values: list[Any], q: Any, new: Any) -> list[Any]:
    """``values`` with entry ``q`` (possibly symbolic) replaced by ``new``."""
    return [ite(eq(q, r), new, values[r]) for r in range(len(values))]


def merge(c: Any, a: State, b: State) -> State:
    """The state ``a if c else b``, leaf by leaf."""
    if not is_z3(c):
        return a if c else b
    fields: dict[str, Any] = {}
    for name, _ in CONFIG_FIELDS + SCALAR_FIELDS:
        fields[name] = ite(c, getattr(a, name), getattr(b, name))
    for name, _ in GPU_FIELDS + CPU_FIELDS + REQUEST_FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        fields[name] = x if x is y else [ite(c, u, v) for u, v in zip(x, y)]
    for name, _ in REQUEST_GPU_FIELDS + REQUEST_CPU_FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        fields[name] = (
            x if x is y else [rx if rx is ry else [ite(c, u, v) for u, v in zip(rx, ry)] for rx, ry in zip(x, y)]
        )
    return State(a.shape, **fields)


def slot_in_range(s: State, q: Any) -> Any:
    return land(0 <= q, q < s.shape.num_reqs) if is_z3(q) else 0 <= q < s.shape.num_reqs


def queue_at(s: State, queue: str, j: Any) -> Any:
    """The slot at position ``j`` of ``queue`` (``waiting``, ``running``, ``swapped``); -1 if none."""
    member, pos = getattr(s, f"in_{queue}"), getattr(s, f"{queue}_pos")
    out: Any = -1
    for r in reversed(s.shape.slots):
        out = ite(land(member[r], eq(pos[r], j)), r, out)
    return out


def queue_len(s: State, queue: str) -> Any:
    return count(getattr(s, f"in_{queue}")[r] for r in s.shape.slots)


def remove_from(s: State, queue: str, q: Any) -> State:
    """``queue.remove(q)`` / ``popleft`` / ``pop``: later groups move up one place."""
    member, pos = getattr(s, f"in_{queue}"), getattr(s, f"{queue}_pos")
    pos_q, in_q = at(pos, q), at(member, q, False)
    return s.replace(
        **{
            f"in_{queue}": put(member, q, False),
            f"{queue}_pos": [
                ite(land(in_q, lnot(eq(q, r)), member[r], pos[r] > pos_q), pos[r] - 1, pos[r]) for r in s.shape.slots
            ],
        }
    )


def append_to(s: State, queue: str, q: Any) -> State:
    """``queue.append(q)``."""
    member, pos = getattr(s, f"in_{queue}"), getattr(s, f"{queue}_pos")
    return s.replace(**{f"in_{queue}": put(member, q, True), f"{queue}_pos": put(pos, q, queue_len(s, queue))})


def prepend_to(s: State, queue: str, q: Any) -> State:
    """``queue.appendleft(q)`` (``waiting.extendleft(preempted)``, one group at a time)."""
    member, pos = getattr(s, f"in_{queue}"), getattr(s, f"{queue}_pos")
    return s.replace(
        **{
            f"in_{queue}": put(member, q, True),
            f"{queue}_pos": [ite(eq(q, r), 0, ite(member[r], pos[r] + 1, pos[r])) for r in s.shape.slots],
        }
    )


def pin(inp: dict[str, Any], key: str, sym: Any) -> tuple[Any, Any]:
    """The subject slot: ``sym`` (an ``If`` chain over the slots), or the Python slot ``inp[key]`` with ``sym == slot`` added to the guard.

    The proofs split a transition on its subject slots (``Transition.split``):
    one case per slot value, each indexing the state directly; the cases
    cover the guard because the subject is always a slot when it holds
    (proved as the goal ``cases``).
    """
    if key in inp:
        return inp[key], eq(sym, inp[key])
    return sym, True


def ceil_div_signed(x: Any, k: int) -> Any:
    """``math.ceil(x / k)`` for any integer ``x`` and a positive Python int ``k``."""
    return -fdiv(-x, k)


def blocks_touched_by_append(s: State, num_seen: Any, num_new: Any) -> Any:
    """``BlockTable.get_num_blocks_touched_by_append_slots`` (block_table.py) for ``num_new`` unseen tokens, no lookahead.

    ``first_chunk = bs - num_full_slots % bs``; ``1 + ceil((num_new - first_chunk) / bs)``.
    For one token this is always 1 (the worst case: room for a copy-on-write).
    """
    bs = s.shape.block_size
    first_chunk = bs - (num_seen - fdiv(num_seen, bs) * bs)
    return 1 + ceil_div_signed(num_new - first_chunk, bs)


# ------------------------------------------------------------------ allocators


def _device(dev: str) -> tuple[str, str, str, str, str, str, str, str]:
    if dev == "gpu":
        return (
            "gpu_ref_cnt",
            "gpu_in_free",
            "gpu_free_key",
            "gpu_free_lo",
            "num_free_gpu",
            "held",
            "table_pos",
            "num_blocks",
        )
    return (
        "cpu_ref_cnt",
        "cpu_in_free",
        "cpu_free_key",
        "cpu_free_lo",
        "num_free_cpu",
        "cpu_held",
        "cpu_table_pos",
        "num_cpu_blocks",
    )


def allocate_blocks(s: State, dev: str, q: Any, n: Any, base: Any, what: str) -> tuple[State, list[Check]]:
    """``n`` x ``NaiveBlockAllocator._allocate_block_id`` (``popleft``) into slot ``q``'s table at ``base, base+1, ...``.

    The popped blocks are the free ones with fewer than ``n`` free blocks
    before them; their rank is their place in pop order. The model raises
    ``NoFreeBlocksError`` when the deque runs dry: a check.
    """
    ref_n, free_n, key_n, _, num_n, held_n, pos_n, nb_n = _device(dev)
    ids = s.shape.blocks if dev == "gpu" else s.shape.cpu_blocks
    ref, in_free, key, held, pos = (getattr(s, x) for x in (ref_n, free_n, key_n, held_n, pos_n))
    num_free = getattr(s, num_n)
    rank = {b: free_rank(in_free, key, b, ids) for b in ids}
    popped = {b: land(in_free[b], rank[b] < n) for b in ids}
    held_q = {b: at([held[r][b] for r in s.shape.slots], q, False) for b in ids}
    checks = [
        (f"{what}: {dev} deque holds the blocks (no NoFreeBlocksError)", land(0 <= n, n <= num_free)),
        (f"{what}: a popped {dev} block has ref count 0", land(*(limplies(popped[b], eq(ref[b], 0)) for b in ids))),
        (
            f"{what}: a popped {dev} block is not already in the table",
            land(*(limplies(popped[b], lnot(held_q[b])) for b in ids)),
        ),
        (PREMISE + f"rank of the {dev} deque", theorem_rank(in_free, key, num_free, n, ids)),
    ]
    post = s.replace(
        **{
            ref_n: [ite(popped[b], 1, ref[b]) for b in ids],
            free_n: [land(in_free[b], lnot(popped[b])) for b in ids],
            num_n: num_free - n,
            held_n: [[lor(held[r][b], land(eq(q, r), popped[b])) for b in ids] for r in s.shape.slots],
            pos_n: [[ite(land(eq(q, r), popped[b]), base + rank[b], pos[r][b]) for b in ids] for r in s.shape.slots],
            nb_n: put(getattr(s, nb_n), q, base + n),
        }
    )
    return post, checks


def free_table(s: State, dev: str, q: Any, what: str) -> tuple[State, list[Check]]:
    """``BlockTable.free`` (or the source side of ``swap``) of slot ``q``'s table on ``dev``.

    Blocks are freed in table order; each reaching ref count 0 goes to the
    front of the deque (``appendleft``), so the table's last block ends up
    first. Block at position ``i`` gets key ``free_lo - 1 - i``.
    """
    ref_n, free_n, key_n, lo_n, num_n, held_n, pos_n, nb_n = _device(dev)
    ids = s.shape.blocks if dev == "gpu" else s.shape.cpu_blocks
    ref, in_free, key, held, pos = (getattr(s, x) for x in (ref_n, free_n, key_n, held_n, pos_n))
    lo = getattr(s, lo_n)
    held_q = {b: at([held[r][b] for r in s.shape.slots], q, False) for b in ids}
    pos_q = {b: at([pos[r][b] for r in s.shape.slots], q, 0) for b in ids}
    reach0 = {b: land(held_q[b], eq(ref[b], 1)) for b in ids}
    checks = [
        (f"{what}: a freed {dev} block has ref count >= 1", land(*(limplies(held_q[b], ref[b] >= 1) for b in ids)))
    ]
    post = s.replace(
        **{
            ref_n: [ite(held_q[b], ref[b] - 1, ref[b]) for b in ids],
            free_n: [lor(in_free[b], reach0[b]) for b in ids],
            key_n: [ite(reach0[b], lo - 1 - pos_q[b], key[b]) for b in ids],
            lo_n: lo - 1 - at(getattr(s, nb_n), q),
            num_n: getattr(s, num_n) + count(reach0.values()),
            held_n: [[land(held[r][b], lnot(eq(q, r))) for b in ids] for r in s.shape.slots],
            nb_n: put(getattr(s, nb_n), q, 0),
        }
    )
    return post, checks


def set_field(s: State, name: str, q: Any, value: Any) -> State:
    return s.replace(**{name: put(getattr(s, name), q, value)})


# ------------------------------------------------------------------ schedule()


def begin_step(s: State, inp: dict[str, Any]) -> Outcome:
    """``schedule()`` -> ``_schedule_default`` starts: a fresh budget (running groups pre-counted); the prefill loop only if nothing is swapped."""
    sh = s.shape
    post = s.replace(
        phase=ite(eq(s.num_swapped(), 0), PREFILL_LOOP, ite(s.priority_policy, PRIORITY_SORT, RUNNING_LOOP)),
        step=s.step + 1,
        req_index=0,
        loop_done=False,
        num_prefills=0,
        num_preempted=0,
        num_swapped_out=0,
        num_swapped_in=0,
        num_scheduled=[0] * sh.num_reqs,
    )
    return Outcome(post, eq(s.phase, IDLE), facts={"skips_prefills": s.num_swapped() > 0})


def _prefill_head(s: State, inp: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """The head of ``waiting``, its token count, the blocks ``can_allocate`` requires, and the loop guard."""
    w, pinned = pin(inp, "case_request", queue_at(s, "waiting", 0))
    n = at(s.num_tokens, w)
    required = cdiv(n, s.shape.block_size)
    guard = land(eq(s.phase, PREFILL_LOOP), lnot(s.loop_done), queue_len(s, "waiting") > 0, pinned)
    return w, n, required, guard


def prefill_ignore(s: State, inp: dict[str, Any]) -> Outcome:
    """``_schedule_prefills``: over the prompt limit (``max_model_len``), or ``can_allocate`` NEVER: FINISHED_IGNORED, popped, continue."""
    w, n, required, loop = _prefill_head(s, inp)
    over_limit = n > s.max_model_len
    never = s.shape.num_blocks - required < s.shape.watermark
    post = remove_from(s, "waiting", w)
    post = set_field(post, "status", w, DEAD)
    return Outcome(
        post,
        land(loop, lor(over_limit, never)),
        facts={"request": w, "over_limit": over_limit, "never": land(lnot(over_limit), never)},
    )


def prefill_admit(s: State, inp: dict[str, Any]) -> Outcome:
    """``_schedule_prefills``: ``can_allocate`` OK and ``budget.can_schedule``: ``_allocate_and_set_running``, chunk = the whole sequence."""
    w, n, required, loop = _prefill_head(s, inp)
    wm = s.shape.watermark
    guard = land(
        loop,
        n <= s.max_model_len,
        s.shape.num_blocks - required >= wm,
        s.num_free_gpu - required >= wm,
        s.num_batched_tokens() + n <= s.max_num_batched_tokens,
        s.num_running() + 1 <= s.max_num_seqs,
    )
    post, checks = allocate_blocks(s, "gpu", w, required, 0, "allocate")
    post = remove_from(post, "waiting", w)
    post = append_to(post, "running", w)
    post = set_field(post, "status", w, RUNNING)
    post = set_field(post, "num_seen", w, n)
    post = set_field(post, "num_scheduled", w, n)
    post = post.replace(num_prefills=s.num_prefills + 1)
    checks.append(("allocate: a waiting group has computed nothing", eq(at(s.num_computed_tokens, w), 0)))
    return Outcome(
        post, guard, checks, {"request": w, "fills_budget": eq(s.num_batched_tokens() + n, s.max_num_batched_tokens)}
    )


def prefill_stop(s: State, inp: dict[str, Any]) -> Outcome:
    """``_schedule_prefills``: ``can_allocate`` LATER (head-of-line block), or the budget refuses: ``break``."""
    w, n, required, loop = _prefill_head(s, inp)
    wm = s.shape.watermark
    later = s.num_free_gpu - required < wm
    guard = land(
        loop,
        n <= s.max_model_len,
        s.shape.num_blocks - required >= wm,
        lor(later, s.num_batched_tokens() + n > s.max_num_batched_tokens, s.num_running() + 1 > s.max_num_seqs),
    )
    return Outcome(s.replace(loop_done=True), guard, facts={"request": w, "later": later})


def end_prefill_loop(s: State, inp: dict[str, Any]) -> Outcome:
    """After ``_schedule_prefills``: a step that admitted prompts schedules nothing else; otherwise (policy priority: ``_schedule_priority_preemption``, then) ``_schedule_running``."""
    guard = land(eq(s.phase, PREFILL_LOOP), lor(s.loop_done, eq(queue_len(s, "waiting"), 0)))
    post = s.replace(
        phase=ite(s.num_prefills > 0, PENDING, ite(s.priority_policy, PRIORITY_SORT, RUNNING_LOOP)),
        loop_done=False,
        req_index=0,
    )
    return Outcome(post, guard)


def _running_cursor(s: State, inp: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """The group at the cursor, the running loop's guard, its unseen tokens, and whether it can append (``can_append_slots``)."""
    cur, pinned = pin(inp, "case_request", queue_at(s, "running", s.req_index))
    guard = land(eq(s.phase, RUNNING_LOOP), s.req_index < s.num_running(), pinned)
    seen = at(s.num_seen, cur)
    unseen = at(s.num_tokens, cur) - seen
    touched = blocks_touched_by_append(s, seen, unseen)
    return cur, guard, unseen, touched <= s.num_free_gpu


def running_append(s: State, inp: dict[str, Any]) -> Outcome:
    """``_schedule_running``: ``_can_append_slots`` holds: ``_append_slots`` (new blocks for the unseen token), a decode of 1 token."""
    cur, loop, unseen, can = _running_cursor(s, inp)
    n_tok = at(s.num_tokens, cur)
    new = cdiv(n_tok, s.shape.block_size) - at(s.num_blocks, cur)
    post, checks = allocate_blocks(s, "gpu", cur, new, at(s.num_blocks, cur), "append_slots")
    post = set_field(post, "num_seen", cur, n_tok)
    post = set_field(post, "num_scheduled", cur, 1)
    post = post.replace(req_index=s.req_index + 1)
    checks.append(
        (
            "a running group is a decode (one uncomputed token)",
            land(eq(unseen, 1), eq(at(s.num_computed_tokens, cur), n_tok - 1)),
        )
    )
    return Outcome(post, land(loop, can), checks, {"request": cur, "new_block": new > 0})


def _victim(s: State, inp: dict[str, Any]) -> tuple[Any, Any, Any]:
    """The victim: ``running_queue.pop()`` (the tail), or the group itself when it is the last one left.

    Either way it is the last of ``running``. Returns it, whether it is the
    group itself, and the pinning guard.
    """
    last = s.num_running() - 1
    v, pinned = pin(inp, "case_victim", queue_at(s, "running", last))
    return v, eq(s.req_index, last), pinned


def running_preempt_recompute(s: State, inp: dict[str, Any]) -> Outcome:
    """``_schedule_running`` cannot append: ``_preempt`` -> ``_preempt_by_recompute`` of the tail (free, WAITING, ``reset_state_for_recompute``), to the head of ``waiting``."""
    cur, loop, _, can = _running_cursor(s, inp)
    v, is_self, pinned = _victim(s, inp)
    post = remove_from(s, "running", v)
    post, checks = free_table(post, "gpu", v, "free")
    post = prepend_to(post, "waiting", v)
    for name, value in (("status", WAITING), ("num_computed_tokens", 0), ("num_seen", 0)):
        post = set_field(post, name, v, value)
    post = post.replace(num_preempted=s.num_preempted + 1)
    return Outcome(
        post,
        land(loop, lnot(can), lnot(s.swap_mode), pinned),
        checks,
        {"request": cur, "victim": v, "self_preempted": is_self},
    )


def _can_swap_out(s: State, v: Any) -> Any:
    """``block_manager.can_swap_out``: ``_can_swap(CPU, RUNNING)`` is OK (touched <= free CPU blocks; watermark 0)."""
    seen = at(s.num_seen, v)
    touched = blocks_touched_by_append(s, seen, at(s.num_tokens, v) - seen) + fdiv(seen, s.shape.block_size)
    return land(touched <= s.shape.num_cpu_blocks, touched <= s.num_free_cpu)


def running_preempt_swap(s: State, inp: dict[str, Any]) -> Outcome:
    """``_preempt_by_swap`` -> ``_swap_out``: GPU table freed in order, one CPU block per table block (``CpuGpuBlockAllocator.swap``), SWAPPED, to the tail of ``swapped``."""
    cur, loop, _, can = _running_cursor(s, inp)
    v, is_self, pinned = _victim(s, inp)
    post = remove_from(s, "running", v)
    nb = at(s.num_blocks, v)
    post, checks = free_table(post, "gpu", v, "swap_out")
    post, more = allocate_blocks(post, "cpu", v, nb, 0, "swap_out")
    post = append_to(post, "swapped", v)
    post = set_field(post, "status", v, SWAPPED)
    post = post.replace(num_swapped_out=s.num_swapped_out + 1)
    return Outcome(
        post,
        land(loop, lnot(can), s.swap_mode, _can_swap_out(s, v), pinned),
        checks + more,
        {"request": cur, "victim": v, "self_preempted": is_self, "num_blocks": nb},
    )


def running_swap_crash(s: State, inp: dict[str, Any]) -> Outcome:
    """``_swap_out`` without CPU room: ``RuntimeError("Aborted due to the lack of CPU swap space")``; the engine is dead."""
    cur, loop, _, can = _running_cursor(s, inp)
    v, _, pinned = _victim(s, inp)
    return Outcome(
        s.replace(phase=CRASHED),
        land(loop, lnot(can), s.swap_mode, lnot(_can_swap_out(s, v)), pinned),
        facts={"victim": v},
    )


def end_running_loop(s: State, inp: dict[str, Any]) -> Outcome:
    """After ``_schedule_running``: ``_schedule_swapped`` only if nothing was preempted or swapped out."""
    guard = land(eq(s.phase, RUNNING_LOOP), eq(s.req_index, s.num_running()))
    post = s.replace(phase=ite(s.num_preempted + s.num_swapped_out > 0, PENDING, SWAPPED_LOOP), loop_done=False)
    return Outcome(post, guard, facts={"preempted": s.num_preempted + s.num_swapped_out > 0})


def _swapped_head(s: State, inp: dict[str, Any]) -> tuple[Any, Any, Any]:
    """The head of ``swapped``, the loop guard, and the blocks ``can_swap_in`` counts (append + full blocks)."""
    h, pinned = pin(inp, "case_request", queue_at(s, "swapped", 0))
    seen = at(s.num_seen, h)
    touched = blocks_touched_by_append(s, seen, at(s.num_tokens, h) - seen) + fdiv(seen, s.shape.block_size)
    guard = land(eq(s.phase, SWAPPED_LOOP), lnot(s.loop_done), queue_len(s, "swapped") > 0, pinned)
    return h, guard, touched


def swapped_ignore(s: State, inp: dict[str, Any]) -> Outcome:
    """``_schedule_swapped``: ``can_swap_in`` NEVER: FINISHED_IGNORED, popped; vLLM frees nothing, so its CPU table stays (mirrored)."""
    h, loop, touched = _swapped_head(s, inp)
    post = remove_from(s, "swapped", h)
    post = set_field(post, "status", h, DEAD)
    return Outcome(post, land(loop, touched > s.shape.num_blocks), facts={"request": h})


def swapped_swap_in(s: State, inp: dict[str, Any]) -> Outcome:
    """``_schedule_swapped``: ``can_swap_in`` OK and the budget fits: ``_swap_in`` (CPU table freed in order, one GPU block each) then ``_append_slots``."""
    h, loop, touched = _swapped_head(s, inp)
    guard = land(
        loop,
        touched <= s.shape.num_blocks,
        s.num_free_gpu - touched >= s.shape.watermark,
        s.num_batched_tokens() + 1 <= s.max_num_batched_tokens,
        s.num_running() + 1 <= s.max_num_seqs,
    )
    n_cpu = at(s.num_cpu_blocks, h)
    post, checks = free_table(s, "cpu", h, "swap_in")
    post, more = allocate_blocks(post, "gpu", h, n_cpu, 0, "swap_in")
    n_tok = at(s.num_tokens, h)
    post, more2 = allocate_blocks(post, "gpu", h, cdiv(n_tok, s.shape.block_size) - n_cpu, n_cpu, "append_slots")
    post = remove_from(post, "swapped", h)
    post = append_to(post, "running", h)
    post = set_field(post, "status", h, RUNNING)
    post = set_field(post, "num_seen", h, n_tok)
    post = set_field(post, "num_scheduled", h, 1)
    post = post.replace(num_swapped_in=s.num_swapped_in + 1)
    checks = checks + more + more2 + [("a swapped group is a decode", eq(at(s.num_computed_tokens, h), n_tok - 1))]
    return Outcome(post, guard, checks, {"request": h})


def swapped_stop(s: State, inp: dict[str, Any]) -> Outcome:
    """``_schedule_swapped``: ``can_swap_in`` LATER, or the budget refuses: ``break``."""
    h, loop, touched = _swapped_head(s, inp)
    later = s.num_free_gpu - touched < s.shape.watermark
    guard = land(
        loop,
        touched <= s.shape.num_blocks,
        lor(later, s.num_batched_tokens() + 1 > s.max_num_batched_tokens, s.num_running() + 1 > s.max_num_seqs),
    )
    return Outcome(s.replace(loop_done=True), guard, facts={"request": h, "later": later})


def end_schedule(s: State, inp: dict[str, Any]) -> Outcome:
    """``_schedule_default`` returns after ``_schedule_swapped``; the output is pending."""
    guard = land(eq(s.phase, SWAPPED_LOOP), lor(s.loop_done, eq(queue_len(s, "swapped"), 0)))
    return Outcome(s.replace(phase=PENDING, loop_done=False), guard)


# ------------------------------------------------------------------ priority


def priority_before(s: State, a: Any, b: Any) -> Any:
    """``a.get_priority() < b.get_priority()``: ``(priority, arrival_time)`` compared as tuples (slots, maybe symbolic)."""
    pa, pb = at(s.priority, a), at(s.priority, b)
    return lor(pa < pb, land(eq(pa, pb), at(s.arrival, a) < at(s.arrival, b)))


def stable_sort(s: State, queue: str) -> State:
    """``deque(sorted(queue, key=SequenceGroup.get_priority))``: Python's sort is stable, so ties keep their order.

    A member's new place is the number of members before it in the order
    (key, old place).
    """
    member, pos = getattr(s, f"in_{queue}"), getattr(s, f"{queue}_pos")
    slots = s.shape.slots

    def before(q: int, r: int) -> Any:
        return lor(
            priority_before(s, q, r),
            land(eq(s.priority[q], s.priority[r]), eq(s.arrival[q], s.arrival[r]), pos[q] < pos[r]),
        )

    new = [ite(member[r], count(land(member[q], before(q, r)) for q in slots if q != r), pos[r]) for r in slots]
    return s.replace(**{f"{queue}_pos": new})


def priority_sort_running(s: State, inp: dict[str, Any]) -> Outcome:
    """``_schedule_priority_preemption`` starts: ``running_queue = deque(sorted(self.running, key=get_priority))``.

    The encoding sorts ``running`` in place at once: the model assigns
    ``self.running = running_queue`` at the end, and nothing in between reads
    ``self.running``.
    """
    post = stable_sort(s, "running").replace(phase=PRIORITY_LOOP)
    return Outcome(
        post,
        eq(s.phase, PRIORITY_SORT),
        facts={
            "reorders": lor(
                *(land(s.in_running[r], lnot(eq(post.running_pos[r], s.running_pos[r]))) for r in s.shape.slots)
            )
        },
    )


def _priority_head(s: State, inp: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """The waiting head ``sg`` (popped first), the tail of ``running_queue``, whether the tail is worse, whether ``sg`` fits.

    ``sg`` fits: ``num_new_tokens > 0`` (always: a waiting group computed
    nothing), ``can_allocate`` OK, and ``budget.can_schedule`` with the
    running groups still pre-counted (a victim's seat is given back as it
    leaves ``running``; no tokens are charged yet: nothing is scheduled).
    """
    w = queue_at(s, "waiting", 0)
    v, pinned = pin(inp, "case_victim", queue_at(s, "running", s.num_running() - 1))
    n = at(s.num_tokens, w)
    required = cdiv(n, s.shape.block_size)
    wm = s.shape.watermark
    fits = land(
        n > 0,
        s.shape.num_blocks - required >= wm,
        s.num_free_gpu - required >= wm,
        s.num_batched_tokens() + n <= s.max_num_batched_tokens,
        s.num_running() + 1 <= s.max_num_seqs,
    )
    worse = land(queue_len(s, "waiting") > 0, s.num_running() > 0, priority_before(s, w, v))
    return w, v, land(worse, lnot(fits)), pinned


def priority_force_preempt(s: State, inp: dict[str, Any]) -> Outcome:
    """The loop of ``_schedule_priority_preemption``: the tail of ``running_queue`` is worse than ``sg`` and ``sg`` does not fit: ``_preempt`` (recompute) the tail, ``waiting.appendleft(victim)``.

    The model pops ``sg`` first and puts it back in front at the end, so the
    victims end up right behind it, the last one first: the encoding keeps
    ``sg`` at the head and puts each victim at place 1. Priority preemptions
    are not counted in the output's ``preempted`` (vLLM returns the count but
    ``_schedule_default`` drops it), so they do not stop ``_schedule_swapped``.
    """
    w, v, force, pinned = _priority_head(s, inp)
    post = remove_from(s, "running", v)
    post, checks = free_table(post, "gpu", v, "free")
    post = post.replace(
        in_waiting=put(post.in_waiting, v, True),
        waiting_pos=[
            ite(
                eq(v, r),
                1,
                ite(land(post.in_waiting[r], post.waiting_pos[r] >= 1), post.waiting_pos[r] + 1, post.waiting_pos[r]),
            )
            for r in s.shape.slots
        ],
    )
    for name, value in (("status", WAITING), ("num_computed_tokens", 0), ("num_seen", 0)):
        post = set_field(post, name, v, value)
    checks.append(("_preempt_by_recompute: the victim is RUNNING", eq(at(s.status, v), RUNNING)))
    return Outcome(
        post,
        land(eq(s.phase, PRIORITY_LOOP), force, lnot(s.swap_mode), pinned),
        checks,
        {"request": w, "victim": v, "last_running": eq(s.num_running(), 1)},
    )


def priority_end(s: State, inp: dict[str, Any]) -> Outcome:
    """The loop ends (no worse tail, or ``sg`` fits): ``waiting.appendleft(sg)``, ``self.waiting = deque(sorted(...))``; on to ``_schedule_running``."""
    _, _, force, _ = _priority_head(s, inp)
    post = stable_sort(s, "waiting").replace(phase=RUNNING_LOOP, req_index=0, loop_done=False)
    return Outcome(
        post,
        land(eq(s.phase, PRIORITY_LOOP), lnot(force)),
        facts={
            "reorders": lor(
                *(land(s.in_waiting[r], lnot(eq(post.waiting_pos[r], s.waiting_pos[r]))) for r in s.shape.slots)
            )
        },
    )


# ------------------------------------------------------------------ update


def begin_update(s: State, inp: dict[str, Any]) -> Outcome:
    """The engine takes the pending output (``update_from_output`` starts)."""
    return Outcome(s.replace(phase=UPDATING), eq(s.phase, PENDING))


def update_append_token(s: State, inp: dict[str, Any]) -> Outcome:
    """One scheduled group (``LLMEngine._process_model_outputs``): computed += chunk, the sampled token appended, the v0 ``StopChecker``, and ``free_finished_seq_groups`` for it.

    Stops on a stop token, on ``len >= max_model_len``, or on
    ``output_len == max_tokens``; a stopped group's GPU table is freed in
    order and it leaves ``running``. (Freeing each group as it stops gives the
    free deque ``free_finished_seq_groups`` gives: it frees in ``running``
    order, which is the scheduled order.)
    """
    sh = s.shape
    q, is_stop = inp["slot"], inp["stop_token"]
    guard = land(
        eq(s.phase, UPDATING),
        slot_in_range(s, q),
        lor(*(land(eq(q, r), s.live(r)) for r in sh.slots)),
        at(s.num_scheduled, q) > 0,
    )
    n1 = at(s.num_tokens, q) + 1
    grown = set_field(s, "num_computed_tokens", q, at(s.num_computed_tokens, q) + at(s.num_scheduled, q))
    grown = set_field(grown, "num_tokens", q, n1)
    grown = set_field(grown, "num_scheduled", q, 0)
    length = lor(n1 >= s.max_model_len, eq(n1 - at(s.num_prompt_tokens, q), at(s.max_tokens, q)))
    stopped = lor(is_stop, length)
    freed, checks = free_table(grown, "gpu", q, "free_finished_seq_groups")
    freed = remove_from(freed, "running", q)
    freed = set_field(freed, "status", q, DEAD)
    post = merge(stopped, freed, grown)
    return Outcome(
        post,
        guard,
        [(n, limplies(stopped, c)) for n, c in checks],
        {"request": q, "stopped": stopped, "length_capped": land(lnot(is_stop), length)},
    )


def end_update(s: State, inp: dict[str, Any]) -> Outcome:
    """Every scheduled group was processed; the step's output is gone."""
    sh = s.shape
    guard = land(eq(s.phase, UPDATING), *(limplies(s.live(r), eq(s.num_scheduled[r], 0)) for r in sh.slots))
    post = s.replace(
        phase=IDLE,
        num_scheduled=[0] * sh.num_reqs,
        num_prefills=0,
        num_preempted=0,
        num_swapped_out=0,
        num_swapped_in=0,
        req_index=0,
        loop_done=False,
    )
    return Outcome(post, guard)


# ------------------------------------------------------------------ requests


def add_request(s: State, inp: dict[str, Any]) -> Outcome:
    """``add_request`` -> ``add_seq_group``: a new WAITING group at the tail of ``waiting``; prompts over ``max_model_len`` are refused (``LLMEngine._validate_model_input``); a priority other than 0 needs policy priority."""
    q, n = inp["slot"], inp["num_prompt_tokens"]
    guard = land(
        lor(eq(s.phase, IDLE), eq(s.phase, PENDING)),
        slot_in_range(s, q),
        eq(at(s.status, q, 0), DEAD),
        eq(at(s.num_scheduled, q), 0),
        1 <= n,
        n <= s.max_model_len,
        inp["max_tokens"] >= 1,
        lor(s.priority_policy, eq(inp["priority"], 0)),
    )
    post = s
    for name, value in (
        ("status", WAITING),
        ("num_tokens", n),
        ("num_prompt_tokens", n),
        ("max_tokens", inp["max_tokens"]),
        ("num_computed_tokens", 0),
        ("num_seen", 0),
        ("priority", inp["priority"]),
        ("arrival", inp["arrival_time"]),
    ):
        post = set_field(post, name, q, value)
    return Outcome(append_to(post, "waiting", q), guard, facts={"request": q})


def abort(s: State, inp: dict[str, Any]) -> Outcome:
    """``abort_seq_group`` between steps: the group leaves its queue, FINISHED_ABORTED, ``free_seq`` frees its table (GPU or CPU)."""
    q = inp["slot"]
    sh = s.shape
    live = lor(*(land(eq(q, r), s.live(r)) for r in sh.slots))
    st = at(s.status, q)
    out = merge(
        eq(st, RUNNING),
        remove_from(s, "running", q),
        merge(eq(st, SWAPPED), remove_from(s, "swapped", q), remove_from(s, "waiting", q)),
    )
    out, c1 = free_table(out, "gpu", q, "free_seq")
    out, c2 = free_table(out, "cpu", q, "free_seq")
    out = set_field(out, "status", q, DEAD)
    guard = land(eq(s.phase, IDLE), slot_in_range(s, q), live)
    return Outcome(out, guard, c1 + c2, {"request": q, "was_swapped": eq(st, SWAPPED)})


# ------------------------------------------------------------------ registry

Inputs = Callable[[Shape, str], dict[str, Any]]


def _no_inputs(shape: Shape, tag: str) -> dict[str, Any]:
    return {}


def _slot_input(shape: Shape, tag: str) -> dict[str, Any]:
    return {"slot": z3.Int(f"{tag}.slot")}


def _append_inputs(shape: Shape, tag: str) -> dict[str, Any]:
    return {"slot": z3.Int(f"{tag}.slot"), "stop_token": z3.Bool(f"{tag}.stop_token")}


def _add_inputs(shape: Shape, tag: str) -> dict[str, Any]:
    return {
        "slot": z3.Int(f"{tag}.slot"),
        "num_prompt_tokens": z3.Int(f"{tag}.num_prompt_tokens"),
        "max_tokens": z3.Int(f"{tag}.max_tokens"),
        "priority": z3.Int(f"{tag}.priority"),
        "arrival_time": z3.Int(f"{tag}.arrival_time"),
    }


@dataclass(frozen=True)
class Transition:
    """A named transition: its function, how to make symbolic inputs, the code it mirrors."""

    name: str
    apply: Callable[[State, dict[str, Any]], Outcome]
    inputs: Inputs
    mirrors: str
    split: tuple[str, ...] = ()
    """Subject slots the proof splits on: ``slot`` (an input), ``case_request``, ``case_victim``."""

    def cases(self, shape: Shape) -> list[dict[str, int]]:
        out: list[dict[str, int]] = [{}]
        for key in self.split:
            out = [{**c, key: r} for c in out for r in shape.slots]
        return out


_S = "spec/v0/scheduler.py"
_B = "spec/v0/block_manager.py"
TRANSITIONS: dict[str, Transition] = {
    t.name: t
    for t in (
        Transition("begin_step", begin_step, _no_inputs, f"{_S} schedule, _schedule_default (budget, swapped guard)"),
        Transition(
            "prefill_admit",
            prefill_admit,
            _no_inputs,
            f"{_S} _schedule_prefills (admission), _allocate_and_set_running; {_B} can_allocate OK, allocate",
            split=("case_request",),
        ),
        Transition(
            "prefill_ignore",
            prefill_ignore,
            _no_inputs,
            f"{_S} _schedule_prefills, _ignore (prompt limit; {_B} can_allocate NEVER)",
            split=("case_request",),
        ),
        Transition(
            "prefill_stop",
            prefill_stop,
            _no_inputs,
            f"{_S} _schedule_prefills (can_allocate LATER, budget break)",
            split=("case_request",),
        ),
        Transition(
            "end_prefill_loop", end_prefill_loop, _no_inputs, f"{_S} _schedule_default (no decodes with prefills)"
        ),
        Transition(
            "running_append",
            running_append,
            _no_inputs,
            f"{_S} _schedule_running (can append), _append_slots; {_B} can_append_slots, append_slots",
            split=("case_request",),
        ),
        Transition(
            "running_preempt_recompute",
            running_preempt_recompute,
            _no_inputs,
            f"{_S} _schedule_running (victim = tail), _preempt, _preempt_by_recompute",
            split=("case_victim",),
        ),
        Transition(
            "running_preempt_swap",
            running_preempt_swap,
            _no_inputs,
            f"{_S} _preempt, _swap_out; {_B} can_swap_out, swap_out, _swap",
            split=("case_victim",),
        ),
        Transition(
            "running_swap_crash",
            running_swap_crash,
            _no_inputs,
            f"{_S} _swap_out (EngineCrash engine_swap_space_exhausted)",
            split=("case_victim",),
        ),
        Transition(
            "priority_sort_running",
            priority_sort_running,
            _no_inputs,
            f"{_S} _schedule_default (policy priority), _schedule_priority_preemption (sorted running)",
        ),
        Transition(
            "priority_force_preempt",
            priority_force_preempt,
            _no_inputs,
            f"{_S} _schedule_priority_preemption (loop: worse tail, head does not fit), _preempt, "
            f"_preempt_by_recompute; {_B} can_allocate",
            split=("case_victim",),
        ),
        Transition(
            "priority_end",
            priority_end,
            _no_inputs,
            f"{_S} _schedule_priority_preemption (appendleft head, sorted waiting)",
        ),
        Transition(
            "end_running_loop",
            end_running_loop,
            _no_inputs,
            f"{_S} _schedule_default (swap-in only without preemption)",
        ),
        Transition(
            "swapped_swap_in",
            swapped_swap_in,
            _no_inputs,
            f"{_S} _schedule_swapped (OK), _swap_in, _append_slots; {_B} can_swap_in, swap_in, append_slots",
            split=("case_request",),
        ),
        Transition(
            "swapped_ignore",
            swapped_ignore,
            _no_inputs,
            f"{_S} _schedule_swapped (can_swap_in NEVER, leaked_seq_groups)",
            split=("case_request",),
        ),
        Transition(
            "swapped_stop",
            swapped_stop,
            _no_inputs,
            f"{_S} _schedule_swapped (can_swap_in LATER, budget break)",
            split=("case_request",),
        ),
        Transition("end_schedule", end_schedule, _no_inputs, f"{_S} _schedule_default (end)"),
        Transition("begin_update", begin_update, _no_inputs, f"{_S} update_from_output (start)"),
        Transition(
            "update_append_token",
            update_append_token,
            _append_inputs,
            f"{_S} update_from_output, free_finished_seq_groups; spec/v0/stop.py maybe_stop_sequence",
            split=("slot",),
        ),
        Transition("end_update", end_update, _no_inputs, f"{_S} update_from_output (end)"),
        Transition("add_request", add_request, _add_inputs, f"{_S} add_request", split=("slot",)),
        Transition("abort", abort, _slot_input, f"{_S} abort, abort_seq_group; {_B} free", split=("slot",)),
    )
}
