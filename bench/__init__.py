"""sluice's benchmarks.

Each script in this folder answers one question a user of sluice asks, against a server it
starts on 127.0.0.1 and talks to over HTTP (or gRPC), and writes one JSON and one PNG
named after it under ``bench/results/``. ``python -m bench`` runs the headline comparison
with llama.cpp's llama-server (``bench/llm_bench.py``). ``bench/lib/`` is what the scripts
share; ``bench/micro/`` holds micro-benchmarks that drive engine internals directly.
"""
