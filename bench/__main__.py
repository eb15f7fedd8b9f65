"""``python -m bench``: the headline comparison with llama-server (``bench/llm_bench.py``)."""

from bench.llm_bench import main

raise SystemExit(main())
