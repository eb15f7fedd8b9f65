"""The ``[server]`` table: the HTTP (and gRPC) front end."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from sluice.config._base import _Strict


class ServerConfig(_Strict):
    """The HTTP front end."""

    host: str = "127.0.0.1"
    """The address to bind, or several separated by commas (``127.0.0.1,::1``), each on
    ``port``."""
    port: int = Field(default=8000, ge=0, le=65535)
    grpc_port: int | None = Field(default=None, ge=0, le=65535)
    """Serve the gRPC API (``sluice.v1.Inference``, health, reflection) on this port of
    ``host``, from the same process and event loop as HTTP; 0 picks a free port; unset: no
    gRPC. Needs the ``grpc`` extra."""
    admin_key: str | None = None
    """Guards ``/admin`` (``X-Admin-Key`` or ``Authorization: Bearer``); also
    ``$SLUICE_ADMIN_KEY``. Without one (here or in ``admin_key_file``) the admin routes are
    disabled (403) unless ``open_admin`` is set."""
    admin_key_file: str | None = None
    """A file holding the admin key (first non-blank, non-``#`` line): a mounted secret
    keeps it out of this file and off the command line. Also ``--admin-key-file`` and
    ``$SLUICE_ADMIN_KEY_FILE``. Read when the server starts."""
    open_admin: bool = False
    """Open ``/admin`` to anyone when no admin key is set: local development only."""
    metrics_key: str | None = None
    """Guards ``/metrics`` and ``/status.json`` (``Authorization: Bearer`` or
    ``X-Metrics-Key``); also ``$SLUICE_METRICS_KEY``. Unset: they are open on a server
    without tenant keys, and closed (403 ``metrics_disabled``) on one with them, unless
    ``open_metrics`` is set."""
    open_metrics: bool = False
    """Open ``/metrics`` and ``/status.json`` without a metrics key on a server with tenant
    keys (a scraper on a private network); they show every tenant's traffic."""
    require_keys: bool = False
    """Every request needs a tenant's API key: the server refuses to start without one,
    rather than let any client claim a tenant (its priority, its quota) by
    ``X-Tenant-ID``."""
    max_body_bytes: int = Field(default=1_000_000, ge=1024)
    """The largest request body (HTTP: 413 past it) and gRPC request message
    (RESOURCE_EXHAUSTED)."""
    header_timeout_s: float = Field(default=10.0, gt=0)
    """A connection sends a complete request head within this many seconds of connecting
    or of its previous response, or it is closed."""
    body_timeout_s: float = Field(default=30.0, gt=0)
    """A request body arrives whole within this many seconds of its head (408 past it)."""
    keep_alive_timeout_s: float = Field(default=5.0, gt=0)
    """An idle keep-alive connection is closed after this many seconds."""
    max_connections: int | None = Field(default=512, ge=1)
    """HTTP connections and requests in progress at once (uvicorn's ``limit_concurrency``):
    past it a request is answered 503 at once. None: no cap."""
    grpc_max_concurrent_rpcs: int = Field(default=256, ge=1)
    """gRPC calls in progress at once; past it a call is RESOURCE_EXHAUSTED at once."""
    default_model: str | None = None
    """The model of a request that names none (llama-server's ``model`` is optional); unset:
    the first model."""
    unknown_model: Literal["refuse", "default"] = "refuse"
    """A request naming a model that is not served: ``refuse`` (404 ``model_not_found``),
    or on a server with one model ``default``: serve it with that model, as llama-server
    does."""
    model_aliases: dict[str, str] = Field(default_factory=dict)
    """More names for configured models (``--alias a,b`` gives a model both names)."""
    cors_origins: list[str] = Field(default_factory=list)
    """Origins a browser may call from (CORS, llama-server's ``--cors-origins``; ``*``: any;
    ``localhost``: any origin on the loopback, ``http://localhost:3000``, ``http://[::1]``
    ...). Empty (the default): no CORS headers, so browsers refuse cross-origin calls."""
    default_max_tokens: int = Field(default=256, ge=1)
    rerank_max_documents: int = Field(default=1000, ge=1, le=100_000)
    """The most documents one rerank request may hold (400 past it); each is a request of
    its own to the reranker, batched with the others."""
    verbose_answers: bool = False
    """Every chat completion answer (not a stream) carries llama-server's ``__verbose``
    (the prompt as rendered) unless the request sets ``verbose: false`` (llama-server's
    ``--verbose``)."""
    web_ui: bool = True
    """Serve the chat page at ``/`` (off: 404 there, as llama-server's ``--no-ui``)."""
    slots_endpoint: bool = True
    """Serve llama-server's ``GET /slots`` and ``POST /slots/{id}`` (off: 501, as
    llama-server's ``--no-slots``)."""
    drain_timeout_s: float = Field(default=10.0, ge=0)
    log_content: bool = False
    """Log prompt and completion text (debug only; off by default)."""
    trace_file: str | None = None
    """Record every request's arrival (model, tenant, token counts, deadline, priority;
    no text) to this JSONL file, which ``sluice simulate --trace`` replays. Off by
    default."""
    strict_fields: bool = False
    """Refuse request bodies with unknown fields (400 naming the field) instead of ignoring
    them (named in the ``x-sluice-ignored-fields`` header)."""
    openapi: bool = False
    """Serve the OpenAPI schema and its pages (``/openapi.json``, ``/docs``, ``/redoc``).
    Off by default: they list every route, admin ones included, to anyone."""

    slot_save_path: str | None = None
    """The folder ``POST /slots/{id}?action=save|restore`` writes and reads a slot's KV in
    (llama-server's ``--slot-save-path``); unset: slot actions answer 501. Checked to be a
    folder when the server starts."""

    def slot_folder(self) -> Path | None:
        """``slot_save_path`` as a folder (``ValueError`` naming the field when it is not
        one)."""
        if self.slot_save_path is None:
            return None
        folder = Path(self.slot_save_path).expanduser()
        if not folder.is_dir():
            raise ValueError(f"server.slot_save_path: {self.slot_save_path} is not a folder")
        return folder

    @field_validator("host")
    @classmethod
    def _host_list(cls, value: str) -> str:
        if any(not part.strip() for part in value.split(",")):
            raise ValueError(f"server.host: an empty address in {value!r}")
        return value

    @property
    def hosts(self) -> list[str]:
        """Every address ``host`` names, in order."""
        return [part.strip() for part in self.host.split(",")]

    def admin_key_value(self) -> str | None:
        """``admin_key``, else the key in ``admin_key_file`` (``ValueError`` naming the field
        when the file cannot be read or holds no key)."""
        if self.admin_key:
            return self.admin_key
        if self.admin_key_file is None:
            return None
        try:
            text = Path(self.admin_key_file).read_text()
        except OSError as exc:
            raise ValueError(f"server.admin_key_file: cannot read {self.admin_key_file}: "
                             f"{exc.strerror}") from None
        keys = [k for k in (line.strip() for line in text.splitlines())
                if k and not k.startswith("#")]
        if not keys:
            raise ValueError(f"server.admin_key_file: {self.admin_key_file} holds no key")
        return keys[0]
