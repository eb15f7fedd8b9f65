"""What the benchmarks share: the load generator (``loadgen``, ``sse_client``), server
launchers for sluice and llama-server (``servers``, ``llama_server``), the configs and
prompts they serve and send (``model_tables``, ``prompts``, ``extremes``), the headline
comparison's settings and measured phase (``llm_runs``), outcome
accounting against the server's counters (``outcomes``), and tables and plots
(``report``)."""
