"""Anthropic Messages on the serving core: request bodies (``schemas``) and the translation
to the core's request and from its output events (``translate``)."""
