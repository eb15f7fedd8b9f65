"""The HTTP front end: OpenAI-compatible and native endpoints, SSE, auth, metrics, status."""
