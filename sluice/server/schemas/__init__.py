"""Request bodies, validated by pydantic; a value out of bounds is a 400 naming the field.

Modules: ``base`` (the body every model derives from, its handling of unknown fields, and
the limits and checks every surface shares), ``messages`` (chat messages, tool definitions
and choices, response formats), ``sampling`` (the sampling fields of every completion-like
body, chat template options), ``openai`` (chat completions, completions, embeddings),
``native`` (``/v1/infer``, ``/tokenize``, ``/detokenize``). Anthropic's and the Responses
API's bodies are in ``sluice.server.anthropic.schemas`` and
``sluice.server.responses.schemas``, llama-server's in ``sluice.server.llama_wire``.
"""
