"""Assistant prefill: a chat whose last message is an assistant turn continues that turn
instead of closing it and opening a new one (llama-server's assistant prefill, vLLM's and
HF transformers' ``continue_final_message``).

The conversation before the last message is rendered as always, generation prompt
included, and the last message's text follows as plain text, unclosed; the model goes on
from there, and the answer holds only what it adds. This is what llama-server does (it
renders ``messages[:-1]``, then the template's generation prompt, then the message's
content, text parts joined by a blank line), so no template has to be told to leave a
turn open: templates that close every message whatever ``add_generation_prompt`` says
are served the same way.

Rules (each refusal a 400 naming the field):

- ``continue_final_message`` ``"content"`` (llama-server's word for continuing the answer)
  is true; ``"reasoning_content"`` (continuing the turn's thinking inside the model's
  reasoning tags) is refused: the continuation here is the answer's text only;

- ``continue_final_message`` true and ``add_generation_prompt`` true: refused, as
  llama-server refuses them;
- ``continue_final_message`` true: the last message must be an assistant's without tool
  calls;
- ``continue_final_message`` unset: a last assistant message is continued unless the
  request sets ``add_generation_prompt`` true (then it is closed, as vLLM does); two
  assistant messages at the end are refused, as llama-server refuses them;
- ``continue_final_message`` false: the last message is closed, whatever its role.

With no turn to continue, ``add_generation_prompt`` false renders the conversation as it
stands, without the assistant turn's opening (``ChatPrompt.add_generation_prompt``), as
llama-server and vLLM render it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from sluice.server.errors import bad_param

CONTENT_PART_SEPARATOR = "\n\n"
"""Between the text parts of a continued message (llama-server's ``render_content``)."""


def continues_final(messages: Sequence[Mapping[str, Any]], *,
                    continue_final_message: bool | Literal["content", "reasoning_content"] | None,
                    add_generation_prompt: bool | None) -> bool:
    """Whether the request's last message is a turn to continue (the module's rules; an
    ``APIError`` 400 for the combinations refused)."""
    if continue_final_message == "reasoning_content":
        raise bad_param("continue_final_message",
                        'continue_final_message "reasoning_content" (continuing the '
                        'thinking) is not served; true or "content" continues the answer')
    if continue_final_message == "content":
        continue_final_message = True
    if continue_final_message and add_generation_prompt:
        raise bad_param("continue_final_message",
                        "Cannot set both add_generation_prompt and continue_final_message "
                        "to true.")
    last = messages[-1] if messages else None
    if continue_final_message:
        if last is None or last.get("role") != "assistant":
            raise bad_param("continue_final_message",
                            "continue_final_message needs the last message to be an "
                            "assistant message")
    elif (continue_final_message is False or add_generation_prompt or last is None
          or last.get("role") != "assistant"):
        return False
    elif len(messages) >= 2 and messages[-2].get("role") == "assistant":
        raise bad_param("messages",
                        "Cannot have 2 or more assistant messages at the end of the list.")
    if last.get("tool_calls"):
        raise bad_param("messages",
                        "Cannot continue an assistant message that contains tool calls.")
    return True
