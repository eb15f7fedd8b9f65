"""One worker's resident models under a memory budget, and which to evict to load another.

Check, then act: ``plan_load`` says what a load would evict (or ``None`` if it cannot happen
now); the caller evicts the victims, loads the model, then calls ``commit_load``. Likewise
``expired(now, busy)`` says which idle models their keep-alive lets go
(``sluice.policy.capacity.keep_alive``); the caller unloads them with ``evict``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from sluice.policy.capacity.keep_alive import STAY, KeepAlive, expires_at_s

EVICTION_NAMES = ("lru", "cost_aware")


@dataclass(slots=True)
class ResidentModel:
    """A loaded model and what the eviction policies weigh."""

    model_id: str
    memory_bytes: int
    """Estimated bytes the model holds."""
    load_cost_s: float
    """What loading it again would cost (seconds)."""
    last_used_s: float
    """When it was last acquired or released (or loaded)."""
    use_count: int
    """How many times it was acquired since it was loaded."""
    in_use: int
    """Reference count of requests using it now; never evicted while > 0."""
    keep_alive: KeepAlive = field(default=STAY)
    """How long it stays once idle; a pinned model is never a victim."""

    @property
    def expires_at_s(self) -> float | None:
        """When it unloads if nothing uses it before (``None``: not by time)."""
        return expires_at_s(self.keep_alive, self.last_used_s, self.in_use)


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """What loading ``model_id`` takes."""

    model_id: str
    victims: tuple[str, ...]
    """Models to evict, in this order, before loading (empty if none)."""
    reason: str


def _lru_key(model: ResidentModel) -> tuple[float, str]:
    return (model.last_used_s, model.model_id)


def _cost_aware_key(model: ResidentModel) -> tuple[float, int, int, float, str]:
    # Cheapest to reload first, then least used, then the one that frees most memory.
    return (model.load_cost_s, model.use_count, -model.memory_bytes, model.last_used_s,
            model.model_id)


_EVICTION_KEYS: dict[str, Callable[[ResidentModel], tuple[float | int | str, ...]]] = {
    "lru": _lru_key,
    "cost_aware": _cost_aware_key,
}


class Residency:
    """One worker's resident set under a memory budget.

    Invariants: ``resident_bytes <= budget_bytes``; a model with ``in_use > 0`` is never chosen
    as a victim nor evicted; a pinned model is never chosen as a victim nor expires;
    ``in_use >= 0``. Victim order: ``lru`` by (last_used_s, model_id);
    ``cost_aware`` by (load_cost_s, use_count, larger memory_bytes first, last_used_s,
    model_id). Victims are taken in that order until the model fits.
    """

    def __init__(self, budget_bytes: int, eviction: str = "lru") -> None:
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        if eviction not in EVICTION_NAMES:
            raise ValueError(f"eviction must be one of {EVICTION_NAMES}, got {eviction!r}")
        self.budget_bytes = budget_bytes
        self.eviction = eviction
        self._models: dict[str, ResidentModel] = {}
        self._resident_bytes = 0

    @property
    def resident_bytes(self) -> int:
        """Bytes held by resident models."""
        return self._resident_bytes

    @property
    def free_bytes(self) -> int:
        """Budget not held by resident models."""
        return self.budget_bytes - self._resident_bytes

    @property
    def evictable_bytes(self) -> int:
        """Bytes of resident models not in use nor pinned (what eviction could free now)."""
        return sum(m.memory_bytes for m in self._models.values() if _evictable(m))

    @property
    def pinned_bytes(self) -> int:
        """Bytes of pinned models (never freed for another model)."""
        return sum(m.memory_bytes for m in self._models.values() if m.keep_alive.pinned)

    def is_resident(self, model_id: str) -> bool:
        """Whether ``model_id`` is loaded."""
        return model_id in self._models

    def models(self) -> list[ResidentModel]:
        """Copies of the resident models, in load order."""
        return [dataclasses.replace(m) for m in self._models.values()]

    def can_ever_hold(self, memory_bytes: int) -> bool:
        """Whether a model of ``memory_bytes`` fits the budget with nothing else resident."""
        return memory_bytes <= self.budget_bytes

    def fits_beside_pins(self, model_id: str, memory_bytes: int) -> bool:
        """Whether ``model_id`` fits the budget beside the other pinned models (a model that
        does not can load only once a pin is lifted)."""
        others = sum(m.memory_bytes for m in self._models.values()
                     if m.keep_alive.pinned and m.model_id != model_id)
        return memory_bytes <= self.budget_bytes - others

    def plan_load(self, model_id: str, memory_bytes: int) -> LoadPlan | None:
        """What loading ``model_id`` would evict; ``None`` if it cannot fit now or ever.

        Already resident or fits free memory: no victims. Otherwise victims are the models not
        in use, in eviction order, until the model fits; ``None`` if even all of them are not
        enough (models in use must be released first) or the budget is too small.
        """
        _check_bytes(memory_bytes)
        if model_id in self._models:
            return LoadPlan(model_id, (), "already resident")
        if not self.can_ever_hold(memory_bytes):
            return None
        free = self.free_bytes
        if memory_bytes <= free:
            return LoadPlan(model_id, (), f"fits free memory ({free} of {memory_bytes} bytes)")
        candidates = sorted(
            (m for m in self._models.values() if _evictable(m)), key=_EVICTION_KEYS[self.eviction]
        )
        victims: list[str] = []
        for model in candidates:
            victims.append(model.model_id)
            free += model.memory_bytes
            if memory_bytes <= free:
                return LoadPlan(
                    model_id,
                    tuple(victims),
                    f"{self.eviction} eviction of {len(victims)} model(s) frees "
                    f"{free - self.free_bytes} bytes; {memory_bytes} needed, "
                    f"{self.free_bytes} free",
                )
        return None

    def expired(self, now: float, busy: Collection[str] = ()) -> tuple[str, ...]:
        """Models whose keep-alive has run out at ``now`` (in load order): not in use, not
        pinned, idle for their ``idle_s``, and not in ``busy`` (models with requests queued or
        on their way: those stay)."""
        return tuple(m.model_id for m in self._models.values()
                     if m.model_id not in busy and (t := m.expires_at_s) is not None and t <= now)

    def next_expiry_s(self, after_s: float = -math.inf) -> float | None:
        """The earliest ``expires_at_s`` later than ``after_s`` (``None``: none)."""
        times = [t for m in self._models.values()
                 if (t := m.expires_at_s) is not None and t > after_s]
        return min(times, default=None)

    def set_keep_alive(self, model_id: str, keep_alive: KeepAlive) -> None:
        """What ``model_id`` does once idle from now on; ``ValueError`` if not resident."""
        self._get(model_id).keep_alive = keep_alive

    def evict(self, model_id: str) -> None:
        """Unload ``model_id``; ``ValueError`` if it is not resident or is in use."""
        model = self._get(model_id)
        if model.in_use > 0:
            raise ValueError(f"model {model_id!r} is in use ({model.in_use}); cannot evict")
        del self._models[model_id]
        self._resident_bytes -= model.memory_bytes

    def commit_load(
        self, model_id: str, memory_bytes: int, load_cost_s: float, now: float,
        keep_alive: KeepAlive = STAY,
    ) -> None:
        """Record ``model_id`` as loaded; ``ValueError`` if it is already resident, the cost is
        not a finite number >= 0, or it would exceed the budget."""
        _check_bytes(memory_bytes)
        if not math.isfinite(load_cost_s) or load_cost_s < 0:
            raise ValueError(f"load_cost_s must be a finite number >= 0, got {load_cost_s}")
        if model_id in self._models:
            raise ValueError(f"model {model_id!r} is already resident")
        if memory_bytes > self.free_bytes:
            raise ValueError(
                f"memory_bytes {memory_bytes} for {model_id!r} exceeds free_bytes "
                f"{self.free_bytes} (budget_bytes {self.budget_bytes})"
            )
        self._models[model_id] = ResidentModel(
            model_id=model_id,
            memory_bytes=memory_bytes,
            load_cost_s=load_cost_s,
            last_used_s=now,
            use_count=0,
            in_use=0,
            keep_alive=keep_alive,
        )
        self._resident_bytes += memory_bytes

    def acquire(self, model_id: str, now: float) -> None:
        """A request starts using ``model_id``; ``ValueError`` if it is not resident."""
        model = self._get(model_id)
        model.in_use += 1
        model.use_count += 1
        model.last_used_s = now

    def release(self, model_id: str, now: float) -> None:
        """A request stops using ``model_id`` (``in_use`` never goes below 0); ``ValueError``
        if it is not resident."""
        model = self._get(model_id)
        model.in_use = max(0, model.in_use - 1)
        model.last_used_s = now

    def check_integrity(self) -> None:
        """Raise ``RuntimeError`` if an invariant does not hold."""
        total = sum(m.memory_bytes for m in self._models.values())
        if total != self._resident_bytes:
            raise RuntimeError(f"resident_bytes {self._resident_bytes} != sum of models {total}")
        if total > self.budget_bytes:
            raise RuntimeError(f"resident_bytes {total} exceeds budget_bytes {self.budget_bytes}")
        for model_id, model in self._models.items():
            if model.model_id != model_id:
                raise RuntimeError(f"model keyed {model_id!r} says it is {model.model_id!r}")
            if model.in_use < 0 or model.use_count < 0 or model.memory_bytes < 0:
                raise RuntimeError(f"negative counter in {model!r}")

    def _get(self, model_id: str) -> ResidentModel:
        model = self._models.get(model_id)
        if model is None:
            raise ValueError(f"model {model_id!r} is not resident")
        return model


def _evictable(model: ResidentModel) -> bool:
    return model.in_use == 0 and not model.keep_alive.pinned


def _check_bytes(memory_bytes: int) -> None:
    if memory_bytes < 0:
        raise ValueError(f"memory_bytes must be >= 0, got {memory_bytes}")
