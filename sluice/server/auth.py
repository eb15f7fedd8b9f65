"""API key → tenant. Keys are held only as SHA-256 digests and compared in constant
time; they are never logged."""

from __future__ import annotations

import hmac
import re
from collections.abc import Mapping, Sequence

from fastapi import Request

from sluice.config import TenantConfig, hash_key
from sluice.server.errors import APIError, unauthorized

DEFAULT_TENANT = TenantConfig(id="default")
ADMIN_DISABLED = (
    "Admin routes are disabled: no admin key is configured. Set one with $SLUICE_ADMIN_KEY, "
    "--admin-key-file (or $SLUICE_ADMIN_KEY_FILE, server.admin_key_file) and send it as "
    "X-Admin-Key; or, for local development only, open them with server.open_admin = true "
    "(--open-admin).")
METRICS_DISABLED = (
    "/metrics and /status.json are closed: tenant API keys are configured and no metrics "
    "key is. Set one with server.metrics_key (or $SLUICE_METRICS_KEY) and send it as "
    "'Authorization: Bearer <key>' or X-Metrics-Key; or open them with "
    "server.open_metrics = true.")
NO_KEYS_REQUIRED = (
    "server.require_keys is set but no tenant has an API key (tenants[].api_keys or "
    "tenants[].api_keys_file)")
_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
TENANT_STATE = "tenant"
"""The key of the tenant resolved for a request in its ASGI scope's ``state``
(``request.state.tenant``), where ``QuotaPeekMiddleware`` leaves it for ``Auth.tenant``."""


def _bearer(headers: Mapping[str, str]) -> str | None:
    value = headers.get("authorization", "")
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


class Auth:
    """Resolves the tenant of a request.

    With API keys configured, a key is required (401 otherwise): ``Authorization: Bearer
    <key>``, or ``x-api-key: <key>`` as Anthropic's clients send it.
    With none, the server is open: the tenant is ``X-Tenant-ID`` if given, else
    ``default``; ``require_keys`` refuses to build such an ``Auth`` (``ValueError``).
    """

    def __init__(self, tenants: Sequence[TenantConfig], admin_key: str | None, *,
                 open_admin: bool = False, metrics_key: str | None = None,
                 open_metrics: bool = False, require_keys: bool = False) -> None:
        # Only digests of the keys are held: the tenants kept here carry none.
        keyless = [t.model_copy(update={"api_keys": [], "api_keys_file": None})
                   for t in tenants]
        self._keys: list[tuple[bytes, TenantConfig]] = [
            (hash_key(k).encode(), bare) for t, bare in zip(tenants, keyless, strict=True)
            for k in t.all_api_keys()
        ]
        digests = [d for d, _ in self._keys]
        if len(set(digests)) != len(digests):
            raise ValueError("tenants: an API key is listed for more than one tenant")
        self._tenants = {t.id: t for t in keyless}
        self._admin = hash_key(admin_key).encode() if admin_key else None
        self._open_admin = open_admin
        self._metrics = hash_key(metrics_key).encode() if metrics_key else None
        self._open_metrics = open_metrics
        if require_keys and not self._keys:
            raise ValueError(NO_KEYS_REQUIRED)

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def tenant(self, request: Request) -> TenantConfig:
        """The request's tenant: the one already resolved from its headers
        (``QuotaPeekMiddleware`` keeps it in the scope's state, so a POST hashes and compares
        its key once), else resolved now."""
        known = request.scope.get("state", {}).get(TENANT_STATE)
        if isinstance(known, TenantConfig):
            return known
        return self.tenant_from_headers(request.headers)

    def tenant_from_headers(self, headers: Mapping[str, str]) -> TenantConfig:
        """The tenant of HTTP headers or gRPC metadata (lower-case names)."""
        if not self._keys:
            name = headers.get("x-tenant-id")
            if name is None:
                return self._tenants.get("default", DEFAULT_TENANT)
            if not _TENANT_RE.match(name):
                raise APIError(400, "Invalid X-Tenant-ID header", param="x-tenant-id",
                               code="invalid_value")
            return self.named_tenant(name)
        key = _bearer(headers) or headers.get("x-api-key", "").strip() or None
        if key is None:
            raise unauthorized("Missing API key: send 'Authorization: Bearer <key>' (or "
                               "'x-api-key: <key>')")
        digest = hash_key(key).encode()
        found: TenantConfig | None = None
        for stored, tenant in self._keys:  # no early exit: same time for every key
            if hmac.compare_digest(stored, digest):
                found = tenant
        if found is None:
            raise unauthorized("Invalid API key")
        return found

    def named_tenant(self, name: str) -> TenantConfig:
        """The tenant called ``name`` on an open server: the configured one, else one with the
        ``default`` tenant's priority and ceiling (and no limits of its own)."""
        found = self._tenants.get(name)
        if found is not None:
            return found
        base = self._tenants.get("default", DEFAULT_TENANT)
        return TenantConfig(id=name, priority=base.priority,
                            priority_ceiling=base.priority_ceiling)

    def require_admin(self, request: Request) -> None:
        """The admin key, when one is set (401 otherwise); without one the admin routes are
        disabled (403) unless opened explicitly (``server.open_admin``)."""
        if self._admin is None:
            if self._open_admin:
                return
            raise APIError(403, ADMIN_DISABLED, type="permission_error", code="admin_disabled")
        key = request.headers.get("x-admin-key") or _bearer(request.headers)
        if key is None or not hmac.compare_digest(self._admin, hash_key(key).encode()):
            raise APIError(401, "Admin key required", type="authentication_error",
                           code="invalid_admin_key")

    @property
    def metrics_closed(self) -> bool:
        """``/metrics`` and ``/status.json`` refuse every request: tenants have keys, no
        metrics key is set, and they were not opened (``server.open_metrics``)."""
        return self._metrics is None and self.enabled and not self._open_metrics

    def require_metrics(self, request: Request) -> None:
        """The metrics key on ``/metrics`` and ``/status.json``, when one is set (401
        ``invalid_metrics_key`` otherwise). Without one they are open on a server without
        tenant keys, and closed (403 ``metrics_disabled``) on one with them unless opened:
        they show every tenant's traffic."""
        if self._metrics is None:
            if self.metrics_closed:
                raise APIError(403, METRICS_DISABLED, type="permission_error",
                               code="metrics_disabled")
            return
        key = request.headers.get("x-metrics-key") or _bearer(request.headers)
        if key is None or not hmac.compare_digest(self._metrics, hash_key(key).encode()):
            raise APIError(401, "Metrics key required: send 'Authorization: Bearer <key>' or "
                                "X-Metrics-Key", type="authentication_error",
                           code="invalid_metrics_key")


def startup_warnings(tenants: Sequence[TenantConfig], auth: Auth) -> list[str]:
    """What an operator should know at start-up about who can reach what."""
    out: list[str] = []
    if auth.metrics_closed:
        out.append(METRICS_DISABLED)
    if not auth.enabled:
        limited = [t.id for t in tenants
                   if any(v is not None for v in t.limits.model_dump().values())
                   or t.priority_ceiling is not None]
        if limited:
            out.append(
                f"tenants {limited} have limits but no API keys: any client can claim one "
                "with X-Tenant-ID (its priority, its quota), or escape its quota by naming "
                "another. Give them api_keys (or api_keys_file) and set "
                "server.require_keys = true.")
    return out
