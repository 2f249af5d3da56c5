"""SGLang's request log (``--log-requests``), read into the same :class:`~vtop.core.requests.log.RequestEvent`
values as vLLM's. Pure: no I/O.

What SGLang logs, by version (the sources of ``sgl-project/sglang``; 0.5.17 read in its wheel):

========================  ========================================================================================
version                   the lines (each in SGLang's record format ``[%Y-%m-%d %H:%M:%S] message``)
========================  ========================================================================================
≤0.3                      no Receive line; at the end ``in={text or obj}, out={out}`` (not read: no id before the
                          prompt; blanked whole by :func:`vtop.model.redact.redact_prompts`)
0.3-0.4.0                 ``Receive: obj=GenerateReqInput(...)`` and ``Finish: obj=..., out={...}``, strings and
                          lists cut to 2048 (``dataclass_to_string_truncated(obj)``), the prompt always in them
0.4.1-0.4.3               the same, ``--log-requests-level`` 0 (cut to 2048) or 1 (whole)
0.4.4-0.5.x               levels 0-3 (``log_request_metadata``): 0 leaves out the inputs, the outputs and the
                          sampling parameters, 1 only the inputs and outputs, 2 (the default) cuts them to 2048,
                          3 logs them whole
0.5.17                    the same lines from ``RequestLogger`` (``srt/utils/request_logger.py``), with
                          ``, headers={...}`` where whitelisted headers came, ``Receive OpenAI: obj={...}`` (the
                          OpenAI request as sent, levels 2-3) and ``--log-requests-format json``: one JSON object a
                          line (``{"timestamp", "event": "request.received" | "request.finished", "rid", "obj",
                          "out"}``)
========================  ========================================================================================

The fields read (0.5.17's ``RequestLogger.log_received_request`` / ``log_finished_request`` print
``TokenizerManager``'s ``GenerateReqInput`` after ``normalize_batch_and_arguments``, ``io_struct.py``):

* ``rid``: the request's id (a uuid4 hex unless the client sent ``rid``; a list for a batch, and for one prompt
  with ``n`` > 1, which ``_handle_parallel_sampling`` makes a batch of one);
* ``sampling_params``: a dict (a list of them for a batch), as the API layer built it:
  ``max_new_tokens`` None where a chat client sent no ``max_tokens`` (``ChatCompletionRequest.
  to_sampling_params``: ``self.max_completion_tokens or self.max_tokens``); the scheduler then allows
  ``context length - prompt - 1`` (``Scheduler.init_req_max_new_tokens``): the client set no cap
  (:attr:`RequestEvent.max_tokens_omitted`). A ``/generate`` request without the key gets
  ``SamplingParams``' default (128) or ``--preferred-sampling-params``' (``TokenizerManager.
  _create_tokenized_object``): not known from the log, so None and not flagged. ``n``, ``temperature``;
* at the end (``_wait_one_response``, once ``state.finished``): ``out['meta_info']``: ``finish_reason``
  (``{'type': 'stop' | 'length' | 'abort', ...}``, ``schedule_batch.py``'s ``FINISH_*.to_json``),
  ``completion_tokens``. An abort (``POST /abort_request``, a request the scheduler refused) ends with
  ``type: 'abort'``. With ``n`` > 1 each sample ends on its own line, with the id ``<rid>_<uuid4 hex>``
  (``regenerate_rid(prefix=rid)``), after one more such line for the prompt's prefill (its copy asks for 0
  new tokens, ``_handle_batch_request``): the request ends with its ``n``-th sample.

What is **not** logged: a client that goes away ends its request (``create_abort_task`` /
``abort_request``) with no line at INFO, except a ``/generate`` client's (``http_server.py``: ``[http_server]
Client disconnected: Request is disconnected from the client side (type 1). Abort request obj.rid='X'``, read
as an abort; the scheduler's ``Abort running request. req.rid='X'`` lines are DEBUG). So an open entry may have
ended unseen: the end lines do not make the ages exact (:data:`ENDS_EXACT`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from vtop.core.requests.events import RequestEvent
from vtop.model.pyrepr import entries, items, literal_str
from vtop.model.redact import PY_STR_RE, repr_len

__all__ = ["ENDS_EXACT", "MARKERS", "events_from"]

#: lines holding one of these go through :func:`events_from`
MARKERS = ("Receive: obj=", "Finish: obj=", "Abort ", '"event": "request.')
#: an end line does not prove every end is logged (a client's disconnect is not)
ENDS_EXACT = False

_OBJ_RE = re.compile(r"(?P<what>Receive|Finish): obj=(?P<cls>\w+)\(")
# http_server.py's disconnect line and _wait_one_response's message (0.5.17: "obj.rid='X'"; earlier "rid=X");
# the scheduler's DEBUG "Abort running request. req.rid='X'" (scheduler.py, abort_request)
_ABORT_RE = re.compile(r"\bAbort request (?:obj\.)?rid=(?P<q>'?)(?P<id>[^\s',]+)(?P=q)")
_SCHED_ABORT_RE = re.compile(r"^Abort (?:[\w-]+ )*request\. (?:decode_)?req\.rid=(?P<q>'?)(?P<id>[^\s',]+)(?P=q)")
_CHILD_RE = re.compile(r"(?P<base>\S+)_[0-9a-f]{32}")
_REDACTED_RE = re.compile(r"<redacted (\d{1,12}) chars>")
_INT_RE = re.compile(r"-?\d{1,12}")
_FLOAT_RE = re.compile(r"[-+]?(?:\d{1,12}(?:\.\d{0,20})?(?:[eE][-+]?\d{1,4})?|inf|nan)")


def _rx(kind: str, rid: str, log_t: float | None, endpoint: str | None, **kw: Any) -> RequestEvent:
    child = _CHILD_RE.fullmatch(rid)
    return RequestEvent(kind, rid, log_t, endpoint, kw.pop("max_tokens", None), kw.pop("temperature", None),
                        kw.pop("n", None), kw.pop("finish_reason", None), kw.pop("prompt_chars", None),
                        kw.pop("prompt_tokens", None), engine="sglang",
                        child_of=child.group("base") if child and kind != "received" else None, **kw)


def events_from(message: str, log_t: float | None) -> list[RequestEvent]:
    """The request events of one SGLang record's message (prefix removed); ``[]`` for any other. Never raises."""
    try:
        m = _OBJ_RE.match(message)
        if m is not None:
            return _received(message, m, log_t) if m.group("what") == "Receive" else _finished(message, m, log_t)
        if message.startswith('{"timestamp": '):
            return _json(message, log_t)
        a = _ABORT_RE.search(message) or _SCHED_ABORT_RE.match(message)
        if a is not None:
            return [_rx("aborted", a.group("id"), log_t, None, finish_reason="abort")]
    except (ValueError, IndexError, TypeError, AttributeError, RecursionError):
        pass
    return []


# --------------------------------------------------------------------------- the text format


def _fields(s: str, at: int) -> dict[str, str]:
    """The complete top-level fields of ``Name(...)`` from ``at`` (a cut line gives those before the cut)."""
    ents, _ = entries(s, at, keyed=False)
    return {name: s[a:b] for name, a, b in ents if b >= 0}


def _dict(v: str) -> dict[str, str] | None:
    if not v.startswith("{"):
        return None
    ents, close = entries(v, 1, keyed=True)
    return {k: v[a:b] for k, a, b in ents if b >= 0} if close >= 0 else None


def _list(v: str) -> list[str] | None:
    if not v.startswith("["):
        return None
    spans, close = items(v, 1)
    return [v[a:b] for a, b in spans if b >= 0] if close >= 0 else None


def _int(v: str | None) -> int | None:
    return int(v) if v is not None and _INT_RE.fullmatch(v) else None


def _float(v: str | None) -> float | None:
    return float(v) if v is not None and _FLOAT_RE.fullmatch(v) else None


def _params(sp: dict[str, str] | None) -> dict[str, Any]:
    """``max_tokens`` / ``max_tokens_omitted`` / ``temperature`` / ``n`` of one ``sampling_params`` dict."""
    if sp is None:
        return {}
    mnt = sp.get("max_new_tokens")
    return {"max_tokens": _int(mnt), "max_tokens_omitted": mnt == "None", "temperature": _float(sp.get("temperature")),
            "n": _int(sp.get("n"))}


def _received(s: str, m: re.Match[str], log_t: float | None) -> list[RequestEvent]:
    f = _fields(s, m.end())
    endpoint = "embedding" if m.group("cls") == "EmbeddingReqInput" else None
    rid_v = f.get("rid")
    if rid_v is None:
        return []
    rids = [literal_str(x) for x in (_list(rid_v) or [])] if rid_v.startswith("[") else [literal_str(rid_v)]
    sp_v = f.get("sampling_params")
    per: list[dict[str, Any]] = []
    if sp_v is not None and sp_v.startswith("["):
        per = [_params(_dict(x)) for x in (_list(sp_v) or [])]
    elif sp_v is not None:
        per = [_params(_dict(sp_v))]
    text, ids = f.get("text"), f.get("input_ids")
    prompt_chars = None
    if text is not None and PY_STR_RE.fullmatch(text):
        prompt_chars = repr_len(text)
    elif text is not None and (r := _REDACTED_RE.fullmatch(text)) is not None:  # a line redact_prompts went through
        prompt_chars = int(r.group(1))
    prompt_tokens = None
    if ids is not None and ids.startswith("[") and "[" not in ids[1:] and " ... " not in ids:
        body = ids[1:-1].strip()
        prompt_tokens = body.count(",") + 1 if body else 0
    out = []
    for i, rid in enumerate(rids):
        if not rid:
            continue
        p = per[i] if i < len(per) else (per[0] if len(per) == 1 else {})
        one = len(rids) == 1
        out.append(_rx("received", rid, log_t, endpoint, prompt_chars=prompt_chars if one else None,
                       prompt_tokens=prompt_tokens if one else None, **p))
    return out


def _finished(s: str, m: re.Match[str], log_t: float | None) -> list[RequestEvent]:
    ents, close = entries(s, m.end(), keyed=False)
    f = {name: s[a:b] for name, a, b in ents if b >= 0}
    rid = literal_str(f.get("rid") or "")
    if not rid:
        return []
    endpoint = "embedding" if m.group("cls") == "EmbeddingReqInput" else None
    meta: dict[str, str] | None = None
    if close >= 0 and s.startswith(", ", close + 1):
        tail, _ = entries(s, close + 3, keyed=False, end_ok=True)
        out_v = next((s[a:b] for name, a, b in tail if name == "out" and b >= 0), None)
        out = _dict(out_v) if out_v is not None else None
        meta = _dict(out.get("meta_info", "")) if out is not None else None
    reason = None
    tokens = None
    if meta is not None:
        fr = _dict(meta.get("finish_reason", ""))
        reason = literal_str(fr.get("type", "")) if fr is not None else None
        tokens = _int(meta.get("completion_tokens"))
    return [_end(rid, log_t, endpoint, reason, tokens)]


def _end(rid: str, log_t: float | None, endpoint: str | None, reason: str | None, tokens: int | None) -> RequestEvent:
    if reason == "abort":
        return _rx("aborted", rid, log_t, endpoint, finish_reason="abort", completion_tokens=tokens)
    return _rx("finished", rid, log_t, endpoint, finish_reason=reason, completion_tokens=tokens)


# --------------------------------------------------------------------------- --log-requests-format json


def _json(message: str, log_t: float | None) -> list[RequestEvent]:
    if '"event": "request.' not in message:
        return []
    d = json.loads(message)
    if not isinstance(d, dict):
        return []
    event, rid, obj = d.get("event"), d.get("rid"), d.get("obj")
    if not isinstance(obj, dict):
        return []
    if event == "request.received":
        rids = rid if isinstance(rid, list) else [rid]
        sp = obj.get("sampling_params")
        sps = sp if isinstance(sp, list) else [sp]
        out = []
        for i, r in enumerate(rids):
            if not isinstance(r, str) or not r:
                continue
            p = sps[i] if i < len(sps) else (sps[0] if len(sps) == 1 else None)
            out.append(_rx("received", r, log_t, None, **_json_params(p)))
        return out
    if event == "request.finished" and isinstance(rid, str) and rid:
        o = d.get("out")
        meta = o.get("meta_info") if isinstance(o, dict) else None
        reason = tokens = None
        if isinstance(meta, dict):
            fr = meta.get("finish_reason")
            reason = fr.get("type") if isinstance(fr, dict) and isinstance(fr.get("type"), str) else None
            ct = meta.get("completion_tokens")
            tokens = ct if isinstance(ct, int) and not isinstance(ct, bool) else None
        return [_end(rid, log_t, None, reason, tokens)]
    return []


def _json_params(p: Any) -> dict[str, Any]:
    if not isinstance(p, dict):
        return {}
    mnt, te, n = p.get("max_new_tokens", ...), p.get("temperature"), p.get("n")
    return {"max_tokens": mnt if isinstance(mnt, int) and not isinstance(mnt, bool) else None,
            "max_tokens_omitted": mnt is None,
            "temperature": float(te) if isinstance(te, (int, float)) and not isinstance(te, bool) else None,
            "n": n if isinstance(n, int) and not isinstance(n, bool) else None}
