"""Queues and their decisions: admission, the schedulers, dispatch, routing across workers and
replicas, and the control plane's queue core."""
