"""The runtime: request lifecycle, control plane, workers and the batching engines."""
