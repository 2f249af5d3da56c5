"""One request-log line's news about one request: what every engine's request-log parser gives the tracker
(:mod:`vtop.core.requests.log` for vLLM's lines, :mod:`vtop.core.requests.sglang_log` for SGLang's). Pure."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RequestEvent"]


@dataclass(frozen=True, slots=True)
class RequestEvent:
    """What one request-log line says about one request.

    ``kind`` is ``"received"``, ``"added"``, ``"finished"`` (V0 ``Finished
    request``, or a non-delta ``Generated response``), ``"aborted"``, or
    ``"delta"`` (a ``Generated response … (streaming delta)`` line: the request
    is producing output, it has not ended). SGLang's lines give ``"received"``,
    ``"finished"`` and ``"aborted"`` (:mod:`vtop.core.requests.sglang_log`).
    """

    kind: str
    request_id: str
    log_t: float | None
    endpoint: str | None
    max_tokens: int | None
    temperature: float | None
    n: int | None
    finish_reason: str | None
    prompt_chars: int | None
    #: Tokens in the logged ``prompt_token_ids`` list (≤0.11 Received lines), when complete.
    prompt_tokens: int | None = None
    #: True for a ``Generated response`` line (``--enable-log-outputs``), False for V0's ``Finished request``.
    output_logged: bool = False
    #: the engine whose request log the line is in (``None``: vLLM's; "sglang"), as
    #: :attr:`~vtop.core.phases.patterns.LogEvent.engine`: the tracker reads its end lines by its table
    engine: str | None = None
    #: the request's sampling parameters say it has no cap on new tokens (SGLang's ``max_new_tokens`` None: a
    #: client that sent no ``max_tokens``; the engine lets it run to its context length less the prompt)
    max_tokens_omitted: bool = False
    #: tokens the request generated, where its end line says (SGLang's ``completion_tokens``)
    completion_tokens: int | None = None
    #: the request this line's id is one sample of (SGLang's ``<rid>_<hex>`` for ``n`` > 1): its end is one
    #: sample's; the request ends with its ``n``-th
    child_of: str | None = None
