"""sluice: an adaptive inference server.

Layers (see docs/architecture.md): ``policy`` (pure decisions), ``engine`` (the runtime
that drives them with real threads), ``backends`` (synthetic, llama.cpp, ONNX Runtime),
``server`` (HTTP), ``sim`` (discrete-event simulator).
"""

__version__ = "0.1.0"
