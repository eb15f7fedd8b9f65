"""The prompts the benchmarks send: one definition each, so that every benchmark that says
"the benchmark's prompts" sends the same text."""

from __future__ import annotations

import random

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator works to a curious ten year old child.",
    "List some reasons why people enjoy hiking in the mountains during autumn.",
    "Describe the city of Paris in the spring, its streets, cafes and gardens.",
    "What are the main differences between a violin and a cello? Explain in detail.",
    "Tell me about the history of the bicycle and how its design changed over time.",
    "Write a letter from a sailor to his family after a long voyage at sea.",
    "Summarize the life cycle of a butterfly from egg to adult, step by step.",
    "Give advice to a student who is starting to learn how to program computers.",
    "Describe a busy market day in a small village by the river.",
    "Why is the sky blue during the day and red at sunset? Explain the physics.",
    "Write a recipe for a simple vegetable soup that anyone can cook at home.",
    "Imagine a robot that learns to paint. Describe its first painting.",
    "What makes a good friend? Give several examples from everyday life.",
    "Describe the sounds and smells of a forest after heavy rain.",
    "Explain the rules of chess to someone who has never played a board game.",
]
"""Open-ended prompts for the real model: generation runs to ``max_tokens``."""

SYSTEM_PREFIX = (
    "You are a helpful assistant for a public library. Answer questions about opening "
    "hours, membership, borrowing rules, events and the catalogue. Be accurate and brief. "
    "The library opens at nine in the morning and closes at eight in the evening on "
    "weekdays, and at five on Saturdays; it is closed on Sundays and public holidays. "
    "Members may borrow up to twelve items for three weeks and renew twice online. "
    "Children's story time is on Wednesday mornings; the reading club meets on the first "
    "Thursday of each month. Printing costs ten cents a page. Quiet study rooms can be "
    "booked for two hours at a time at the front desk or on the website. "
) * 2
"""A shared system prompt of about 200 tokens, for the prefix-reuse comparisons."""

LLM_PROMPTS = [PROMPTS[i] for i in (0, 1, 2, 3, 5, 7, 8, 10)]
"""Eight of ``PROMPTS``: the overload, chaos and simulator-validation workloads on the real
model."""
SYNTH_PROMPTS = [f"request number {i} with a few words of prompt" for i in range(16)]
"""Prompts for the synthetic model (its cost depends on token counts only)."""

TOPICS = ["a public library", "a bicycle repair shop", "a city bus company",
          "a dental clinic", "a mountain hotel", "an online bookshop", "a tax office",
          "a football club", "a bakery chain", "a museum of science"]
QUESTIONS = ["When do you open?", "How much does it cost?", "Can I book online?",
             "Who do I call about a complaint?", "Is there parking nearby?",
             "What should I bring?", "Do you have a student discount?",
             "How long does it take?"]
"""Short questions put after a ``system_prompt``."""


def system_prompt(app: int, words: int) -> str:
    """A long, app-specific instruction block (deterministic)."""
    rng = random.Random(app)
    topic = TOPICS[app % len(TOPICS)]
    facts = [f"Rule {i + 1} for {topic}: item {rng.randint(100, 999)} costs "
             f"{rng.randint(2, 90)} euros and is available on day {rng.randint(1, 28)}."
             for i in range(max(1, words // 14))]
    return (f"You are the assistant of {topic} (application {app}). Answer in one short "
            f"sentence, using only these facts. " + " ".join(facts) + "\n\nQuestion: ")
