"""Response bodies: the engine's events rendered as one endpoint sends them.

Modules: ``base`` (the ``Shape`` every endpoint's rendering derives from, choices, token
text for logprobs, OpenAI's ``usage``), ``timings`` (llama-server's ``timings`` and
``prompt_progress`` objects), ``chat`` (OpenAI's ``chat.completion``), ``completion``
(OpenAI's ``text_completion``), ``native`` (sluice's ``/v1/infer``). llama-server's native
bodies are in ``sluice.server.llama_shapes``; Anthropic's and the Responses API's events in
their packages' ``translate``.
"""
