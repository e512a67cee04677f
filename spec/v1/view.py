"""The state view invariants read: a fixed shape of scalars, domains and lookups.

``ConcreteView`` reads a live :class:`~schedconf.spec.v1.scheduler.Scheduler`; the symbolic
view (``spec/symbolic/``) offers the same names over Z3 terms. Domains are what
the invariants quantify over (``blocks``, ``requests``, ...): the concrete view
lists only what exists, the symbolic one every index up to its bounds.

Status codes are integers so that both backends compare them the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from schedconf.spec.v1.request import RequestStatus

WAITING, RUNNING, PREEMPTED = 0, 1, 2
STATUS_CODES = {RequestStatus.WAITING: WAITING, RequestStatus.RUNNING: RUNNING, RequestStatus.PREEMPTED: PREEMPTED}
FCFS, PRIORITY = 0, 1


@dataclass(frozen=True)
class PreemptionView:
    """One preemption of the last step: the candidates in ``running`` order, and the victim's place."""

    policy: int
    victim_pos: int
    candidate_keys: tuple[tuple[int, int], ...]


class ConcreteView:
    """The state view of a live scheduler (see module docstring)."""

    def __init__(self, scheduler) -> None:  # noqa: ANN001 - avoid an import cycle
        cfg = scheduler.config
        pool = scheduler.block_pool
        kv = scheduler.kv_cache_manager
        self.step = scheduler.current_step
        self.num_gpu_blocks = cfg.num_gpu_blocks
        self.block_size = cfg.block_size
        self.max_num_batched_tokens = cfg.max_num_batched_tokens
        self.max_num_seqs = cfg.max_num_seqs
        self.num_spec_tokens = cfg.num_spec_tokens
        self.num_free_blocks = pool.get_num_free_blocks()
        pending = scheduler.pending_output
        last = scheduler.last_step
        # Step quantities describe the step only between schedule() and its
        # update. A request aborted in between keeps its place in the output;
        # its tokens count as given back (it is no longer a request).
        live = scheduler.requests
        if pending is not None and last is not None:
            aborted = sum(n for rid, n in pending.num_scheduled_tokens.items() if rid not in live)
            self._scheduled = {rid: n for rid, n in pending.num_scheduled_tokens.items() if rid in live}
            self.total_num_scheduled_tokens = pending.total_num_scheduled_tokens - aborted
            self.remaining_token_budget = last.remaining_token_budget + aborted
        else:
            self._scheduled = {}
            self.total_num_scheduled_tokens = 0
            self.remaining_token_budget = cfg.max_num_batched_tokens

        self.blocks = [b.block_id for b in pool.blocks if not b.is_null]
        self.null_block = pool.null_block.block_id
        self._ref_cnt = {b.block_id: b.ref_cnt for b in pool.blocks}
        self._in_free = {b.block_id: False for b in pool.blocks}
        for b in pool.free_block_queue:
            self._in_free[b.block_id] = True
        self._cached = {b.block_id: b.block_hash is not None for b in pool.blocks}
        self._indexed = {b.block_id: False for b in pool.blocks}
        self._hash = {b.block_id: b.block_hash for b in pool.blocks}
        for key, entries in pool.cached_block_hash_to_block.items():
            for block_id, block in entries.items():
                self._indexed[block_id] = block.block_hash == key and block.block_id == block_id

        self.requests = sorted(scheduler.requests)
        reqs = scheduler.requests
        self._status = {rid: STATUS_CODES.get(r.status, -1) for rid, r in reqs.items()}
        running_ids = [r.request_id for r in scheduler.running]
        waiting_ids = [r.request_id for r in scheduler.waiting]
        self._num_in_running = {rid: running_ids.count(rid) for rid in reqs}
        self._num_in_waiting = {rid: waiting_ids.count(rid) for rid in reqs}
        # Requests that sit in a queue but are no longer live (freed): a leak.
        self.orphans_in_queues = len([r for r in running_ids + waiting_ids if r not in reqs])
        self.num_running = len(running_ids)
        self._num_tokens = {rid: r.num_tokens for rid, r in reqs.items()}
        self._num_computed = {rid: r.num_computed_tokens for rid, r in reqs.items()}
        # In-flight steps (scheduled, output not applied), oldest first.
        self._placeholders = {rid: r.num_output_placeholders for rid, r in reqs.items()}
        self._in_flight = {rid: r.num_in_flight_tokens for rid, r in reqs.items()}
        self._stale = {rid: r.num_stale_output_tokens for rid, r in reqs.items()}
        records = list(getattr(scheduler, "in_flight", ()))
        self._in_flight_scheduled = {
            rid: sum(rec.output.num_scheduled_tokens.get(rid, 0) for rec in records) for rid in reqs
        }
        self._in_flight_samples = {
            rid: sum(
                1 + len(rec.output.scheduled_spec_decode_tokens.get(rid, ())) for rec in records if rec.samples.get(rid)
            )
            for rid in reqs
        }
        self._tables = {rid: [b.block_id for b in kv.req_to_blocks.get(rid, [])] for rid in reqs}
        self.orphan_tables = len([rid for rid in kv.req_to_blocks if rid not in reqs])
        self._req_hashes = {rid: r.block_hashes for rid, r in reqs.items()}
        self._holders: dict[int, int] = {b: 0 for b in self._ref_cnt}
        for table in kv.req_to_blocks.values():
            for block in table:
                self._holders[block.block_id] += 1
        self.hold_pairs = sorted({(rid, b) for rid, table in self._tables.items() for b in table})
        self._hold_count = {(rid, b): table.count(b) for rid, table in self._tables.items() for b in set(table)}
        self.table_positions = [(rid, i) for rid, table in self._tables.items() for i in range(len(table))]

        record = scheduler.last_step if pending is not None else None
        # The pending step held prefill back (throttle_prefills or the 0.33 local cadence).
        self.deferred_prefills = bool(record is not None and record.defer_prefills)
        self.preemptions: list[PreemptionView] = []
        if record is not None:
            for p in record.preemptions:
                ids = [c[0] for c in p.candidates]
                self.preemptions.append(
                    PreemptionView(
                        policy=PRIORITY if p.policy == "priority" else FCFS,
                        victim_pos=ids.index(p.victim_id),
                        candidate_keys=tuple((c[1], c[2]) for c in p.candidates),
                    )
                )

    # blocks
    def ref_cnt(self, b: int) -> int:
        return self._ref_cnt[b]

    def in_free_queue(self, b: int) -> bool:
        return self._in_free[b]

    def num_holders(self, b: int) -> int:
        return self._holders[b]

    def is_cached(self, b: int) -> bool:
        return self._cached[b]

    def is_indexed(self, b: int) -> bool:
        return self._indexed[b]

    # requests
    def status(self, r: str) -> int:
        return self._status[r]

    def num_in_running(self, r: str) -> int:
        return self._num_in_running[r]

    def num_in_waiting(self, r: str) -> int:
        return self._num_in_waiting[r]

    def num_tokens(self, r: str) -> int:
        return self._num_tokens[r]

    def num_computed_tokens(self, r: str) -> int:
        return self._num_computed[r]

    def num_blocks(self, r: str) -> int:
        return len(self._tables[r])

    def num_output_placeholders(self, r: str) -> int:
        return self._placeholders[r]

    def num_in_flight_tokens(self, r: str) -> int:
        return self._in_flight[r]

    def num_stale_output_tokens(self, r: str) -> int:
        return self._stale[r]

    def num_in_flight_scheduled(self, r: str) -> int:
        """Tokens the steps still in flight scheduled for ``r``."""
        return self._in_flight_scheduled[r]

    def num_in_flight_samples(self, r: str) -> int:
        """Tokens the steps still in flight may sample for ``r``: 1 plus its drafts per step in which it samples."""
        return self._in_flight_samples[r]

    def num_scheduled_tokens(self, r: str) -> int:
        return self._scheduled.get(r, 0)

    def hold_count(self, pair: tuple[str, int]) -> int:
        return self._hold_count[pair]

    # table positions (r, i)
    def position_is_cached(self, pos: tuple[str, int]) -> bool:
        rid, i = pos
        return self._cached[self._tables[rid][i]]

    def position_hash_matches(self, pos: tuple[str, int]) -> bool:
        rid, i = pos
        hashes = self._req_hashes[rid]
        return i < len(hashes) and self._hash[self._tables[rid][i]] == hashes[i]
