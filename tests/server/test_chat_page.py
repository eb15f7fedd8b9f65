"""The chat page at ``/``: served without a key (it holds no data), and in headless Chromium
it lists the chat models with the key typed into its key field, preselects the default
model, and shows a typed message's answer as it streams in from ``/v1/chat/completions``."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.server.browser import Browser, needs_chromium
from tests.server.live import LiveServer, assert_error, config_with, synth_chat

KEY = "key-chat-page"
REPLY = ("Hello! I am a synthetic model: this answer streams in one byte per decode step, "
         "so the page shows it as it grows.")
CHAT = "chat-model"


@pytest.fixture
def live(serve: Callable[..., LiveServer]) -> LiveServer:
    scripted = {"byte_tokens": True, "vocab_size": 300, "reply": REPLY, "step_fixed_s": 0.01}
    return serve(config_with(
        models=[synth_chat("other-chat", **scripted), synth_chat(CHAT, **scripted),
                synth_chat("plain-completion", completion_only=True)],
        server={"default_model": CHAT},
        tenants=[{"id": "web", "api_keys": [KEY]}]))


def test_the_chat_page_answers_without_a_key_and_names_the_default_model(
        live: LiveServer) -> None:
    with live.client() as c:
        page = c.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert f'<meta name="sluice-default-model" content="{CHAT}">' in page.text
        assert "/v1/chat/completions" in page.text and "getReader" in page.text
        assert c.get("/v1/models").status_code == 401  # the data behind it needs the key
        assert_error(c.post("/", json={}), 405)  # a wrong method: an error body, not a page
        assert c.get("/").status_code == 200


@needs_chromium
def test_a_typed_message_streams_its_answer_into_the_page(live: LiveServer) -> None:
    with Browser(width=1100, height=720) as browser:
        browser.goto(f"{live.url}/")
        browser.wait_for("document.getElementById('note').textContent.includes('API key')")
        browser.type_into("#key", KEY)
        browser.click("#prompt")  # leaving the key field fires its change: models reload
        options = browser.wait_for(
            "Array.from(document.querySelectorAll('#model option')).map(o => o.value)")
        assert options == ["other-chat", CHAT]  # chat models only, in configured order
        assert browser.evaluate("document.getElementById('model').value") == CHAT
        # every length the answer's text has in the DOM, as it changes
        browser.evaluate("""window.lengths = [];
            new MutationObserver(() => {
              const a = document.querySelector('.msg.assistant .content');
              if (a) window.lengths.push(a.textContent.length);
            }).observe(document.getElementById('log'),
                       {subtree: true, childList: true, characterData: true})""")
        browser.type_into("#prompt", "Say hello.")
        browser.click("#send")
        browser.wait_for("!!document.querySelector('.msg.assistant .meta')")
        answer = browser.evaluate("document.querySelector('.msg.assistant .content').textContent")
        assert answer == REPLY
        assert browser.evaluate("document.querySelector('.msg.user').textContent") == "Say hello."
        meta = browser.evaluate("document.querySelector('.msg.assistant .meta').textContent")
        assert meta.startswith("finish: stop")
        lengths = browser.evaluate("window.lengths")
        partial = {n for n in lengths if 0 < n < len(REPLY)}
        assert len(partial) >= 3, lengths  # shown as it grew, not all at once at the end
        assert not browser.evaluate("!!document.querySelector('.msg.error')")
    with live.client(headers={"Authorization": f"Bearer {KEY}"}) as c:
        assert c.get("/v1/models").status_code == 200  # the server serves on


def test_without_the_web_ui_the_root_is_404_and_the_apis_still_answer(
        serve: Callable[..., LiveServer]) -> None:
    live = serve(config_with(models=[synth_chat(CHAT)], server={"web_ui": False}))
    with live.client() as c:
        assert_error(c.get("/"), 404)
        assert c.get("/v1/models").status_code == 200
        assert c.get("/health").status_code == 200
