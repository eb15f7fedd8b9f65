"""Micro-benchmarks: each drives engine, backend or policy internals in-process (no server,
no HTTP) to measure one mechanism: the KV layout, the engine's Python per step, sampling
and grammar costs, one scheduling decision, the simulator's own cost. They explain the
standing benchmarks' numbers; they are not what a user of the server sees."""
