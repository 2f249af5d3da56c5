"""Prompts out of log lines (vtop never shows or writes a prompt unless asked). Pure."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from vtop.model.pyrepr import entries

#: A Python ``repr()`` of a ``str`` (vLLM logs prompts and outputs with ``%r``):
#: ``'…'`` or ``"…"`` with backslash escapes and never a raw newline. Shared with
#: :mod:`vtop.actions.snapshot`, which compiles it as bytes.
PY_STR_REPR = r"""(?:'[^'\\\n]*(?:\\.[^'\\\n]*)*'|"[^"\\\n]*(?:\\.[^"\\\n]*)*")"""

#: one Python string literal as ``repr`` writes it
PY_STR_RE = re.compile(PY_STR_REPR)
# One escape inside a repr body (each stands for one character).
_ESC_RE = re.compile(r"\\(?:x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|N\{[^}]*\}|[0-7]{1,3}|.)", re.S)

# Where a request line's prompt (or request body) starts.
_PROMPT_AT_RE = re.compile(r"(?:\bReceived request \S+?: |\bRequest \S+ details: )prompt: ")
_TOKEN_IDS_AT_RE = re.compile(r"\bprompt_token_ids: \[[^\]\r\n]*\]?")
_BODY_AT_RE = re.compile(r"\bRequest \S+ JSON body: ")
_CUT_MARK = " …"  # what vtop.sources.logtail appends to a line it had to cut


def repr_len(literal: str) -> int:
    """Characters of the string a ``repr`` literal (quotes included) stands for."""
    body = literal[1:-1]
    if "\\" not in body:
        return len(body)
    n = len(body)
    for m in _ESC_RE.finditer(body):
        n -= len(m.group()) - 1
    return n


def redact_prompts(line: str) -> str:
    """``line`` with the prompt of a request line replaced by ``<redacted N chars>``.

    Covers ``Received request X: prompt: '…'`` (≤0.11 INFO) and ``Request X
    details: prompt: '…'`` (0.15+ DEBUG), the ``prompt_token_ids`` list that
    follows them (token ids decode back to the prompt: ``<redacted N ids>``),
    and 0.15+'s DEBUG ``Request X JSON body: {…}``. A line cut inside the prompt
    loses everything after ``prompt: ``. Other lines come back unchanged.
    """
    if "prompt: " not in line and " JSON body: " not in line:
        if "obj=" in line or "] in=" in line or '"event": "request.' in line:
            return _redact_sglang(line)
        return line
    body = line.rstrip("\r\n")
    ending = line[len(body) :]
    out = body
    m = _PROMPT_AT_RE.search(body)
    if m:
        start = m.end()
        lit = PY_STR_RE.match(body, start)
        if lit:
            head = body[:start] + f"<redacted {repr_len(lit.group())} chars>"
            tail = body[lit.end() :]
            tail = _TOKEN_IDS_AT_RE.sub(_redact_ids, tail, count=1)
            out = head + tail
        elif body.startswith("None", start) and not body[start + 4 : start + 5].isalnum():
            tail = _TOKEN_IDS_AT_RE.sub(_redact_ids, body[start:], count=1)
            out = body[:start] + tail
        else:  # unterminated (a cut line): the rest of the line may all be prompt
            rest = body[start:]
            cut = rest.endswith(_CUT_MARK)
            if cut:
                rest = rest[: -len(_CUT_MARK)]
            out = body[:start] + f"<redacted {len(rest)} chars>" + (_CUT_MARK if cut else "")
    else:
        b = _BODY_AT_RE.search(body)
        if b:
            rest = body[b.end() :]
            out = body[: b.end()] + f"<redacted {len(rest)} chars>"
    return out + ending


# --------------------------------------------------------------------------- SGLang's request log
# SGLang 0.5.17 (``python/sglang/srt/utils/request_logger.py``, ``RequestLogger.log_received_request``,
# ``log_openai_received_request``, ``log_finished_request``) logs, with ``--log-requests`` (the record format
# ``[%(asctime)s] %(message)s``):
#   ``Receive: obj=GenerateReqInput(rid='…', …, text='…', input_ids=[…], …, sampling_params={…}, …)[, headers={…}]``
#   ``Finish: obj=GenerateReqInput(…)[, headers={…}], out={'text': '…', 'output_ids': […], 'meta_info': {…}}``
#   ``Receive OpenAI: obj={'messages': […], …}`` (``--log-requests-level`` 2 and 3: the OpenAI request as sent)
# and with ``--log-requests-format json`` one JSON object a line (``log_json``: ``{"timestamp": …, "event":
# "request.received" | "request.finished" | "request.received.openai", "rid": …, "obj": {…}, "out": {…}}``).
# Before 0.4 (``TokenizerManager``) the finish line was ``in={obj or its text}, out={out}``. The level decides
# what is in them (``RequestLogger._compute_metadata``): 0 and 1 leave out the inputs and outputs below (1 keeps
# the sampling parameters), 2 (the default) cuts each string and list to 2048, 3 logs them whole. What is
# blanked here is what SGLang's own levels 0/1 leave out as inputs and outputs (``skip_names``,
# ``out_skip_names``), the prompt's token ids ``out`` carries on request, and every list in ``meta_info``
# (the logprobs, which carry the tokens' text, hidden states): whatever the level, nothing of the prompt or the
# answer is left, and the metadata vtop reads (``rid``, ``sampling_params``, ``finish_reason``, the token
# counts) stays. Where a line breaks off (cut, or not in this grammar) everything from there is blanked.
#: the request's inputs (``GenerateReqInput`` / ``EmbeddingReqInput`` fields)
SGL_INPUT_FIELDS = frozenset({"text", "input_ids", "input_embeds", "image_data", "audio_data", "video_data",
                              "mm_data_mooncake"})
#: the answer's parts in ``out``
SGL_OUTPUT_KEYS = frozenset({"text", "output_ids", "embedding", "prompt_token_ids", "pooled_hidden_state"})
_SGL_OBJ_AT_RE = re.compile(r"\] (?:Receive|Finish): obj=\w+\(")
_SGL_OPENAI_AT_RE = re.compile(r"\] Receive OpenAI: obj=")
_SGL_OLD_AT_RE = re.compile(r"\] in=")
_SGL_JSON_AT_RE = re.compile(r"\] (?=\{\"timestamp\": .*\"event\": \"request\.)")


class _Cut(Exception):
    """The line breaks off (or leaves the grammar) at ``pos``: blank from there."""

    def __init__(self, pos: int) -> None:
        super().__init__(pos)
        self.pos = pos


def _redact_sglang(line: str) -> str:
    body = line.rstrip("\r\n")
    ending = line[len(body) :]
    cut = body.endswith(_CUT_MARK)
    if cut:
        body = body[: -len(_CUT_MARK)]
    m = _SGL_OBJ_AT_RE.search(body)
    repl: list[tuple[int, int, str]] = []
    try:
        if m is not None:
            _sgl_obj(body, m.end(), repl)
        elif (o := _SGL_OPENAI_AT_RE.search(body) or _SGL_OLD_AT_RE.search(body)) is not None:
            raise _Cut(o.end())  # the OpenAI request as sent (its messages), or an old line's text: all of it
        elif (j := _SGL_JSON_AT_RE.search(body)) is not None:
            return _sgl_json(body, j.end(), cut) + ending
        else:
            return line
    except _Cut as c:
        repl = [r for r in repl if r[1] <= c.pos]
        repl.append((c.pos, len(body), f"<redacted {len(body) - c.pos} chars>" + (_CUT_MARK if cut else "")))
        cut = False
    out = body
    for a, b, text in sorted(repl, reverse=True):
        out = out[:a] + text + out[b:]
    return out + (_CUT_MARK if cut else "") + ending


def _blank(repl: list[tuple[int, int, str]], s: str, a: int, b: int, ids: bool) -> None:
    """Blank ``s[a:b]`` (a value; ``None`` stays: nothing was sent)."""
    v = s[a:b]
    if v == "None":
        return
    if PY_STR_RE.fullmatch(v):
        text = f"<redacted {repr_len(v)} chars>"
    elif ids and v.startswith("["):
        text = f"<redacted {len(re.findall(r'-?[0-9]+', v))} ids>"
    else:  # a cut string ('head' ... 'tail'), a batch's list, any other value: its size in the log
        text = f"<redacted {b - a} chars logged>"
    repl.append((a, b, text))


def _sgl_obj(s: str, at: int, repl: list[tuple[int, int, str]]) -> None:
    """``Name(fields)`` from ``at`` (after the bracket), then ``, headers={…}, out={…}`` to the end."""
    ents, close = entries(s, at, keyed=False)
    for name, a, b in ents:
        if b < 0:
            raise _Cut(a)
        if name in SGL_INPUT_FIELDS:
            _blank(repl, s, a, b, name.endswith("_ids"))
    if close < 0 or s[close] != ")":
        raise _Cut(ents[-1][2] if ents else at)
    rest = close + 1
    if rest == len(s):
        return
    if not s.startswith(", ", rest):
        raise _Cut(rest)
    tail, end = entries(s, rest + 2, keyed=False, end_ok=True)
    for name, a, b in tail:
        if b < 0:
            raise _Cut(a)
        if name == "out":
            _sgl_out(s, a, b, repl)
        elif name != "headers":  # only the whitelisted routing headers are logged
            _blank(repl, s, a, b, False)
    if end != len(s):
        raise _Cut(tail[-1][2] if tail else rest)


def _sgl_out(s: str, a: int, b: int, repl: list[tuple[int, int, str]]) -> None:
    if not s.startswith("{", a):
        _blank(repl, s, a, b, False)
        return
    ents, close = entries(s, a + 1, keyed=True)
    for key, va, vb in ents:
        if vb < 0:
            raise _Cut(va)
        if key in SGL_OUTPUT_KEYS:
            _blank(repl, s, va, vb, key.endswith("_ids"))
        elif key == "meta_info" and s.startswith("{", va):
            meta, mclose = entries(s, va + 1, keyed=True)
            for mk, ma, mb in meta:
                if mb < 0:
                    raise _Cut(ma)
                if s[ma] in "[(" or "logprob" in mk or "hidden_state" in mk:
                    _blank(repl, s, ma, mb, False)
            if mclose < 0:
                raise _Cut(meta[-1][2] if meta else va + 1)
    if close < 0 or close + 1 != b:
        raise _Cut(ents[-1][2] if ents else a + 1)


def _sgl_json(body: str, at: int, cut: bool) -> str:
    """A ``--log-requests-format json`` line: its inputs and outputs blanked, the rest written back."""
    try:
        d = json.loads(body[at:]) if not cut else None
    except ValueError:
        d = None
    if not isinstance(d, dict):  # cut short: keep what comes before the request itself
        o = body.find('"obj": ', at)
        start = o + len('"obj": ') if o >= 0 else at
        return body[:start] + f"<redacted {len(body) - start} chars>" + (_CUT_MARK if cut else "")
    def blank(dd: dict[str, object], keys: Iterable[str]) -> None:
        for k in keys:
            if dd.get(k) is not None:
                v = dd[k]
                dd[k] = f"<redacted {len(v) if isinstance(v, str) else len(json.dumps(v))} chars>"

    obj = d.get("obj")
    if str(d.get("event")) == "request.received.openai":
        blank(d, ("obj",))
    elif isinstance(obj, dict):
        blank(obj, SGL_INPUT_FIELDS & obj.keys())
    out = d.get("out")
    if isinstance(out, dict):
        blank(out, SGL_OUTPUT_KEYS & out.keys())
        meta = out.get("meta_info")
        if isinstance(meta, dict):
            blank(meta, [k for k, v in meta.items() if isinstance(v, list) or "logprob" in k or "hidden_state" in k])
    return body[:at] + json.dumps(d, ensure_ascii=False)


def _redact_ids(m: re.Match[str]) -> str:
    ids = m.group()[len("prompt_token_ids: [") :].rstrip("]").strip()
    n = ids.count(",") + 1 if ids else 0
    return f"prompt_token_ids: <redacted {n} ids>"


# --------------------------------------------------------------------------- argv
_REDACTED = "***"
#: ``vllm serve`` flags whose value is a secret
_SECRET_FLAGS = frozenset({"--api-key", "--hf-token", "--ssl-keyfile-password"})


def redact_argv(argv: Iterable[str]) -> list[str]:
    """Copy of ``argv`` with the values of secret flags replaced by ``***``."""
    out: list[str] = []
    hide_next = False
    for tok in argv:
        if hide_next:
            out.append(_REDACTED)
            hide_next = False
            continue
        name, eq, _ = tok.partition("=")
        if name in _SECRET_FLAGS:
            if eq:
                out.append(f"{name}={_REDACTED}")
            else:
                out.append(tok)
                hide_next = True
            continue
        out.append(tok)
    return out


# --------------------------------------------------------------------------- secrets by pattern
#: What a secret looks like in text vtop copies (log lines, py-spy output, a process's command line,
#: a URL), whether or not vtop knows the value: a server in a container or of another user shows no
#: argv to vtop, yet its log prints ``non-default args: {... 'api_key': ['S'] ...}``.
_SECRET_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # vllm serve --api-key S / --api-key=S / --hf-token S (and a shell's quotes around S)
    (re.compile(r"(--(?:api-key|hf-token|ssl-keyfile-password|token|password)(?:=|\s+))(?!\*\*\*)(['\"]?)[^\s'\"]+\2"),
     r"\1***"),
    # vLLM's "non-default args: {'api_key': ['S'], 'hf_token': 'S'}" (a Python dict's repr)
    (re.compile(r"""(['"](?:api_key|hf_token|ssl_keyfile_password|token|password|secret)['"]\s*:\s*)"""
                r"""(?:\[[^\]\n]*\]|'[^'\n]*'|"[^"\n]*")"""),
     r"\1'***'"),
    # Authorization: Bearer S / Basic S, and a bare "Bearer S"
    (re.compile(r"(?i)(\bauthorization\b['\"]?\s*[:=]\s*['\"]?(?:bearer|basic)\s+)[^\s'\",}]+"), r"\1***"),
    (re.compile(r"(\bBearer\s+)(?!\*\*\*)[A-Za-z0-9._~+/=-]{8,}"), r"\1***"),
    # HF_TOKEN=S, OPENAI_API_KEY=S, AWS_SECRET_ACCESS_KEY=S, DB_PASSWORD=S (environment dumps, shells)
    (re.compile(r"\b([A-Za-z][A-Za-z0-9_]*(?:TOKEN|_KEY|SECRET|PASSWORD|PASSWD)(?:_[A-Za-z0-9]+)?)=(?!\*\*\*)[^\s'\"]+"),
     r"\1=***"),
    # OpenAI-style and Hugging Face token shapes wherever they stand
    (re.compile(r"\bsk-(?:proj-)?[A-Za-z0-9_-]{16,}"), "sk-***"),
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), "hf_***"),
    # a webhook's URL is its secret: Slack's hook path, Discord's and Teams' tokens (issue #41's alert delivery)
    (re.compile(r"(\bhttps?://hooks\.slack\.com/(?:services|workflows|triggers)/)[^\s'\"<>]+"), r"\1***"),
    (re.compile(r"(\bhttps?://(?:[a-z0-9-]+\.)*discord(?:app)?\.com/api/webhooks/)[^\s'\"<>]+"), r"\1***"),
    # a token in a URL's query: ?token=S, &access_token=S, &key=S, &sig=S
    (re.compile(r"(?i)([?&](?:token|access_token|auth|key|api_key|apikey|secret|password|sig|signature)=)"
                r"(?!\*\*\*)[^&\s'\"#<>]+"), r"\1***"),
    # userinfo in a URL: scheme://user:password@host
    (re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@'\"]+:)[^/\s@'\"]+@"), r"\1***@"),
)
#: cheap literal screen before the regexes (a line with none of these holds no pattern above)
_SECRET_HINTS = ("key", "KEY", "token", "TOKEN", "Token", "password", "PASSWORD", "PASSWD", "secret", "SECRET",
                 "Bearer", "bearer", "BEARER", "uthorization", "UTHORIZATION", "sk-", "hf_", "@", "hooks.slack",
                 "/webhooks/", "sig=", "auth=", "Key=")


def scrub_secrets(text: str) -> str:
    """``text`` with every secret-shaped value replaced by ``***`` (see ``_SECRET_PATTERNS``).

    Applied to everything vtop writes or shows that came from outside: log lines (the pane, recordings,
    the bundle's log copy), py-spy output, command lines. Known values (``--api-key`` given to vtop)
    are scrubbed as well by the snapshot's own pass; this one needs no knowledge of them."""
    if not any(h in text for h in _SECRET_HINTS):
        return text
    for rx, repl in _SECRET_PATTERNS:
        text = rx.sub(repl, text)
    return text


def redact_webhook(url: str) -> str:
    """A webhook's URL as vtop shows and writes it: ``https://hooks.slack.com/***``, ``https://ntfy.sh/***``.

    The whole path and query go: a webhook's URL is its credential (Slack's ``/services/T/B/X``, an ntfy
    topic anyone who knows it may read, a ``?token=``), and the user and password too. The scheme, host
    and port stay, so a person can tell which of several hooks failed. A prefix (``slack:``) stays."""
    from urllib.parse import urlsplit

    prefix, rest = "", url.strip()
    head, colon, tail = rest.partition(":")
    if colon and head.lower() in ("slack", "ntfy", "json") and not tail.startswith("//"):
        prefix, rest = head.lower() + ":", tail
    try:
        parts = urlsplit(rest)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return prefix + "***"
    if not parts.scheme or not host:
        return prefix + "***"
    shown = f"[{host}]" if ":" in host else host
    tail_shown = "/***" if (parts.path.strip("/") or parts.query or parts.fragment or parts.username) else ""
    return f"{prefix}{parts.scheme}://{shown}{f':{port}' if port else ''}{tail_shown}"


def redact_url(url: str) -> str:
    """A URL with its password (``user:pw@``) replaced by ``***`` for display."""
    return split_userinfo(url)[0]


def split_userinfo(url: str) -> tuple[str, str | None]:
    """``(url, None)``, or for a URL with a password (``http://user:pw@host:8000``) the URL as every
    face shows it (``http://user:***@host:8000``) and ``"user:pw"`` (percent-decoded) for the one
    place that sends it (the HTTP client's ``Authorization: Basic``). A user without a password is
    no secret and stays. Parsed, not matched: a password holding ``@`` or ``:`` is masked whole."""
    if "@" not in url:
        return url, None
    from urllib.parse import unquote, urlsplit, urlunsplit

    try:
        parts = urlsplit(url if "://" in url else "http://" + url)
    except ValueError:  # not a URL: mask by pattern
        return _SECRET_PATTERNS[-1][0].sub(_SECRET_PATTERNS[-1][1], url), None
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url, None
    user, _, password = userinfo.partition(":")
    shown = urlunsplit((parts.scheme, f"{user}:{_REDACTED}@{hostport}", parts.path, parts.query, parts.fragment))
    if password == _REDACTED:  # already masked (a recording's URL): nothing to send
        return shown, None
    return shown, f"{unquote(user)}:{unquote(password)}"


def basic_auth(userinfo: str) -> str:
    """The ``Authorization`` value for ``"user:password"``."""
    import base64

    return "Basic " + base64.b64encode(userinfo.encode()).decode("ascii")
