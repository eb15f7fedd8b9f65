"""Cross-replica routing: the order in which sluice replicas are offered one request.

Each replica is one whole sluice runtime (its own queue, workers and engines). A front end
(Ray Serve's request router, in ``sluice.cluster``) asks one of these policies for a
*ranking* of the replicas and sends the request to the first one in it that still has
room; the in-process routers of ``sluice.policy.queues.router`` then pick a worker inside it.

- ``round_robin``: rotation over the replicas with room, the baseline.
- ``least_loaded``: fewest requests in flight first.
- ``affinity``: residency first (a replica that holds the model, then one whose free
  memory fits it, then one that must evict), then, for a request with a prompt-prefix
  key, **consistent hashing with bounded loads** (Mirrokni, Thorup, Zadimoghaddam 2018):
  the key's place on a ring of virtual nodes names a home replica, and a replica whose
  load would pass ``ceil(load_factor × (total + 1) / n)`` is skipped for the next one on
  the ring, so one hot prefix cannot pile onto one replica. Without a key (short prompts,
  one-shot models) it is least-loaded within the best residency tier.

A ranking names every replica exactly once, so routing never stalls on a stale view:
replicas with room come first, full ones after them, and replicas to avoid (draining, or
excluded because they just refused this request) last. Serve's own fresh queue-length
check skips full replicas; a request that finds them all full waits in a bounded queue.

Pure: the views come in as arguments, and the ring is a function of the replica ids and
``vnodes`` alone, so every front end process computes the same homes.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sluice.policy.queues.router import TIER_WORDS, residency_tier

REPLICA_ROUTER_NAMES = ("round_robin", "least_loaded", "affinity")

CLASS_OPEN = 0
"""Has room (``ongoing < capacity``) and is not to be avoided."""
CLASS_FULL = 1
"""Its last known load fills it; Serve probes it again before sending anything."""
CLASS_AVOID = 2
"""Draining, or excluded by the caller (it just refused this request)."""


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """One replica as a cross-replica router sees it."""

    replica_id: str
    ongoing: int
    """Requests sent to it and not finished (the front end's latest count)."""
    capacity: int
    """Requests it may hold at once (Serve's ``max_ongoing_requests``), >= 1."""
    resident: frozenset[str] = frozenset()
    """Models resident on any of its workers (as last reported)."""
    free_bytes: int = 0
    """The largest free model-memory budget among its workers (as last reported)."""
    draining: bool = False
    """It said it is draining: it finishes what it holds and takes nothing new."""

    def __post_init__(self) -> None:
        if self.ongoing < 0:
            raise ValueError(f"ongoing must be >= 0, got {self.ongoing}")
        if self.capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {self.capacity}")
        if self.free_bytes < 0:
            raise ValueError(f"free_bytes must be >= 0, got {self.free_bytes}")

    @property
    def has_room(self) -> bool:
        return self.ongoing < self.capacity


@dataclass(frozen=True, slots=True)
class ReplicaRequest:
    """What routing needs to know about one request."""

    model_id: str
    """The model (or model group) it names."""
    model_bytes: int = 0
    """Memory the model takes (0 when unknown, e.g. a group)."""
    prefix_key: str | None = None
    """Fingerprint of its prompt's first characters (``prefix_fingerprint``), if it has a
    prompt long enough to be worth keeping together."""
    exclude: frozenset[str] = frozenset()
    """Replicas to try last (they refused this request a moment ago)."""

    def __post_init__(self) -> None:
        if self.model_bytes < 0:
            raise ValueError(f"model_bytes must be >= 0, got {self.model_bytes}")


@dataclass(frozen=True, slots=True)
class ReplicaRanking:
    """Every replica, most preferred first, and why each is where it is.

    Invariant: ``ranked`` is a permutation of the replica ids given; ``reasons`` has a key
    for each of them."""

    ranked: tuple[str, ...]
    reasons: Mapping[str, str] = field(default_factory=dict)

    @property
    def first(self) -> str | None:
        return self.ranked[0] if self.ranked else None


class ReplicaRouter(Protocol):
    """Ranks replicas for one request. Invariants: see ``ReplicaRanking``."""

    name: str

    def rank(self, request: ReplicaRequest, replicas: Sequence[ReplicaView]) -> ReplicaRanking:
        """The ranking of ``replicas`` (any order; ids unique) for ``request``."""
        ...


def prefix_fingerprint(model_id: str, text: str, prefix_chars: int) -> str | None:
    """A key for ``text``'s first ``prefix_chars`` characters on ``model_id``, or ``None``
    when ``text`` is shorter than that (no prefix long enough to be worth keeping together).

    Two prompts share a key exactly when they name the same model and agree on their first
    ``prefix_chars`` characters; a shared system prompt of at least that length does.
    """
    if prefix_chars < 1:
        raise ValueError(f"prefix_chars must be >= 1, got {prefix_chars}")
    if len(text) < prefix_chars:
        return None
    digest = hashlib.blake2b(f"{model_id}\x1f{text[:prefix_chars]}".encode(), digest_size=8)
    return digest.hexdigest()


def _hash64(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class HashRing:
    """A consistent-hash ring with ``vnodes`` points per replica id.

    Invariant: a function of the id set and ``vnodes`` only, so every front end builds the
    same ring; adding or removing one replica moves only the keys whose first point was or
    becomes one of that replica's."""

    def __init__(self, replica_ids: Sequence[str], vnodes: int) -> None:
        if vnodes < 1:
            raise ValueError(f"vnodes must be >= 1, got {vnodes}")
        self.replica_ids = frozenset(replica_ids)
        self.vnodes = vnodes
        self._points = sorted((_hash64(f"{rid}#{i}"), rid)
                              for rid in self.replica_ids for i in range(vnodes))

    def walk(self, key: str) -> list[str]:
        """The distinct replica ids met walking clockwise from ``key``'s point."""
        points = self._points
        if not points:
            return []
        start = bisect.bisect_right(points, (_hash64(key), ""))
        order: list[str] = []
        seen: set[str] = set()
        for offset in range(len(points)):
            rid = points[(start + offset) % len(points)][1]
            if rid not in seen:
                seen.add(rid)
                order.append(rid)
                if len(order) == len(self.replica_ids):
                    break
        return order


def load_bound(total_ongoing: int, n_replicas: int, load_factor: float) -> int:
    """The most requests one replica may hold after taking one more, under bounded-load
    consistent hashing: ``ceil(load_factor × (total + 1) / n)``. Some replica is always
    within it (the least loaded holds at most ``total / n``)."""
    if n_replicas < 1:
        raise ValueError(f"n_replicas must be >= 1, got {n_replicas}")
    return math.ceil(load_factor * (total_ongoing + 1) / n_replicas)


def _route_class(view: ReplicaView, exclude: frozenset[str]) -> int:
    if view.draining or view.replica_id in exclude:
        return CLASS_AVOID
    return CLASS_OPEN if view.has_room else CLASS_FULL


_CLASS_WORDS = {CLASS_FULL: "full", CLASS_AVOID: "avoided"}


def _load_words(view: ReplicaView) -> str:
    return f"load {view.ongoing}/{view.capacity}"


def _fallback_order(
    request: ReplicaRequest, replicas: Sequence[ReplicaView], placed: set[str],
) -> list[tuple[str, str]]:
    """The replicas not yet placed: by (class, residency tier, load, id)."""
    rest = [r for r in replicas if r.replica_id not in placed]
    key = {r.replica_id: (_route_class(r, request.exclude),
                          residency_tier(r, request.model_id, request.model_bytes),
                          r.ongoing, r.replica_id) for r in rest}
    rest.sort(key=lambda r: key[r.replica_id])
    out = []
    for r in rest:
        cls, tier = key[r.replica_id][:2]
        words = _CLASS_WORDS.get(cls, "fallback")
        out.append((r.replica_id, f"{words}, {TIER_WORDS[tier]}, {_load_words(r)}"))
    return out


class LazyReasons(Mapping[str, str]):
    """A ranking's reasons, formatted on first read: a front end reads a few, a simulator
    routing millions of requests reads none, and formatting one per replica costs more than
    the ranking itself. Reads as the plain mapping ``build()`` returns."""

    __slots__ = ("_build", "_data")

    def __init__(self, build: Callable[[], dict[str, str]]) -> None:
        self._build = build
        self._data: dict[str, str] | None = None

    def _get(self) -> dict[str, str]:
        if self._data is None:
            self._data = self._build()
        return self._data

    def __getitem__(self, key: str) -> str:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def __repr__(self) -> str:
        return repr(self._get())


def _check_unique(replicas: Sequence[ReplicaView]) -> None:
    ids = [r.replica_id for r in replicas]
    if len(set(ids)) != len(ids):
        raise ValueError(f"replica ids must be unique, got {ids}")


class RoundRobinReplicaRouter:
    """Rotation over the replicas with room in id order, starting after the last first
    choice; the rest follow by (class, load, id). Keeps no state but the cursor."""

    name: str = "round_robin"

    def __init__(self) -> None:
        self._last_id: str | None = None

    def rank(self, request: ReplicaRequest, replicas: Sequence[ReplicaView]) -> ReplicaRanking:
        _check_unique(replicas)
        open_ids = sorted(r.replica_id for r in replicas
                          if _route_class(r, request.exclude) == CLASS_OPEN)
        last = self._last_id
        start = next((i for i, rid in enumerate(open_ids) if last is None or rid > last), 0)
        rotation = open_ids[start:] + open_ids[:start]
        if rotation:
            self._last_id = rotation[0]
        rest = _fallback_order(request, replicas, set(rotation))

        def reasons() -> dict[str, str]:
            by_id = {r.replica_id: r for r in replicas}
            return {**{rid: f"round robin, {_load_words(by_id[rid])}" for rid in rotation},
                    **dict(rest)}

        return ReplicaRanking((*rotation, *(rid for rid, _ in rest)), LazyReasons(reasons))


class LeastLoadedReplicaRouter:
    """By (class, load, id): the open replica with the fewest requests in flight first."""

    name: str = "least_loaded"

    def rank(self, request: ReplicaRequest, replicas: Sequence[ReplicaView]) -> ReplicaRanking:
        _check_unique(replicas)
        exclude = request.exclude
        ordered = sorted(replicas, key=lambda r: (_route_class(r, exclude), r.ongoing,
                                                   r.replica_id))

        def reasons() -> dict[str, str]:
            return {r.replica_id: f"{_CLASS_WORDS.get(_route_class(r, exclude), 'least loaded')}"
                                  f", {_load_words(r)}" for r in ordered}

        return ReplicaRanking(tuple(r.replica_id for r in ordered), LazyReasons(reasons))


class AffinityReplicaRouter:
    """Residency tier, then bounded-load consistent hashing on the prompt prefix, then
    least loaded (see the module docstring).

    Among the open replicas of the best residency tier: with a prefix key, the first
    replica on the key's ring walk whose load after this request stays within
    ``load_bound`` comes first (its *home*, or a *spill* past loaded ones), the others of
    the tier follow in ring order; without a key, the tier is ordered by (load, id). Every
    other replica follows by (class, tier, load, id).
    """

    name: str = "affinity"

    def __init__(self, load_factor: float = 1.25, vnodes: int = 64) -> None:
        if not (math.isfinite(load_factor) and load_factor >= 1.0):
            raise ValueError(f"load_factor must be a finite number >= 1, got {load_factor!r}")
        if vnodes < 1:
            raise ValueError(f"vnodes must be >= 1, got {vnodes}")
        self.load_factor = load_factor
        self.vnodes = vnodes
        self._ring = HashRing((), vnodes)
        """The ring of the last pool seen (pools change only when replicas come and go)."""

    def rank(self, request: ReplicaRequest, replicas: Sequence[ReplicaView]) -> ReplicaRanking:
        _check_unique(replicas)
        open_views = [r for r in replicas if _route_class(r, request.exclude) == CLASS_OPEN]
        if not open_views:
            ranked = _fallback_order(request, replicas, set())
            return ReplicaRanking(tuple(rid for rid, _ in ranked), dict(ranked))
        tiers = {r.replica_id: residency_tier(r, request.model_id, request.model_bytes)
                 for r in open_views}
        best = min(tiers.values())
        pool = [r for r in open_views if tiers[r.replica_id] == best]
        tier_words = TIER_WORDS[best]
        if request.prefix_key is None:
            pool.sort(key=lambda r: (r.ongoing, r.replica_id))
            head = [(r.replica_id, f"{tier_words}, least loaded, {_load_words(r)}")
                    for r in pool]
        else:
            head = self._by_prefix(request, pool, replicas, tier_words)
        head += _fallback_order(request, replicas, {rid for rid, _ in head})
        return ReplicaRanking(tuple(rid for rid, _ in head), dict(head))

    def _by_prefix(self, request: ReplicaRequest, pool: list[ReplicaView],
                   replicas: Sequence[ReplicaView], tier_words: str) -> list[tuple[str, str]]:
        """The pool in ring order from the request's prefix key, the first one within the
        load bound moved to the front.

        The ring holds every replica, not only the pool, so the key's *home* is the same
        replica whatever its state: when the home cannot take the request (it refused it a
        moment ago, is draining, full, or in a worse residency tier) the chosen replica is
        reported as a spill from it, with the reason. Walking the whole ring and skipping
        replicas outside the pool gives the same order as a ring of the pool alone (each
        replica's points depend on its id only)."""
        assert request.prefix_key is not None
        ids = {r.replica_id for r in replicas}
        if self._ring.replica_ids != ids:
            self._ring = HashRing(list(ids), self.vnodes)
        walk = self._ring.walk(request.prefix_key)
        home = walk[0]
        by_id = {r.replica_id: r for r in pool}
        order = [rid for rid in walk if rid in by_id]
        bound = load_bound(sum(r.ongoing for r in pool), len(pool), self.load_factor)
        chosen = next(rid for rid in order if by_id[rid].ongoing + 1 <= bound)
        out: list[tuple[str, str]] = []
        if chosen == home:
            out.append((home, f"{tier_words}, prefix home, {_load_words(by_id[home])}, "
                              f"bound {bound}"))
        else:
            if home in by_id:
                why = f"load {by_id[home].ongoing} + 1 > bound {bound}"
            else:
                why = _unavailable_words(request, next(r for r in replicas
                                                       if r.replica_id == home))
            out.append((chosen, f"{tier_words}, prefix spill from {home} ({why}), "
                                f"{_load_words(by_id[chosen])}"))
        for rid in order:
            if rid != chosen:
                out.append((rid, f"{tier_words}, prefix ring, {_load_words(by_id[rid])}"))
        return out


def _unavailable_words(request: ReplicaRequest, view: ReplicaView) -> str:
    """Why ``view``, open or not, was left out of the affinity pool for ``request``."""
    if view.replica_id in request.exclude:
        return "it refused this request"
    if view.draining:
        return "draining"
    if not view.has_room:
        return f"full, {_load_words(view)}"
    return TIER_WORDS[residency_tier(view, request.model_id, request.model_bytes)]


def make_replica_router(name: str, *, load_factor: float = 1.25,
                        vnodes: int = 64) -> ReplicaRouter:
    """The replica router called ``name`` (one of ``REPLICA_ROUTER_NAMES``)."""
    if name == "round_robin":
        return RoundRobinReplicaRouter()
    if name == "least_loaded":
        return LeastLoadedReplicaRouter()
    if name == "affinity":
        return AffinityReplicaRouter(load_factor=load_factor, vnodes=vnodes)
    raise ValueError(f"replica router name must be one of {REPLICA_ROUTER_NAMES}, got {name!r}")
