"""The waiting queues: FCFS and priority (§2, ``vllm/v1/core/sched/request_queue.py``).

Both hold requests that hold no KV blocks (WAITING or PREEMPTED). The
scheduler peeks at the head, pops it when admitted, and prepends preempted or
skipped requests.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from typing import Literal

from schedconf.spec.v1.request import Request


class FCFSRequestQueue:
    """First come, first served: a deque; preempted requests go to the head."""

    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add_request(self, request: Request) -> None:
        """Append a newly arrived request at the tail."""
        self._queue.append(request)

    def peek_request(self) -> Request:
        """Return the head without removing it."""
        return self._queue[0]

    def pop_request(self) -> Request:
        """Remove and return the head."""
        return self._queue.popleft()

    def prepend_request(self, request: Request) -> None:
        """Put a preempted request at the head (§4.2 step 7)."""
        self._queue.appendleft(request)

    def prepend_requests(self, requests: list[Request], order: Literal["preserve", "reverse"]) -> None:
        """Put the requests skipped by one waiting loop back at the head.

        ``requests`` is in skip order. ``preserve`` (0.14+) leaves them at the
        head in that order; ``reverse`` (<=0.12.0) leaves them reversed: skipping
        r1 then r2 gives ``[r2, r1, ...rest]`` (§2, vLLM #32173).
        """
        if order == "preserve":
            self._queue.extendleft(reversed(requests))
        else:
            self._queue.extendleft(requests)

    def remove_requests(self, requests: set[Request]) -> None:
        """Remove the given requests, keeping the others' relative order."""
        self._queue = deque(r for r in self._queue if r not in requests)

    def __len__(self) -> int:
        return len(self._queue)

    def __bool__(self) -> bool:
        return bool(self._queue)

    def __iter__(self) -> Iterator[Request]:
        """Iterate head to tail."""
        return iter(self._queue)


class PriorityRequestQueue:
    """A heap keyed by (priority, arrival_time, request_id); lower is served first.

    There is no head to prepend to: preempted and skipped requests are pushed
    back by their key (§2), so with equal priorities the queue orders by
    arrival time, not by insertion.

    DEVIATION(vllm 0.11.0): 0.11 heaps ``(priority, arrival_time, request)``
    tuples and raises TypeError on an exact tie of the first two keys; we break
    the tie by request id, as 0.33 does.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, int | float, str, Request]] = []

    def add_request(self, request: Request) -> None:
        """Push a request by its key."""
        priority, arrival, request_id = request.sort_key
        heapq.heappush(self._heap, (priority, arrival, request_id, request))

    def peek_request(self) -> Request:
        """Return the minimum without removing it."""
        return self._heap[0][3]

    def pop_request(self) -> Request:
        """Remove and return the minimum."""
        return heapq.heappop(self._heap)[3]

    def prepend_request(self, request: Request) -> None:
        """Same as add_request: the key decides the place."""
        self.add_request(request)

    def prepend_requests(self, requests: list[Request], order: Literal["preserve", "reverse"]) -> None:
        """Push each request back by its key; ``order`` does not matter here."""
        for request in requests:
            self.add_request(request)

    def remove_requests(self, requests: set[Request]) -> None:
        """Remove the given requests and restore the heap."""
        self._heap = [item for item in self._heap if item[3] not in requests]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Request]:
        """Iterate in key order (vLLM pops from a copy; tests rely on it)."""
        return iter([item[3] for item in sorted(self._heap, key=lambda item: item[:3])])


RequestQueue = FCFSRequestQueue | PriorityRequestQueue


def create_request_queue(policy: str) -> RequestQueue:
    """Return the queue for ``policy`` (``fcfs`` or ``priority``)."""
    return PriorityRequestQueue() if policy == "priority" else FCFSRequestQueue()
