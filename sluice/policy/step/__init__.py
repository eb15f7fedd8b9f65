"""The continuous-batching step and the KV cache: the step-time model, the step planner, slots
and KV blocks, widths from latency targets, TTFT prediction and n-gram speculation."""
