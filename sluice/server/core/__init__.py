"""The transport-neutral serving core: every API (OpenAI chat, completions and responses,
Anthropic Messages, native ``/v1/infer``, gRPC) is an adapter that translates its wire body
into one ``ServeRequest``, calls ``open_generation`` (or ``admit`` for one-shot inputs), and
translates the ``Generation``'s events back into its wire format and its error shape.

Invariants every adapter relies on:

- the tenant comes from the transport (``Auth``) before the body is looked at;
- quota and runtime admission happen here, once per API request, in the order
  ``generate`` states, and an overloaded server never compiles a grammar;
- every refusal is an ``APIError`` (status, type, code, ``Retry-After``); the adapter only
  renders it;
- an admitted request ends in exactly one terminal state, whose ``Final`` is the last event.
"""

from sluice.server.core.controls import (
    check_text_input,
    controls,
    decision_headers,
    embedding_spec,
    model_list,
    model_name,
    plan_headers,
    rerank_model,
    spec_of_kind,
    tokenizer_of,
    ttft_deadline,
    ttft_target,
)
from sluice.server.core.embeddings import embed_inputs, embedded
from sluice.server.core.generate import (
    ChatPrompt,
    Generation,
    MixedPrompt,
    Prompt,
    ServeRequest,
    TextPrompt,
    TokenPrompt,
    admit,
    final_api_error,
    one_shot_requests,
    open_admitted,
    open_generation,
    rendered_chat,
)
from sluice.server.core.prompt import (
    chat_bounds,
    check_prompt_length,
    prompt_bounds,
    text_bounds,
    token_limit,
    tokenize_chat,
    tokenize_text,
)

__all__ = [
    "ChatPrompt",
    "Generation",
    "MixedPrompt",
    "Prompt",
    "ServeRequest",
    "TextPrompt",
    "TokenPrompt",
    "admit",
    "chat_bounds",
    "check_prompt_length",
    "check_text_input",
    "controls",
    "decision_headers",
    "embed_inputs",
    "embedded",
    "embedding_spec",
    "final_api_error",
    "model_list",
    "model_name",
    "one_shot_requests",
    "open_admitted",
    "open_generation",
    "plan_headers",
    "prompt_bounds",
    "rendered_chat",
    "rerank_model",
    "spec_of_kind",
    "text_bounds",
    "token_limit",
    "tokenize_chat",
    "tokenize_text",
    "tokenizer_of",
    "ttft_deadline",
    "ttft_target",
]
