"""State-based prediction for the variant planner: when each request already in a model
group's pool will finish, and when a new one would, from the work queued and running
now (not from the arrival rate). Pure: the state and the service curves are arguments,
times are seconds from "now".

The model of the pool, and why it fits sluice's one-shot path:

* Requests start in the order they were admitted (the FIFO scheduler, then each
  worker's inbox in order), so a request's finish depends only on the work ahead of it:
  arrivals after it cannot delay it.
* A worker's dynamic batcher runs the contiguous same-variant requests at its inbox head
  as one batch (``max_batch_size`` at most), and every member finishes when the batch
  does. So the queue is cut into contiguous same-variant runs, each run into batches of
  at most ``max_batch_size``.
* Each batch goes to the worker that is free first (list scheduling over ``c``
  workers): a worker is free when the batch it is running now ends (``busy_s``).

A request of variant ``v`` joining the queue's tail extends the last batch when that
batch is also ``v`` and has room — which lengthens that batch, so the members already in
it must still finish in time (``placement`` checks) — and otherwise starts a batch of
its own on the first free worker.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

BatchCurves = Mapping[str, Mapping[int, float]]
"""Per variant: predicted seconds of one batch by batch size (1..max_batch_size)."""

LengthScale = Callable[[str, int, int], float]
"""``(variant, longest input in characters, batch size)`` → how many times its curve a
batch of that variant and size takes when its longest member is that long (a batch is
padded to it; 1.0 at the typical length, and for length 0: unknown)."""


@dataclass(frozen=True, slots=True)
class Queued:
    """One admitted request that has not started."""

    variant: str
    time_left_s: float | None = None
    """Seconds from now to its deadline (``None``: none)."""
    length: int = 0
    """Its input's length in characters (0: unknown)."""


@dataclass(frozen=True, slots=True)
class Backlog:
    """A pool's state at one instant.

    Invariant: ``busy_s`` has one entry per worker, each >= 0 (0: idle now).
    """

    busy_s: tuple[float, ...]
    """Per worker: predicted seconds until the batch it is running ends."""
    queued: tuple[Queued, ...] = ()
    """Admitted and not started, in the order they will start."""

    def __post_init__(self) -> None:
        if not self.busy_s:
            raise ValueError("busy_s needs one entry per worker (at least one)")
        if any(not b >= 0 or not math.isfinite(b) for b in self.busy_s):
            raise ValueError(f"busy_s must be finite and >= 0, got {self.busy_s!r}")

    @property
    def is_empty(self) -> bool:
        """Nothing queued and every worker idle."""
        return not self.queued and not any(self.busy_s)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a new request of one variant would run."""

    variant: str
    batch_size: int
    """The size of the batch it would run in."""
    start_s: float
    """When that batch is predicted to start (its wait)."""
    finish_s: float
    """When that batch is predicted to end (its sojourn)."""
    delays_others: bool
    """It would join a batch and push one of that batch's members past its deadline."""


def _runs(queued: Sequence[Queued], max_batch_size: int) -> Iterator[tuple[int, int]]:
    """``(first index, size)`` of each batch the queue is cut into: contiguous
    same-variant runs, each cut into pieces of at most ``max_batch_size``."""
    i = 0
    while i < len(queued):
        j = i + 1
        while (j < len(queued) and j - i < max_batch_size
               and queued[j].variant == queued[i].variant):
            j += 1
        yield i, j - i
        i = j


def _batch_s(members: Sequence[Queued], curves: BatchCurves,
             scale: LengthScale | None) -> float:
    """Predicted seconds of one batch of ``members`` (same variant)."""
    variant = members[0].variant
    base = curves[variant][len(members)]
    if scale is None:
        return base
    return base * scale(variant, max(q.length for q in members), len(members))


def finishes_s(backlog: Backlog, curves: BatchCurves, max_batch_size: int,
               scale: LengthScale | None = None) -> list[float]:
    """The predicted finish (seconds from now) of each queued request, in queue order.
    ``scale``: each batch's time for its longest member (none: the curves alone)."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    free = sorted(backlog.busy_s)
    out = [0.0] * len(backlog.queued)
    for first, size in _runs(backlog.queued, max_batch_size):
        start = heapq.heappop(free)
        end = start + _batch_s(backlog.queued[first:first + size], curves, scale)
        heapq.heappush(free, end)
        out[first:first + size] = [end] * size
    return out


def placement(backlog: Backlog, variant: str, curves: BatchCurves, max_batch_size: int,
              pessimism: float = 1.0, length: int = 0,
              scale: LengthScale | None = None) -> Placement:
    """Where a new request of ``variant`` (its input ``length`` characters, 0: unknown)
    appended to the queue would run, and when it would finish. ``delays_others``:
    joining the tail batch would make one of its members miss its deadline (predicted
    times × ``pessimism``)."""
    queued = (*backlog.queued, Queued(variant, length=length))
    ends = finishes_s(Backlog(backlog.busy_s, queued), curves, max_batch_size, scale)
    first, size = list(_runs(queued, max_batch_size))[-1]
    finish = ends[-1]
    start = finish - _batch_s(queued[first:first + size], curves, scale)
    late = any(q.time_left_s is not None and pessimism * finish > q.time_left_s
               for q in queued[first:-1])
    return Placement(variant, size, max(0.0, start), finish, late)


@dataclass(frozen=True, slots=True)
class Margin:
    """Time to keep free before a deadline, growing with the prediction it guards:
    ``ratio × (predicted_s + floor_s)``. The model's error grows with what it predicts
    (each batch ahead brings its own spread: input lengths, a slower core), so a deep
    queue needs more room than an idle pool; ``floor_s`` stands for the fixed per-request
    overhead (the transport, the dispatcher), which a tiny prediction does not scale.
    Invariant: ``ratio >= 0`` and ``floor_s >= 0`` (the default keeps nothing)."""

    ratio: float = 0.0
    floor_s: float = 0.0

    def __post_init__(self) -> None:
        if not (self.ratio >= 0 and self.floor_s >= 0 and math.isfinite(self.ratio)
                and math.isfinite(self.floor_s)):
            raise ValueError(f"ratio and floor_s must be finite and >= 0, got {self!r}")

    def of(self, predicted_s: float) -> float:
        """Seconds to keep free after a predicted sojourn of ``predicted_s``."""
        if self.ratio == 0:
            return 0.0
        return self.ratio * (max(0.0, predicted_s) + self.floor_s)


NO_MARGIN = Margin()


def _left(q: Queued) -> float:
    return math.inf if q.time_left_s is None else q.time_left_s


def _late(finish_s: float, margin: Margin, time_left_s: float) -> bool:
    """A predicted finish that, with its margin, passes the time left."""
    return finish_s + margin.of(finish_s) > time_left_s


@dataclass(frozen=True, slots=True)
class Move:
    """A re-planning decision for one queued request."""

    index: int
    """Its position in ``Backlog.queued``."""
    variant: str | None
    """The variant it moves to; ``None``: none meets its deadline (fail it now)."""


def _finish_on(state: Backlog, k: int, variant: str, curves: BatchCurves,
               max_batch_size: int, pessimism: float, scale: LengthScale | None) -> float:
    """Queued request ``k``'s predicted finish (× ``pessimism``) were it on ``variant``."""
    trial = list(state.queued)
    trial[k] = Queued(variant, state.queued[k].time_left_s, state.queued[k].length)
    return pessimism * finishes_s(Backlog(state.busy_s, tuple(trial)), curves,
                                  max_batch_size, scale)[k]


def replan(backlog: Backlog, curves: BatchCurves, max_batch_size: int,
           options: Mapping[int, Sequence[str]], pessimism: float = 1.0,
           margin: Margin = NO_MARGIN, max_moves: int = 64,
           scale: LengthScale | None = None) -> list[Move]:
    """Moves for queued requests predicted to miss their deadlines.

    ``options[i]``: the variants queued request ``i`` may move to, most preferred first
    (requests not in it stay where they are). Repeatedly, the first request predicted to
    miss (finish × ``pessimism``, plus ``margin`` of it, later than its time left) that
    has options moves to the first of them on which it meets that; if none does, to the
    first on which it meets its deadline itself (no margin), unless it already does
    where it is; failing all that it fails (``variant=None``): only requests that surely
    miss are failed. Each move only ever shortens the work ahead of the requests behind
    it. At most ``max_moves`` moves per call.
    """
    queued = list(backlog.queued)
    moves: dict[int, str | None] = {}
    settled: set[int] = set()
    for _ in range(max_moves):
        live = [i for i in range(len(queued)) if moves.get(i, "") is not None]
        state = Backlog(backlog.busy_s, tuple(queued[i] for i in live))
        ends = finishes_s(state, curves, max_batch_size, scale)
        miss = next((k for k, i in enumerate(live) if i in options and i not in settled
                     and _late(pessimism * ends[k], margin, _left(queued[i]))), None)
        if miss is None:
            break
        index = live[miss]
        time_left = _left(queued[index])
        settled.add(index)

        others = [v for v in options[index] if v != queued[index].variant]
        finish = {v: _finish_on(state, miss, v, curves, max_batch_size, pessimism, scale)
                  for v in others}
        target = next((v for v in others if not _late(finish[v], margin, time_left)), None)
        if target is None and pessimism * ends[miss] <= time_left:
            continue  # it may still make it where it is: keep it
        if target is None:
            target = next((v for v in others if finish[v] <= time_left), None)
        moves[index] = target
        if target is not None:
            queued[index] = Queued(target, queued[index].time_left_s, queued[index].length)
    return [Move(i, v) for i, v in sorted(moves.items())]


class PredictionError:
    """How late requests finish against their predicted finish, relative to what was
    predicted, and the margin the planner keeps for it.

    The queueing model leaves out what it cannot see — service-time spread (a long text
    runs longer), a noisy neighbour on the CPU (the drift factor follows the mean, not
    the spread), the batcher's wait, the server's own overhead — so the planner measures
    its own error instead of guessing it. Each completed request contributes
    ``(actual - predicted) / (predicted sojourn + floor_s)``; the margin is that ratio's
    ``quantile`` over the errors of the last ``horizon_s`` seconds (at most ``window``),
    never below 0, times the candidate's own predicted sojourn (``Margin``). So an idle
    pool's short prediction keeps a small margin and a deep queue a large one, and an
    overload's errors are forgotten ``horizon_s`` after it ends. Invariant: until
    ``min_samples`` recent errors are known the ratio is ``prior_ratio`` (a cold server
    neither plans with no margin nor with its first, slowest batches' errors).
    """

    def __init__(self, window: int = 200, quantile: float = 0.99, min_samples: int = 20,
                 horizon_s: float = 5.0, floor_s: float = 0.010,
                 prior_ratio: float = 0.25) -> None:
        if window < 1 or not 0 < quantile <= 1 or min_samples < 1:
            raise ValueError(f"need window >= 1, quantile in (0, 1], min_samples >= 1; got "
                             f"{window}, {quantile}, {min_samples}")
        if not horizon_s > 0 or not floor_s >= 0 or not prior_ratio >= 0:
            raise ValueError(f"need horizon_s > 0, floor_s >= 0, prior_ratio >= 0; got "
                             f"{horizon_s}, {floor_s}, {prior_ratio}")
        self.quantile = quantile
        self.min_samples = min_samples
        self.horizon_s = horizon_s
        self.floor_s = floor_s
        self.prior_ratio = prior_ratio
        self._errors: deque[tuple[float, float]] = deque(maxlen=window)
        """(when observed, relative error), oldest first."""

    def observe(self, error_s: float, predicted_s: float, now: float) -> None:
        """One request's ``actual - predicted`` finish (seconds; negative: early), the
        sojourn that was predicted for it, and when it ended."""
        scale = max(0.0, predicted_s) + self.floor_s
        if scale > 0 and math.isfinite(error_s) and math.isfinite(scale) and math.isfinite(now):
            self._errors.append((now, error_s / scale))

    def margin(self, now: float) -> Margin:
        """The margin to keep before deadlines now."""
        while self._errors and self._errors[0][0] < now - self.horizon_s:
            self._errors.popleft()
        if len(self._errors) < self.min_samples:
            return Margin(self.prior_ratio, self.floor_s)
        ordered = sorted(r for _, r in self._errors)
        index = min(len(ordered) - 1, math.ceil(self.quantile * len(ordered)) - 1)
        return Margin(max(0.0, ordered[index]), self.floor_s)


__all__ = [
    "NO_MARGIN",
    "Backlog",
    "BatchCurves",
    "LengthScale",
    "Margin",
    "Move",
    "Placement",
    "PredictionError",
    "Queued",
    "finishes_s",
    "placement",
    "replan",
]
