"""The engine's waiting queue, in the two orders vLLM offers.

`FcfsQueue` is arrival order; a preempted request is put back at the front, so
it resumes before anything that arrived after it. `PriorityQueue` is ordered by
(priority, arrival): a lower value is served first, and a preempted request
keeps its original arrival, so it is back at the front of its priority. Both
mirror vLLM's `request_queue.py`. Removal (a client gone while waiting) is
O(n); it is rare next to adding and popping.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar


class Queued(Protocol):
    """What a waiting queue orders by."""

    @property
    def priority(self) -> int: ...

    @property
    def arrival(self) -> int: ...


Q = TypeVar("Q", bound=Queued)


class WaitingQueue(Protocol[Q]):
    def add(self, seq: Q) -> None: ...

    def put_back(self, seq: Q) -> None:
        """Re-queue a preempted request ahead of the requests that came after it."""

    def peek(self) -> Q: ...

    def pop(self) -> Q: ...

    def remove(self, seq: Q) -> None: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Q]:
        """In scheduling order."""


class FcfsQueue(Generic[Q]):
    def __init__(self) -> None:
        self._items: deque[Q] = deque()

    def add(self, seq: Q) -> None:
        self._items.append(seq)

    def put_back(self, seq: Q) -> None:
        self._items.appendleft(seq)

    def peek(self) -> Q:
        return self._items[0]

    def pop(self) -> Q:
        return self._items.popleft()

    def remove(self, seq: Q) -> None:
        self._items.remove(seq)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Q]:
        return iter(self._items)


class PriorityQueue(Generic[Q]):
    def __init__(self) -> None:
        # Arrivals are unique, so a comparison never reaches the sequence itself.
        self._heap: list[tuple[int, int, Q]] = []

    def add(self, seq: Q) -> None:
        heapq.heappush(self._heap, (seq.priority, seq.arrival, seq))

    def put_back(self, seq: Q) -> None:
        self.add(seq)  # its old arrival already puts it ahead of later ones

    def peek(self) -> Q:
        return self._heap[0][2]

    def pop(self) -> Q:
        return heapq.heappop(self._heap)[2]

    def remove(self, seq: Q) -> None:
        self._heap = [item for item in self._heap if item[2] is not seq]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Q]:
        return (item[2] for item in sorted(self._heap, key=lambda item: item[:2]))
