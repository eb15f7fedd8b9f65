"""What the HTTP layer shares: one ``AppContext`` per app, built by ``create_app``.

Its own module so that the app (which builds it) and the routes (which read it) import it
rather than each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from sluice.config import Config
from sluice.engine.runtime import Runtime
from sluice.server.auth import Auth
from sluice.server.decisions import DecisionLog
from sluice.server.history import History
from sluice.server.quota import QuotaGate


@dataclass
class AppContext:
    """What every route needs; stored on ``app.state.ctx``."""

    config: Config
    runtime: Runtime
    auth: Auth
    registry: CollectorRegistry
    quota: QuotaGate
    history: History = field(default_factory=History)
    """The status page's last minutes, recorded while the app runs (``sampler``)."""
    decisions: DecisionLog = field(default_factory=DecisionLog)
    """The last requests' decisions (the runtime's observer feeds it)."""
    preloaded: bool = False
    """The default model loaded at start-up (``/ready`` turns 200)."""
    load_error: str | None = None
    """Why the default model failed to load at start-up (fit for a public body), if it
    did: ``/health`` fails until it is loaded."""
    grpc_port: int | None = None
    """The gRPC server's bound port, once started (``server.grpc_port``)."""
