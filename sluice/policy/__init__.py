"""Pure decision objects: no clock reads, no threads, no I/O.

Time comes in as ``now: float`` (seconds on any monotonic clock), randomness as a seeded
generator, and decisions go out as plain frozen dataclasses. The runtime and the
simulator drive the same objects.
"""
