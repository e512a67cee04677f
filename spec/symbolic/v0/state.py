"""The symbolic state of the v0 scheduler, its view, its lemmas and its canonical form.

Shape
-----
A :class:`Shape` fixes what stays a Python value: ``R`` request slots,
``B`` GPU blocks (ids ``0..B-1``: v0 has no null block), ``C`` CPU blocks
(ids ``0..C-1``) and the block size. Everything else (the configuration's
numbers, the preemption mode, every counter and table entry) is a Z3 term in
a symbolic state and a Python value in a concrete one.

A slot holds one request (a sequence group with one sequence) or nothing.
Slot ``r`` is *live* iff its status is WAITING, RUNNING or SWAPPED
(``vllm.sequence.SequenceStatus`` values 0, 1, 2); a finished, ignored or
aborted request is *dead* (``DEAD``): v0 forgets it.

What is represented (vLLM 0.10.2 names):

* each device's ``NaiveBlockAllocator``: ``ref_cnt`` per block, membership
  of ``_free_block_indices`` and the deque's order as a *key* per free block
  (front = least key). The allocator pops from the front (``popleft``) and
  gives freed blocks back at the front (``appendleft``), so it is a stack; new
  keys go below ``*_free_lo``, which moves down, so nothing is renumbered;
* per request: status, token counts, ``num_computed_tokens``, ``num_seen``
  (the tokens the block table has been given: ``BlockTable._num_full_slots``),
  membership and position in ``waiting``, ``running`` and ``swapped``, the
  GPU and CPU block tables as position maps (``held[r][b]`` at
  ``table_pos[r][b]``, length ``num_blocks[r]``; ``cpu_held`` /
  ``cpu_table_pos`` / ``num_cpu_blocks``), and the tokens scheduled this step
  (``num_scheduled``: ``token_chunk_size``), and its ``(priority,
  arrival_time)`` (``SequenceGroup.get_priority``; arrival times are ints here);
* the step: the phase, the running loop's cursor, the loop-ended flag, and
  the step's counts (prefills admitted, recompute preemptions, swap-outs,
  swap-ins). The budget's counters are derived: ``num_batched_tokens`` is the
  sum of ``num_scheduled`` and ``num_curr_seqs`` is ``len(running)`` (every
  running group is pre-counted in ``_schedule_default``; see
  ``transitions.py``).

Phases: ``IDLE``, ``PREFILL_LOOP`` (``_schedule_prefills``), ``RUNNING_LOOP``
(``_schedule_running``), ``SWAPPED_LOOP`` (``_schedule_swapped``),
``PENDING`` (``schedule()`` returned), ``UPDATING`` (the engine processes the
output) and ``CRASHED`` (a swap-out found no CPU space: the engine is dead);
under policy priority ``PRIORITY_SORT`` and ``PRIORITY_LOOP``
(``_schedule_priority_preemption``, between the prefill and running loops).

Inside ``schedule()`` the queues already show where each group will be when
the step ends (a scheduled decode stays in ``running``, a recompute victim is
at the head of ``waiting``, a swap-out victim at the tail of ``swapped``):
``_schedule_default`` puts them there at its end, and nothing in between
reads the places it would change (see ``transitions.py``).
"""

# Size: the v0 symbolic state and the lemmas that constrain it are one encoding, as
# spec/symbolic/state.py is for v1.

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import z3

from schedconf.spec.symbolic.z3ops import cdiv, count, fdiv, is_z3, land, limplies, lnot, total, value_of
from schedconf.spec.symbolic.z3ops import eq as eq_
from schedconf.spec.symbolic.z3ops import ite as ite_
from schedconf.spec.symbolic.z3ops import lor as lor_

DEAD, WAITING, RUNNING, SWAPPED = -1, 0, 1, 2
STATUS_NAMES = {DEAD: "DEAD", WAITING: "WAITING", RUNNING: "RUNNING", SWAPPED: "SWAPPED"}

IDLE, PREFILL_LOOP, RUNNING_LOOP, SWAPPED_LOOP, PENDING, UPDATING, CRASHED, PRIORITY_SORT, PRIORITY_LOOP = range(9)
PHASE_NAMES = {
    IDLE: "idle",
    PREFILL_LOOP: "prefill_loop",
    RUNNING_LOOP: "running_loop",
    SWAPPED_LOOP: "swapped_loop",
    PENDING: "pending",
    UPDATING: "updating",
    CRASHED: "crashed",
    PRIORITY_SORT: "priority_sort",
    PRIORITY_LOOP: "priority_loop",
}

PROFILE = "vllm-0.10"
INT, BOOL = "int", "bool"

CONFIG_FIELDS = (
    ("max_num_batched_tokens", INT),
    ("max_num_seqs", INT),
    ("max_model_len", INT),
    ("swap_mode", BOOL),
    ("priority_policy", BOOL),
)
SCALAR_FIELDS = (
    ("phase", INT),
    ("step", INT),
    ("num_free_gpu", INT),
    ("gpu_free_lo", INT),
    ("num_free_cpu", INT),
    ("cpu_free_lo", INT),
    ("req_index", INT),
    ("loop_done", BOOL),
    ("num_prefills", INT),
    ("num_preempted", INT),
    ("num_swapped_out", INT),
    ("num_swapped_in", INT),
)
GPU_FIELDS = (("gpu_ref_cnt", INT), ("gpu_in_free", BOOL), ("gpu_free_key", INT))
CPU_FIELDS = (("cpu_ref_cnt", INT), ("cpu_in_free", BOOL), ("cpu_free_key", INT))
REQUEST_FIELDS = (
    ("status", INT),
    ("num_tokens", INT),
    ("num_prompt_tokens", INT),
    ("max_tokens", INT),
    ("num_computed_tokens", INT),
    ("num_seen", INT),
    ("in_waiting", BOOL),
    ("waiting_pos", INT),
    ("in_running", BOOL),
    ("running_pos", INT),
    ("in_swapped", BOOL),
    ("swapped_pos", INT),
    ("num_scheduled", INT),
    ("num_blocks", INT),
    ("num_cpu_blocks", INT),
    ("priority", INT),
    ("arrival", INT),
)
REQUEST_GPU_FIELDS = (("held", BOOL), ("table_pos", INT))
REQUEST_CPU_FIELDS = (("cpu_held", BOOL), ("cpu_table_pos", INT))

ALL_FIELDS = tuple(
    name
    for group in (
        CONFIG_FIELDS,
        SCALAR_FIELDS,
        GPU_FIELDS,
        CPU_FIELDS,
        REQUEST_FIELDS,
        REQUEST_GPU_FIELDS,
        REQUEST_CPU_FIELDS,
    )
    for name, _ in group
)


@dataclass(frozen=True)
class Shape:
    """The Python-valued dimensions of a state."""

    num_reqs: int
    num_blocks: int
    num_cpu_blocks: int = 8
    block_size: int = 2

    def __post_init__(self) -> None:
        assert 1 <= self.num_reqs <= 10 and self.num_blocks >= 1 and self.num_cpu_blocks >= 0 and self.block_size >= 1

    @property
    def watermark(self) -> int:
        """``watermark_blocks = int(0.01 * num_gpu_blocks)`` (0 below 100 blocks)."""
        return int(0.01 * self.num_blocks)

    @property
    def blocks(self) -> range:
        return range(self.num_blocks)

    @property
    def cpu_blocks(self) -> range:
        return range(self.num_cpu_blocks)

    @property
    def slots(self) -> range:
        return range(self.num_reqs)

    def label(self) -> str:
        return f"R={self.num_reqs},B={self.num_blocks},C={self.num_cpu_blocks},bs={self.block_size}"


def slot_id(r: int) -> str:
    """The request id of slot ``r`` in states built from a shape (ids sort like slots)."""
    return f"r{r}"


class State:
    """One v0 scheduler state: Python values or Z3 terms (field names in the module docstring)."""

    __slots__ = ALL_FIELDS + ("shape",)

    def __init__(self, shape: Shape, **fields: Any) -> None:
        self.shape = shape
        for name in ALL_FIELDS:
            setattr(self, name, fields[name])

    def replace(self, **changes: Any) -> State:
        fields = {name: getattr(self, name) for name in ALL_FIELDS}
        unknown = set(changes) - set(fields)
        assert not unknown, unknown
        fields.update(changes)
        return State(self.shape, **fields)

    def _groups(self) -> Iterator[tuple[str, str, str]]:
        """``(name, kind, layout)`` for every field; layout: scalar, gpu, cpu, req, req_gpu, req_cpu."""
        for group, layout in (
            (CONFIG_FIELDS, "scalar"),
            (SCALAR_FIELDS, "scalar"),
            (GPU_FIELDS, "gpu"),
            (CPU_FIELDS, "cpu"),
            (REQUEST_FIELDS, "req"),
            (REQUEST_GPU_FIELDS, "req_gpu"),
            (REQUEST_CPU_FIELDS, "req_cpu"),
        ):
            for name, kind in group:
                yield name, kind, layout

    def leaves(self) -> Iterator[tuple[str, Any, str]]:
        """Every leaf as ``(name, value, kind)``."""
        sh = self.shape
        for name, kind, layout in self._groups():
            v = getattr(self, name)
            if layout == "scalar":
                yield name, v, kind
            elif layout in ("gpu", "cpu", "req"):
                for i in range(len(v)):
                    yield f"{name}[{i}]", v[i], kind
            else:
                for r in sh.slots:
                    for i in range(len(v[r])):
                        yield f"{name}[{r}][{i}]", v[r][i], kind

    def map(self, fn: Callable[[str, Any, str], Any]) -> State:
        """A state with ``fn(name, value, kind)`` applied to every leaf."""
        fields: dict[str, Any] = {}
        for name, kind, layout in self._groups():
            v = getattr(self, name)
            if layout == "scalar":
                fields[name] = fn(name, v, kind)
            elif layout in ("gpu", "cpu", "req"):
                fields[name] = [fn(f"{name}[{i}]", v[i], kind) for i in range(len(v))]
            else:
                fields[name] = [
                    [fn(f"{name}[{r}][{i}]", row[i], kind) for i in range(len(row))] for r, row in enumerate(v)
                ]
        return State(self.shape, **fields)

    # ----------------------------------------------------------- derived values
    def live(self, r: int) -> Any:
        st = self.status[r]
        if not is_z3(st):
            return st in (WAITING, RUNNING, SWAPPED)
        return z3.And(st >= WAITING, st <= SWAPPED)

    def num_running(self) -> Any:
        return count(self.in_running[r] for r in self.shape.slots)

    def num_waiting(self) -> Any:
        return count(self.in_waiting[r] for r in self.shape.slots)

    def num_swapped(self) -> Any:
        return count(self.in_swapped[r] for r in self.shape.slots)

    def num_batched_tokens(self) -> Any:
        """``SchedulingBudget.num_batched_tokens`` of the step (no cached tokens without prefix caching)."""
        return total(self.num_scheduled[r] for r in self.shape.slots)

    def in_priority(self) -> Any:
        """Inside ``_schedule_priority_preemption`` (nothing is scheduled there)."""
        ph = self.phase
        return (
            lor_(eq_(ph, PRIORITY_SORT), eq_(ph, PRIORITY_LOOP)) if is_z3(ph) else ph in (PRIORITY_SORT, PRIORITY_LOOP)
        )

    def in_step(self) -> Any:
        ph = self.phase
        if is_z3(ph):
            return lor_(land(ph >= PREFILL_LOOP, ph <= SWAPPED_LOOP), self.in_priority())
        return PREFILL_LOOP <= ph <= SWAPPED_LOOP or self.in_priority()

    def has_output(self) -> Any:
        """The step's scheduled tokens are visible: inside ``schedule()`` or pending."""
        ph = self.phase
        if is_z3(ph):
            return lor_(land(ph >= PREFILL_LOOP, ph <= PENDING), self.in_priority())
        return PREFILL_LOOP <= ph <= PENDING or self.in_priority()


# --------------------------------------------------------------- construction


def _var(kind: str, name: str) -> z3.ExprRef:
    return z3.Int(name) if kind == INT else z3.Bool(name)


def fresh_state(shape: Shape, tag: str = "s") -> State:
    """A state whose every leaf is a fresh Z3 constant named ``tag.field[index]``."""
    sh = shape
    fields: dict[str, Any] = {}
    sizes = {"gpu": sh.num_blocks, "cpu": sh.num_cpu_blocks, "req": sh.num_reqs}
    for name, kind, layout in State(sh, **{n: None for n in ALL_FIELDS})._groups():
        if layout == "scalar":
            fields[name] = _var(kind, f"{tag}.{name}")
        elif layout in sizes:
            fields[name] = [_var(kind, f"{tag}.{name}[{i}]") for i in range(sizes[layout])]
        else:
            width = sh.num_blocks if layout == "req_gpu" else sh.num_cpu_blocks
            fields[name] = [[_var(kind, f"{tag}.{name}[{r}][{i}]") for i in range(width)] for r in sh.slots]
    return State(sh, **fields)


def bind(symbolic: State, concrete: State) -> list[z3.BoolRef]:
    """Equalities fixing every leaf of ``symbolic`` to the value of ``concrete``."""
    out = []
    for (_, sym, kind), (_, val, _) in zip(symbolic.leaves(), concrete.leaves()):
        out.append(sym == (z3.IntVal(int(val)) if kind == INT else z3.BoolVal(bool(val))))
    return out


def evaluate(state: State, model: z3.ModelRef) -> State:
    """The Python values of every leaf of ``state`` in ``model``."""
    return state.map(lambda name, v, kind: value_of(model.eval(v, model_completion=True)) if is_z3(v) else v)


def empty_state(
    shape: Shape,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
    swap_mode: bool,
    priority_policy: bool = False,
) -> State:
    """The Python state of a fresh scheduler (free deques ``0..N-1`` front first)."""
    sh = shape
    R, B, C = sh.num_reqs, sh.num_blocks, sh.num_cpu_blocks
    zeros = [0] * R
    falses = [False] * R
    return State(
        sh,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        swap_mode=swap_mode,
        priority_policy=priority_policy,
        phase=IDLE,
        step=0,
        num_free_gpu=B,
        gpu_free_lo=-1,
        num_free_cpu=C,
        cpu_free_lo=-1,
        req_index=0,
        loop_done=False,
        num_prefills=0,
        num_preempted=0,
        num_swapped_out=0,
        num_swapped_in=0,
        gpu_ref_cnt=[0] * B,
        gpu_in_free=[True] * B,
        gpu_free_key=list(range(B)),
        cpu_ref_cnt=[0] * C,
        cpu_in_free=[True] * C,
        cpu_free_key=list(range(C)),
        status=[DEAD] * R,
        num_tokens=zeros,
        num_prompt_tokens=zeros,
        max_tokens=zeros,
        num_computed_tokens=zeros,
        num_seen=zeros,
        in_waiting=falses,
        waiting_pos=zeros,
        in_running=falses,
        running_pos=zeros,
        in_swapped=falses,
        swapped_pos=zeros,
        num_scheduled=zeros,
        num_blocks=zeros,
        num_cpu_blocks=zeros,
        priority=zeros,
        arrival=zeros,
        held=[[False] * B for _ in range(R)],
        table_pos=[[0] * B for _ in range(R)],
        cpu_held=[[False] * C for _ in range(R)],
        cpu_table_pos=[[0] * C for _ in range(R)],
    )


# --------------------------------------------------------------- the view


class StateView:
    """The state view the v0 invariants read (``spec/symbolic/v0/invariants.py``), over a :class:`State`.

    Works on Python values (the state read from the model: the concrete
    evaluation) and on Z3 terms alike. Dead slots are masked so that every
    per-request rule holds vacuously on them, as a concrete view would not
    list them; a dead slot's table entries still count as holders (a leak).
    """

    def __init__(self, s: State) -> None:
        sh = s.shape
        self._s = s
        self.block_size = sh.block_size
        self.num_gpu_blocks = sh.num_blocks
        self.num_cpu_blocks = sh.num_cpu_blocks
        self.max_num_batched_tokens = s.max_num_batched_tokens
        self.max_num_seqs = s.max_num_seqs
        self.max_model_len = s.max_model_len
        self.num_free_gpu_blocks = s.num_free_gpu
        self.num_free_cpu_blocks = s.num_free_cpu
        self.gpu_blocks = list(sh.blocks)
        self.cpu_blocks = list(sh.cpu_blocks)
        self.requests = list(sh.slots)
        self._live = [s.live(r) for r in sh.slots]
        self.num_running = s.num_running()
        self.num_swapped = s.num_swapped()
        self.has_output = s.has_output()
        self.num_batched_tokens = ite_(self.has_output, s.num_batched_tokens(), 0)
        self.num_swapped_in = ite_(self.has_output, s.num_swapped_in, 0)
        self.num_swapped_out = ite_(self.has_output, s.num_swapped_out, 0)
        self.orphans_in_queues = count(
            land(lnot(self._live[r]), lor_(s.in_running[r], s.in_waiting[r], s.in_swapped[r])) for r in sh.slots
        )

    # blocks
    def gpu_ref_cnt(self, b: int) -> Any:
        return self._s.gpu_ref_cnt[b]

    def gpu_in_free(self, b: int) -> Any:
        return self._s.gpu_in_free[b]

    def gpu_num_holders(self, b: int) -> Any:
        return count(self._s.held[r][b] for r in self._s.shape.slots)

    def cpu_ref_cnt(self, c: int) -> Any:
        return self._s.cpu_ref_cnt[c]

    def cpu_in_free(self, c: int) -> Any:
        return self._s.cpu_in_free[c]

    def cpu_num_holders(self, c: int) -> Any:
        return count(self._s.cpu_held[r][c] for r in self._s.shape.slots)

    # requests
    def is_live(self, r: int) -> Any:
        return self._live[r]

    def status(self, r: int) -> Any:
        return ite_(self._live[r], self._s.status[r], DEAD)

    def num_in_waiting(self, r: int) -> Any:
        return ite_(land(self._live[r], self._s.in_waiting[r]), 1, 0)

    def num_in_running(self, r: int) -> Any:
        return ite_(land(self._live[r], self._s.in_running[r]), 1, 0)

    def num_in_swapped(self, r: int) -> Any:
        return ite_(land(self._live[r], self._s.in_swapped[r]), 1, 0)

    def num_tokens(self, r: int) -> Any:
        return ite_(self._live[r], self._s.num_tokens[r], 0)

    def num_computed_tokens(self, r: int) -> Any:
        return ite_(self._live[r], self._s.num_computed_tokens[r], 0)

    def num_seen_tokens(self, r: int) -> Any:
        return ite_(self._live[r], self._s.num_seen[r], 0)

    def num_gpu_table_blocks(self, r: int) -> Any:
        """Blocks in the request's GPU table (a dead request's table, if any, shows here too)."""
        s = self._s
        return count(s.held[r][b] for b in s.shape.blocks)

    def num_cpu_table_blocks(self, r: int) -> Any:
        s = self._s
        return count(s.cpu_held[r][c] for c in s.shape.cpu_blocks)

    def num_scheduled_tokens(self, r: int) -> Any:
        return ite_(land(self.has_output, self._live[r]), self._s.num_scheduled[r], 0)

    def is_scheduled_prefill(self, r: int) -> Any:
        """Scheduled this step as a prompt (``is_prompt``): it had computed nothing before the step."""
        s = self._s
        return land(self.has_output, self._live[r], s.num_scheduled[r] > 0, eq_(s.num_computed_tokens[r], 0))


# --------------------------------------------------------------- lemmas


def _distinct_positions(o: Any, members: list[Any], positions: list[Any], size: Any, what: str) -> Any:
    """Members' positions lie in ``[0, size)`` and differ pairwise."""
    n = len(members)
    return o.and_(
        o.forall(
            range(n),
            lambda i: o.implies(members[i], o.and_(o.le(0, positions[i]), o.lt(positions[i], size))),
            lambda i: f"{what} {i}",
        ),
        o.forall(
            [(i, j) for i in range(n) for j in range(i + 1, n)],
            lambda p: o.implies(o.and_(members[p[0]], members[p[1]]), o.not_(o.eq(positions[p[0]], positions[p[1]]))),
            lambda p: f"{what}s {p[0]} and {p[1]}",
        ),
    )


def lemma_config(s: State, o: Any) -> Any:
    """The configuration passes 0.10.2's checks for _schedule_default: max_model_len <= max_num_batched_tokens, max_num_seqs <= max_num_batched_tokens (SchedulerConfig), max_model_len <= block_size * num_gpu_blocks (worker.raise_if_cache_size_invalid, spec/v0/config.py)."""
    return o.and_(
        o.le(1, s.max_num_seqs),
        o.le(1, s.max_model_len),
        o.le(s.max_model_len, s.max_num_batched_tokens),
        o.le(s.max_num_seqs, s.max_num_batched_tokens),
        o.le(s.max_model_len, s.shape.block_size * s.shape.num_blocks),
        # Scope: priority preemption in swap mode puts a SWAPPED group into waiting (a vLLM bug the model
        # reproduces, EngineCrash engine_swapped_group_in_waiting later); the encoding covers priority with
        # recompute only (preemption_mode None or "recompute": vLLM recomputes single-sequence groups).
        o.implies(s.priority_policy, o.not_(s.swap_mode)),
    )


def lemma_step(s: State, o: Any) -> Any:
    """Phase bookkeeping: idle means nothing scheduled and no step counts; the running loop's cursor is in range and nothing after it is scheduled; step counts are consistent."""
    sh = s.shape
    sched_sum = s.num_batched_tokens()
    no_counts = o.and_(
        o.eq(s.num_prefills, 0), o.eq(s.num_preempted, 0), o.eq(s.num_swapped_out, 0), o.eq(s.num_swapped_in, 0)
    )
    return o.and_(
        o.le(IDLE, s.phase),
        o.le(s.phase, PRIORITY_LOOP),
        o.le(0, s.step),
        # _schedule_priority_preemption runs only under policy priority, after a prefill loop that admitted
        # nothing (or none ran); no group is scheduled yet and the step's counts are 0.
        o.implies(s.in_priority(), o.and_(s.priority_policy, o.eq(sched_sum, 0), no_counts)),
        o.forall(sh.slots, lambda r: o.le(0, s.num_scheduled[r]), lambda r: f"slot {r} scheduled"),
        o.implies(o.eq(s.phase, IDLE), o.and_(o.eq(sched_sum, 0), no_counts)),
        o.le(0, s.num_prefills),
        o.le(0, s.num_preempted),
        o.le(0, s.num_swapped_out),
        o.le(0, s.num_swapped_in),
        # Inside the step, scheduled means live and RUNNING, with a chunk of 1 (decode) or the whole sequence (prefill).
        o.implies(
            s.in_step(),
            o.forall(
                sh.slots,
                lambda r: o.implies(
                    o.lt(0, s.num_scheduled[r]),
                    o.and_(
                        s.live(r),
                        o.eq(s.status[r], RUNNING),
                        s.in_running[r],
                        o.or_(
                            o.and_(o.eq(s.num_computed_tokens[r], 0), o.eq(s.num_scheduled[r], s.num_tokens[r])),
                            o.and_(o.lt(0, s.num_computed_tokens[r]), o.eq(s.num_scheduled[r], 1)),
                        ),
                        o.eq(s.num_seen[r], s.num_tokens[r]),
                    ),
                ),
                lambda r: f"slot {r} scheduled in the step",
            ),
        ),
        # The prefill loop admits; the other loops only run when it admitted nothing.
        o.implies(
            o.eq(s.phase, PREFILL_LOOP),
            o.and_(
                o.eq(s.num_preempted, 0),
                o.eq(s.num_swapped_out, 0),
                o.eq(s.num_swapped_in, 0),
                o.eq(s.num_swapped(), 0),
                o.eq(
                    s.num_prefills,
                    count(o.and_(o.lt(0, s.num_scheduled[r]), o.eq(s.num_computed_tokens[r], 0)) for r in sh.slots),
                ),
                o.eq(s.num_prefills, count(o.lt(0, s.num_scheduled[r]) for r in sh.slots)),
            ),
        ),
        o.implies(
            o.and_(o.le(RUNNING_LOOP, s.phase), o.le(s.phase, SWAPPED_LOOP)),
            o.and_(
                o.eq(s.num_prefills, 0),
                o.forall(
                    sh.slots,
                    lambda r: o.implies(
                        o.lt(0, s.num_scheduled[r]),
                        o.and_(o.eq(s.num_scheduled[r], 1), o.lt(0, s.num_computed_tokens[r])),
                    ),
                    lambda r: f"slot {r} decodes",
                ),
            ),
        ),
        o.implies(
            o.eq(s.phase, RUNNING_LOOP),
            o.and_(
                o.eq(s.num_swapped_in, 0),
                o.le(0, s.req_index),
                o.le(s.req_index, s.num_running()),
                o.forall(
                    sh.slots,
                    lambda r: o.implies(
                        s.in_running[r], o.eq(o.lt(0, s.num_scheduled[r]), o.lt(s.running_pos[r], s.req_index))
                    ),
                    lambda r: f"slot {r} against the cursor",
                ),
            ),
        ),
        o.implies(
            o.eq(s.phase, SWAPPED_LOOP),
            o.and_(
                o.eq(s.num_preempted, 0),
                o.eq(s.num_swapped_out, 0),
                o.forall(
                    sh.slots,
                    lambda r: o.implies(s.in_running[r], o.eq(s.num_scheduled[r], 1)),
                    lambda r: f"slot {r} running in the swapped loop",
                ),
            ),
        ),
        # A step either swaps out or swaps in (SchedulerOutputs.__post_init__ asserts it).
        o.or_(o.eq(s.num_swapped_out, 0), o.eq(s.num_swapped_in, 0)),
        o.implies(
            o.eq(s.phase, UPDATING),
            o.forall(
                sh.slots,
                lambda r: o.implies(
                    o.and_(s.live(r), o.lt(0, s.num_scheduled[r])),
                    o.and_(
                        o.eq(s.status[r], RUNNING),
                        o.eq(s.num_seen[r], s.num_tokens[r]),
                        o.le(s.num_computed_tokens[r] + s.num_scheduled[r], s.num_tokens[r]),
                    ),
                ),
                lambda r: f"slot {r} to update",
            ),
        ),
        o.implies(
            o.eq(s.phase, PENDING),
            o.forall(
                sh.slots,
                lambda r: o.implies(
                    o.lt(0, s.num_scheduled[r]),
                    o.and_(
                        s.live(r),
                        o.eq(s.status[r], RUNNING),
                        o.eq(s.num_seen[r], s.num_tokens[r]),
                        o.eq(s.num_computed_tokens[r] + s.num_scheduled[r], s.num_tokens[r]),
                    ),
                ),
                lambda r: f"slot {r} pending",
            ),
        ),
    )


def lemma_allocators(s: State, o: Any) -> Any:
    """Each free deque's blocks have distinct keys above its free_lo; no block has two holders (one sequence per group, no prefix caching)."""
    sh = s.shape

    def device(in_free: list[Any], key: list[Any], lo: Any, ids: range, what: str) -> Any:
        ref = s.gpu_ref_cnt if what == "gpu" else s.cpu_ref_cnt
        return o.and_(
            o.forall(ids, lambda b: o.le(ref[b], 1), lambda b: f"{what} block {b} ref count"),
            o.forall(ids, lambda b: o.implies(in_free[b], o.lt(lo, key[b])), lambda b: f"free {what} block {b}"),
            o.forall(
                [(b, c) for b in ids for c in ids if b < c],
                lambda p: o.implies(o.and_(in_free[p[0]], in_free[p[1]]), o.not_(o.eq(key[p[0]], key[p[1]]))),
                lambda p: f"free {what} blocks {p[0]} and {p[1]}",
            ),
        )

    return o.and_(
        device(s.gpu_in_free, s.gpu_free_key, s.gpu_free_lo, sh.blocks, "gpu"),
        device(s.cpu_in_free, s.cpu_free_key, s.cpu_free_lo, sh.cpu_blocks, "cpu"),
    )


def lemma_requests(s: State, o: Any) -> Any:
    """Live requests: 1 <= prompt <= num_tokens, outputs below max_tokens, tables sized by the seen tokens on the device their status names; queue positions are permutations."""
    sh = s.shape
    bs = sh.block_size
    slots = list(sh.slots)

    def table(held: list[Any], pos: list[Any], n: Any, ids: range, r: int, what: str) -> Any:
        return o.and_(
            o.forall(
                ids,
                lambda b: o.implies(held[b], o.and_(o.le(0, pos[b]), o.lt(pos[b], n))),
                lambda b: f"slot {r} {what} block {b}",
            ),
            o.forall(
                [(b, c) for b in ids for c in ids if b < c],
                lambda p: o.implies(o.and_(held[p[0]], held[p[1]]), o.not_(o.eq(pos[p[0]], pos[p[1]]))),
                lambda p: f"slot {r} {what} blocks {p[0]} and {p[1]}",
            ),
            o.le(0, n),
            # No holes: the table holds exactly n blocks (the model's lists have none).
            o.eq(o.count(held[b] for b in ids), n),
        )

    def one(r: int) -> Any:
        running, swapped = o.eq(s.status[r], RUNNING), o.eq(s.status[r], SWAPPED)
        return o.and_(
            o.or_(o.eq(s.status[r], DEAD), s.live(r)),
            o.implies(
                s.live(r),
                o.and_(
                    o.le(1, s.num_prompt_tokens[r]),
                    o.le(s.num_prompt_tokens[r], s.num_tokens[r]),
                    o.lt(s.num_tokens[r] - s.num_prompt_tokens[r], s.max_tokens[r]),
                    o.le(0, s.num_computed_tokens[r]),
                    o.le(s.num_computed_tokens[r], s.num_seen[r]),
                    o.le(s.num_seen[r], s.num_tokens[r]),
                    # Prompts over max_model_len are refused; a group stops when it reaches it.
                    o.le(s.num_tokens[r], s.max_model_len),
                    o.implies(
                        running,
                        o.and_(
                            o.eq(s.num_blocks[r], cdiv(s.num_seen[r], bs)),
                            o.eq(s.num_cpu_blocks[r], 0),
                            o.le(s.num_tokens[r], s.max_model_len),
                            o.le(1, s.num_seen[r]),
                            # Scheduled this step: the table has seen everything; else one token is new.
                            o.ite(
                                o.lt(0, s.num_scheduled[r]),
                                o.and_(
                                    o.eq(s.num_seen[r], s.num_tokens[r]),
                                    o.eq(s.num_computed_tokens[r] + s.num_scheduled[r], s.num_tokens[r]),
                                ),
                                o.and_(
                                    o.eq(s.num_seen[r] + 1, s.num_tokens[r]),
                                    o.eq(s.num_computed_tokens[r], s.num_seen[r]),
                                ),
                            ),
                        ),
                    ),
                    o.implies(
                        swapped,
                        o.and_(
                            o.eq(s.num_cpu_blocks[r], cdiv(s.num_seen[r], bs)),
                            o.eq(s.num_blocks[r], 0),
                            o.eq(s.num_tokens[r], s.num_seen[r] + 1),
                            o.le(1, s.num_seen[r]),
                            o.eq(s.num_computed_tokens[r], s.num_seen[r]),
                            o.le(s.num_tokens[r], s.max_model_len),
                            # can_swap_out counted 1 + full blocks against the CPU pool.
                            o.le(1 + fdiv(s.num_seen[r], bs), sh.num_cpu_blocks),
                        ),
                    ),
                    o.implies(
                        o.eq(s.status[r], WAITING),
                        o.and_(
                            o.eq(s.num_blocks[r], 0),
                            o.eq(s.num_cpu_blocks[r], 0),
                            o.eq(s.num_seen[r], 0),
                            o.eq(s.num_computed_tokens[r], 0),
                        ),
                    ),
                ),
            ),
            o.implies(
                o.not_(s.live(r)),
                o.and_(o.eq(s.num_blocks[r], 0), o.eq(s.num_cpu_blocks[r], 0), o.eq(s.num_scheduled[r], 0)),
            ),
            table(s.held[r], s.table_pos[r], s.num_blocks[r], sh.blocks, r, "gpu"),
            table(s.cpu_held[r], s.cpu_table_pos[r], s.num_cpu_blocks[r], sh.cpu_blocks, r, "cpu"),
        )

    return o.and_(
        o.forall(slots, one, lambda r: f"slot {r}"),
        _distinct_positions(
            o, [s.in_running[r] for r in slots], [s.running_pos[r] for r in slots], s.num_running(), "running slot"
        ),
        _distinct_positions(
            o, [s.in_waiting[r] for r in slots], [s.waiting_pos[r] for r in slots], s.num_waiting(), "waiting slot"
        ),
        _distinct_positions(
            o, [s.in_swapped[r] for r in slots], [s.swapped_pos[r] for r in slots], s.num_swapped(), "swapped slot"
        ),
    )


def free_rank(in_free: list[Any], key: list[Any], b: int, ids: range) -> Any:
    """How many free blocks come before block ``b`` in a free deque (its index if it is free)."""
    return count(land(in_free[c], key[c] < key[b]) for c in ids if c != b)


def theorem_rank(in_free: list[Any], key: list[Any], num_free: Any, n: Any, ids: range) -> Any:
    """On a deque of distinct keys: for ``0 <= n <= num_free`` exactly ``n`` free blocks have fewer than ``n`` before them; ranks follow keys and stay below ``num_free``.

    A fact about finite orders, proved once per size (``proofs.prove_theorem_rank``)
    and used by the transitions as an instantiated premise.
    """
    distinct = land(
        eq_(count(in_free[b] for b in ids), num_free),
        *(limplies(land(in_free[b], in_free[c]), lnot(eq_(key[b], key[c]))) for b in ids for c in ids if b < c),
    )
    rank = {b: free_rank(in_free, key, b, ids) for b in ids}
    monotone = land(
        *(
            limplies(land(in_free[b], in_free[c], key[b] < key[c]), rank[b] < rank[c])
            for b in ids
            for c in ids
            if b != c
        )
    )
    return land(
        limplies(land(distinct, 0 <= n, n <= num_free), eq_(count(land(in_free[b], rank[b] < n) for b in ids), n)),
        limplies(distinct, land(monotone, *(limplies(in_free[b], rank[b] < num_free) for b in ids))),
    )


def lemma_priority(s: State, o: Any) -> Any:
    """Policy priority: ``running`` is sorted by ``(priority, arrival_time)`` from ``_schedule_priority_preemption`` through the running loop; ``waiting`` is sorted from its end until a recompute preemption of the running loop prepends a victim."""
    sh = s.shape
    pairs = [(q, r) for q in sh.slots for r in sh.slots if q != r]

    def sorted_queue(queue: str) -> Any:
        member, pos = getattr(s, f"in_{queue}"), getattr(s, f"{queue}_pos")
        return o.forall(
            pairs,
            lambda p: o.implies(
                o.and_(member[p[0]], member[p[1]], o.lt(pos[p[0]], pos[p[1]])),
                o.not_(
                    o.or_(
                        o.lt(s.priority[p[1]], s.priority[p[0]]),
                        o.and_(o.eq(s.priority[p[1]], s.priority[p[0]]), o.lt(s.arrival[p[1]], s.arrival[p[0]])),
                    )
                ),
            ),
            lambda p: f"{queue} slots {p[0]} before {p[1]}",
        )

    return o.and_(
        o.implies(
            o.and_(s.priority_policy, o.or_(o.eq(s.phase, PRIORITY_LOOP), o.eq(s.phase, RUNNING_LOOP))),
            sorted_queue("running"),
        ),
        o.implies(
            o.and_(
                s.priority_policy,
                o.or_(o.eq(s.phase, RUNNING_LOOP), o.eq(s.phase, SWAPPED_LOOP)),
                o.eq(s.num_preempted, 0),
            ),
            sorted_queue("waiting"),
        ),
    )


LEMMAS: dict[str, Callable[[State, Any], Any]] = {
    fn.__name__.removeprefix("lemma_"): fn
    for fn in (lemma_config, lemma_step, lemma_allocators, lemma_requests, lemma_priority)
}


# --------------------------------------------------------------- canonical form


def table_of(s: State, r: int, cpu: bool = False) -> list[int]:
    """Slot ``r``'s GPU (or CPU) block table, in position order (Python values)."""
    held, pos, ids = (s.cpu_held, s.cpu_table_pos, s.shape.cpu_blocks) if cpu else (s.held, s.table_pos, s.shape.blocks)
    return sorted((b for b in ids if held[r][b]), key=lambda b: pos[r][b])


def canonical(s: State) -> dict[str, Any]:
    """What two states must agree on to be the same scheduler state (Python values)."""
    sh = s.shape
    live = [r for r in sh.slots if s.status[r] in (WAITING, RUNNING, SWAPPED)]
    out: dict[str, Any] = {
        "phase": s.phase,
        "step": s.step,
        "num_free_gpu": s.num_free_gpu,
        "num_free_cpu": s.num_free_cpu,
        "gpu_free": sorted((b for b in sh.blocks if s.gpu_in_free[b]), key=lambda b: s.gpu_free_key[b]),
        "cpu_free": sorted((c for c in sh.cpu_blocks if s.cpu_in_free[c]), key=lambda c: s.cpu_free_key[c]),
        "gpu_ref_cnt": list(s.gpu_ref_cnt),
        "cpu_ref_cnt": list(s.cpu_ref_cnt),
        "waiting": sorted((r for r in sh.slots if s.in_waiting[r]), key=lambda r: s.waiting_pos[r]),
        "running": sorted((r for r in sh.slots if s.in_running[r]), key=lambda r: s.running_pos[r]),
        "swapped": sorted((r for r in sh.slots if s.in_swapped[r]), key=lambda r: s.swapped_pos[r]),
        "requests": {
            r: {
                "status": s.status[r],
                "num_tokens": s.num_tokens[r],
                "num_prompt_tokens": s.num_prompt_tokens[r],
                "num_computed_tokens": s.num_computed_tokens[r],
                "num_seen": s.num_seen[r],
                "num_scheduled": s.num_scheduled[r],
                "gpu_table": table_of(s, r),
                "cpu_table": table_of(s, r, True),
                "priority": (s.priority[r], s.arrival[r]),
            }
            for r in live
        },
        "dead_tables": {
            r: (table_of(s, r), table_of(s, r, True))
            for r in sh.slots
            if r not in live and (table_of(s, r) or table_of(s, r, True))
        },
    }
    if s.phase in (PREFILL_LOOP, RUNNING_LOOP, SWAPPED_LOOP, PENDING, PRIORITY_SORT, PRIORITY_LOOP):
        # What the output shows: prefill groups, ``preempted``, and whether it swaps out / in.
        out["step_counts"] = (
            s.num_prefills,
            s.num_preempted + s.num_swapped_out,
            s.num_swapped_out > 0,
            s.num_swapped_in > 0,
        )
    return out


def describe(s: State) -> str:
    """A readable dump of a Python-valued state (counterexamples, witnesses)."""
    sh = s.shape
    c = canonical(s)
    lines = [
        f"shape {sh.label()}  phase {PHASE_NAMES.get(s.phase, s.phase)}  step {s.step}",
        f"config: max_num_batched_tokens={s.max_num_batched_tokens} max_num_seqs={s.max_num_seqs} "
        f"max_model_len={s.max_model_len} preemption={'swap' if s.swap_mode else 'recompute'} "
        f"policy={'priority' if s.priority_policy else 'fcfs'}",
        f"gpu free (front first): {c['gpu_free']} num_free={s.num_free_gpu}  "
        f"cpu free: {c['cpu_free']} num_free={s.num_free_cpu}",
        f"gpu ref_cnt {list(s.gpu_ref_cnt)}  cpu ref_cnt {list(s.cpu_ref_cnt)}",
        f"waiting {[slot_id(r) for r in c['waiting']]}  running {[slot_id(r) for r in c['running']]}  "
        f"swapped {[slot_id(r) for r in c['swapped']]}  cursor {s.req_index} loop_done {s.loop_done}",
        f"step counts (prefills, preempted, swapped_out, swapped_in) = "
        f"{(s.num_prefills, s.num_preempted, s.num_swapped_out, s.num_swapped_in)}",
    ]
    for r, info in c["requests"].items():
        lines.append(
            f"  {slot_id(r)}: {STATUS_NAMES[info['status']]} tokens={info['num_tokens']} "
            f"(prompt {info['num_prompt_tokens']}, max_tokens {s.max_tokens[r]}) computed="
            f"{info['num_computed_tokens']} seen={info['num_seen']} scheduled={info['num_scheduled']} "
            f"gpu={info['gpu_table']}/{s.num_blocks[r]} cpu={info['cpu_table']}/{s.num_cpu_blocks[r]}"
        )
    for r, (g, cpu) in c["dead_tables"].items():
        lines.append(f"  {slot_id(r)}: dead, still holding gpu {g} cpu {cpu}")
    return "\n".join(lines)
