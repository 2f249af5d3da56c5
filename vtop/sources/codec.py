"""Plain-JSON forms of what the sources return, for ``--record``, replay and ``--json``.

Each ``*_to_json`` gives a dict of JSON types only (no NaN: ``None``), and
its ``*_from_json`` gives back an equal object, so a replay feeds the very
same dataclasses the live sources produce into the very same trackers; the
round trip is tested field by field.

Why not pickle or ``dataclasses.asdict``: a recording outlives the version
of vtop that wrote it, must be readable by ``jq`` and by people, and must
never carry a secret (``--api-key`` on a command line is masked here).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from vtop.model.redact import redact_argv
from vtop.sources.discovery import ServerProcess, VllmChild
from vtop.sources.metrics_text import HIST_ATTRS, EngineMetrics, Histogram, VllmMetrics
from vtop.sources.vllm import ModelsInfo, ServerPoll

__all__ = [
    "metrics_from_json",
    "metrics_to_json",
    "poll_from_json",
    "poll_to_json",
    "process_from_json",
    "process_to_json",
]

_HIST_FIELDS = HIST_ATTRS
_MAP_FIELDS = ("waiting_by_reason", "request_success_total", "spec_accepted_per_pos", "prompt_tokens_by_source",
               "sleep_state", "http_requests_by_status")


def _num(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def _unnum(x: Any) -> Any:
    if x == "inf":
        return math.inf
    if x == "-inf":
        return -math.inf
    return x


def _hist_to_json(h: Histogram | None) -> Any:
    if h is None:
        return None
    return {"b": [[_num(b), _num(c)] for b, c in h.buckets], "s": _num(h.sum), "c": _num(h.count)}


def _hist_from_json(d: Any) -> Histogram | None:
    if not isinstance(d, dict):
        return None
    return Histogram(
        buckets=tuple((float(_unnum(b)), float(_unnum(c))) for b, c in d.get("b", ())),
        sum=_unnum(d.get("s")),
        count=_unnum(d.get("c")),
    )


def _values_to_json(v: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(v):
        if f.name in skip:
            continue
        x = getattr(v, f.name)
        if f.name in _HIST_FIELDS:
            x = _hist_to_json(x)
        elif f.name in _MAP_FIELDS:
            x = {k: _num(n) for k, n in x.items()}
        elif isinstance(x, tuple):
            x = list(x)
        else:
            x = _num(x)
        out[f.name] = x
    return out


def _values_from_json(cls: type, d: Mapping[str, Any]) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    names = {f.name for f in fields(cls)}
    for k, x in d.items():
        if k not in names or k == "engines":
            continue
        if k in _HIST_FIELDS:
            x = _hist_from_json(x)
        elif k in _MAP_FIELDS:
            x = {str(a): float(_unnum(b)) for a, b in (x or {}).items()}
        elif k == "cache_config" and isinstance(x, list):
            x = tuple((str(a), str(b)) for a, b in x)
        elif isinstance(x, list):
            x = tuple(x)
        else:
            x = _unnum(x)
        kw[k] = x
    return kw


def metrics_to_json(m: VllmMetrics) -> dict[str, Any]:
    d = _values_to_json(m, skip=("engines",))
    d["engines"] = [_values_to_json(e) for e in m.engines]
    return d


def metrics_from_json(d: Mapping[str, Any]) -> VllmMetrics:
    kw = _values_from_json(VllmMetrics, d)
    kw["engines"] = tuple(EngineMetrics(**_values_from_json(EngineMetrics, e)) for e in d.get("engines") or ())
    return VllmMetrics(**kw)


def poll_to_json(p: ServerPoll, *, metrics: bool = True) -> dict[str, Any]:
    """A poll; ``metrics=False`` leaves the parsed metrics out (the recorder
    stores them separately, as changes)."""
    d: dict[str, Any] = {
        "t": p.t, "mono": p.mono, "url": p.url, "ok": p.ok, "error": p.error, "message": p.message,
        "latency_s": _num(p.latency_s), "body_bytes": p.body_bytes, "status": p.status,
    }
    if p.health_polled:
        d.update(health=p.health, health_polled=True, health_error=p.health_error)
    if p.info_polled:
        d["info_polled"] = True
        d["version"] = p.version
        if p.models is not None:
            d["models"] = {"ids": list(p.models.ids), "max_model_len": p.models.max_model_len, "root": p.models.root}
    if p.notes:
        d["notes"] = list(p.notes)
    if metrics and p.metrics is not None:
        d["metrics"] = metrics_to_json(p.metrics)
    return d


def poll_from_json(d: Mapping[str, Any], metrics: VllmMetrics | None = None) -> ServerPoll:
    models = d.get("models")
    mi = None
    if isinstance(models, dict):
        mi = ModelsInfo(ids=tuple(models.get("ids") or ()), max_model_len=models.get("max_model_len"),
                        root=models.get("root"))
    if metrics is None and isinstance(d.get("metrics"), dict):
        metrics = metrics_from_json(d["metrics"])
    return ServerPoll(
        t=float(d["t"]), mono=float(d["mono"]), url=str(d["url"]), ok=bool(d.get("ok")),
        error=d.get("error"), message=str(d.get("message") or ""), latency_s=d.get("latency_s"),
        body_bytes=int(d.get("body_bytes") or 0), metrics=metrics, status=d.get("status"),
        health=d.get("health"), health_polled=bool(d.get("health_polled")), health_error=d.get("health_error"),
        models=mi, version=d.get("version"), info_polled=bool(d.get("info_polled")),
        notes=tuple(d.get("notes") or ()),
    )


def process_to_json(sp: ServerProcess) -> dict[str, Any]:
    """A server process with its argv masked (``--api-key`` never leaves the box)."""
    out: dict[str, Any] = {}
    for f in fields(sp):
        if f.name == "api_key":
            continue
        x = getattr(sp, f.name)
        if f.name == "argv":
            x = list(redact_argv(x))
        elif f.name == "children":
            x = [{cf.name: (list(map(list, getattr(c, cf.name))) if cf.name == "ranks" else getattr(c, cf.name))
                  for cf in fields(c)} for c in x]
        elif isinstance(x, tuple):
            x = list(x)
        out[f.name] = x
    return out


def _child_from_json(c: Mapping[str, Any], cnames: set[str]) -> VllmChild:
    kw: dict[str, Any] = {a: (tuple(tuple(r) for r in b) if a == "ranks" else b) for a, b in c.items() if a in cnames}
    return VllmChild(**kw)


def process_from_json(d: Mapping[str, Any]) -> ServerProcess:
    names = {f.name for f in fields(ServerProcess)}
    kw: dict[str, Any] = {}
    for k, x in d.items():
        if k not in names:
            continue
        if k == "children":
            cnames = {f.name for f in fields(VllmChild)}
            x = tuple(_child_from_json(c, cnames) for c in x)
        elif isinstance(x, list):
            x = tuple(x)
        kw[k] = x
    return ServerProcess(**kw)
