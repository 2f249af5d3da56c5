"""The snapshot key: write everything needed to debug a vLLM box into one folder.

Why it works this way:

* **Blocking, run from a thread.** Copying a multi-GB log takes seconds; the
  UI runs :func:`make_bundle` (or :meth:`SnapshotRunner.start`) off the event
  loop and gets ``progress(done, total)`` calls from that thread. Nothing here
  imports Textual.
* **Never raises.** Every failure becomes a line in
  :attr:`SnapshotResult.problems`; a missing log still leaves the rest of the
  bundle on disk (half a bundle beats none when a server just died).
* **Private by default.** The folder is 0700 and every file 0600, created with
  ``O_EXCL`` (no following a planted symlink). vLLM logs can hold user
  prompts (request logging: ``Received request X: prompt: '...'``): with ``redact_prompts`` the prompt
  text, token ids, JSON bodies and generated outputs of request-log lines are
  replaced by ``[redacted]``. Known secrets (API keys given by the caller, the
  servers' ``--api-key``, secret-looking environment values) are scrubbed
  from every byte written, the log included.
* **The log is streamed**, never read whole: chunks of 1 MiB, processed a
  complete line at a time (so a regex never sees half a request line), up to
  the size the file had when the copy started (a busy server keeps appending;
  a copy to a moving EOF might never end).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import functools
import hashlib
import json
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import vtop
from vtop.model.redact import PY_STR_REPR, redact_argv, redact_prompts, scrub_secrets
from vtop.sources.discovery import ServerProcess

__all__ = [
    "LogRedactor",
    "SnapshotResult",
    "SnapshotRunner",
    "filter_environ",
    "is_secret_env",
    "latest_bundle",
    "make_bundle",
    "read_environ",
    "redact_request_line",
]

CHUNK = 1 << 20
#: A log "line" longer than this without a newline is handled in pieces.
MAX_LINE = 8 << 20
REDACTED = "[redacted]"
SECRET_MASK = "***"
FOLDER_PREFIX = "vtop-snapshot-"

ProgressFn = Callable[[int, int], None]

# --- environment -------------------------------------------------------------------

#: Variables worth keeping in processes.json (exact names and prefixes).
ENV_NAMES = frozenset({"CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF"})
ENV_PREFIXES = ("VLLM_", "NCCL_", "HF_")

_SECRET_NAME_RE = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.I)
_SECRET_VALUE_RES = (
    re.compile(r"^\s*(bearer|basic)\s+\S+", re.I),  # an Authorization header value
    re.compile(r"^(hf|sk|pk|rk|ghp|gho|ghs|github_pat|xox[bpas]|glpat|AKIA|ASIA)[_-]?[A-Za-z0-9_\-]{8,}"),
    re.compile(r"^eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]+"),  # a JWT
    re.compile(r"://[^/\s:@]+:[^/\s@]+@"),  # credentials inside a URL
)
# A long token-like string with upper case, lower case and digits (GPU UUIDs are lower-case hex, paths have '/').
_OPAQUE_RE = re.compile(r"^[A-Za-z0-9_\-+=.]{32,}$")
_UUID_RE = re.compile(r"(?:GPU-|MIG-)?[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)


def is_secret_env(name: str, value: str) -> bool:
    """True when ``name`` or ``value`` looks like a key/token/secret/password.

    Name rule: contains KEY, TOKEN, SECRET, PASSW(ORD), CREDENTIAL, AUTH...
    (so ``VLLM_API_KEY``, ``HF_TOKEN``). Value rule: bearer/basic headers,
    well-known token prefixes (``hf_``, ``sk-``, ``ghp_``...), JWTs, URLs
    with a password, and long opaque mixed-case alphanumerics. False
    positives only hide a harmless value; false negatives leak, hence broad.
    """
    if _SECRET_NAME_RE.search(name):
        return True
    v = value.strip()
    if any(r.search(v) for r in _SECRET_VALUE_RES):
        return True
    v = _UUID_RE.sub("", v)  # GPU/MIG UUIDs (CUDA_VISIBLE_DEVICES) are identifiers, not secrets
    return bool(_OPAQUE_RE.match(v) and re.search(r"[A-Z]", v) and re.search(r"[a-z]", v) and re.search(r"\d", v))


def _env_wanted(name: str) -> bool:
    return name in ENV_NAMES or name.startswith(ENV_PREFIXES)


def filter_environ(env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The variables that matter for vLLM, secrets replaced by ``***``.

    Returns ``(kept, secret_values)``; the caller scrubs the secret values
    from every file (a token in the environment may also be echoed in a log).
    """
    kept: dict[str, str] = {}
    secrets: list[str] = []
    for name in sorted(env):
        if not _env_wanted(name):
            continue
        value = env[name]
        if is_secret_env(name, value):
            kept[name] = SECRET_MASK if value else ""
            if value:
                secrets.append(value)
        else:
            kept[name] = value
    return kept, secrets


def read_environ(pid: int) -> dict[str, str]:
    """``/proc/PID/environ`` as a dict (raises OSError: PermissionError for another user's process)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        if not item:
            continue
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def _read_cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0")] if raw else []


# --- log redaction -----------------------------------------------------------------

# Python repr() of a str (vLLM logs the prompt with %r): '...' or "..." with backslash escapes;
# the pattern is vtop.core.requests', which parses the same lines.
_PYSTR = rb"(?:" + PY_STR_REPR.encode() + rb"|None)"
_LIST = rb"(?:\[[^\]\n]*\]|None)"
_RULES: tuple[tuple[re.Pattern[bytes], bytes], ...] = (
    # <=0.11 INFO: "Received request X: prompt: '...', params: ..., prompt_token_ids: [...]"
    # 0.15+ DEBUG: "Request X details: prompt: '...', prompt_token_ids: [...], prompt_embeds shape: ..."
    (re.compile(rb"(\bprompt: )" + _PYSTR), rb"\1" + REDACTED.encode()),
    (re.compile(rb"(\bprompt_token_ids: )" + _LIST), rb"\1" + REDACTED.encode()),
    # --enable-log-outputs: "Generated response X: output: '...', finish_reason: ..."; DEBUG "output_token_ids: [...]"
    (re.compile(rb"(\bGenerated response \S+(?: \([^)\n]*\))?: output: )" + _PYSTR), rb"\1" + REDACTED.encode()),
    (re.compile(rb"(\boutput_token_ids: )" + _LIST), rb"\1" + REDACTED.encode()),
    # 0.15+ DEBUG: "Request X JSON body: {...}" (the whole body: messages, prompt...)
    (re.compile(rb"(\bRequest \S+ JSON body: )[^\n\r]*"), rb"\1" + REDACTED.encode()),
)
# SGLang's request log (--log-requests): "Receive: obj=GenerateReqInput(... text='...', input_ids=[...] ...)",
# "Finish: obj=..., out={'text': ..., 'output_ids': ..., 'meta_info': ...}", "Receive OpenAI: obj={...}", the
# JSON format's '{"timestamp": ..., "event": "request.received", ...}' and the old "in=..., out=...": a grammar
# of nested reprs, not one regex; these lines go through the one redaction every face uses (redact_prompts).
_SGL_MARKERS = (b"Receive: obj=", b"Finish: obj=", b"Receive OpenAI: obj=", b"] in=", b'"event": "request.')
# Literal markers: only lines holding one of these go through the regexes (bytes.find is
# memchr-fast; a regex scan of every line would cost ~0.1 s per MB, minutes for a 2 GB log).
_MARKERS = (b"prompt: ", b"prompt_token_ids: ", b"Generated response ", b"output_token_ids: ", b" JSON body: ",
            *_SGL_MARKERS)
_OVERLONG_MARKER_RE = re.compile(rb"prompt: |prompt_token_ids: |Generated response |output_token_ids: | JSON body: "
                                 rb"|Receive: obj=|Finish: obj=|Receive OpenAI: obj=|\] in=|\"event\": \"request\.")


def redact_request_line(line: str) -> str:
    """One log line with prompts, token ids and outputs replaced by ``[redacted]``."""
    out, _ = _redact_bytes(line.encode())
    return out.decode(errors="replace")


def _redact_line(line: bytes) -> tuple[bytes, int]:
    if any(m in line for m in _SGL_MARKERS):
        text = line.decode("utf-8", "surrogateescape")
        red = redact_prompts(text)
        return (line, 0) if red == text else (red.encode("utf-8", "surrogateescape"), 1)
    total = 0
    for rx, repl in _RULES:
        line, n = rx.subn(repl, line)
        total += n
    return line, total


def _redact_bytes(block: bytes) -> tuple[bytes, int]:
    """Redact the request-log lines of ``block`` (whole lines); other lines are not touched."""
    nxt = [block.find(m) for m in _MARKERS]  # next hit of each marker; -1 once it has none left
    if max(nxt) < 0:
        return block, 0
    out: list[bytes] = []
    total = 0
    pos = 0  # everything before pos is already in out
    while True:
        live = [i for i in nxt if i >= 0]
        if not live:
            break
        at = min(live)
        start = block.rfind(b"\n", 0, at) + 1
        end = block.find(b"\n", at)
        end = len(block) if end < 0 else end
        line, n = _redact_line(block[start:end])
        out.append(block[pos:start])
        out.append(line)
        total += n
        pos = end
        # re-find only the markers whose next hit was on this line (each marker's scan is then linear)
        nxt = [block.find(m, end) if 0 <= i < end else i for i, m in zip(nxt, _MARKERS)]
    out.append(block[pos:])
    return b"".join(out), total


def _secret_forms(secrets: Iterable[str]) -> list[bytes]:
    """The byte forms to scrub: raw, and JSON-escaped when that differs. Longest first."""
    forms: set[bytes] = set()
    for s in secrets:
        if not s or len(s) < 4:  # a 1-3 character "secret" would shred the whole bundle
            continue
        forms.add(s.encode())
        forms.add(json.dumps(s)[1:-1].encode())
    return sorted(forms, key=len, reverse=True)


def _scrub(data: bytes, forms: Sequence[bytes]) -> bytes:
    """The known secrets' values, then anything shaped like a secret (``scrub_secrets``): a server
    vtop cannot see into (a container, another user, a remote URL) still logs its ``api_key``."""
    for f in forms:
        if f in data:
            data = data.replace(f, SECRET_MASK.encode())
    text = data.decode("utf-8", "surrogateescape")
    scrubbed = scrub_secrets(text)
    return data if scrubbed is text else scrubbed.encode("utf-8", "surrogateescape")


class LogRedactor:
    """Streams a log through prompt redaction and secret scrubbing.

    Feed it chunks with :meth:`feed`, then call :meth:`finish`. Only complete
    lines are processed; a line over ``max_line`` bytes without a newline is
    cut: if it looks like a request-log line its rest is dropped (it may be a
    huge prompt), else it is written on, keeping a tail long enough that a
    secret straddling the cut is still found.
    """

    def __init__(self, secrets: Iterable[str], *, redact_prompts: bool, max_line: int = MAX_LINE) -> None:
        self.forms = _secret_forms(secrets)
        self.redact_prompts = redact_prompts
        self.max_line = max_line
        self.keep = max((len(f) for f in self.forms), default=1) - 1
        self.redacted = 0
        self._buf = b""
        self._dropping = False

    def _process(self, block: bytes) -> bytes:
        if self.redact_prompts:
            block, n = _redact_bytes(block)
            self.redacted += n
        return _scrub(block, self.forms)

    def feed(self, chunk: bytes) -> bytes:
        buf = self._buf + chunk
        out: list[bytes] = []
        if self._dropping:
            nl = buf.find(b"\n")
            if nl < 0:
                self._buf = b""
                return b""
            buf = buf[nl:]
            self._dropping = False
        nl = buf.rfind(b"\n")
        if nl >= 0:
            out.append(self._process(buf[: nl + 1]))
            buf = buf[nl + 1:]
        if len(buf) > self.max_line:
            m = _OVERLONG_MARKER_RE.search(buf) if self.redact_prompts else None
            if m:
                out.append(self._process(buf[: m.start()]) + b"[redacted: over-long request line]")
                self.redacted += 1
                self._dropping = True
                buf = b""
            else:
                scrubbed = self._process(buf)
                cut = len(scrubbed) - self.keep
                out.append(scrubbed[:cut])
                buf = scrubbed[cut:]
        self._buf = buf
        return b"".join(out)

    def finish(self) -> bytes:
        buf, self._buf = self._buf, b""
        return b"" if self._dropping else self._process(buf)


# --- results -----------------------------------------------------------------------


@dataclass(frozen=True)
class SnapshotResult:
    """What :func:`make_bundle` did.

    ``ok`` is True only for a complete bundle. ``path`` is set whenever a
    folder was written, complete or not (``partial``); ``problems`` says what
    is missing, one line each.
    """

    ok: bool
    message: str
    path: Path | None = None
    files: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    bytes_written: int = 0
    log_bytes: int = 0
    redacted_lines: int = 0
    cancelled: bool = False
    refused: bool = False
    elapsed_s: float = 0.0

    @property
    def partial(self) -> bool:
        return self.path is not None and not self.ok


#: Problems that do not make a bundle incomplete (nothing to copy in the first place).
_SOFT = ("screen.svg: no screenshot given", "/metrics of ")


class _Cancelled(Exception):
    pass


# --- writing -----------------------------------------------------------------------


class _Writer:
    """Creates 0600 files in the bundle, scrubbing secrets and hashing as it goes."""

    def __init__(self, folder: Path, forms: Sequence[bytes]) -> None:
        self.folder = folder
        self.forms = forms
        self.manifest: list[tuple[str, int, str, str]] = []  # name, size, sha256, note
        self.bytes = 0

    def open(self, name: str) -> BinaryIO:
        fd = os.open(self.folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        os.fchmod(fd, 0o600)  # whatever the umask
        return os.fdopen(fd, "wb")

    def write(self, name: str, data: bytes | str, note: str = "") -> None:
        raw = data.encode() if isinstance(data, str) else data
        raw = _scrub(raw, self.forms)
        with self.open(name) as f:
            f.write(raw)
        self.add(name, len(raw), hashlib.sha256(raw).hexdigest(), note)

    def add(self, name: str, size: int, digest: str, note: str) -> None:
        self.manifest.append((name, size, digest, note))
        self.bytes += size


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.repr}
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, bytes):
        return obj.decode(errors="replace")
    if hasattr(obj, "_asdict"):
        return _jsonable(obj._asdict())
    return str(obj)


def _dumps(obj: Any) -> str:
    return json.dumps(_jsonable(obj), indent=2, sort_keys=False, allow_nan=False, default=str) + "\n"


def _safe_json(obj: Any) -> str:
    try:
        return _dumps(obj)
    except ValueError:  # NaN/inf: write them as strings rather than fail
        return json.dumps(_jsonable(obj), indent=2, default=str) + "\n"


def _metrics_name(url: str, used: set[str]) -> str:
    base = re.sub(r"^[a-z]+://", "", url).strip("/")
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-") or "server"
    name = f"metrics-{base}.txt"
    n = 2
    while name in used:
        name = f"metrics-{base}-{n}.txt"
        n += 1
    used.add(name)
    return name


def _new_folder(dest_root: Path, now: float) -> Path:
    """``vtop-snapshot-YYYYmmdd-HHMMSS[-N]``, created atomically with mode 0700."""
    dest_root.mkdir(parents=True, exist_ok=True, mode=0o700)
    stamp = _dt.datetime.fromtimestamp(now).strftime("%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        path = dest_root / (f"{FOLDER_PREFIX}{stamp}" + (f"-{n}" if n > 1 else ""))
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        os.chmod(path, 0o700)  # the umask may have removed bits; make it exact
        return path
    raise OSError(f"too many snapshots named {FOLDER_PREFIX}{stamp}-N in {dest_root}")


def _process_entry(pid: int, title: str, role: str, argv: Sequence[str] | None, extra: dict[str, Any],
                   secrets_out: list[str]) -> dict[str, Any]:
    entry: dict[str, Any] = {"pid": pid, "title": title, "role": role, **extra}
    entry["cmdline"] = " ".join(redact_argv(argv)) if argv is not None else None
    try:
        kept, secret_values = filter_environ(read_environ(pid))
        entry["env"] = kept
        secrets_out.extend(secret_values)
    except PermissionError:
        entry["env"] = None
        entry["env_error"] = "permission denied (another user's process: run vtop as that user or root)"
    except FileNotFoundError:
        entry["env"] = None
        entry["env_error"] = "process gone"
    except OSError as e:
        entry["env"] = None
        entry["env_error"] = f"unreadable: {e.strerror or e}"
    return entry


def _processes(servers: Sequence[ServerProcess], secrets_out: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for s in servers:
        srv = _process_entry(
            s.pid, "API server", "api_server", s.argv,
            {"url": s.url, "model": s.model, "served_name": s.served_name, "tp": s.tp, "dp": s.dp,
             "max_model_len": s.max_model_len, "gpu_pids": list(s.gpu_pids), "placement": s.placement,
             "container_id": s.container_id, "ns_pid": s.ns_pid, "published": list(s.published)},
            secrets_out,
        )
        srv["cmdline"] = s.display_argv()
        kids = []
        for c in s.children:
            kids.append(_process_entry(
                c.pid, c.title, c.role, _read_cmdline(c.pid),
                {"ppid": c.ppid, "rank": c.rank, "ranks": [list(r) for r in c.ranks], "holds_gpu": c.holds_gpu,
                 "depth": c.depth, "ns_pid": c.ns_pid},
                secrets_out,
            ))
        srv["children"] = kids
        out.append(srv)
    return out


def _copy_log(src_path: Path, w: _Writer, name: str, secrets: Sequence[str], redact_prompts: bool,
              progress: ProgressFn | None, cancel: threading.Event | None) -> tuple[int, int, int]:
    """Stream the log into the bundle. Returns ``(source bytes read, bytes written, redactions)``."""
    red = LogRedactor(secrets, redact_prompts=redact_prompts)
    digest = hashlib.sha256()
    written = 0
    done = 0
    with open(src_path, "rb") as src:
        total = os.fstat(src.fileno()).st_size
        if progress:
            progress(0, total)
        with w.open(name) as dst:
            while done < total:
                if cancel is not None and cancel.is_set():
                    raise _Cancelled
                chunk = src.read(min(CHUNK, total - done))
                if not chunk:  # truncated (rotated) while we read
                    break
                done += len(chunk)
                out = red.feed(chunk)
                if out:
                    dst.write(out)
                    digest.update(out)
                    written += len(out)
                if progress:
                    progress(done, total)
            tail = red.finish()
            dst.write(tail)
            digest.update(tail)
            written += len(tail)
    w.add(name, written, digest.hexdigest(),
          f"copy of {src_path} ({done} of {total} bytes)" + (f", {red.redacted} redactions" if redact_prompts else ""))
    return done, written, red.redacted


def _readme(folder: Path, w: _Writer, *, started: float, log_path: str | None, redact_prompts: bool,
            servers: Sequence[ServerProcess], problems: Sequence[str], redacted: int,
            timeline: Sequence[str] = ()) -> str:
    lines = [
        f"vtop snapshot {folder.name}",
        f"created   {_dt.datetime.fromtimestamp(started).astimezone().isoformat(timespec='seconds')}",
        f"host      {socket.gethostname()}",
        f"vtop      {vtop.__version__}",
        f"log       {log_path or '(no log known to vtop)'}",
        f"prompts   {'redacted (' + str(redacted) + ' replacements)' if redact_prompts else 'NOT redacted'}",
        "secrets   API keys and secret-looking env values are replaced by *** in every file",
        "",
        # what the log says happened before vtop started (vtop.core.timeline): the first thing to read
        *([timeline[0], *(f"  {ln}" for ln in timeline[1:]), ""] if timeline else []),
        "servers:",
        *([f"  {s.url}  pid {s.pid}  model {s.served_name}" + (f"  {s.placement}" if s.placement else "")
           for s in servers] or ["  (none found)"]),
        "",
        "files (name, bytes, sha256, note):",
        *[f"  {n:<32} {size:>12}  {digest}  {note}".rstrip() for n, size, digest, note in w.manifest],
        "  README.txt (this file)",
        "",
        "problems:",
        *([f"  - {p}" for p in problems] or ["  none"]),
        "",
        "Folder 0700, files 0600: share the bundle only with people allowed to see this server's data.",
    ]
    return "\n".join(lines) + "\n"


def make_bundle(
    dest_root: str | os.PathLike[str],
    *,
    log_path: str | None,
    servers: Sequence[ServerProcess],
    metrics_texts: Mapping[str, bytes | str | None],
    history_json: Any,
    phases_json: Any | None,
    alerts: Sequence[Any],
    screen_svg: str | None,
    actions: Sequence[Any] = (),
    timeline: Sequence[str] = (),
    timeline_json: Any | None = None,
    redact_prompts: bool = True,
    secrets: Sequence[str] = (),
    progress: ProgressFn | None = None,
    cancel: threading.Event | None = None,
    now: float | None = None,
) -> SnapshotResult:
    """Write a snapshot bundle under ``dest_root``; blocking, never raises.

    ``secrets`` (API keys...) are scrubbed from every file; the servers'
    own ``--api-key`` values are added automatically. ``progress(done,
    total)`` is called from this thread while the log is copied (bytes).
    Setting ``cancel`` stops the copy and removes the half-written folder.
    ``timeline``: what the log says happened before vtop started (:meth:`vtop.core.timeline.Timeline.lines`),
    at the top of README.txt; ``timeline_json`` its JSON, in timeline.json.
    """
    t0 = time.monotonic()
    started = time.time() if now is None else now
    problems: list[str] = []
    all_secrets: list[str] = [s for s in secrets if s]
    all_secrets += [s.api_key for s in servers if s.api_key]
    folder: Path | None = None
    try:
        folder = _new_folder(Path(dest_root).expanduser(), started)
    except OSError as e:
        return SnapshotResult(False, f"Snapshot failed: cannot create a folder in {dest_root}: {e.strerror or e}",
                              problems=(str(e),), elapsed_s=time.monotonic() - t0)
    try:
        # processes first: reading environments may reveal more secrets to scrub everywhere else.
        env_secrets: list[str] = []
        try:
            procs = _processes(servers, env_secrets)
        except Exception as e:  # noqa: BLE001 - a bundle without processes.json is still useful
            procs = []
            problems.append(f"processes.json: {type(e).__name__}: {e}")
        all_secrets += env_secrets
        w = _Writer(folder, _secret_forms(all_secrets))

        def attempt(name: str, fn: Callable[[], None]) -> None:
            if cancel is not None and cancel.is_set():
                raise _Cancelled
            try:
                fn()
            except _Cancelled:
                raise
            except Exception as e:  # noqa: BLE001 - each file on its own
                problems.append(f"{name}: {type(e).__name__}: {getattr(e, 'strerror', None) or e}")

        attempt("processes.json", lambda: w.write("processes.json", _safe_json({"servers": procs})))
        used: set[str] = set()
        metrics_index: dict[str, str | None] = {}
        for url, payload in metrics_texts.items():
            name = _metrics_name(url, used)
            if payload is None:
                metrics_index[url] = None
                problems.append(f"/metrics of {url}: not available (server not answering)")
                continue
            metrics_index[url] = name
            attempt(name, functools.partial(w.write, name, payload, f"raw /metrics of {url}"))
        attempt("history.json", lambda: w.write("history.json", _safe_json(history_json)))
        attempt("phases.json", lambda: w.write("phases.json", _safe_json(phases_json)))
        attempt("alerts.json", lambda: w.write("alerts.json", _safe_json(list(alerts))))
        if actions:  # what vtop did to the box since the last bundle (x: the requests it stopped)
            attempt("actions.json", lambda: w.write("actions.json", _safe_json(list(actions))))
        if timeline_json is not None:
            attempt("timeline.json", lambda: w.write("timeline.json", _safe_json(timeline_json),
                                                     "what the vLLM log says happened before vtop started"))
        if screen_svg is not None:
            attempt("screen.svg", lambda: w.write("screen.svg", screen_svg))
        else:
            problems.append("screen.svg: no screenshot given")

        log_read = 0
        redacted = 0
        if log_path:
            src = Path(log_path).expanduser()
            name = "vllm.log"
            try:
                if not src.is_file():
                    raise FileNotFoundError(2, "No such file", str(src))
                log_read, _, redacted = _copy_log(src, w, name, all_secrets, redact_prompts, progress, cancel)
            except _Cancelled:
                raise
            except OSError as e:
                why = "permission denied" if isinstance(e, PermissionError) else (
                    "no such file" if isinstance(e, FileNotFoundError) else (e.strerror or str(e)))
                problems.append(f"log {src}: not copied ({why})")
                with contextlib.suppress(Exception):
                    (folder / name).unlink()
        w.write("README.txt", _readme(folder, w, started=started, log_path=log_path, redact_prompts=redact_prompts,
                                      servers=servers, problems=problems, redacted=redacted,
                                      timeline=timeline))
    except _Cancelled:
        with contextlib.suppress(Exception):
            shutil.rmtree(folder)
        return SnapshotResult(False, "Snapshot cancelled; nothing kept.", cancelled=True,
                              elapsed_s=time.monotonic() - t0)
    except Exception as e:  # noqa: BLE001 - never raise to the UI
        problems.append(f"{type(e).__name__}: {e}")
        return SnapshotResult(False, f"Snapshot incomplete in {folder}: {type(e).__name__}: {e}", path=folder,
                              problems=tuple(problems), elapsed_s=time.monotonic() - t0)
    files = tuple(sorted(p.name for p in folder.iterdir()))
    size = _human(w.bytes)
    if problems:
        msg = f"Snapshot saved to {folder} ({len(files)} files, {size}) with {len(problems)} problem(s): {problems[0]}"
    else:
        msg = f"Snapshot saved to {folder} ({len(files)} files, {size})"
    return SnapshotResult(
        ok=not any(not p.startswith(_SOFT) for p in problems),
        message=msg, path=folder, files=files, problems=tuple(problems), bytes_written=w.bytes,
        log_bytes=log_read, redacted_lines=redacted, elapsed_s=time.monotonic() - t0,
    )


def _human(n: int) -> str:
    f = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if f < 1024 or unit == "GiB":
            return f"{f:.0f} {unit}" if unit == "B" else f"{f:.1f} {unit}"
        f /= 1024
    return f"{n} B"


def latest_bundle(dest_root: str | os.PathLike[str]) -> Path | None:
    """The newest ``vtop-snapshot-*`` folder under ``dest_root`` (for saving a py-spy dump into it)."""
    root = Path(dest_root).expanduser()
    try:
        cands = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(FOLDER_PREFIX)]
    except OSError:
        return None
    return max(cands, key=lambda p: (p.stat().st_mtime, p.name), default=None)


@dataclass
class SnapshotRunner:
    """One snapshot at a time: a second start while one runs is refused, not queued.

    ``run(...)`` blocks (call it from a worker thread); ``start(...)`` runs it
    in a daemon thread and returns a Future. Both take :func:`make_bundle`'s
    arguments (``cancel`` is supplied by the runner: see :meth:`cancel`). A
    refused call returns a result with ``refused=True`` and a polite message.
    """

    last_path: Path | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def running(self) -> bool:
        return self._lock.locked()

    def _refused(self) -> SnapshotResult:
        return SnapshotResult(False, "A snapshot is already being written; wait for it to finish.", refused=True)

    def _run_locked(self, dest_root: str | os.PathLike[str], kw: dict[str, Any]) -> SnapshotResult:
        try:
            res = make_bundle(dest_root, cancel=self._cancel, **kw)
            if res.path is not None:
                self.last_path = res.path
            return res
        finally:
            self._lock.release()

    def run(self, dest_root: str | os.PathLike[str], **kw: Any) -> SnapshotResult:
        if not self._lock.acquire(blocking=False):
            return self._refused()
        self._cancel.clear()
        return self._run_locked(dest_root, kw)

    def start(self, dest_root: str | os.PathLike[str], **kw: Any) -> Future[SnapshotResult]:
        fut: Future[SnapshotResult] = Future()
        if not self._lock.acquire(blocking=False):
            fut.set_result(self._refused())
            return fut
        self._cancel.clear()

        def body() -> None:
            try:
                fut.set_result(self._run_locked(dest_root, kw))
            except BaseException as e:  # noqa: BLE001 - make_bundle does not raise; belt and braces
                fut.set_result(SnapshotResult(False, f"Snapshot failed: {type(e).__name__}: {e}"))

        threading.Thread(target=body, name="vtop-snapshot", daemon=True).start()
        return fut

    def cancel(self) -> bool:
        """Ask the running snapshot to stop (it removes its folder). False when none runs."""
        if not self.running:
            return False
        self._cancel.set()
        return True
