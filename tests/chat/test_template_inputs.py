"""What a chat template sees besides the conversation, as llama-server and transformers
give it: ``add_generation_prompt`` (honoured or not by every renderer), ``enable_thinking``
(a request's, else the model's default), today's date (``strftime_now``, ``date_string``,
``datetime``), the offered tools as ``functions`` JSON, and transformers' ``{% generation %}``
block. The templates are excerpts of the Llama 3.3, Qwen3 and firefunction-v2 templates
that llama.cpp's server tests render."""

from __future__ import annotations

from datetime import datetime

import pytest

from sluice.backends.base import ModelLoadError, ModelSpec, ReasoningFormat, resolved_options
from sluice.backends.chat import RenderOptions, gemma_template, jinja_template
from sluice.backends.chat.jinja import JinjaRenderer
from sluice.backends.synthetic import SyntheticTokenizer
from sluice.server.core.reasoning import opened_by

NOW = datetime(2026, 3, 4, 5, 6, 7)
USER = [{"role": "user", "content": "What is today?"}]
TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "the time",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}

LLAMA_33 = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Today Date: " + date_string + "\\n\\n<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {{- message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

QWEN3 = """{%- for message in messages %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""

FIREFUNCTION = """{%- set system_prompt_suffix -%}
{%- filter trim -%}
Available functions as JSON spec:
{%- endfilter -%}
{%- endset -%}
{%- set system_prompt_suffix = system_prompt_suffix + "\\n" + functions -%}
{%- set system_prompt_suffix = system_prompt_suffix + '\\nToday is ' + datetime + '.' -%}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + system_prompt_suffix + '<|eot_id|>' -}}
{%- for message in messages -%}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' -}}
{{- message['content'] + '<|eot_id|>' -}}
{%- endfor -%}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}"""


def test_add_generation_prompt_is_honoured_by_every_renderer() -> None:
    header = "<|start_header_id|>assistant<|end_header_id|>"
    llama = jinja_template(LLAMA_33)
    assert header in llama.apply(USER).text
    assert header in llama.apply(USER, None, RenderOptions(add_generation_prompt=True)).text
    without = llama.apply(USER, None, RenderOptions(add_generation_prompt=False)).text
    assert header not in without and without.endswith("What is today?<|eot_id|>")
    gemma = gemma_template()
    assert gemma.apply(USER).text.endswith("<start_of_turn>model\n")
    assert gemma.apply(USER, None, RenderOptions(False)).text.endswith("<end_of_turn>\n")
    synthetic = SyntheticTokenizer(ModelSpec("s", "generative", "synthetic", 1))
    assert synthetic.apply_chat(USER).text.endswith("assistant:")
    assert synthetic.apply_chat(USER, None, RenderOptions(False)).text == (
        "user: What is today?")


def test_the_synthetic_backend_renders_a_configured_jinja_template() -> None:
    spec = ModelSpec("s", "generative", "synthetic", 1, options={"chat_template": LLAMA_33})
    assert SyntheticTokenizer(spec).apply_chat(USER).text == jinja_template(LLAMA_33).apply(
        USER).text
    broken = ModelSpec("s", "generative", "synthetic", 1, options={"chat_template": "{% if"})
    with pytest.raises(ModelLoadError, match="s: "):
        SyntheticTokenizer(broken)


def test_the_date_variables_print_today_as_llama_server_gives_them() -> None:
    llama = JinjaRenderer(LLAMA_33, now=lambda: NOW)
    assert "Today Date: 04 Mar 2026" in llama(USER, None, RenderOptions())
    assert JinjaRenderer("{{ strftime_now('%Y-%m-%d %H:%M') }}", now=lambda: NOW)(
        USER, None) == "2026-03-04 05:06"
    today = datetime.now().strftime("%d %b %Y")
    assert f"Today Date: {today}" in jinja_template(LLAMA_33).apply(USER).text


def test_firefunction_renders_its_functions_and_date() -> None:
    """firefunction-v2's template adds ``functions`` and ``datetime`` to strings: both
    undefined, it could not render at all (Jinja's undefined does not concatenate)."""
    fire = JinjaRenderer(FIREFUNCTION, now=lambda: NOW)
    bare = fire(USER, None)
    assert "Available functions as JSON spec:\n\nToday is Mar 04 2026." in bare
    assert bare.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    offered = fire(USER, [TOOL])
    assert '"name": "get_time"' in offered and "Today is Mar 04 2026." in offered
    template = jinja_template(FIREFUNCTION)
    assert template.caps.tools  # its tools come through natively, not the generic format
    prompt = template.apply(USER, [TOOL])
    assert any(p.plain and p.text == "get_time" for p in prompt.parts)  # user text


def test_transformers_generation_block_renders_its_body() -> None:
    source = ("{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
              "A:{{ m.content }}{% endgeneration %}{% else %}U:{{ m.content }}{% endif %}"
              "{% endfor %}")
    history = [*USER, {"role": "assistant", "content": "Tuesday"}]
    assert jinja_template(source).apply(history).text == "U:What is today?A:Tuesday"


@pytest.mark.parametrize(("enable", "end"), [
    (True, "<|im_start|>assistant\n"),
    (False, "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    (None, "<|im_start|>assistant\n"),
])
def test_enable_thinking_reaches_the_template(enable: bool | None, end: str) -> None:
    prompt = jinja_template(QWEN3).apply(USER, None, RenderOptions(enable_thinking=enable))
    assert prompt.text.endswith(end)


def test_enable_thinking_defaults_to_the_models_reasoning_default() -> None:
    plain = ModelSpec("m", "generative", "llamacpp", 1)
    off = ModelSpec("m", "generative", "llamacpp", 1, reasoning=ReasoningFormat(enabled=False))
    on = ModelSpec("m", "generative", "llamacpp", 1, reasoning=ReasoningFormat())
    assert resolved_options(plain, None) == RenderOptions(True, True)
    assert resolved_options(on, None).enable_thinking is True
    assert resolved_options(off, None).enable_thinking is False
    assert resolved_options(off, RenderOptions(False, True)) == RenderOptions(False, True)
    # an undefined enable_thinking reads as false in llama.cpp's R1 template: never left so
    r1 = ("{% if add_generation_prompt %}<｜Assistant｜><think>\n"
          "{% if not enable_thinking %}</think>{% endif %}{% endif %}")
    renderer = JinjaRenderer(r1)
    assert renderer(USER, None, RenderOptions(enable_thinking=True)).endswith("<think>\n")
    assert renderer(USER, None, RenderOptions(enable_thinking=False)).endswith("</think>")


@pytest.mark.parametrize(("prompt", "configured", "opened"), [
    ("<|im_start|>assistant\n<think>\n", False, True),
    ("<|im_start|>assistant\n<think>\n</think>", True, False),
    ("<|im_start|>assistant\n<think>\n\n</think>\n\n", True, False),
    ("<|im_start|>assistant\n", True, True),
    ("<|im_start|>assistant\n", False, False),
    (None, True, True),
])
def test_the_rendered_prompt_says_whether_the_output_starts_inside_thinking(
        prompt: str | None, configured: bool, opened: bool) -> None:
    assert opened_by(prompt, "<think>", "</think>", configured) is opened
