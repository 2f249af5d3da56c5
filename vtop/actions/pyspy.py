"""The py-spy key: dump the Python stacks of a vLLM process.

Why it works this way:

* **Which PID.** "Why is the server stuck" is answered by the EngineCore
  (V1, TP=1: scheduler and model runner in one process) or by the workers
  (TP/PP > 1: the EngineCore only schedules). "Why is HTTP slow" is the API
  server. :func:`pick_targets` takes those from discovery's process tree,
  which only counts titled processes *below* a real ``vllm serve`` command
  line (titles alone can be faked).
* **Subprocess with a timeout.** ``py-spy dump`` pauses the target while it
  reads memory; a wedged ptrace or a huge process can make it hang, so it
  is killed after ``timeout_s`` (the kernel detaches and resumes the target).
* **Distinct failures.** Missing binary, permission (not root, Yama
  ``ptrace_scope``, a container without ``SYS_PTRACE``), process gone,
  timeout and anything else each get their own ``kind`` and a message that
  says what to do. Never raises.
* **Parsed and raw.** The UI shows threads/frames; the raw text is kept for
  saving into the snapshot folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from vtop.model.redact import scrub_secrets
from vtop.sources.discovery import ServerProcess

__all__ = [
    "Frame",
    "PySpyResult",
    "SaveResult",
    "Target",
    "Thread",
    "dump",
    "find_pyspy",
    "parse_dump",
    "permission_hint",
    "pick_targets",
    "save_into",
]

PTRACE_SCOPE = Path("/proc/sys/kernel/yama/ptrace_scope")

# --- targets -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """A process worth dumping; ``label`` is for the UI ("EngineCore", "Worker_TP1", "API server")."""

    pid: int
    role: str
    label: str
    rank: int | None = None


ROLES = ("auto", "engine", "workers", "api_server", "all")


def pick_targets(server: ServerProcess, *, role: str = "auto") -> list[Target]:
    """The processes to py-spy for ``role``.

    * ``auto``: the workers when TP/PP > 1 (they run the model), else the
      EngineCore(s) (V1 TP=1; one per DP rank); with neither (<=0.9, no
      titles) the processes discovery guessed hold the GPU, else the server.
    * ``engine`` / ``workers``: those, possibly empty.
    * ``api_server``: the API server (plus ``APIServer_N`` children with
      ``--api-server-count > 1``).
    * ``all``: all of the above, helpers excluded.
    Unknown roles give ``[]``.
    """
    by_pid = {c.pid: c for c in server.children}

    def of(kind: str) -> list[Target]:
        out = []
        for c in server.children:
            if c.role == kind:
                out.append(Target(c.pid, c.role, c.title or f"{kind} {c.pid}", c.rank))
        return sorted(out, key=lambda t: (t.rank if t.rank is not None else -1, t.pid))

    api = [Target(server.pid, "api_server", "API server")] + of("api_server")
    if role == "engine":
        return of("engine")
    if role == "workers":
        return of("worker")
    if role == "api_server":
        return api
    if role == "all":
        return api + of("coordinator") + of("engine") + of("worker") + of("child")
    if role != "auto":
        return []
    parallel = server.tp > 1 or (server.pipeline_parallel_size or 1) > 1
    workers, engines = of("worker"), of("engine")
    if parallel and workers:
        return workers
    if engines:
        return engines
    if workers:
        return workers
    guessed = [
        Target(p, by_pid[p].role if p in by_pid else "api_server",
               (by_pid[p].title if p in by_pid else "API server") or str(p))
        for p in server.gpu_pids
    ]
    return guessed or api


# --- parsing -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Frame:
    func: str
    file: str
    line: int | None = None

    @property
    def text(self) -> str:
        return f"{self.func} ({self.file}:{self.line})" if self.line is not None else f"{self.func} ({self.file})"


@dataclass(frozen=True, slots=True)
class Thread:
    """One thread of a dump; ``frames[0]`` is the innermost (where it is now)."""

    tid: str
    name: str
    status: str  # idle | active | active+gil | ...
    frames: tuple[Frame, ...]

    @property
    def active(self) -> bool:
        return self.status != "idle"

    @property
    def holds_gil(self) -> bool:
        return "gil" in self.status


_THREAD_RE = re.compile(r'^Thread (?P<tid>\S+) \((?P<status>[^)]*)\)(?::\s*"(?P<name>.*)")?\s*$')
_FRAME_RE = re.compile(r"^\s{4}(?P<func>\S.*?) \((?P<loc>[^()]*)\)\s*$")


def parse_dump(text: str) -> tuple[str | None, str | None, tuple[Thread, ...]]:
    """``(process title, python version line, threads)`` from ``py-spy dump`` output.

    The title may span lines (``python -c`` scripts with newlines); it ends
    at the ``Python v`` line. Frames without ``:line`` are native frames.
    Lines that are none of these (``--locals`` values) are skipped.
    """
    title_lines: list[str] | None = None
    title: str | None = None
    version: str | None = None
    threads: list[Thread] = []
    cur: dict[str, object] | None = None
    frames: list[Frame] = []

    def flush() -> None:
        if cur is not None:
            threads.append(Thread(str(cur["tid"]), str(cur["name"]), str(cur["status"]), tuple(frames)))

    for raw in text.splitlines():
        line = raw.rstrip("\r")
        if title is None and version is None:
            if title_lines is None:
                m = re.match(r"^Process \d+: ?(.*)$", line)
                if m:
                    title_lines = [m.group(1)]
                continue
            if line.startswith("Python v"):
                title = "\n".join(title_lines).strip()
                version = line.strip()
            else:
                title_lines.append(line)
            continue
        m = _THREAD_RE.match(line)
        if m:
            flush()
            cur = {"tid": m.group("tid"), "status": m.group("status"), "name": m.group("name") or ""}
            frames = []
            continue
        if cur is None:
            continue
        fm = _FRAME_RE.match(line)
        if fm and not line.startswith("        "):
            func, loc = fm.group("func"), fm.group("loc")
            file, sep, ln = loc.rpartition(":")
            if sep and ln.isdigit():
                frames.append(Frame(func, file, int(ln)))
            else:
                frames.append(Frame(func, loc, None))
    flush()
    if title is None and title_lines is not None:
        title = "\n".join(title_lines).strip()
    return title, version, tuple(threads)


# --- results -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SaveResult:
    ok: bool
    message: str
    path: Path | None = None


@dataclass(frozen=True)
class PySpyResult:
    """A py-spy run. ``kind``: ok | not_installed | permission | gone | timeout | failed."""

    ok: bool
    message: str
    pid: int
    kind: str
    raw: str = ""
    threads: tuple[Thread, ...] = ()
    process_title: str | None = None
    python_version: str | None = None
    native: bool = False
    stderr: str = ""
    returncode: int | None = None
    elapsed_s: float = 0.0
    started_at: float = field(default_factory=time.time)

    def save_into(self, folder: str | os.PathLike[str]) -> SaveResult:
        return save_into(self, folder)


def find_pyspy(explicit: str | None = None) -> str | None:
    """The py-spy binary: ``explicit`` if it is executable; else ``$PATH``; else next to
    this interpreter (a venv whose ``bin`` is not on ``$PATH``: ``pip install py-spy`` puts it there)."""
    if explicit is not None:
        p = Path(explicit)
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
        return shutil.which(explicit) if os.sep not in explicit else None
    found = shutil.which("py-spy")
    if found:
        return found
    cand = Path(sys.executable).parent / "py-spy"
    return str(cand) if cand.is_file() and os.access(cand, os.X_OK) else None


def _in_container() -> bool:
    if Path("/.dockerenv").exists() or Path("/run/.containerenv").exists():
        return True
    try:
        cg = Path("/proc/1/cgroup").read_text(errors="replace")
    except OSError:
        return False
    return any(k in cg for k in ("docker", "kubepods", "containerd", "lxc", "podman"))


def _read_ptrace_scope(path: Path = PTRACE_SCOPE) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def permission_hint(pid: int, *, euid: int, ptrace_scope: int | None, in_container: bool) -> str:
    """What to do about a denied ptrace, from who we are and the Yama setting.

    Yama ``ptrace_scope``: 0 = any process of the same user, 1 = only
    descendants (Ubuntu's default: even the same user's vLLM is off limits),
    2 = only with CAP_SYS_PTRACE, 3 = nobody (until reboot).
    """
    scope = f"kernel.yama.ptrace_scope={ptrace_scope}" if ptrace_scope is not None else "no Yama ptrace_scope"
    base = f"py-spy may not attach to pid {pid} ({scope}"
    if ptrace_scope == 3:
        return base + "): ptrace is disabled until reboot; set kernel.yama.ptrace_scope=1 at boot to use py-spy."
    if euid == 0:
        if in_container:
            return base + (", running as root in a container): restart the container with "
                           "--cap-add SYS_PTRACE (Kubernetes: securityContext.capabilities.add: [SYS_PTRACE]).")
        return base + (", running as root): a seccomp/LSM policy blocks ptrace; "
                       "check the sandbox or run py-spy on the host.")
    fix = "run vtop as root (sudo vtop), or the same py-spy command with sudo"
    if ptrace_scope == 1:
        fix += ", or allow same-user attach: echo 0 | sudo tee /proc/sys/kernel/yama/ptrace_scope"
    elif ptrace_scope == 2:
        fix = "run vtop as root (sudo vtop): only CAP_SYS_PTRACE may attach"
    if in_container:
        fix += "; in a container also start it with --cap-add SYS_PTRACE"
    return base + f", not root): {fix}."


_PERM_RE = re.compile(r"permission denied|operation not permitted|SYS_PTRACE|elevated permissions", re.I)
_GONE_RE = re.compile(r"No such process|Check that the process is running|process \d+ .*not found|"
                      r"Failed to (?:find|open) process|No such file or directory", re.I)


def _error_line(stderr: str, stdout: str) -> str:
    """The telling line: py-spy's ``Error: ...`` if any (a Rust backtrace may follow it), else the last line."""
    lines = [ln.strip() for ln in (stderr or stdout).splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("Error:"):
            return ln
    return lines[-1] if lines else ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def dump(pid: int, *, native: bool = False, timeout_s: float = 20, pyspy: str | None = None,
               locals_: bool = False) -> PySpyResult:
    """Run ``py-spy dump --pid PID`` and parse it; never raises.

    ``native`` adds C/C++ frames (CUDA/NCCL waits). The process is killed
    after ``timeout_s``.
    """
    t0 = time.monotonic()

    def res(ok: bool, kind: str, msg: str, **kw: object) -> PySpyResult:
        return PySpyResult(ok, msg, pid, kind, native=native, elapsed_s=time.monotonic() - t0, **kw)  # type: ignore[arg-type]

    exe = find_pyspy(pyspy)
    if exe is None:
        where = f" at {pyspy}" if pyspy else " on $PATH or next to this Python"
        return res(False, "not_installed", f"py-spy is not installed{where}: pip install py-spy")
    if pid <= 0 or not _pid_alive(pid):
        return res(False, "gone", f"process {pid} is gone (exited or restarted); nothing to dump")
    cmd = [exe, "dump", "--pid", str(pid)]
    if native:
        cmd.append("--native")
    if locals_:
        cmd.append("--locals")
    env = dict(os.environ, RUST_BACKTRACE="0", RUST_LIB_BACKTRACE="0")
    try:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env,
        )
    except FileNotFoundError:
        return res(False, "not_installed", f"py-spy could not be started ({exe}): pip install py-spy")
    except PermissionError:
        return res(False, "not_installed", f"py-spy at {exe} is not executable: pip install py-spy")
    except OSError as e:
        return res(False, "failed", f"py-spy could not be started: {e.strerror or e}")
    try:
        out_b, err_b = await asyncio.wait_for(proc.communicate(), timeout_s)
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), 5)
        return res(False, "timeout",
                   f"py-spy dump of pid {pid} gave no answer in {timeout_s:g} s and was stopped "
                   "(the process may be stuck in a system call; try again, or with --native)")
    except asyncio.CancelledError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        raise
    # py-spy prints the process's command line ("Process 12: vllm serve --api-key S"): scrubbed before
    # it is shown, saved or put into a bundle
    out = scrub_secrets(out_b.decode(errors="replace"))
    err = scrub_secrets(err_b.decode(errors="replace"))
    rc = proc.returncode
    if rc == 0 and out.strip():
        title, version, threads = parse_dump(out)
        n_active = sum(t.active for t in threads)
        native_note = " (with native frames)" if native else ""
        return res(True, "ok", f"pid {pid}: {len(threads)} thread(s), {n_active} active{native_note}",
                   raw=out, threads=threads, process_title=title, python_version=version, stderr=err, returncode=rc)
    line = _error_line(err, out)
    both = err + "\n" + out
    if _PERM_RE.search(both):
        hint = permission_hint(pid, euid=os.geteuid(), ptrace_scope=_read_ptrace_scope(), in_container=_in_container())
        return res(False, "permission", f"permission denied: {hint}", raw=out, stderr=err, returncode=rc)
    if not _pid_alive(pid) or _GONE_RE.search(both):
        return res(False, "gone", f"process {pid} is gone (it exited during the dump): {line}".rstrip(": "),
                   raw=out, stderr=err, returncode=rc)
    return res(False, "failed", f"py-spy dump of pid {pid} failed (exit {rc}): {line or 'no output'}",
               raw=out, stderr=err, returncode=rc)


def save_into(result: PySpyResult, folder: str | os.PathLike[str]) -> SaveResult:
    """Write the raw dump as ``pyspy-PID-YYYYmmdd-HHMMSS.txt`` (0600) into ``folder``
    (the latest snapshot bundle: see ``snapshot.latest_bundle``). Never raises."""
    if not result.raw:
        return SaveResult(False, f"nothing to save: {result.message}")
    stamp = _dt.datetime.fromtimestamp(result.started_at).strftime("%Y%m%d-%H%M%S")
    base = Path(folder)
    header = (f"# py-spy dump{' --native' if result.native else ''} --pid {result.pid} at "
              f"{_dt.datetime.fromtimestamp(result.started_at).astimezone().isoformat(timespec='seconds')}\n")
    for n in range(1, 100):
        path = base / (f"pyspy-{result.pid}-{stamp}" + (f"-{n}" if n > 1 else "") + ".txt")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except FileExistsError:
            continue
        except OSError as e:
            return SaveResult(False, f"cannot save the dump into {base}: {e.strerror or e}")
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(header + result.raw)
        except OSError as e:
            return SaveResult(False, f"cannot write {path}: {e.strerror or e}")
        return SaveResult(True, f"dump saved to {path}", path)
    return SaveResult(False, f"too many dumps of pid {result.pid} at {stamp} in {base}")
