"""The symbolic state of the scheduler, its state view, and the bridges to the concrete model.

Shape
-----
A :class:`Shape` fixes what stays a Python value: ``R`` request *slots*,
``B`` usable blocks (ids ``1..B``; block 0 is the null block, so
``num_gpu_blocks = B + 1``), the block size and the policy. Everything else
(the configuration's numbers and switches, every counter, every table entry)
is a Z3 term in a symbolic state and a Python value in a concrete one: the
same :class:`State` class holds either, and the transitions
(``transitions.py``) compute on both.

A slot holds one request or nothing. Slot ``r`` is *live* iff its status is
WAITING, RUNNING or PREEMPTED (``spec/v1/view.py`` codes); a *dead* slot
(status ``DEAD``) is a request never added or already freed. Slots are in
request-id order, which the priority queue uses to break ties.

What is represented, and how (citing ``spec/``):

* blocks (``spec/v1/block_pool.py``): ``ref_cnt``, membership of the free queue
  and its *eviction key* (``free_key``: the queue is the free blocks in
  increasing key order, front first; keys are distinct but not dense, and lie
  strictly between ``free_lo`` and ``free_hi``, so that prepending and
  appending never renumber), whether the block carries a hash (``cached``)
  and which (``block_hash``, an abstract integer), whether the prefix-cache
  map indexes it (``indexed``) and its insertion order (``insert_order``:
  ``get_cached_block`` returns the first inserted);
* requests (``spec/v1/request.py``, ``spec/v1/kv_cache.py``): status, token counts,
  ``num_computed_tokens``, key, membership and position in ``running`` and
  (FCFS) ``waiting``, the block table as a *position map* (``held[r][b]``:
  the table holds block ``b``, at ``table_pos[r][b]``; ``num_blocks`` is the
  table's length; ``has_table``: the manager has an entry), ``num_cached_block``
  and the chained block hashes (abstract integers).

Why position maps and keys rather than arrays and dense positions: every
count the invariants take (free blocks, held blocks, holders of a block) then
changes by a sum of per-block changes, which Z3 handles linearly, instead of
needing a pigeonhole argument (which took Z3 minutes at 8 blocks). The one
counting fact left, "the ``n`` front blocks of the queue are ``n`` blocks",
is a theorem about any state (:func:`theorem_rank`), proved once per shape
(``proofs.py``) and used as an instantiated premise. A table holding a block
twice cannot be represented; instead every transition that adds a block to a
table carries the model-level check that the table did not hold it.
* the step in progress (``spec/v1/scheduler.py`` ``_StepState``): the phase, the
  tokens scheduled so far, the token budget, the running loop's cursor, the
  step's threshold, the preemption records, and the running loop's pending
  allocation (``alloc_active``: ``_allocate_or_preempt`` is under way for
  slot ``alloc_request`` with ``alloc_num_new`` tokens).
* prefill deferral (``Scheduler.is_prefill_deferred``; vLLM 0.32's
  ``throttle_prefills`` and 0.33's ``prefill_schedule_interval``): the step's
  verdict (``defer_prefills``) and whether it has carried prefill so far
  (``prefill_in_step``: ``_StepState.prefill_scheduled or prefill_admitted``),
  the scheduler's ``prefill_capacity_bound``, ``num_executed_steps`` and
  ``last_prefill_step``, and each request's ``is_prefill_chunk`` (set by
  ``_update_after_schedule``, read by the next steps). The throttle itself is
  an input of ``begin_step``, as it is an argument of ``schedule()``.

Phases: ``IDLE`` (no pending output), ``RUNNING_LOOP`` and ``WAITING_LOOP``
(inside ``schedule()``), ``PENDING`` (``schedule()`` returned, output not yet
processed) and ``UPDATING`` (inside ``update_from_output()``).

The view
--------
:class:`SymbolicView` offers the names of :class:`schedconf.spec.v1.view.ConcreteView`.
Dead slots are masked so that every per-request predicate holds vacuously on
them, the way the concrete view simply does not list them; a dead slot's
tokens still in a pending output count as given back, as in the concrete
view. Table positions are named ``(slot, block)`` (the domain is opaque to
the invariants). The preemption records are listed as guarded cases (see
:class:`_GuardedPreemption`), because ``inv_victim_order`` indexes with a
Python ``victim_pos``. Inside
``schedule()`` the view shows the state *as if the step ended now*:
``num_computed_tokens`` includes the tokens scheduled so far (what
``_update_after_schedule`` will add). Inside ``update_from_output()`` the view
shows no scheduled tokens (the model clears ``pending_output`` first).

Lemmas
------
:data:`LEMMAS` are the well-formedness facts of this encoding (ranges,
distinct keys and positions, the step's bookkeeping) and the strengthening
lemmas the proofs need (e.g. a table's blocks below ``num_cached_block`` are
exactly its cached ones; an uncached block has at most one holder; a live
request's block hashes differ). They are written with the same operations as
the invariants, proved preserved by every transition together with them, and
checked on every reachable state the tests build. Tables may have holes in
the symbolic states (no lemma forbids them); the concrete model's lists have
none, so counterexamples are asked for without holes first.
"""

# Size: the symbolic state and the lemmas that constrain it are one encoding: each lemma reads the
# state's fields directly, and the two change together.

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import z3

from schedconf.spec.output import SchedulerOutput
from schedconf.spec.symbolic.z3ops import (
    cdiv,
    count,
    count_set,
    fdiv,
    is_z3,
    ite,
    land,
    limplies,
    lnot,
    select,
    total,
    value_of,
)
from schedconf.spec.symbolic.z3ops import (
    eq as eq_,
)
from schedconf.spec.v1.block_pool import FreeKVCacheBlockQueue
from schedconf.spec.v1.config import SchedulerConfig
from schedconf.spec.v1.request import Request, RequestStatus, SamplingParams
from schedconf.spec.v1.scheduler import PreemptionRecord, Scheduler, StepRecord, _StepState
from schedconf.spec.v1.view import FCFS, PREEMPTED, PRIORITY, RUNNING, STATUS_CODES, WAITING

DEAD = -1
"""Status code of a dead slot (no live request)."""

IDLE, RUNNING_LOOP, WAITING_LOOP, PENDING, UPDATING = 0, 1, 2, 3, 4
PHASE_NAMES = {
    IDLE: "idle",
    RUNNING_LOOP: "running_loop",
    WAITING_LOOP: "waiting_loop",
    PENDING: "pending",
    UPDATING: "updating",
}

PROFILE = "vllm-0.33"
"""The release profile the encoding mirrors."""

INT, BOOL = "int", "bool"

CONFIG_FIELDS = (
    ("max_num_batched_tokens", INT),
    ("max_num_seqs", INT),
    ("max_model_len", INT),
    ("long_prefill_token_threshold", INT),
    ("num_lookahead_tokens", INT),
    ("enable_chunked_prefill", BOOL),
    ("enable_prefix_caching", BOOL),
    ("reserve_full_sequence", BOOL),
    ("prefill_schedule_interval", INT),
)
SCALAR_FIELDS = (
    ("phase", INT),
    ("step", INT),
    ("num_free_blocks", INT),
    ("free_lo", INT),
    ("free_hi", INT),
    ("next_insert", INT),
    ("token_budget", INT),
    ("total_num_scheduled", INT),
    ("req_index", INT),
    ("threshold", INT),
    ("num_preemptions", INT),
    ("running_done", BOOL),
    ("waiting_done", BOOL),
    ("alloc_active", BOOL),
    ("alloc_request", INT),
    ("alloc_num_new", INT),
    ("defer_prefills", BOOL),
    ("prefill_in_step", BOOL),
    ("prefill_capacity_bound", BOOL),
    ("num_executed_steps", INT),
    ("last_prefill_step", INT),
)
BLOCK_FIELDS = (
    ("ref_cnt", INT),
    ("in_free", BOOL),
    ("free_key", INT),
    ("cached", BOOL),
    ("block_hash", INT),
    ("indexed", BOOL),
    ("insert_order", INT),
)
REQUEST_FIELDS = (
    ("status", INT),
    ("num_tokens", INT),
    ("num_prompt_tokens", INT),
    ("max_tokens", INT),
    ("num_computed_tokens", INT),
    ("priority", INT),
    ("arrival_time", INT),
    ("in_running", BOOL),
    ("running_pos", INT),
    ("in_waiting", BOOL),
    ("waiting_pos", INT),
    ("num_scheduled", INT),
    ("has_table", BOOL),
    ("num_blocks", INT),
    ("num_cached_blocks", INT),
    ("is_prefill_chunk", BOOL),
)
REQUEST_ROW_FIELDS = (("hashes", INT),)
"""Per slot, per table position ``i < B``."""
REQUEST_BLOCK_FIELDS = (("held", BOOL), ("table_pos", INT))
"""Per slot, per block id ``0..B`` (index 0, the null block, is a constant)."""
RECORD_FIELDS = (("rec_num_candidates", INT), ("rec_victim_pos", INT))
RECORD_ROW_FIELDS = (("rec_priority", INT), ("rec_arrival", INT))

ALL_FIELDS = tuple(
    name
    for group in (
        CONFIG_FIELDS,
        SCALAR_FIELDS,
        BLOCK_FIELDS,
        REQUEST_FIELDS,
        REQUEST_ROW_FIELDS,
        REQUEST_BLOCK_FIELDS,
        RECORD_FIELDS,
        RECORD_ROW_FIELDS,
    )
    for name, _ in group
)


@dataclass(frozen=True)
class Shape:
    """The Python-valued dimensions of a state (see module docstring)."""

    num_reqs: int
    num_blocks: int
    block_size: int = 2
    policy: str = "fcfs"

    def __post_init__(self) -> None:
        assert 1 <= self.num_reqs <= 10, "slots are named r0..r9"
        assert self.num_blocks >= 1 and self.block_size >= 1
        assert self.policy in ("fcfs", "priority")

    @property
    def is_priority(self) -> bool:
        return self.policy == "priority"

    @property
    def blocks(self) -> range:
        """Usable block ids."""
        return range(1, self.num_blocks + 1)

    @property
    def slots(self) -> range:
        return range(self.num_reqs)

    def label(self) -> str:
        return f"R={self.num_reqs},B={self.num_blocks},bs={self.block_size},{self.policy}"


def slot_id(r: int) -> str:
    """The request id of slot ``r`` (ids sort like slots)."""
    return f"r{r}"


class State:
    """One scheduler state: Python values or Z3 terms, field names as in the module docstring.

    Block fields are lists of ``B + 1`` (index 0, the null block, holds
    constants), request fields lists of ``R``, rows lists of lists.
    """

    __slots__ = ALL_FIELDS + ("shape",)

    def __init__(self, shape: Shape, **fields: Any) -> None:
        self.shape = shape
        for name in ALL_FIELDS:
            setattr(self, name, fields[name])

    def replace(self, **changes: Any) -> State:
        """A copy with some fields replaced (lists are shared unless replaced)."""
        fields = {name: getattr(self, name) for name in ALL_FIELDS}
        unknown = set(changes) - set(fields)
        assert not unknown, unknown
        fields.update(changes)
        return State(self.shape, **fields)

    def leaves(self) -> Iterator[tuple[str, Any, str]]:
        """Every leaf as ``(name, value, kind)``; the null block's constants are skipped."""
        sh = self.shape
        for group in (CONFIG_FIELDS, SCALAR_FIELDS):
            for name, kind in group:
                yield name, getattr(self, name), kind
        for name, kind in BLOCK_FIELDS:
            values = getattr(self, name)
            for b in sh.blocks:
                yield f"{name}[{b}]", values[b], kind
        for name, kind in REQUEST_FIELDS + RECORD_FIELDS:
            values = getattr(self, name)
            for r in sh.slots:
                yield f"{name}[{r}]", values[r], kind
        for name, kind in REQUEST_ROW_FIELDS:
            rows = getattr(self, name)
            for r in sh.slots:
                for i in range(sh.num_blocks):
                    yield f"{name}[{r}][{i}]", rows[r][i], kind
        for name, kind in REQUEST_BLOCK_FIELDS:
            rows = getattr(self, name)
            for r in sh.slots:
                for b in sh.blocks:
                    yield f"{name}[{r}][{b}]", rows[r][b], kind
        for name, kind in RECORD_ROW_FIELDS:
            rows = getattr(self, name)
            for k in sh.slots:
                for j in range(sh.num_reqs):
                    yield f"{name}[{k}][{j}]", rows[k][j], kind

    def map(self, fn: Callable[[str, Any, str], Any]) -> State:
        """A state with ``fn(name, value, kind)`` applied to every leaf (null block kept)."""
        sh = self.shape
        fields: dict[str, Any] = {}
        for group in (CONFIG_FIELDS, SCALAR_FIELDS):
            for name, kind in group:
                fields[name] = fn(name, getattr(self, name), kind)
        for name, kind in BLOCK_FIELDS:
            values = getattr(self, name)
            fields[name] = [values[0]] + [fn(f"{name}[{b}]", values[b], kind) for b in sh.blocks]
        for name, kind in REQUEST_FIELDS + RECORD_FIELDS:
            values = getattr(self, name)
            fields[name] = [fn(f"{name}[{r}]", values[r], kind) for r in sh.slots]
        for name, kind in REQUEST_ROW_FIELDS:
            rows = getattr(self, name)
            fields[name] = [[fn(f"{name}[{r}][{i}]", rows[r][i], kind) for i in range(sh.num_blocks)] for r in sh.slots]
        for name, kind in REQUEST_BLOCK_FIELDS:
            rows = getattr(self, name)
            fields[name] = [
                [rows[r][0]] + [fn(f"{name}[{r}][{b}]", rows[r][b], kind) for b in sh.blocks] for r in sh.slots
            ]
        for name, kind in RECORD_ROW_FIELDS:
            rows = getattr(self, name)
            fields[name] = [[fn(f"{name}[{k}][{j}]", rows[k][j], kind) for j in range(sh.num_reqs)] for k in sh.slots]
        return State(sh, **fields)

    # ----------------------------------------------------------- derived values
    def live(self, r: int) -> Any:
        """Slot ``r`` holds a live request (WAITING, RUNNING or PREEMPTED)."""
        st = self.status[r]
        if not is_z3(st):
            return st in (WAITING, RUNNING, PREEMPTED)
        return z3.And(st >= WAITING, st <= PREEMPTED)

    def num_running(self) -> Any:
        """``len(running)`` (the same term under any renaming of the slots)."""
        return count_set(self.in_running[r] for r in self.shape.slots)

    def num_waiting(self) -> Any:
        """``len(waiting)`` (the same term under any renaming of the slots)."""
        return count_set(self.in_waiting[r] for r in self.shape.slots)

    def num_full_blocks(self, r: int) -> Any:
        """``len(request.block_hashes)``: the full blocks of its tokens."""
        return fdiv(self.num_tokens[r], self.shape.block_size)

    def block_attr(self, name: str, block: Any) -> Any:
        """Attribute ``name`` of a block given by a possibly symbolic id (null block's for id 0)."""
        values = getattr(self, name)
        return select(values, block, values[0])

    def in_step(self) -> Any:
        """Inside ``schedule()``."""
        ph = self.phase
        return land(ph >= RUNNING_LOOP, ph <= WAITING_LOOP) if is_z3(ph) else ph in (RUNNING_LOOP, WAITING_LOOP)

    def has_output(self) -> Any:
        """The step's scheduled tokens are visible: inside ``schedule()`` or pending."""
        ph = self.phase
        return land(ph >= RUNNING_LOOP, ph <= PENDING) if is_z3(ph) else ph in (RUNNING_LOOP, WAITING_LOOP, PENDING)


# --------------------------------------------------------------- construction


def _var(kind: str, name: str) -> z3.ExprRef:
    return z3.Int(name) if kind == INT else z3.Bool(name)


def _null_block_values() -> dict[str, Any]:
    return {
        "ref_cnt": 0,
        "in_free": False,
        "free_key": 0,
        "cached": False,
        "block_hash": 0,
        "indexed": False,
        "insert_order": 0,
    }


def fresh_state(shape: Shape, tag: str = "s") -> State:
    """A state whose every leaf is a fresh Z3 constant named ``tag.field[index]``."""
    sh = shape
    fields: dict[str, Any] = {}
    for group in (CONFIG_FIELDS, SCALAR_FIELDS):
        for name, kind in group:
            fields[name] = _var(kind, f"{tag}.{name}")
    null = _null_block_values()
    for name, kind in BLOCK_FIELDS:
        null_value = z3.IntVal(null[name]) if kind == INT else z3.BoolVal(null[name])
        fields[name] = [null_value] + [_var(kind, f"{tag}.{name}[{b}]") for b in sh.blocks]
    for name, kind in REQUEST_FIELDS + RECORD_FIELDS:
        fields[name] = [_var(kind, f"{tag}.{name}[{r}]") for r in sh.slots]
    for name, kind in REQUEST_ROW_FIELDS:
        fields[name] = [[_var(kind, f"{tag}.{name}[{r}][{i}]") for i in range(sh.num_blocks)] for r in sh.slots]
    for name, kind in REQUEST_BLOCK_FIELDS:
        null_value = z3.IntVal(0) if kind == INT else z3.BoolVal(False)
        fields[name] = [[null_value] + [_var(kind, f"{tag}.{name}[{r}][{b}]") for b in sh.blocks] for r in sh.slots]
    for name, kind in RECORD_ROW_FIELDS:
        fields[name] = [[_var(kind, f"{tag}.{name}[{k}][{j}]") for j in range(sh.num_reqs)] for k in sh.slots]
    return State(sh, **fields)


def bind(symbolic: State, concrete: State) -> list[z3.BoolRef]:
    """Equalities fixing every leaf of ``symbolic`` to the value of ``concrete``."""
    out = []
    for (_, sym, kind), (_, val, _) in zip(symbolic.leaves(), concrete.leaves()):
        if kind == INT:
            out.append(sym == z3.IntVal(int(val)))
        else:
            out.append(sym == z3.BoolVal(bool(val)))
    return out


def evaluate(state: State, model: z3.ModelRef) -> State:
    """The Python values of every leaf of ``state`` in ``model``."""

    def ev(name: str, value: Any, kind: str) -> Any:
        if not is_z3(value):
            return value
        return value_of(model.eval(value, model_completion=True))

    return state.map(ev)


def to_python(state: State) -> State:
    """Ground Z3 literals to Python values (fails on a non-ground term)."""
    return state.map(lambda name, value, kind: value_of(z3.simplify(value)) if is_z3(value) else value)


# --------------------------------------------------------------- the view


class _GuardedPreemption:
    """One (record, candidate count, victim position) case of a symbolic preemption record.

    ``inv_victim_order`` needs a Python ``victim_pos`` and a Python-length
    ``candidate_keys``. The symbolic view therefore lists, for every record
    slot ``k`` and every pair ``0 <= v < n <= R``, one case that is *active*
    when record ``k`` exists with ``n`` candidates and victim ``v``. An
    inactive case shows the priority policy and keys under which the rule
    holds trivially (all ``(0, 0)`` but the victim's ``(1, 0)``).
    """

    def __init__(self, policy: Any, victim_pos: int, candidate_keys: tuple[tuple[Any, Any], ...]) -> None:
        self.policy = policy
        self.victim_pos = victim_pos
        self.candidate_keys = candidate_keys


class SymbolicView:
    """The state view of a :class:`State` with the names of :class:`schedconf.spec.v1.view.ConcreteView`."""

    def __init__(self, s: State) -> None:
        sh = s.shape
        self._s = s
        self.step = s.step
        self.num_gpu_blocks = sh.num_blocks + 1
        self.block_size = sh.block_size
        self.max_num_batched_tokens = s.max_num_batched_tokens
        self.max_num_seqs = s.max_num_seqs
        self.num_spec_tokens = 0
        self.num_free_blocks = s.num_free_blocks
        out = s.has_output()
        # The step in progress or pending held prefill back (throttle_prefills or the local cadence).
        self.deferred_prefills = land(out, s.defer_prefills)
        self._out = out
        # A request aborted while the step is pending keeps its place in the
        # output; its tokens count as given back (spec/v1/view.py).
        self._live = [s.live(r) for r in sh.slots]
        aborted = total(ite(self._live[r], 0, s.num_scheduled[r]) for r in sh.slots)
        self.total_num_scheduled_tokens = ite(out, s.total_num_scheduled - aborted, 0)
        self.remaining_token_budget = ite(out, s.token_budget + aborted, s.max_num_batched_tokens)
        self.blocks = list(sh.blocks)
        self.null_block = 0
        self.requests = list(sh.slots)
        self._live = [s.live(r) for r in sh.slots]
        self.orphans_in_queues = total(
            (
                count(land(lnot(self._live[r]), s.in_running[r]) for r in sh.slots),
                count(land(lnot(self._live[r]), s.in_waiting[r]) for r in sh.slots),
            )
        )
        self.num_running = s.num_running()
        self.orphan_tables = count(land(lnot(self._live[r]), s.has_table[r]) for r in sh.slots)
        self.hold_pairs = [(r, b) for r in sh.slots for b in sh.blocks]
        # A table position is named by the block there: (slot, block).
        self.table_positions = [(r, b) for r in sh.slots for b in sh.blocks]
        self.preemptions = self._preemption_cases()

    def _held(self, r: int, b: int) -> Any:
        s = self._s
        return land(s.has_table[r], s.held[r][b])

    def _preemption_cases(self) -> list[_GuardedPreemption]:
        s = self._s
        sh = s.shape
        cases = []
        for k in sh.slots:
            exists = land(self._out, k < s.num_preemptions)
            for n in range(1, sh.num_reqs + 1):
                for v in range(n):
                    active = land(exists, s.rec_num_candidates[k] == n, s.rec_victim_pos[k] == v)
                    if active is False:
                        continue
                    keys = tuple(
                        (ite(active, s.rec_priority[k][c], 1 if c == v else 0), ite(active, s.rec_arrival[k][c], 0))
                        for c in range(n)
                    )
                    policy = PRIORITY if sh.is_priority else ite(active, FCFS, PRIORITY)
                    cases.append(_GuardedPreemption(policy, v, keys))
        return cases

    # blocks
    def ref_cnt(self, b: int) -> Any:
        return self._s.ref_cnt[b]

    def in_free_queue(self, b: int) -> Any:
        return self._s.in_free[b]

    def num_holders(self, b: int) -> Any:
        s = self._s
        if b == 0:
            return 0  # the representation has no entry for the null block
        return count(self._held(r, b) for r in s.shape.slots)

    def is_cached(self, b: int) -> Any:
        return self._s.cached[b]

    def is_indexed(self, b: int) -> Any:
        return self._s.indexed[b]

    # requests
    def status(self, r: int) -> Any:
        return ite(self._live[r], self._s.status[r], DEAD)

    def num_in_running(self, r: int) -> Any:
        return ite(land(self._live[r], self._s.in_running[r]), 1, 0)

    def num_in_waiting(self, r: int) -> Any:
        return ite(land(self._live[r], self._s.in_waiting[r]), 1, 0)

    def num_tokens(self, r: int) -> Any:
        return ite(self._live[r], self._s.num_tokens[r], 0)

    def num_computed_tokens(self, r: int) -> Any:
        s = self._s
        computed = s.num_computed_tokens[r] + ite(s.in_step(), s.num_scheduled[r], 0)
        return ite(self._live[r], computed, 0)

    def num_blocks(self, r: int) -> Any:
        s = self._s
        return ite(land(self._live[r], s.has_table[r]), s.num_blocks[r], 0)

    # The encoding is synchronous (one step in flight at most, no placeholders):
    # a request's in-flight tokens are the pending step's, nothing is stale.
    def num_output_placeholders(self, r: int) -> Any:
        return 0

    def num_in_flight_tokens(self, r: int) -> Any:
        return self.num_scheduled_tokens(r)

    def num_stale_output_tokens(self, r: int) -> Any:
        return 0

    def num_in_flight_scheduled(self, r: int) -> Any:
        return self.num_scheduled_tokens(r)

    def num_in_flight_samples(self, r: int) -> Any:
        return 0

    def num_scheduled_tokens(self, r: int) -> Any:
        return ite(land(self._out, self._live[r]), self._s.num_scheduled[r], 0)

    def hold_count(self, pair: tuple[int, int]) -> Any:
        r, b = pair
        return ite(land(self._live[r], self._held(r, b)), 1, 0)

    # table positions, named (slot, block)
    def position_is_cached(self, pos: tuple[int, int]) -> Any:
        r, b = pos
        return land(self._live[r], self._held(r, b), self._s.cached[b])

    def position_hash_matches(self, pos: tuple[int, int]) -> Any:
        r, b = pos
        s = self._s
        i = s.table_pos[r][b]
        return land(
            0 <= i, i < s.num_full_blocks(r), s.cached[b], s.block_hash[b] == select(s.hashes[r], i, s.hashes[r][0])
        )


# --------------------------------------------------------------- lemmas


def _distinct_positions(o: Any, members: list[Any], positions: list[Any], size: Any, what: str) -> Any:
    """Members' positions lie in ``[0, size)`` and differ pairwise: a permutation of ``[0, size)``."""
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
    """The configuration passes SchedulerConfig validation (spec/v1/config.py), for this shape."""
    sh = s.shape
    return o.and_(
        o.le(1, s.max_num_batched_tokens),
        o.le(1, s.max_num_seqs),
        o.le(1, s.max_model_len),
        o.le(cdiv(s.max_model_len, sh.block_size), sh.num_blocks),
        o.le(0, s.long_prefill_token_threshold),
        o.le(0, s.num_lookahead_tokens),
        o.le(1, s.prefill_schedule_interval),
        o.or_(s.enable_chunked_prefill, o.le(s.max_model_len, s.max_num_batched_tokens)),
        o.le(s.max_num_seqs, s.max_num_batched_tokens),
        # vllm-0.33 (spec/v1/profiles.py check_config_for_profile)
        o.le(s.long_prefill_token_threshold, s.max_model_len),
    )


def lemma_step(s: State, o: Any) -> Any:
    """Phase bookkeeping: idle means nothing scheduled; the budget is what the scheduled tokens left; the cursor is in range and nothing at or after it is scheduled; records are well formed."""
    sh = s.shape
    in_step_or_pending = s.has_output()
    sched_total = total(s.num_scheduled[r] for r in sh.slots)
    return o.and_(
        o.le(0, s.phase),
        o.le(s.phase, UPDATING),
        o.le(0, s.step),
        o.forall(sh.slots, lambda r: o.le(0, s.num_scheduled[r]), lambda r: f"slot {r} scheduled"),
        o.implies(o.eq(s.phase, IDLE), o.and_(o.eq(s.num_preemptions, 0), o.eq(sched_total, 0))),
        o.implies(in_step_or_pending, o.eq(s.token_budget, s.max_num_batched_tokens - sched_total)),
        o.implies(s.in_step(), o.eq(s.total_num_scheduled, sched_total)),
        # Inside schedule() nothing is aborted: only RUNNING requests are scheduled.
        o.implies(
            s.in_step(),
            o.forall(
                sh.slots,
                lambda r: o.implies(o.lt(0, s.num_scheduled[r]), o.and_(s.live(r), o.eq(s.status[r], RUNNING))),
                lambda r: f"slot {r} scheduled in the step",
            ),
        ),
        o.le(0, s.num_preemptions),
        o.le(s.num_preemptions, sh.num_reqs),
        # Each preemption removes a running request and none is admitted after one.
        o.implies(in_step_or_pending, o.le(s.num_preemptions + s.num_running(), sh.num_reqs)),
        o.implies(
            o.eq(s.phase, RUNNING_LOOP),
            o.and_(
                o.le(0, s.req_index),
                o.le(s.req_index, s.num_running()),
                o.forall(
                    sh.slots,
                    lambda r: o.implies(
                        o.and_(s.in_running[r], o.le(s.req_index, s.running_pos[r])), o.eq(s.num_scheduled[r], 0)
                    ),
                    lambda r: f"slot {r} after the cursor",
                ),
            ),
        ),
        o.implies(s.in_step(), o.or_(o.eq(s.threshold, 0), o.eq(s.threshold, s.long_prefill_token_threshold))),
        o.implies(
            s.alloc_active,
            o.and_(
                o.eq(s.phase, RUNNING_LOOP),
                o.not_(s.running_done),
                o.forall(
                    sh.slots,
                    lambda r: o.implies(
                        o.eq(s.alloc_request, r),
                        o.and_(
                            s.live(r),
                            o.eq(s.status[r], RUNNING),
                            s.in_running[r],
                            o.eq(s.running_pos[r], s.req_index),
                            o.eq(s.num_scheduled[r], 0),
                            o.lt(0, s.alloc_num_new),
                            o.le(s.alloc_num_new, s.num_tokens[r] - s.num_computed_tokens[r]),
                            o.le(s.num_computed_tokens[r] + s.alloc_num_new, s.max_model_len - 1),
                            o.le(s.alloc_num_new, s.token_budget),
                            # A step that holds prefill back skips running prefill chunks.
                            o.implies(s.defer_prefills, o.not_(s.is_prefill_chunk[r])),
                        ),
                    ),
                    lambda r: f"slot {r} allocating",
                ),
                o.le(0, s.alloc_request),
                o.lt(s.alloc_request, sh.num_reqs),
            ),
        ),
        o.implies(o.and_(o.eq(s.phase, WAITING_LOOP), o.lt(0, s.num_preemptions)), s.waiting_done),
        o.implies(
            o.eq(s.phase, UPDATING),
            o.forall(
                sh.slots,
                lambda r: o.implies(o.and_(s.live(r), o.lt(0, s.num_scheduled[r])), o.eq(s.status[r], RUNNING)),
                lambda r: f"slot {r} to update",
            ),
        ),
        o.forall(
            sh.slots,
            lambda k: o.implies(
                o.lt(k, s.num_preemptions),
                o.and_(
                    o.le(1, s.rec_num_candidates[k]),
                    o.le(s.rec_num_candidates[k], sh.num_reqs),
                    o.le(0, s.rec_victim_pos[k]),
                    o.lt(s.rec_victim_pos[k], s.rec_num_candidates[k]),
                ),
            ),
            lambda k: f"record {k}",
        ),
    )


def lemma_deferral(s: State, o: Any) -> Any:
    """A running request that is not a prefill chunk lacks at most one token (the one its last step sampled), unless this step scheduled it already."""
    sh = s.shape
    return o.forall(
        sh.slots,
        lambda r: o.implies(
            o.and_(
                s.live(r),
                o.eq(s.status[r], RUNNING),
                o.not_(s.is_prefill_chunk[r]),
                o.not_(o.and_(s.in_step(), o.lt(0, s.num_scheduled[r]))),
            ),
            o.le(s.num_tokens[r] - s.num_computed_tokens[r], 1),
        ),
        lambda r: f"slot {r}",
    )


def lemma_free_queue(s: State, o: Any) -> Any:
    """Free blocks have distinct eviction keys strictly between free_lo and free_hi; prefix-map insertion orders differ and are below next_insert."""
    sh = s.shape
    blocks = list(sh.blocks)
    return o.and_(
        o.lt(s.free_lo, s.free_hi),
        o.forall(
            blocks,
            lambda b: o.implies(s.in_free[b], o.and_(o.lt(s.free_lo, s.free_key[b]), o.lt(s.free_key[b], s.free_hi))),
            lambda b: f"free block {b}",
        ),
        o.forall(
            [(b, c) for b in blocks for c in blocks if b < c],
            lambda p: o.implies(
                o.and_(s.in_free[p[0]], s.in_free[p[1]]), o.not_(o.eq(s.free_key[p[0]], s.free_key[p[1]]))
            ),
            lambda p: f"free blocks {p[0]} and {p[1]}",
        ),
        o.le(0, s.next_insert),
        _distinct_positions(
            o, [s.indexed[b] for b in blocks], [s.insert_order[b] for b in blocks], s.next_insert, "indexed block"
        ),
    )


def lemma_requests(s: State, o: Any) -> Any:
    """Live requests: 1 <= prompt <= num_tokens <= max_model_len - 1, outputs below max_tokens, a block table iff RUNNING; queue positions are permutations."""
    sh = s.shape
    slots = list(sh.slots)

    def one(r: int) -> Any:
        return o.and_(
            o.or_(o.eq(s.status[r], DEAD), s.live(r)),
            o.implies(
                s.live(r),
                o.and_(
                    o.le(1, s.num_prompt_tokens[r]),
                    o.le(s.num_prompt_tokens[r], s.num_tokens[r]),
                    o.le(s.num_tokens[r], s.max_model_len - 1),
                    o.lt(s.num_tokens[r] - s.num_prompt_tokens[r], s.max_tokens[r]),
                    o.eq(s.has_table[r], o.eq(s.status[r], RUNNING)),
                ),
            ),
            o.implies(
                s.has_table[r],
                o.and_(
                    o.le(0, s.num_cached_blocks[r]),
                    o.le(s.num_cached_blocks[r], s.num_blocks[r]),
                ),
            ),
            # A table's blocks sit at distinct positions in [0, num_blocks); no entry, no blocks.
            o.forall(
                sh.blocks,
                lambda b: o.implies(
                    s.held[r][b],
                    o.and_(s.has_table[r], o.le(0, s.table_pos[r][b]), o.lt(s.table_pos[r][b], s.num_blocks[r])),
                ),
                lambda b: f"slot {r} block {b}",
            ),
            o.forall(
                [(b, c) for b in sh.blocks for c in sh.blocks if b < c],
                lambda p: o.implies(
                    o.and_(s.held[r][p[0]], s.held[r][p[1]]), o.not_(o.eq(s.table_pos[r][p[0]], s.table_pos[r][p[1]]))
                ),
                lambda p: f"slot {r} blocks {p[0]} and {p[1]}",
            ),
        )

    parts = [
        o.forall(slots, one, lambda r: f"slot {r}"),
        _distinct_positions(
            o, [s.in_running[r] for r in slots], [s.running_pos[r] for r in slots], s.num_running(), "running slot"
        ),
    ]
    if not sh.is_priority:
        parts.append(
            _distinct_positions(
                o, [s.in_waiting[r] for r in slots], [s.waiting_pos[r] for r in slots], s.num_waiting(), "waiting slot"
            )
        )
    return o.and_(*parts)


def lemma_cached_prefix(s: State, o: Any) -> Any:
    """A table's first num_cached_block entries are exactly its cached blocks; an uncached block has at most one holder; no caching, no hashes."""
    sh = s.shape

    def table_ok(r: int) -> Any:
        return o.implies(
            o.and_(s.live(r), s.has_table[r]),
            o.and_(
                o.le(s.num_cached_blocks[r], s.num_full_blocks(r)),
                o.forall(
                    sh.blocks,
                    lambda b: o.implies(
                        s.held[r][b], o.eq(s.cached[b], o.lt(s.table_pos[r][b], s.num_cached_blocks[r]))
                    ),
                    lambda b: f"slot {r} block {b}",
                ),
            ),
        )

    return o.and_(
        o.forall(sh.slots, table_ok, lambda r: f"slot {r}"),
        o.forall(sh.blocks, lambda b: o.implies(o.not_(s.cached[b]), o.le(s.ref_cnt[b], 1)), lambda b: f"block {b}"),
        o.implies(
            o.not_(s.enable_prefix_caching),
            o.forall(sh.blocks, lambda b: o.not_(o.or_(s.cached[b], s.indexed[b])), lambda b: f"block {b}"),
        ),
    )


def lemma_hashes(s: State, o: Any) -> Any:
    """A live request's block hashes differ pairwise (a chained hash encodes its prefix length)."""
    sh = s.shape
    n = sh.num_blocks
    return o.forall(
        [(r, i, j) for r in sh.slots for i in range(n) for j in range(i + 1, n)],
        lambda p: o.implies(
            o.and_(s.live(p[0]), o.lt(p[2], s.num_full_blocks(p[0]))),
            o.not_(o.eq(s.hashes[p[0]][p[1]], s.hashes[p[0]][p[2]])),
        ),
        lambda p: f"slot {p[0]} hashes {p[1]} and {p[2]}",
    )


def free_rank(s: State, b: int) -> Any:
    """How many free blocks come before block ``b`` in the free queue (its position if it is free)."""
    return count(land(s.in_free[c], s.free_key[c] < s.free_key[b]) for c in s.shape.blocks if c != b)


def theorem_rank(s: State, n: Any) -> Any:
    """For ``0 <= n <= num_free_blocks``: exactly ``n`` free blocks have fewer than ``n`` free blocks before them; and (for any keys) a free block before another has a smaller rank.

    Holds in every state whose free blocks have distinct keys and number
    ``num_free_blocks`` (a fact about finite orders, not about the model);
    ``proofs.prove_theorem_rank`` proves it for a shape, after which
    transitions use instances of it as premises.
    """
    sh = s.shape
    hypothesis = land(
        eq_(count(s.in_free[b] for b in sh.blocks), s.num_free_blocks),
        *(
            limplies(land(s.in_free[b], s.in_free[c]), lnot(eq_(s.free_key[b], s.free_key[c])))
            for b in sh.blocks
            for c in sh.blocks
            if b < c
        ),
        0 <= n,
        n <= s.num_free_blocks,
    )
    rank = {b: free_rank(s, b) for b in sh.blocks}
    # Needs no hypothesis: every free block before b is before c too, and b is one more.
    monotone = land(
        *(
            limplies(land(s.in_free[b], s.in_free[c], s.free_key[b] < s.free_key[c]), rank[b] < rank[c])
            for b in sh.blocks
            for c in sh.blocks
            if b != c
        )
    )
    return land(limplies(hypothesis, eq_(count(land(s.in_free[b], rank[b] < n) for b in sh.blocks), n)), monotone)


def order_rank(members: dict[int, Any], keys: dict[int, Any], b: int, descending: bool = False) -> Any:
    """How many other members come before member ``b`` by key (larger keys first when ``descending``)."""
    return count(land(members[c], keys[c] > keys[b] if descending else keys[c] < keys[b]) for c in members if c != b)


def theorem_order(
    members: dict[int, Any], keys: dict[int, Any], descending: bool = False, rank: dict[int, Any] | None = None
) -> Any:
    """Ranks by key within a subset: a member before another has a smaller rank, and every rank is below the subset's size.

    Valid for any Booleans ``members`` and integers ``keys`` over the same
    index set (transitivity of ``<``); ``proofs.prove_theorem_order`` proves
    it for index sets of a given size, after which transitions use instances
    of it as premises. ``rank``: stand-ins for the ranks (``order_rank`` by
    default), of which the same is said.
    """
    size = count(members.values())
    rank = rank or {b: order_rank(members, keys, b, descending) for b in members}
    before = (lambda x, y: x > y) if descending else (lambda x, y: x < y)
    return land(
        *(
            limplies(land(members[b], members[c], before(keys[b], keys[c])), rank[b] < rank[c])
            for b in members
            for c in members
            if b != c
        ),
        *(limplies(members[b], rank[b] < size) for b in members),
    )


LEMMAS: dict[str, Callable[[State, Any], Any]] = {
    fn.__name__.removeprefix("lemma_"): fn
    for fn in (
        lemma_config,
        lemma_step,
        lemma_free_queue,
        lemma_requests,
        lemma_cached_prefix,
        lemma_hashes,
        lemma_deferral,
    )
}


# --------------------------------------------------------------- concrete bridges


@dataclass
class Snapshot:
    """A concrete state together with the naming it was read with.

    ``slot_ids[r]`` is the request id in slot ``r`` (None: never used);
    ``hash_ids`` numbers the distinct block-hash byte strings from 1.
    """

    state: State
    slot_ids: list[str | None]
    hash_ids: dict[bytes, int]

    def hash_id(self, h: bytes) -> int:
        """The number of hash ``h``, allocating the next one on first sight."""
        if h not in self.hash_ids:
            self.hash_ids[h] = len(self.hash_ids) + 1
        return self.hash_ids[h]


def assign_slots(sched: Scheduler, shape: Shape, extra_ids: tuple[str, ...] = ()) -> list[str | None]:
    """Slots in request-id order for every id the scheduler mentions, plus ``extra_ids``."""
    ids: set[str] = set(sched.requests) | set(extra_ids)
    ids |= {r.request_id for r in sched.running} | {r.request_id for r in sched.waiting}
    ids |= set(sched.kv_cache_manager.req_to_blocks)
    if sched.pending_output is not None:
        ids |= set(sched.pending_output.num_scheduled_tokens)
    ordered: list[str | None] = sorted(ids)
    if len(ordered) > shape.num_reqs:
        raise ValueError(f"{len(ordered)} request ids do not fit {shape.num_reqs} slots")
    return ordered + [None] * (shape.num_reqs - len(ordered))


def shape_of(sched: Scheduler, num_reqs: int) -> Shape:
    """The shape matching a scheduler's pool and policy, with ``num_reqs`` slots."""
    cfg = sched.config
    return Shape(num_reqs=num_reqs, num_blocks=cfg.num_gpu_blocks - 1, block_size=cfg.block_size, policy=cfg.policy)


def from_scheduler(
    sched: Scheduler,
    shape: Shape,
    *,
    step_state: _StepState | None = None,
    phase: int | None = None,
    req_index: int = 0,
    threshold: int = 0,
    running_done: bool = False,
    waiting_done: bool = False,
    slot_ids: list[str | None] | None = None,
    hash_ids: dict[bytes, int] | None = None,
) -> Snapshot:
    """Read a concrete scheduler into a Python-valued :class:`State`.

    Without ``step_state`` the phase is PENDING when an output is pending,
    else IDLE. With it (a ``_StepState`` of a ``schedule()`` in progress) the
    caller gives the phase, cursor, threshold and loop flags.
    """
    cfg = sched.config
    assert cfg.num_gpu_blocks == shape.num_blocks + 1 and cfg.block_size == shape.block_size
    assert cfg.policy == shape.policy and cfg.num_spec_tokens == 0
    snap = Snapshot(state=None, slot_ids=slot_ids or assign_slots(sched, shape), hash_ids=dict(hash_ids or {}))  # type: ignore[arg-type]
    pool = sched.block_pool
    kv = sched.kv_cache_manager
    pending = sched.pending_output
    if step_state is not None:
        assert phase in (RUNNING_LOOP, WAITING_LOOP)
        scheduled = dict(step_state.num_scheduled_tokens)
        records = list(step_state.preemptions)
        budget = step_state.token_budget
        total_scheduled = sum(scheduled.values())
        defer_prefills = step_state.defer_prefills
        prefill_in_step = step_state.prefill_scheduled or step_state.prefill_admitted
    else:
        phase = PENDING if pending is not None else IDLE
        scheduled = dict(pending.num_scheduled_tokens) if pending is not None else {}
        records = list(sched.last_step.preemptions) if pending is not None and sched.last_step else []
        budget = cfg.max_num_batched_tokens - sum(scheduled.values())
        total_scheduled = pending.total_num_scheduled_tokens if pending is not None else 0
        if pending is not None and sched.last_step is not None:
            budget = getattr(sched.last_step, "remaining_token_budget", budget)
        defer_prefills = pending is not None and sched.last_step is not None and sched.last_step.defer_prefills
        prefill_in_step = False

    B, R = shape.num_blocks, shape.num_reqs
    free_order = [b.block_id for b in pool.free_block_queue]
    free_pos = {bid: i for i, bid in enumerate(free_order)}
    num_free_listed = len(free_order)
    insert_order: dict[int, int] = {}
    indexed: dict[int, bool] = {}
    n_insert = 0
    for key, entries in pool.cached_block_hash_to_block.items():
        for bid, block in entries.items():
            indexed[bid] = block.block_hash == key and block.block_id == bid
            insert_order[bid] = n_insert
            n_insert += 1
    null = _null_block_values()
    blocks = pool.blocks
    fields: dict[str, Any] = {
        "max_num_batched_tokens": cfg.max_num_batched_tokens,
        "max_num_seqs": cfg.max_num_seqs,
        "max_model_len": cfg.max_model_len,
        "long_prefill_token_threshold": cfg.long_prefill_token_threshold,
        "num_lookahead_tokens": cfg.num_lookahead_tokens,
        "enable_chunked_prefill": cfg.enable_chunked_prefill,
        "enable_prefix_caching": cfg.enable_prefix_caching,
        "reserve_full_sequence": sched.reserve_full_sequence,
        "prefill_schedule_interval": cfg.prefill_schedule_interval,
        "phase": phase,
        "step": sched.current_step,
        "num_free_blocks": pool.get_num_free_blocks(),
        "free_lo": -1,
        "free_hi": num_free_listed,
        "next_insert": n_insert,
        "token_budget": budget,
        "total_num_scheduled": total_scheduled,
        "req_index": req_index,
        "threshold": threshold,
        "num_preemptions": len(records),
        "running_done": running_done,
        "waiting_done": waiting_done,
        "alloc_active": False,
        "alloc_request": 0,
        "alloc_num_new": 0,
        "defer_prefills": defer_prefills,
        "prefill_in_step": prefill_in_step,
        "prefill_capacity_bound": sched.prefill_capacity_bound,
        "num_executed_steps": sched.num_executed_steps,
        "last_prefill_step": sched.last_prefill_step,
        "ref_cnt": [null["ref_cnt"]] + [blocks[b].ref_cnt for b in shape.blocks],
        "in_free": [False] + [b in free_pos for b in shape.blocks],
        "free_key": [0] + [free_pos.get(b, 0) for b in shape.blocks],
        "cached": [False] + [blocks[b].block_hash is not None for b in shape.blocks],
        "block_hash": [0]
        + [snap.hash_id(blocks[b].block_hash) if blocks[b].block_hash is not None else 0 for b in shape.blocks],
        "indexed": [False] + [indexed.get(b, False) for b in shape.blocks],
        "insert_order": [0] + [insert_order.get(b, 0) for b in shape.blocks],
    }
    running_ids = [r.request_id for r in sched.running]
    waiting_ids = [r.request_id for r in sched.waiting]
    per: dict[str, list[Any]] = {name: [] for name, _ in REQUEST_FIELDS + REQUEST_ROW_FIELDS + REQUEST_BLOCK_FIELDS}
    for r in range(R):
        rid = snap.slot_ids[r]
        req = sched.requests.get(rid) if rid is not None else None
        table = [b.block_id for b in kv.req_to_blocks.get(rid, [])] if rid is not None else []
        hashes = [snap.hash_id(h) for h in req.block_hashes] if req is not None else []
        row = {
            "status": STATUS_CODES.get(req.status, DEAD) if req is not None else DEAD,
            "num_tokens": req.num_tokens if req else 0,
            "num_prompt_tokens": req.num_prompt_tokens if req else 0,
            "max_tokens": req.max_tokens if req else 0,
            "num_computed_tokens": req.num_computed_tokens if req else 0,
            "priority": req.priority if req else 0,
            "arrival_time": req.arrival_time if req else 0,
            "in_running": rid in running_ids,
            "running_pos": running_ids.index(rid) if rid in running_ids else 0,
            "in_waiting": rid in waiting_ids,
            "waiting_pos": waiting_ids.index(rid) if rid in waiting_ids else 0,
            "num_scheduled": scheduled.get(rid, 0) if rid is not None else 0,
            "has_table": rid is not None and rid in kv.req_to_blocks,
            "num_blocks": len(table),
            "num_cached_blocks": kv.num_cached_block.get(rid, 0) if rid is not None else 0,
            "is_prefill_chunk": req.is_prefill_chunk if req else False,
            "held": [False] + [b in table for b in shape.blocks],
            "table_pos": [0] + [table.index(b) if b in table else 0 for b in shape.blocks],
            "hashes": (hashes + [0] * B)[:B],
        }
        if len(set(table)) != len(table):
            raise ValueError(f"request {rid} holds a block twice: the position map cannot represent it")
        if len(hashes) > B:
            raise ValueError(f"request {rid} has more than {B} block hashes")
        for name in per:
            per[name].append(row[name])
    fields.update(per)
    rec_n, rec_v, rec_p, rec_a = [], [], [], []
    for k in range(R):
        if k < len(records):
            p = records[k]
            ids = [c[0] for c in p.candidates]
            rec_n.append(len(ids))
            rec_v.append(ids.index(p.victim_id))
            rec_p.append(([c[1] for c in p.candidates] + [0] * R)[:R])
            rec_a.append(([c[2] for c in p.candidates] + [0] * R)[:R])
        else:
            rec_n.append(0)
            rec_v.append(0)
            rec_p.append([0] * R)
            rec_a.append([0] * R)
    fields.update(rec_num_candidates=rec_n, rec_victim_pos=rec_v, rec_priority=rec_p, rec_arrival=rec_a)
    snap.state = State(shape, **fields)
    return snap


def hash_bytes(h: int) -> bytes:
    """The synthetic block-hash bytes standing for abstract hash ``h``."""
    return hashlib.sha256(b"schedconf/symbolic-hash\x00" + str(h).encode()).digest()


def config_of(s: State) -> SchedulerConfig:
    """The SchedulerConfig of a Python-valued state."""
    sh = s.shape
    return SchedulerConfig(
        block_size=sh.block_size,
        num_gpu_blocks=sh.num_blocks + 1,
        max_num_batched_tokens=s.max_num_batched_tokens,
        max_num_seqs=s.max_num_seqs,
        max_model_len=s.max_model_len,
        enable_chunked_prefill=s.enable_chunked_prefill,
        long_prefill_token_threshold=s.long_prefill_token_threshold,
        enable_prefix_caching=s.enable_prefix_caching,
        policy=sh.policy,
        num_spec_tokens=0,
        num_lookahead_tokens=s.num_lookahead_tokens,
        scheduler_reserve_full_isl=s.reserve_full_sequence,
        prefill_schedule_interval=s.prefill_schedule_interval,
    )


def to_scheduler(s: State, token_of: Callable[[int, int], int] | None = None) -> tuple[Scheduler, _StepState | None]:
    """Build a concrete scheduler in the state ``s`` (Python values), by state injection.

    Hashes become synthetic bytes (:func:`hash_bytes`); prompt and output
    tokens are ``token_of(slot, position)`` (default ``100 + position``), so
    they never equal an EOS (requests get none). Inside ``schedule()`` the
    returned ``_StepState`` carries the step's bookkeeping; the requests
    preempted earlier in the step are represented by placeholders (only their
    number matters to the model).
    """
    sh = s.shape
    token_of = token_of or (lambda r, i: 100 + i)
    sched = Scheduler(config_of(s), PROFILE)
    pool = sched.block_pool
    kv = sched.kv_cache_manager
    for b in sh.blocks:
        block = pool.blocks[b]
        block.ref_cnt = s.ref_cnt[b]
        block.block_hash = hash_bytes(s.block_hash[b]) if s.cached[b] else None
    pool.cached_block_hash_to_block.clear()
    for b in sorted((b for b in sh.blocks if s.indexed[b]), key=lambda b: s.insert_order[b]):
        pool.cached_block_hash_to_block.setdefault(hash_bytes(s.block_hash[b]), {})[b] = pool.blocks[b]
    for b in sh.blocks:
        pool.blocks[b].prev_free = pool.blocks[b].next_free = None
    pool.free_block_queue = FreeKVCacheBlockQueue(
        [pool.blocks[b] for b in sorted((b for b in sh.blocks if s.in_free[b]), key=lambda b: s.free_key[b])]
    )
    pool.free_block_queue.num_free_blocks = s.num_free_blocks

    reqs: dict[int, Request] = {}
    for r in sh.slots:
        if s.status[r] not in (WAITING, RUNNING, PREEMPTED):
            continue
        rid = slot_id(r)
        prompt = tuple(token_of(r, i) for i in range(s.num_prompt_tokens[r]))
        req = Request(
            request_id=rid,
            prompt_token_ids=prompt,
            sampling_params=SamplingParams(max_tokens=s.max_tokens[r]),
            priority=s.priority[r],
            arrival_time=s.arrival_time[r],
            block_size=sh.block_size,
        )
        for i in range(s.num_prompt_tokens[r], s.num_tokens[r]):
            req.output_token_ids.append(token_of(r, i))
            req.all_token_ids.append(token_of(r, i))
        req.block_hashes = [hash_bytes(h) for h in s.hashes[r][: s.num_tokens[r] // sh.block_size]]
        req.status = {
            WAITING: RequestStatus.WAITING,
            RUNNING: RequestStatus.RUNNING,
            PREEMPTED: RequestStatus.PREEMPTED,
        }[s.status[r]]
        req.num_computed_tokens = s.num_computed_tokens[r]
        req.is_prefill_chunk = s.is_prefill_chunk[r]
        reqs[r] = req
        sched.requests[rid] = req
        sched.seen_request_ids.add(rid)
    sched.running = [reqs[r] for r in sorted((r for r in reqs if s.in_running[r]), key=lambda r: s.running_pos[r])]
    waiting = [r for r in reqs if s.in_waiting[r]]
    if not sh.is_priority:
        waiting.sort(key=lambda r: s.waiting_pos[r])
    for r in waiting:
        sched.waiting.add_request(reqs[r])
    for r in sh.slots:
        if s.has_table[r]:
            kv.req_to_blocks[slot_id(r)] = [pool.blocks[b] for b in table_of(s, r)]
            kv.num_cached_block[slot_id(r)] = s.num_cached_blocks[r]
    sched.current_step = s.step
    sched.prefill_capacity_bound = s.prefill_capacity_bound
    sched.num_executed_steps = s.num_executed_steps
    sched.last_prefill_step = s.last_prefill_step

    scheduled = {slot_id(r): s.num_scheduled[r] for r in sh.slots if s.num_scheduled[r] > 0}
    records = []
    for k in range(s.num_preemptions if s.phase != IDLE else 0):
        n = s.rec_num_candidates[k]
        cands = tuple((f"candidate{k}.{j}", s.rec_priority[k][j], s.rec_arrival[k][j]) for j in range(n))
        records.append(
            PreemptionRecord(
                requester_id=f"requester{k}",
                victim_id=cands[s.rec_victim_pos[k]][0],
                policy=sh.policy,
                candidates=cands,
            )
        )
    step_state = None
    if s.phase in (RUNNING_LOOP, WAITING_LOOP):
        step_state = _StepState(token_budget=s.token_budget)
        step_state.defer_prefills = s.defer_prefills
        # Only their disjunction is state (end_schedule reads it).
        step_state.prefill_scheduled = s.prefill_in_step
        step_state.num_scheduled_tokens = dict(scheduled)
        step_state.preemptions = list(records)
        for rid in scheduled:
            if rid in sched.requests:
                step_state.scheduled_running_reqs.append(sched.requests[rid])
                step_state.req_to_new_blocks[rid] = []
        step_state.preempted_reqs = [
            Request(f"preempted{k}", (0,), SamplingParams(max_tokens=1), 0, 0, sh.block_size)
            for k in range(s.num_preemptions)
        ]
    elif s.phase == PENDING:
        output = SchedulerOutput(
            step=s.step,
            scheduled_new_reqs=(),
            scheduled_cached_reqs=(),
            num_scheduled_tokens=dict(scheduled),
            total_num_scheduled_tokens=s.total_num_scheduled,
            scheduled_spec_decode_tokens={},
            finished_req_ids=frozenset(),
            preempted_req_ids=frozenset(),
        )
        record_fields = {f.name for f in dataclasses.fields(StepRecord)}
        extra = {"remaining_token_budget": s.token_budget} if "remaining_token_budget" in record_fields else {}
        sched.last_step = StepRecord(
            step=s.step,
            output=output,
            preemptions=tuple(records),
            samples={rid: rid in sched.requests and not sched.requests[rid].is_prefill_chunk for rid in scheduled},
            defer_prefills=s.defer_prefills,
            **extra,
        )
        sched.in_flight.append(sched.last_step)
        for rid, n in scheduled.items():
            if rid in sched.requests:
                sched.requests[rid].num_in_flight_tokens = n
    return sched, step_state


# --------------------------------------------------------------- canonical form


def canonical(s: State) -> dict[str, Any]:
    """What two states must agree on to be the same scheduler state (Python values).

    Values without meaning are dropped: positions of blocks not in the free
    queue, hashes of uncached blocks, insertion orders (only their order per
    hash matters), eviction keys (only their order), hashes past a request's
    full blocks, waiting positions under the priority policy (the key orders
    that queue), dead slots, records beyond the step's preemptions, the step's
    deferral verdict outside a step and its output, and ``is_prefill_chunk``
    of a request not running (read only from ``running``).
    """
    sh = s.shape
    live = [r for r in sh.slots if s.status[r] in (WAITING, RUNNING, PREEMPTED)]
    per_hash: dict[int, list[int]] = {}
    for b in sorted((b for b in sh.blocks if s.indexed[b]), key=lambda b: s.insert_order[b]):
        per_hash.setdefault(s.block_hash[b], []).append(b)
    out: dict[str, Any] = {
        "phase": s.phase,
        "step": s.step,
        "num_free_blocks": s.num_free_blocks,
        "free_queue": sorted((b for b in sh.blocks if s.in_free[b]), key=lambda b: s.free_key[b]),
        "blocks": {
            b: (s.ref_cnt[b], s.cached[b], s.block_hash[b] if s.cached[b] else None, s.indexed[b]) for b in sh.blocks
        },
        "prefix_map": per_hash,
        "running": sorted((r for r in sh.slots if s.in_running[r]), key=lambda r: s.running_pos[r]),
        "waiting": (
            sorted((r for r in sh.slots if s.in_waiting[r]), key=lambda r: s.waiting_pos[r])
            if not sh.is_priority
            else sorted(r for r in sh.slots if s.in_waiting[r])
        ),
        "requests": {
            r: {
                "status": s.status[r],
                "num_tokens": s.num_tokens[r],
                "num_prompt_tokens": s.num_prompt_tokens[r],
                "num_computed_tokens": s.num_computed_tokens[r],
                "num_scheduled": s.num_scheduled[r],
                "table": (
                    [(s.table_pos[r][b], b) for b in table_of(s, r)] + [("num_blocks", s.num_blocks[r])]
                    if s.has_table[r]
                    else None
                ),
                "num_cached_blocks": s.num_cached_blocks[r] if s.has_table[r] else None,
                "hashes": list(s.hashes[r][: s.num_tokens[r] // sh.block_size]),
                "is_prefill_chunk": s.is_prefill_chunk[r] if s.status[r] == RUNNING else None,
            }
            for r in live
        },
        "prefill_capacity_bound": s.prefill_capacity_bound,
        "num_executed_steps": s.num_executed_steps,
        "last_prefill_step": s.last_prefill_step,
        "scheduled_dead": {r: s.num_scheduled[r] for r in sh.slots if r not in live and s.num_scheduled[r]},
    }
    if s.phase in (RUNNING_LOOP, WAITING_LOOP, PENDING):
        out["defer_prefills"] = s.defer_prefills
        out["token_budget"] = s.token_budget
        out["total_num_scheduled"] = s.total_num_scheduled
        out["preemptions"] = [
            (
                s.rec_victim_pos[k],
                [
                    (s.rec_priority[k][j], s.rec_arrival[k][j])
                    for j in range(max(0, min(s.rec_num_candidates[k], sh.num_reqs)))
                ],
            )
            for k in range(max(0, min(s.num_preemptions, sh.num_reqs)))
        ]
    if s.phase == RUNNING_LOOP:
        out["req_index"] = s.req_index
        out["running_done"] = s.running_done
        out["allocating"] = (s.alloc_request, s.alloc_num_new) if s.alloc_active else None
    if s.phase in (RUNNING_LOOP, WAITING_LOOP):
        out["prefill_in_step"] = s.prefill_in_step
    if s.phase == WAITING_LOOP:
        out["waiting_done"] = s.waiting_done
    return out


def table_of(s: State, r: int) -> list[int]:
    """Slot ``r``'s block table as a list, in position order (Python values)."""
    return sorted((b for b in s.shape.blocks if s.held[r][b]), key=lambda b: s.table_pos[r][b])


def describe(s: State) -> str:
    """A readable dump of a Python-valued state (counterexamples, witnesses)."""
    sh = s.shape
    c = canonical(s)
    lines = [
        f"shape {sh.label()}  phase {PHASE_NAMES.get(s.phase, s.phase)}  step {s.step}",
        f"config: max_num_batched_tokens={s.max_num_batched_tokens} max_num_seqs={s.max_num_seqs} "
        f"max_model_len={s.max_model_len} threshold={s.long_prefill_token_threshold} "
        f"lookahead={s.num_lookahead_tokens} chunked={s.enable_chunked_prefill} "
        f"caching={s.enable_prefix_caching} reserve_full={s.reserve_full_sequence} "
        f"prefill_schedule_interval={s.prefill_schedule_interval}",
        f"deferral: capacity_bound={s.prefill_capacity_bound} executed_steps={s.num_executed_steps} "
        f"last_prefill_step={s.last_prefill_step}"
        + (f" defer_prefills={s.defer_prefills}" if "defer_prefills" in c else "")
        + (f" prefill_in_step={s.prefill_in_step}" if "prefill_in_step" in c else ""),
        f"free queue (front first): {c['free_queue']}  num_free_blocks={s.num_free_blocks}",
        "blocks: "
        + " ".join(
            f"{b}:ref={s.ref_cnt[b]}{'/h' + str(s.block_hash[b]) if s.cached[b] else ''}"
            f"{'' if s.cached[b] == s.indexed[b] else '/indexed=' + str(s.indexed[b])}"
            for b in sh.blocks
        ),
        f"running: {[slot_id(r) for r in c['running']]}  waiting: {[slot_id(r) for r in c['waiting']]}",
    ]
    if "token_budget" in c:
        lines.append(
            f"token_budget={s.token_budget} preemptions={c['preemptions']}"
            + (f" req_index={s.req_index} threshold={s.threshold}" if s.phase == RUNNING_LOOP else "")
        )
    status_name = {WAITING: "WAITING", RUNNING: "RUNNING", PREEMPTED: "PREEMPTED"}
    for r, info in c["requests"].items():
        lines.append(
            f"  {slot_id(r)}: {status_name[info['status']]} tokens={info['num_tokens']} "
            f"(prompt {info['num_prompt_tokens']}, max_tokens {s.max_tokens[r]}) "
            f"computed={info['num_computed_tokens']} scheduled={info['num_scheduled']} "
            f"key=({s.priority[r]},{s.arrival_time[r]}) "
            f"table={table_of(s, r) if s.has_table[r] else None}"
            f"{'' if not s.has_table[r] or len(table_of(s, r)) == s.num_blocks[r] else '/num_blocks=' + str(s.num_blocks[r])} "
            f"cached_blocks={info['num_cached_blocks']} hashes={info['hashes']}"
            + (" prefill_chunk" if info["is_prefill_chunk"] else "")
        )
    for r, n in c["scheduled_dead"].items():
        lines.append(f"  {slot_id(r)}: not live, {n} tokens still in the pending output")
    return "\n".join(lines)
