"""The liveness bound: how many steps a fixed set of requests can take to finish (no Z3 here).

Statement (``spec/symbolic/LIVENESS.md`` has the proof): under the vllm-0.33
and vllm-0.32 rules, without speculative decoding, once no request arrives and
the model samples one token whenever a request's step reaches the end of its
sequence, every live request ends within

* FCFS: ``sum_r S_r`` steps, ``S_r = ceil(P_r / c) + W_r - P_r``;
* priority, keys ``(priority, arrival_time)`` pairwise distinct:
  ``sum_i (W_(i) + sum_{j > i} (W_(j) + 1))`` steps, requests ``(1) .. (n)``
  in key order (most important first);

and, for any order of the requests, within :func:`compute_any_order_bound`,
which is what the campaigns hold every scheduler to. Here

* ``P_r`` is the prompt length, ``M_r`` its ``max_tokens``;
* ``W_r = min(P_r + M_r, max_model_len) - 1``: the most tokens request ``r``
  computes from scratch (its last token is sampled, never computed; a resumed
  request re-prefills its outputs, so the total is the same after a preemption);
* ``c``: the prefill chunk the first request of a step always gets,
  ``min(max_num_batched_tokens, long_prefill_token_threshold)`` (the threshold
  when it is set, else the budget).

Every request fits the pool alone: ``SchedulerConfig`` refuses a pool that
cannot hold ``max_model_len`` tokens (``spec/v1/config.py``), and no request grows
past ``max_model_len - 1`` tokens.

Functions here are pure and take plain numbers, so that the conformance
harness can use them without Z3.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RequestWork:
    """What the bound needs of one live request."""

    request_id: str
    num_prompt_tokens: int
    max_tokens: int
    priority: int = 0
    arrival_time: int | float = 0

    @property
    def sort_key(self) -> tuple[int, int | float, str]:
        """The priority queue's order (spec/v1/request.py ``Request.sort_key``)."""
        return (self.priority, self.arrival_time, self.request_id)


def compute_work(num_prompt_tokens: int, max_tokens: int, max_model_len: int) -> int:
    """``W = min(P + M, max_model_len) - 1``: the most tokens one request computes from scratch."""
    return min(num_prompt_tokens + max_tokens, max_model_len) - 1


def compute_chunk(max_num_batched_tokens: int, long_prefill_token_threshold: int) -> int:
    """``c``: the tokens the first request processed in a step gets while it prefills (at least)."""
    if long_prefill_token_threshold > 0:
        return min(max_num_batched_tokens, long_prefill_token_threshold)
    return max_num_batched_tokens


def compute_fcfs_steps(num_prompt_tokens: int, max_tokens: int, max_model_len: int, chunk: int) -> int:
    """``S = ceil(P / c) + W - P``: steps one request takes as the head of ``running``, from scratch.

    A resumed request with ``o`` outputs re-prefills ``P + o`` tokens and has
    ``W - P - o`` decode steps left: ``ceil((P + o) / c) + W - P - o <= S``.
    """
    work = compute_work(num_prompt_tokens, max_tokens, max_model_len)
    return -(-num_prompt_tokens // chunk) + work - num_prompt_tokens


def compute_fcfs_bound(requests: Iterable[RequestWork], config: Any) -> int:
    """The FCFS bound ``sum_r S_r`` for the live ``requests`` under ``config`` (a SchedulerConfig or dict)."""
    cfg = _config_dict(config)
    chunk = compute_chunk(cfg["max_num_batched_tokens"], cfg["long_prefill_token_threshold"])
    return sum(compute_fcfs_steps(r.num_prompt_tokens, r.max_tokens, cfg["max_model_len"], chunk) for r in requests)


def compute_ordered_bound(works: list[int]) -> int:
    """``sum_i (W_i + sum_{j > i} (W_j + 1))`` for works listed leader first (the priority key order)."""
    total, tail = 0, 0
    for w in reversed(works):
        total += w + tail
        tail += w + 1
    return total


def compute_any_order_bound(works: Iterable[int]) -> int:
    """The largest :func:`compute_ordered_bound` over every order: the smallest works first.

    A policy-independent bound (it covers priority for every assignment of
    priorities, and FCFS, whose bound is below it: ``S_r <= W_r``).
    """
    return compute_ordered_bound(sorted(works))


def has_distinct_keys(requests: Iterable[RequestWork]) -> bool:
    """True iff no two requests share ``(priority, arrival_time)`` (the priority theorem's hypothesis)."""
    keys = [(r.priority, r.arrival_time) for r in requests]
    return len(set(keys)) == len(keys)


def compute_priority_bound(requests: Iterable[RequestWork], config: Any) -> int:
    """The priority bound in key order for the live ``requests`` (needs distinct keys to be a theorem)."""
    cfg = _config_dict(config)
    ordered = sorted(requests, key=lambda r: r.sort_key)
    return compute_ordered_bound(
        [compute_work(r.num_prompt_tokens, r.max_tokens, cfg["max_model_len"]) for r in ordered]
    )


def compute_policy_bound(requests: Iterable[RequestWork], config: Any) -> int:
    """The bound of the config's policy: FCFS or priority (key order)."""
    cfg = _config_dict(config)
    reqs = list(requests)
    if cfg["policy"] == "priority":
        return compute_priority_bound(reqs, cfg)
    return compute_fcfs_bound(reqs, cfg)


# ----------------------------------------------------------------- traces


@dataclass(frozen=True)
class TraceTail:
    """What a trace does after its last input: the requests live then and when they ended."""

    last_input_step: int
    """Steps run before the last input (an input in flight during step k counts k: step k's schedule came first)."""
    live: tuple[RequestWork, ...]
    """Requests live right after the last input."""
    ended_at: dict[str, int]
    """For each of ``live`` that ended: the step whose update ended it."""

    @property
    def steps_to_finish(self) -> int | None:
        """Steps after the last input until every live request ended (None: some never did)."""
        if len(self.ended_at) < len(self.live):
            return None
        return max(self.ended_at.values(), default=self.last_input_step) - self.last_input_step


def get_trace_tail(events: Iterable[Mapping[str, Any]]) -> TraceTail:
    """Read a trace's events (dicts, header excluded): the live requests at its last input and their ends.

    An accepted ``add_request`` starts a request; an ``abort`` of a live one or
    an output with a ``finish_reason`` ends it. A request re-added under an
    ended id is a new request.
    """
    evs = list(events)
    last_input = max((i for i, e in enumerate(evs) if e["kind"] in ("add_request", "abort")), default=-1)
    live: dict[str, RequestWork] = {}
    steps = 0
    ended_at: dict[str, int] = {}
    for i, e in enumerate(evs):
        kind = e["kind"]
        if kind == "step" and "expect" in e:
            steps = e["step"]
        elif kind == "add_request" and "expect_error" not in e:
            live[e["request_id"]] = RequestWork(
                e["request_id"],
                len(e["prompt_token_ids"]),
                e["max_tokens"],
                e.get("priority", 0),
                e.get("arrival_time", 0),
            )
        elif kind == "abort" and "expect_error" not in e:
            live.pop(e["request_id"], None)  # an input: never after the last one
        elif kind == "model_output":
            for out in e.get("expect", {}).get("outputs", []):
                if out.get("finish_reason") is None:
                    continue
                if i < last_input:
                    live.pop(out["req_id"], None)
                else:
                    ended_at.setdefault(out["req_id"], e["step"])
        if i == last_input:
            snapshot, last_step = dict(live), steps
    if last_input < 0:
        return TraceTail(0, (), {})
    return TraceTail(last_step, tuple(snapshot.values()), {k: v for k, v in ended_at.items() if k in snapshot})


def _config_dict(config: Any) -> dict[str, Any]:
    return config if isinstance(config, Mapping) else config.to_dict()
