"""Find running vLLM servers on this host from the process table.

Why it works this way:

* **Blocking, run from a thread.** One ``psutil.process_iter`` pass costs
  tens of milliseconds on a busy host; the caller runs
  :func:`discover_servers` in a worker every few seconds, never on the UI
  thread. Nothing here imports Textual.
* **Pure core, psutil at the edge.** :func:`discover_servers` builds
  everything from plain process records (pid, ppid, name, cmdline,
  create_time), so tests feed it a real ``ps`` capture or hand-written
  command lines; only :func:`read_processes` touches psutil, and it swallows
  ``NoSuchProcess``/``AccessDenied``/``ZombieProcess`` per process (a
  process can vanish between listing and reading).
* **A server is a command line, not a title.** Titles like
  ``VLLM::EngineCore`` are set with setproctitle and any process can take
  one, so a server is only a ``vllm serve ...`` or
  ``python -m vllm.entrypoints.openai.api_server ...`` command line run by
  Python; titled processes count only as that server's descendants. Titled
  processes with no server above them are reported as ``orphans`` (an
  EngineCore left behind by a crashed API server still holds GPU memory).
* **Forked children keep the parent's command line** (V0, <=0.9 fork), so
  a server candidate below another one is that server's child, not a
  second server.
* **Which PID holds the GPU**: the API server never does. The
  ``Worker*`` processes if there are any (TP/PP > 1, and 0.32's CPU build
  even at TP=1), else the ``EngineCore`` (V1, TP=1). With no titles at all
  (<=0.9) it is a guess: the non-helper descendants, else the server itself.
* **A restart is a new create_time**, not a new pid alone (pids get
  reused): :attr:`ServerProcess.key` is ``(pid, create_time)``.
* **The API key may be on the command line.** ``argv`` and ``api_key`` are
  kept (a later rule reads risky flags; the scraper needs the key) but
  never shown in ``repr``; use :meth:`ServerProcess.display_argv` to show
  the command line.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from vtop.model.fmt import to_float as _float
from vtop.model.fmt import to_int as _int
from vtop.model.procs import ServerProcess, VllmChild
from vtop.sources.procs import parse_stat, stat_cpu_s, stat_is_kernel_thread, stat_state
from vtop.sources.urls import url_for

__all__ = [
    "ProcRecord",
    "ServerProcess",
    "VllmChild",
    "Discovery",
    "discover",
    "discover_servers",
    "parse_human_int",
    "read_processes",
    "url_for",
]

DEFAULT_PORT = 8000

#: The engines vtop finds by their command lines, as tables (the forms :func:`_server_args` returns):
#: form -> engine. vLLM: ``vllm serve``, ``python -m vllm.entrypoints.openai.api_server``. SGLang (read in
#: SGLang 0.5.17's source: ``sglang/launch_server.py``, ``sglang/cli/main.py`` and ``cli/serve.py``, the
#: ``sglang`` console script of its wheel): ``python -m sglang.launch_server --model-path M ...`` and
#: ``sglang serve [M] --model-path M ...``.
ENGINE_OF_FORM: dict[str, str] = {"serve": "vllm", "api_server": "vllm", "sglang": "sglang", "sglang_serve": "sglang"}
#: each engine's default port (vLLM's ``--port`` 8000; SGLang's ``ServerArgs.port`` 30000)
DEFAULT_PORTS: dict[str, int] = {"vllm": DEFAULT_PORT, "sglang": 30000}
#: SGLang's spellings of the flags a server record holds (``server_args.py`` 0.5.17: ``--model-path`` with
#: the alias ``--model``, ``--tp-size`` / ``--tensor-parallel-size``, ``--dp-size`` / ``--data-parallel-size``,
#: ``--pp-size`` / ``--pipeline-parallel-size``, ``--context-length``, ``--max-running-requests``,
#: ``--mem-fraction-static``), read as vLLM's
_SGLANG_FLAGS: dict[str, str] = {
    "--model-path": "--model", "--tp-size": "--tensor-parallel-size", "--tp": "--tensor-parallel-size",
    "--dp-size": "--data-parallel-size", "--dp": "--data-parallel-size", "--pp-size": "--pipeline-parallel-size",
    "--context-length": "--max-model-len", "--max-running-requests": "--max-num-seqs",
}
_SGLANG_MODULES = ("sglang.launch_server",)
_SGLANG_CLI_MODULES = ("sglang.cli.main",)

# --- records -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcRecord:
    """What discovery needs to know about one process."""

    pid: int
    ppid: int
    name: str
    cmdline: tuple[str, ...]
    create_time: float
    #: user + system CPU seconds so far (None: not read, or not readable)
    cpu: float | None = None
    #: the state letter of /proc/PID/stat (R, S, D, T stopped, t traced, ...); None: not read
    state: str | None = None


@dataclass(frozen=True, slots=True)
class Discovery:
    servers: tuple[ServerProcess, ...]
    #: vLLM-titled processes with no server above them (leaked engines/workers)
    orphans: tuple[VllmChild, ...]


# --- command lines ---------------------------------------------------------------

# Flags whose value is a secret: masked in display_argv().

# Flags that take one value (so the next token is not the positional model).
_VALUE_FLAGS = frozenset(
    {
        "--host", "--port", "--model", "--tokenizer", "--revision", "--dtype", "--max-model-len",
        "--max-num-seqs", "--max-num-batched-tokens", "--gpu-memory-utilization", "--tensor-parallel-size",
        "--data-parallel-size", "--pipeline-parallel-size", "--api-key", "--quantization", "--kv-cache-dtype",
        "--seed", "--swap-space", "--block-size", "--download-dir", "--load-format", "--config",
        "--chat-template", "--generation-config", "--override-generation-config", "--uvicorn-log-level",
        "--root-path", "--ssl-keyfile", "--ssl-certfile", "--api-server-count", "--data-parallel-address",
        "--data-parallel-rpc-port", "--data-parallel-size-local", "--data-parallel-start-rank", "--uds",
        "--tool-call-parser", "--reasoning-parser", "--compilation-config", "--hf-overrides", "--lora-modules",
        "--max-loras", "--max-lora-rank", "--distributed-executor-backend", "--cpu-offload-gb",
        "--limit-mm-per-prompt", "--mm-processor-cache-gb", "--speculative-config", "--hf-token",
        "--tokenizer-mode", "--trust-remote-code-revision", "--middleware", "--allowed-origins",
        "--response-role", "--max-log-len", "--served-model-name", "--enable-prefix-caching-hash-algo",
        "--task", "--runner", "--pooler-config", "--kv-transfer-config", "--ssl-keyfile-password",
        "-tp", "-dp", "-pp", "-O", "-q", "-cc",
    }
)
# Flags that take one or more values (argparse nargs="+").
_MULTI_FLAGS = frozenset({"--served-model-name", "--lora-modules", "--allowed-origins", "--middleware"})
# Short aliases vLLM accepts.
_ALIASES = {"-tp": "--tensor-parallel-size", "-dp": "--data-parallel-size", "-pp": "--pipeline-parallel-size"}

_PY_RE = re.compile(r"^python[0-9.]*[a-z]?$")
_API_SERVER_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")
_CLI_MODULES = ("vllm.entrypoints.cli.main", "vllm")


def _is_bool_flag(tok: str) -> bool:
    return tok.startswith(("--enable-", "--disable-", "--no-")) or tok in {
        "--enforce-eager", "--trust-remote-code", "--headless", "--async-scheduling", "--skip-tokenizer-init",
        "--enable-auto-tool-choice", "--use-v2-block-manager", "--return-tokens-as-token-ids",
    }


def _split_args(args: Iterable[str]) -> tuple[dict[str, str], list[str], dict[str, tuple[str, ...]]]:
    """argparse-like split: ``({flag: last value}, positionals, {multi flag: values})``.

    Unknown ``--flags`` take the next token as their value unless it starts
    with ``-`` or the flag looks boolean (``--enable-*``, ``--no-*``...).
    That is a guess; the positional model right after ``serve`` is taken
    before any guessing (see :func:`_parse_server_argv`).
    """
    toks = list(args)
    flags: dict[str, str] = {}
    multi: dict[str, tuple[str, ...]] = {}
    pos: list[str] = []
    i = 0
    while i < len(toks):
        tok = toks[i]
        i += 1
        if tok == "--":
            pos.extend(toks[i:])
            break
        if not tok.startswith("-") or tok == "-" or _is_number(tok):
            pos.append(tok)
            continue
        name, eq, val = tok.partition("=")
        if not eq and name.startswith("-O") and len(name) > 2 and not name.startswith("--"):
            name, val, eq = "-O", name[2:], "="  # -O3
        name = _ALIASES.get(name, name)
        if eq:
            flags[name] = val
            if name in _MULTI_FLAGS:
                multi[name] = (val,)
            continue
        if name in _MULTI_FLAGS:
            vals: list[str] = []
            while i < len(toks) and not (toks[i].startswith("-") and not _is_number(toks[i])):
                vals.append(toks[i])
                i += 1
            multi[name] = tuple(vals)
            flags[name] = vals[0] if vals else ""
            continue
        takes = name in _VALUE_FLAGS or name in _ALIASES.values()
        if not takes and not _is_bool_flag(name):
            takes = i < len(toks) and (not toks[i].startswith("-") or _is_number(toks[i]))
        if takes and i < len(toks):
            flags[name] = toks[i]
            i += 1
        else:
            flags[name] = ""
    return flags, pos, multi


def flag_of(server: ServerProcess, name: str) -> str | None:
    """Raw value of ``--name`` in a server's argv (``--name v`` or ``--name=v``); ``""`` for a bare flag."""
    return _flags(server.argv).get(name)


def _flags(argv: tuple[str, ...]) -> dict[str, str]:
    found = _server_args(argv)
    return _split_args(found[1])[0] if found else _split_args(argv)[0]


def _is_number(tok: str) -> bool:
    try:
        float(tok)
    except ValueError:
        return False
    return True


def _skip_python(argv: tuple[str, ...]) -> int | None:
    """Index just after the interpreter and its own options, or None if
    ``argv[0]`` is not a Python interpreter."""
    if not argv or not _PY_RE.match(os.path.basename(argv[0])):
        return None
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-m", "-c"):
        opt = argv[i]
        i += 1
        if opt in ("-X", "-W", "-Q") and i < len(argv):
            i += 1
    return i


def _server_args(argv: tuple[str, ...]) -> tuple[str, list[str]] | None:
    """``(form, arguments after the entry point)`` if this command line is a
    vLLM API server, else None.

    Accepted: ``vllm serve ...`` (the console script run directly or by a
    Python interpreter), ``python -m vllm.entrypoints.cli.main serve ...``,
    ``python -m vllm.entrypoints.openai.api_server ...``. Wrappers (``sh -c``,
    ``timeout``, ``uv run``) are not servers: their child is.
    """
    if not argv:
        return None
    for script, servers, clis, forms in _ENTRY_POINTS:
        got = _entry_args(argv, script, servers, clis, forms)
        if got is not None:
            return got
    return None


#: each engine's entry points: the console script, the ``-m`` modules that are the server itself, the
#: ``-m`` modules of the CLI (then ``serve``), and the two forms' names (server module, ``serve``)
_ENTRY_POINTS: tuple[tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, str]], ...] = (
    # ``python -m sglang.launch_server ...``; ``sglang serve ...`` (run directly or by Python, or -m sglang.cli.main)
    ("sglang", _SGLANG_MODULES, _SGLANG_CLI_MODULES, ("sglang", "sglang_serve")),
    ("vllm", _API_SERVER_MODULES, _CLI_MODULES, ("api_server", "serve")),
)


def _entry_args(argv: tuple[str, ...], script: str, servers: tuple[str, ...], clis: tuple[str, ...],
                forms: tuple[str, str]) -> tuple[str, list[str]] | None:
    """``(form, arguments after the entry point)`` if ``argv`` runs this engine's server, else None."""
    if os.path.basename(argv[0]) == script:
        i = 1
    else:
        j = _skip_python(argv)
        if j is None or j >= len(argv):
            return None
        if argv[j] == "-m" and j + 1 < len(argv):
            mod = argv[j + 1]
            if mod in servers:
                return forms[0], list(argv[j + 2:])
            if mod not in clis:
                return None
            i = j + 2
        elif os.path.basename(argv[j]) == script:
            i = j + 1
        else:
            return None
    if i < len(argv) and argv[i] == "serve":
        return forms[1], list(argv[i + 1:])
    return None


def parse_human_int(s: str | None) -> int | None:
    """vLLM's ``human_readable_int``: ``32768``, ``32k`` (x1000), ``32K``
    (x1024), ``25.6k``, ``1M``... ``-1``/``auto``/unparseable give None."""
    if s is None:
        return None
    s = s.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT]?)", s)
    if not m:
        return None
    num, unit = m.groups()
    if not unit:
        try:
            return int(num) if "." not in num else None
        except ValueError:
            return None
    power = "kmgt".index(unit.lower()) + 1
    base = 1000 if unit.islower() else 1024
    return int(float(num) * base**power)


def _parse_server_argv(form: str, args: list[str]) -> dict[str, Any]:
    engine = ENGINE_OF_FORM.get(form, "vllm")
    model: str | None = None
    rest = args
    positional = form in ("serve", "sglang_serve")
    if positional and args and not args[0].startswith("-"):
        model, rest = args[0], args[1:]  # the positional right after `serve`
    flags, pos, multi = _split_args(rest)
    if engine == "sglang":
        for name, same in _SGLANG_FLAGS.items():
            if name in flags:
                flags.setdefault(same, flags[name])
    if model is None and form == "serve" and pos:
        model = pos[0]
    if model is None:
        model = flags.get("--model") or None
    port = _int(flags.get("--port"))
    if port is None or not 0 < port < 65536:
        port = DEFAULT_PORTS[engine]
    bind = flags.get("--host")
    host, url = url_for(bind, port)
    return {
        "host": host,
        "port": port,
        "url": url,
        "bind_host": bind,
        "model": model,
        "served_model_names": multi.get("--served-model-name", ()),
        "tensor_parallel_size": _int(flags.get("--tensor-parallel-size")),
        "data_parallel_size": _int(flags.get("--data-parallel-size")),
        "pipeline_parallel_size": _int(flags.get("--pipeline-parallel-size")),
        "max_model_len": parse_human_int(flags.get("--max-model-len")),
        "max_num_seqs": _int(flags.get("--max-num-seqs")),
        # SGLang's --mem-fraction-static is not the same budget (weights + KV pool, not all of vLLM's):
        # not read as one
        "gpu_memory_utilization": _float(flags.get("--gpu-memory-utilization")) if engine == "vllm" else None,
        "headless": "--headless" in flags,
        "api_key": flags.get("--api-key") or None,
        "engine": engine,
    }


# --- titles ------------------------------------------------------------------------

_TITLE_RE = re.compile(r"^([A-Za-z0-9_]+)::(\S+)")
_RANK_RE = re.compile(r"_(DP|PP|TP|EP)(\d+)")


def _title(rec: ProcRecord, *, any_prefix: bool = True) -> str | None:
    """The vLLM process title (``VLLM::Worker_TP0``), from the command line
    (setproctitle pads it with spaces) or else the 15-char ``comm``.

    Below a server any ``PREFIX::`` counts (``VLLM_PROCESS_NAME_PREFIX`` can
    change it); elsewhere (orphans) only ``VLLM::``, so that some other
    program's ``foo::Worker`` is not taken for a leaked vLLM worker.
    """
    for text in (" ".join(rec.cmdline).strip(), rec.name.strip()):
        m = _TITLE_RE.match(text)
        if m and m.group(1) != "ray" and (any_prefix or m.group(1) in _ORPHAN_PREFIXES):
            return m.group(0)
    return None


#: the title prefixes that count on their own, with no server above them (a leaked process)
_ORPHAN_PREFIXES = ("VLLM", "sglang")
#: SGLang's process titles (setproctitle in 0.5.17: ``sglang::scheduler`` + ``_DP0``/``_PP0``/``_TP1``/``_EP0``
#: as the parallel sizes ask, ``sglang::detokenizer``, ``sglang::data_parallel_controller``,
#: ``sglang::tokenizer_worker:PID``, ``sglang::detokenizer_router``), by the start of the name -> role.
#: Each scheduler holds its rank's GPU: a worker. (``comm`` keeps 15 characters: ``sglang::schedul``.)
SGLANG_ROLES: tuple[tuple[str, str], ...] = (
    ("schedul", "worker"), ("data_parallel", "coordinator"), ("tokenizer_worker", "api_server"),
    ("detokeni", "other"),
)


def _classify(title: str) -> tuple[str, int | None, tuple[tuple[str, int], ...]]:
    """``(role, rank, ranks)`` from a title. Truncated ``comm`` names
    (``VLLM::EngineCor``, ``VLLM::Worker_TP``) still classify, without ranks."""
    prefix, name = title.split("::", 1)
    ranks = tuple((k.lower(), int(v)) for k, v in _RANK_RE.findall(name))
    rd = dict(ranks)
    if prefix == "sglang":
        role = next((r for start, r in SGLANG_ROLES if name.startswith(start)), "other")
        return role, rd.get("tp") if role == "worker" else rd.get("dp"), ranks
    base = name.split("_", 1)[0]
    if "EngineCor" in base and "_TP" in name:
        role = "worker"  # 0.10 fork: EngineCore_TP0 is a worker
    elif "EngineCor" in base:
        role = "engine"
    elif base.startswith(("Worker", "VllmWorker", "RayWorker")):
        role = "worker"
    elif base.startswith("APIServer"):
        role = "api_server"
        m = re.search(r"_(\d+)$", name)
        if m:
            rd.setdefault("api", int(m.group(1)))
            ranks = ranks + (("api", int(m.group(1))),)
    elif base.startswith("DPCoordinator"):
        role = "coordinator"
    else:
        role = "other"
    if role == "engine" and base.startswith("DPEngineCore"):
        m = re.search(r"_(\d+)$", name)
        if m and "dp" not in rd:
            rd["dp"] = int(m.group(1))
            ranks = ranks + (("dp", int(m.group(1))),)
    rank = rd.get("tp") if role == "worker" else rd.get("dp") if role == "engine" else rd.get("api")
    return role, rank, ranks


def _is_helper(rec: ProcRecord) -> bool:
    text = " ".join(rec.cmdline)
    return "multiprocessing.resource_tracker" in text or "multiprocessing.semaphore_tracker" in text


# --- the scan ----------------------------------------------------------------------


def _coerce(rec: Any) -> ProcRecord | None:
    """Accept ProcRecord, any object with the five attributes, or a mapping."""
    if isinstance(rec, ProcRecord):
        return rec
    try:
        get = rec.get if isinstance(rec, Mapping) else lambda k, d=None: getattr(rec, k, d)
        cmd = get("cmdline", None) or ()
        if isinstance(cmd, str):
            cmd = tuple(cmd.split())
        return ProcRecord(
            pid=int(get("pid") or 0),
            ppid=int(get("ppid", 0) or 0),
            name=str(get("name", "") or ""),
            cmdline=tuple(str(c) for c in cmd),
            create_time=float(get("create_time", 0.0) or 0.0),
            cpu=_cpu_of(get("cpu", None)),
            state=_state_of(get("state", None)),
        )
    except (TypeError, ValueError, AttributeError):
        return None


def _state_of(x: Any) -> str | None:
    """A record's ``state``: one letter of /proc/PID/stat's (psutil's words mapped to it), else None."""
    if not isinstance(x, str) or not x:
        return None
    return _PSUTIL_STATE.get(x, x[0] if len(x) == 1 and x.isalpha() else None)


#: psutil's status words as /proc/PID/stat's letters
_PSUTIL_STATE = {"running": "R", "sleeping": "S", "disk-sleep": "D", "stopped": "T", "tracing-stop": "t",
                 "zombie": "Z", "dead": "X", "idle": "I"}


def _cpu_of(x: Any) -> float | None:
    """A record's ``cpu`` (user + system seconds): a finite number >= 0, else None (never a zero)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    v = float(x)
    return v if math.isfinite(v) and v >= 0 else None


def read_processes() -> list[ProcRecord]:
    """The live process table (blocking). Processes that vanish or deny access
    while being read are skipped or kept with what could be read; nothing raises.

    On Linux it reads ``/proc/PID/stat`` and ``/proc/PID/cmdline`` directly: two
    small reads a process. psutil's ``process_iter`` with the same attributes
    cost about 20 ms of CPU for 75 processes on the 2-core dev box, which at one
    discovery every 5 s was 0.4 % of a core, as much as the whole GPU panel;
    the direct reads take a few ms. Elsewhere psutil is used.
    """
    if os.path.isdir("/proc/self") and os.path.exists("/proc/stat"):
        try:
            return _read_proc_linux()
        except OSError:
            pass
    return _read_psutil()


# comm (the kernel's 15-character name) of processes that may be vLLM or its children:
# "vllm" (the launcher), "python3.12", "VLLM::EngineCor", "pt_main_thread", "ray::..".
_MAYBE_VLLM = ("python", "vllm", "sglang", "pt_main", "ray", "uv", "pypy",
               # where a container's server is published and its files are (vtop/sources/containers.py)
               "docker-pr", "dockerd")

_BOOT: float | None = None
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _boot_time() -> float:
    global _BOOT
    if _BOOT is None:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    _BOOT = float(line.split()[1])
                    break
            else:
                _BOOT = 0.0
    return _BOOT


#: The PIDs (as named in /proc) the last scans found to be kernel threads, and when that list was begun
#: (monotonic): a scan does not read them again. Kernel threads are most of a GPU box's process table
#: (hundreds: per-core kworkers, the driver's threads; 58 of 68 PIDs on the dev VM), and reading each one's
#: stat was most of a scan's cost (2.0 ms a scan on the dev VM, every 5 s while no server answers). A PID
#: is only reused after the kernel has gone through ``pid_max`` of them, and the list is begun afresh every
#: ``_KTHREADS_FOR_S`` whatever happens, so a process that got a kernel thread's PID in between is found
#: at most that late. Replaced, never changed in place: scans in two threads (tests) may read it at once.
_KTHREADS: frozenset[str] = frozenset()
_KTHREADS_SINCE = 0.0
_KTHREADS_FOR_S = 60.0


def _read_proc_linux() -> list[ProcRecord]:
    global _KTHREADS, _KTHREADS_SINCE
    boot = _boot_time()
    out: list[ProcRecord] = []
    now = time.monotonic()
    known = _KTHREADS if now - _KTHREADS_SINCE < _KTHREADS_FOR_S else frozenset()
    kthreads: list[str] = []
    for entry in os.scandir("/proc"):
        name = entry.name
        if name in known:
            kthreads.append(name)
            continue
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone, or not ours to read
            continue
        if stat_is_kernel_thread(stat):
            # no record for them (building one was most of a scan's cost), and no read next time
            kthreads.append(name)
            continue
        fields = parse_stat(stat)
        if fields is None:
            continue
        comm, ppid, start_ticks = fields
        raw = b""
        if comm.lower().startswith(_MAYBE_VLLM):
            # Only a process that can be vLLM (a Python interpreter, the vllm
            # launcher, a VLLM:: title) is worth a second read: on a GPU box most
            # processes are kernel threads and daemons.
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    raw = f.read()
            except OSError:
                continue
        parts = raw.split(b"\0")
        if parts and parts[-1] == b"":
            parts.pop()
        if len(parts) == 1 and b" " in parts[0]:
            # A process that rewrote its title (setproctitle): one string with spaces.
            parts = parts[0].split()
        cmd = tuple(x.decode("utf-8", "replace") for x in parts)
        out.append(ProcRecord(pid=int(name), ppid=ppid, name=comm, cmdline=cmd,
                              create_time=boot + start_ticks / _TICKS, cpu=stat_cpu_s(stat, _TICKS),
                              state=stat_state(stat)))
    if not known:
        _KTHREADS_SINCE = now
    _KTHREADS = frozenset(kthreads)  # those gone since are dropped
    return out


def _read_psutil() -> list[ProcRecord]:
    import psutil

    out: list[ProcRecord] = []
    try:
        it = psutil.process_iter(["pid", "ppid", "name", "cmdline", "create_time", "cpu_times", "status"],
                                 ad_value=None)
        for p in it:
            try:
                info = p.info
                out.append(
                    ProcRecord(
                        pid=int(info["pid"]),
                        ppid=int(info.get("ppid") or 0),
                        name=str(info.get("name") or ""),
                        cmdline=tuple(info.get("cmdline") or ()),
                        create_time=float(info.get("create_time") or 0.0),
                        cpu=_psutil_cpu(info.get("cpu_times")),
                        state=_state_of(info.get("status")),
                    )
                )
            except (psutil.Error, KeyError, TypeError, ValueError):
                continue
    except (psutil.Error, OSError):
        pass
    return out


def _psutil_cpu(ct: Any) -> float | None:
    try:
        return _cpu_of(float(ct.user) + float(ct.system))
    except (AttributeError, TypeError, ValueError):
        return None


_ENRICHER: Any = None


def discover(procs: Iterable[Any] | None = None) -> Discovery:
    """Servers and orphan vLLM processes in ``procs`` (default: the live
    table via :func:`read_processes`, each server then placed in its container,
    pod or unit with its namespaces' PIDs and ports: :mod:`vtop.sources.containers`).
    Never raises on odd records."""
    global _ENRICHER
    found = _discover(read_processes() if procs is None else procs)
    if procs is not None or not found[0].servers:
        return found[0]
    from vtop.sources.containers import Enricher

    if _ENRICHER is None:
        _ENRICHER = Enricher()
    try:
        servers = _ENRICHER.enrich(found[0].servers, found[1])
    except (OSError, ValueError):  # best effort: the servers as found
        servers = list(found[0].servers)
    return Discovery(tuple(servers), found[0].orphans)


def enricher() -> Any:
    """The live discovery's :class:`~vtop.sources.containers.Enricher` (what it read of the
    containers' files), or None before the first scan that found a server."""
    return _ENRICHER


def _discover(procs: Iterable[Any]) -> tuple[Discovery, list[ProcRecord]]:
    records: dict[int, ProcRecord] = {}
    for raw in procs:
        rec = _coerce(raw)
        if rec is not None:
            records[rec.pid] = rec
    kids: dict[int, list[int]] = {}
    for rec in records.values():
        if rec.ppid != rec.pid:
            kids.setdefault(rec.ppid, []).append(rec.pid)

    cand: dict[int, tuple[str, list[str]]] = {}
    for rec in records.values():
        found = _server_args(rec.cmdline)
        if found is not None:
            cand[rec.pid] = found

    def has_candidate_ancestor(pid: int) -> bool:
        seen = {pid}
        cur = records[pid].ppid
        while cur in records and cur not in seen:
            if cur in cand:
                return True
            seen.add(cur)
            cur = records[cur].ppid
        return False

    roots = sorted((pid for pid in cand if not has_candidate_ancestor(pid)), key=lambda p: (records[p].create_time, p))
    claimed: set[int] = set()
    servers: list[ServerProcess] = []
    for pid in roots:
        form, args = cand[pid]
        rec = records[pid]
        info = _parse_server_argv(form, args)
        walked = _walk(pid, records, kids)
        claimed.update(c.pid for c in walked)
        children, gpu, guessed = _mark_gpu(pid, walked)
        servers.append(
            ServerProcess(
                pid=pid,
                create_time=rec.create_time,
                form=form,
                children=children,
                gpu_pids=gpu,
                gpu_pids_guessed=guessed,
                argv=rec.cmdline,
                cpu=rec.cpu,
                state=rec.state,
                **info,
            )
        )
    orphans: list[VllmChild] = []
    for rec in records.values():
        if rec.pid in claimed or rec.pid in cand:
            continue
        title = _title(rec, any_prefix=False)
        if title is None:
            continue
        role, rank, ranks = _classify(title)
        if role == "other":
            continue
        orphans.append(VllmChild(rec.pid, rec.ppid, title, role, rank, ranks, rec.create_time, depth=0, cpu=rec.cpu,
                                 state=rec.state))
    orphans.sort(key=lambda c: c.pid)
    return Discovery(tuple(servers), tuple(orphans)), list(records.values())


def discover_servers(procs: Iterable[Any] | None = None) -> list[ServerProcess]:
    """vLLM API servers in ``procs`` (default: this host's processes),
    oldest first. Blocking: call it from a thread."""
    return list(discover(procs).servers)


def _walk(root: int, records: Mapping[int, ProcRecord], kids: Mapping[int, list[int]]) -> list[VllmChild]:
    out: list[VllmChild] = []
    stack = [(c, 1) for c in sorted(kids.get(root, ()), reverse=True)]
    seen = {root}
    while stack:
        pid, depth = stack.pop()
        if pid in seen or pid not in records:
            continue
        seen.add(pid)
        rec = records[pid]
        title = _title(rec)
        if title is not None:
            role, rank, ranks = _classify(title)
        elif _is_helper(rec):
            title, role, rank, ranks = (rec.name or "python"), "helper", None, ()
        else:
            title, role, rank, ranks = (rec.name or "?"), "child", None, ()
        out.append(VllmChild(pid, rec.ppid, title, role, rank, ranks, rec.create_time, depth=depth, cpu=rec.cpu,
                             state=rec.state))
        stack.extend((c, depth + 1) for c in sorted(kids.get(pid, ()), reverse=True))
    return out


def _mark_gpu(server_pid: int, children: list[VllmChild]) -> tuple[tuple[VllmChild, ...], tuple[int, ...], bool]:
    """Which descendants hold the GPU: workers, else engine cores; with
    no vLLM titles at all, the untitled descendants (a guess), else the
    server itself."""
    workers = [c.pid for c in children if c.role == "worker"]
    engines = [c.pid for c in children if c.role == "engine"]
    guessed = False
    if workers:
        gpu = workers
    elif engines:
        gpu = engines
    else:
        guessed = True
        gpu = [c.pid for c in children if c.role == "child"] or [server_pid]
    gset = set(gpu)
    marked = tuple(
        VllmChild(c.pid, c.ppid, c.title, c.role, c.rank, c.ranks, c.create_time, c.pid in gset, c.depth, c.cpu,
                  state=c.state)
        for c in children
    )
    return marked, tuple(gpu), guessed
