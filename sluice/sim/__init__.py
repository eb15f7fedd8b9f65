"""The discrete-event simulator: sluice's own policies on a virtual clock.

The same ``policy/`` objects that run the server — admission, schedulers, the dispatcher,
routers, residency and eviction, the dynamic batcher, the KV block allocator and the step
planner, the variant tracker and planner, tenant quotas, the cross-replica router — driven
by an event loop instead of threads, with measured cost models instead of models. No
threads, no sleeps; every simulated request ends in exactly one terminal state.

- ``workload``: arrival processes (Poisson, on/off MMPP, diurnal) and JSONL traces;
- ``costs``: one-shot batch times, LLM step-time models, load times, from files;
- ``setup``: the fleet's shape, from the server's TOML config;
- ``engine`` / ``worker`` / ``replica`` / ``fleet``: the simulated parts;
- ``report``: TTFT / TPOT / end-to-end percentiles, goodput, rejections, utilisation.

See docs/simulator.md.
"""

from sluice.sim.fleet import ConservationError, Fleet, simulate, simulate_closed_loop
from sluice.sim.setup import SimConfig, SimGroup, SimModel
from sluice.sim.workload import Arrival, WorkloadSpec, generate, parse_spec, read_trace

__all__ = ["Arrival", "ConservationError", "Fleet", "SimConfig", "SimGroup", "SimModel",
           "WorkloadSpec", "generate", "parse_spec", "read_trace", "simulate",
           "simulate_closed_loop"]
