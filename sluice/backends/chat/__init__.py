"""Chat formats: templates (Gemma's turns, Jinja templates as llama-server renders them),
the generic tool-call format and its parser, and prompts whose user text stays plain."""

from sluice.backends.chat.gemma import render_gemma
from sluice.backends.chat.jinja import JinjaRenderer, looks_like_jinja
from sluice.backends.chat.prompt import ChatPart, ChatPrompt, chat_tokens, split_marked
from sluice.backends.chat.template import Capabilities, ChatTemplate, RenderOptions, probe
from sluice.backends.chat.tools import ToolCall, call_schema, parse_tool_calls, tool_preamble

GEMMA_CAPS = Capabilities(system=True, trims=True)


def gemma_template() -> ChatTemplate:
    """Gemma's turn format (no tools of its own: they use the generic format)."""
    return ChatTemplate("gemma", lambda m, _t, o: render_gemma(m, o.add_generation_prompt),
                        caps=GEMMA_CAPS)


def jinja_template(source: str, *, bos_token: str = "", eos_token: str = "",
                   adds_bos: bool = True) -> ChatTemplate:
    """A Jinja template; ``ValueError`` if it does not compile or cannot render a one-turn
    conversation. ``adds_bos``: the tokenizer puts BOS first itself, so a rendering that
    starts with ``bos_token`` loses it (as llama-server does); else the text stays (SmolLM2's
    BOS is ``<|im_start|>``, the first turn's own marker)."""
    renderer = JinjaRenderer(source, bos_token=bos_token, eos_token=eos_token)
    renderer([{"role": "user", "content": "hi"}], None, RenderOptions(enable_thinking=True))
    return ChatTemplate("jinja", renderer, bos_text=bos_token if adds_bos else "")


__all__ = [
    "GEMMA_CAPS",
    "Capabilities",
    "ChatPart",
    "ChatPrompt",
    "ChatTemplate",
    "JinjaRenderer",
    "RenderOptions",
    "ToolCall",
    "call_schema",
    "chat_tokens",
    "gemma_template",
    "jinja_template",
    "looks_like_jinja",
    "parse_tool_calls",
    "probe",
    "render_gemma",
    "split_marked",
    "tool_preamble",
]
