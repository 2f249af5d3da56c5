"""One poll of one vLLM server, as a plain frozen dataclass (made by
:mod:`vtop.sources.vllm`, fed to :class:`vtop.core.server.ServerTracker`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from vtop.model.metrics import VllmMetrics

#: Error kinds; ``http <code>`` is written with the status, e.g. ``http 500``.
ERROR_KINDS = ("refused", "timeout", "http", "not vllm", "garbage", "too large", "reset", "dns", "other")


@dataclass(frozen=True, slots=True)
class ModelsInfo:
    """What ``/v1/models`` says: the served names and the context length."""

    ids: tuple[str, ...]
    #: ``max_model_len`` of the first (base) model
    max_model_len: int | None
    #: ``root`` of the first model: the path or HF id actually loaded
    root: str | None

    @property
    def model_id(self) -> str | None:
        return self.ids[0] if self.ids else None


@dataclass(frozen=True, slots=True)
class ServerPoll:
    """One poll of one server. ``ok`` means ``/metrics`` answered with vLLM
    metrics; ``health``/``models``/``version`` are ``None`` when they were not
    polled this time (see ``info_polled``/``health_polled``) or failed."""

    #: wall-clock time the poll started (for display)
    t: float
    #: monotonic time the poll started (for rates and ages)
    mono: float
    url: str
    ok: bool
    #: None when ok; else one of ERROR_KINDS (``http 500`` style for HTTP)
    error: str | None
    #: one line for a person
    message: str
    #: seconds for /metrics (until the body was read or the error came)
    latency_s: float | None
    body_bytes: int
    metrics: VllmMetrics | None = field(default=None, repr=False)
    #: HTTP status of /metrics, when one came back
    status: int | None = None
    #: /health status code, when polled and answered
    health: int | None = None
    health_polled: bool = False
    #: error kind of /health when polled and it did not answer
    health_error: str | None = None
    models: ModelsInfo | None = None
    version: str | None = None
    info_polled: bool = False
    #: problems with /health, /v1/models, /version (plain words, scrubbed)
    notes: tuple[str, ...] = ()

    @property
    def connected(self) -> bool:
        """Something answered HTTP on the port (even an error page)."""
        return self.status is not None


# --- classification (shared with replays) ---------------------------------------
