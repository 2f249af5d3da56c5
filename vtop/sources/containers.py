"""Where a vLLM process runs: a docker/podman container, a Kubernetes pod, a systemd unit; its
PIDs and ports in its own namespaces; where its runtime writes its log.

Everything starts from the process itself, as vtop sees it in ``/proc`` (no runtime API, no
socket to dockerd or the kubelet, nothing to configure):

* ``/proc/PID/cgroup`` names the container or the unit. The layouts (the path is the one the host
  sees; the line is ``0::PATH`` under cgroup v2 and ``N:controller:PATH`` under v1):

  - docker, cgroupfs driver: ``/docker/<id>``; systemd driver: ``/system.slice/docker-<id>.scope``
  - podman: ``/machine.slice/libpod-<id>.scope[/container]``, ``.../libpod-<id>``
  - kubelet, cgroupfs driver: ``/kubepods[/burstable|/besteffort]/pod<uid>/<id>``; systemd driver:
    ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice/``
    ``cri-containerd-<id>.scope`` (``crio-<id>.scope``, ``docker-<id>.scope``)
  - a systemd service: ``/system.slice/vllm.service``; a user's:
    ``/user.slice/user-1000.slice/user@1000.service/app.slice/vllm.service``

* ``/proc/PID/status`` ``NSpid:`` lists its PID in every PID namespace from vtop's down: the last
  one is what the container sees and what vLLM logs (``(EngineCore pid=245)``).
* ``/proc/PID/ns/net`` against ``/proc/self/ns/net``: whether it listens in a network namespace of
  its own; then ``/proc/PID/net/fib_trie`` gives its local addresses (readable without privilege).
* docker keeps a container's name and log path in ``<data-root>/containers/<id>/config.v2.json``
  (``Name``, ``LogPath``) and its log driver in ``hostconfig.json`` (``LogConfig.Type``); the data
  root is ``/var/lib/docker`` unless dockerd runs with ``--data-root`` (read from its command line)
  or ``VTOP_DOCKER_ROOT`` says otherwise.
* the kubelet links ``/var/log/containers/<pod>_<ns>_<container>-<id>.log`` to
  ``/var/log/pods/<ns>_<pod>_<uid>/<container>/<restart>.log`` (``VTOP_POD_LOG_ROOT`` for another
  ``/var/log/pods``).
* a published port: ``docker-proxy -proto tcp -host-ip 0.0.0.0 -host-port 18000 -container-ip
  172.17.0.2 -container-port 8000`` on the process table, or a DNAT rule in ``iptables-save -t
  nat`` (``--dport 18000 -j DNAT --to-destination 172.17.0.2:8000``; read only as root, with a
  deadline, when no docker-proxy publishes the server).

Blocking (file reads, one short subprocess at most): called from the discovery thread.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vtop.model.procs import ServerProcess, VllmChild

_ID = r"[0-9a-f]{64}"
_DOCKER_RE = re.compile(rf"/docker[-/]({_ID})(?:\.scope)?(?:/|$)")
_PODMAN_RE = re.compile(rf"/libpod-(?:conmon-)?({_ID})(?:\.scope)?(?:/|$)")
_KUBE_RE = re.compile(r"kubepods.*?pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
                      rf"(?:\.slice)?/(?:(cri-containerd|crio|docker)-)?({_ID})(?:\.scope)?(?:/|$)")
_UNIT_RE = re.compile(r"/([^/]+\.service)(?:/|$)")
_USER_RE = re.compile(r"/user@\d+\.service/")

#: kubelet's and docker's layouts (see the module doc)
DOCKER_ROOT = "/var/lib/docker"
POD_LOG_ROOT = "/var/log/pods"


@dataclass(frozen=True)
class Cgroup:
    """What a process's cgroup path says of where it runs."""

    kind: str | None
    """``docker``, ``podman``, ``pod`` (a Kubernetes pod's container), ``unit`` (a systemd service),
    or None (nothing known: the bare host, a login shell)."""
    path: str = ""
    container_id: str | None = None
    pod_uid: str | None = None
    runtime: str | None = None
    """The pod's runtime from its scope name: ``cri-containerd``, ``crio``, ``docker`` (None: cgroupfs)."""
    unit: str | None = None
    user_unit: bool = False


def parse_cgroup(text: str) -> Cgroup:
    """:class:`Cgroup` from the text of ``/proc/PID/cgroup`` (v1 or v2); the most specific line wins."""
    paths: list[str] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2] not in ("", "/"):
            paths.append(parts[2])
    for path in paths:
        m = _KUBE_RE.search(path)
        if m:
            return Cgroup("pod", path, m.group(3), m.group(1).replace("_", "-"), m.group(2))
    for path in paths:
        m = _DOCKER_RE.search(path)
        if m:
            return Cgroup("docker", path, m.group(1))
        m = _PODMAN_RE.search(path)
        if m:
            return Cgroup("podman", path, m.group(1))
    for path in paths:
        units = [u for u in _UNIT_RE.findall(path) if not u.startswith("user@")]
        if units:
            return Cgroup("unit", path, unit=units[-1], user_unit=bool(_USER_RE.search(path)))
    return Cgroup(None, paths[0] if paths else "")


def parse_nspid(status: str) -> list[int]:
    """The ``NSpid:`` PIDs of ``/proc/PID/status`` (vtop's namespace first, the innermost last)."""
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            try:
                return [int(x) for x in line.split()[1:]]
            except ValueError:
                return []
    return []


def parse_fib_trie_local(text: str) -> list[str]:
    """The IPv4 addresses local to a network namespace (``/proc/PID/net/fib_trie``: an address line
    ``|-- 172.17.0.2`` followed by ``/32 host LOCAL``), loopback left out."""
    out: list[str] = []
    last: str | None = None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("|-- "):
            last = s[4:].strip()
        elif last is not None and s.startswith("/32 host LOCAL"):
            if not last.startswith("127.") and last not in out:
                out.append(last)
    return out


@dataclass(frozen=True)
class Forward:
    """A host port that reaches a container's port (docker-proxy, or a DNAT rule)."""

    host_ip: str
    host_port: int
    to_ip: str
    to_port: int
    via: str  # "docker-proxy" or "DNAT"

    @property
    def published(self) -> str:
        """``host:port`` to connect to from this box (all interfaces -> loopback)."""
        h = self.host_ip.strip("[]")
        if h in ("", "0.0.0.0", "::"):
            h = "127.0.0.1"
        return f"[{h}]:{self.host_port}" if ":" in h else f"{h}:{self.host_port}"


def parse_docker_proxy(argv: Sequence[str]) -> Forward | None:
    """A docker-proxy command line (``-proto tcp -host-ip H -host-port P -container-ip C
    -container-port Q``); None for anything else or a UDP proxy."""
    if not argv or os.path.basename(argv[0]) != "docker-proxy":
        return None
    opts: dict[str, str] = {}
    i = 1
    while i < len(argv):
        a = argv[i].lstrip("-")
        if "=" in a:
            k, v = a.split("=", 1)
            opts[k] = v
            i += 1
        elif i + 1 < len(argv):
            opts[a] = argv[i + 1]
            i += 2
        else:
            i += 1
    if opts.get("proto", "tcp") != "tcp":
        return None
    try:
        return Forward(opts.get("host-ip", "0.0.0.0"), int(opts["host-port"]), opts["container-ip"],
                       int(opts["container-port"]), "docker-proxy")
    except (KeyError, ValueError):
        return None


_DNAT_RE = re.compile(r"--to-destination\s+\[?([0-9a-fA-F.:]+?)\]?:(\d+)")
_DPORT_RE = re.compile(r"--dport\s+(\d+)(?:\s|$)")
_DST_RE = re.compile(r"(?:^|\s)-d\s+([0-9.]+)(?:/32)?(?:\s|$)")


def parse_dnat(text: str) -> list[Forward]:
    """TCP DNAT rules of ``iptables-save -t nat`` text (docker's ``DOCKER`` chain, a CNI portmap's
    ``CNI-DN-*`` chains, a hand-written rule): ``--dport P ... -j DNAT --to-destination C:Q``."""
    out: list[Forward] = []
    for line in text.splitlines():
        if not line.startswith("-A ") or "-j DNAT" not in line or "-p tcp" not in line:
            continue
        to, dport = _DNAT_RE.search(line), _DPORT_RE.search(line)
        if to is None or dport is None:
            continue
        dst = _DST_RE.search(line)
        out.append(Forward(dst.group(1) if dst else "0.0.0.0", int(dport.group(1)), to.group(1), int(to.group(2)),
                           "DNAT"))
    return out


# --------------------------------------------------------------------------- the runtime's files


@dataclass(frozen=True)
class RuntimeInfo:
    """What the runtime's own files say of a container."""

    name: str | None = None
    log_path: str | None = None
    log_driver: str | None = None
    pod: str | None = None  # "namespace/name"
    container: str | None = None  # the container's name in its pod


def docker_roots(records: Iterable[Any] = (), env: Mapping[str, str] | None = None) -> list[str]:
    """Where docker keeps its containers: ``VTOP_DOCKER_ROOT``, every running dockerd's ``--data-root``
    (or ``-g``), ``/etc/docker/daemon.json``'s ``data-root``, then ``/var/lib/docker``."""
    env = os.environ if env is None else env
    out: list[str] = []
    if env.get("VTOP_DOCKER_ROOT"):
        out.append(env["VTOP_DOCKER_ROOT"])
    for rec in records:
        argv = tuple(getattr(rec, "cmdline", ()) or ())
        if not argv or os.path.basename(argv[0]) != "dockerd":
            continue
        for i, a in enumerate(argv):
            if a in ("--data-root", "-g", "--graph") and i + 1 < len(argv):
                out.append(argv[i + 1])
            elif a.startswith(("--data-root=", "--graph=")):
                out.append(a.split("=", 1)[1])
    try:
        with open("/etc/docker/daemon.json", encoding="utf-8") as f:
            root = json.load(f).get("data-root")
        if isinstance(root, str) and root:
            out.append(root)
    except (OSError, ValueError, AttributeError):
        pass
    out.append(DOCKER_ROOT)
    return list(dict.fromkeys(out))


def docker_info(cid: str, roots: Sequence[str]) -> RuntimeInfo | None:
    """Name, log path and log driver of docker container ``cid``; None when no root holds it."""
    for root in roots:
        d = os.path.join(root, "containers", cid)
        try:
            with open(os.path.join(d, "config.v2.json"), encoding="utf-8") as f:
                cfg = json.load(f)
        except (OSError, ValueError):
            continue
        driver = None
        try:
            with open(os.path.join(d, "hostconfig.json"), encoding="utf-8") as f:
                driver = (json.load(f).get("LogConfig") or {}).get("Type")
        except (OSError, ValueError, AttributeError):
            pass
        name = cfg.get("Name") if isinstance(cfg, dict) else None
        log = cfg.get("LogPath") if isinstance(cfg, dict) else None
        return RuntimeInfo(name.lstrip("/") if isinstance(name, str) and name else None,
                           log if isinstance(log, str) and log else None,
                           driver if isinstance(driver, str) else None)
    return None


def pod_info(pod_uid: str, cid: str, root: str = POD_LOG_ROOT) -> RuntimeInfo | None:
    """The pod's namespace/name and the container's CRI log, from the kubelet's log folders: the
    ``/var/log/containers`` link naming ``cid`` first, else ``<ns>_<pod>_<uid>/<container>/`` with
    the highest restart number (a single container, or the one whose file is newest)."""
    parent = os.path.dirname(root.rstrip("/"))
    links = os.path.join(parent, "containers")
    try:
        for entry in os.scandir(links):
            if entry.name.endswith(f"-{cid}.log"):
                target = os.path.realpath(entry.path)
                pod, ns, ctr = _split_link_name(entry.name[: -len(f"-{cid}.log")])
                return RuntimeInfo(ctr, target if os.path.isfile(target) else entry.path, "cri",
                                   f"{ns}/{pod}" if ns and pod else None, ctr)
    except OSError:
        pass
    try:
        dirs = [e for e in os.scandir(root) if e.is_dir() and e.name.endswith("_" + pod_uid)]
    except OSError:
        return None
    if not dirs:
        return None
    pod_dir = dirs[0]
    ns, _, rest = pod_dir.name.partition("_")
    pod = rest[: -len(pod_uid) - 1]
    best: tuple[float, str, str] | None = None
    try:
        for cdir in os.scandir(pod_dir.path):
            if not cdir.is_dir():
                continue
            logs = []
            for f in os.scandir(cdir.path):
                m = re.fullmatch(r"(\d+)\.log", f.name)
                if m:
                    logs.append((int(m.group(1)), f.path))
            if not logs:
                continue
            path = max(logs)[1]
            mtime = os.stat(path).st_mtime
            if best is None or mtime > best[0]:
                best = (mtime, cdir.name, path)
    except OSError:
        pass
    if best is None:
        return RuntimeInfo(None, None, "cri", f"{ns}/{pod}")
    return RuntimeInfo(best[1], best[2], "cri", f"{ns}/{pod}", best[1])


def _split_link_name(stem: str) -> tuple[str | None, str | None, str | None]:
    """``<pod>_<ns>_<container>`` (pod names and namespaces hold no ``_``)."""
    parts = stem.split("_", 2)
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else (None, None, None)


def podman_info(cid: str, roots: Sequence[str] = ("/var/lib/containers/storage",)) -> RuntimeInfo | None:
    """podman's ``k8s-file`` log (CRI format) of ``cid``: ``<root>/overlay-containers/<id>/userdata/ctr.log``."""
    for root in roots:
        path = os.path.join(root, "overlay-containers", cid, "userdata", "ctr.log")
        if os.path.isfile(path):
            return RuntimeInfo(None, path, "k8s-file")
    return None


def placement_label(cg: Cgroup, info: RuntimeInfo | None) -> str | None:
    """``container vllm-0`` / ``pod default/vllm-7d9f`` / ``unit vllm.service``, or None."""
    if cg.kind == "pod":
        if info is not None and info.pod:
            return f"pod {info.pod}"
        return f"pod {cg.pod_uid[:8]}" if cg.pod_uid else "pod"
    if cg.kind in ("docker", "podman"):
        name = info.name if info is not None and info.name else (cg.container_id or "")[:12]
        return f"container {name}"
    if cg.kind == "unit":
        return f"{'user unit' if cg.user_unit else 'unit'} {cg.unit}"
    return None


# --------------------------------------------------------------------------- a process's namespaces


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _ns(pid: int | str, kind: str, proc_root: str) -> str | None:
    try:
        return os.readlink(f"{proc_root}/{pid}/ns/{kind}")
    except OSError:
        return None


#: ``/proc/self/ns/pid`` of the init PID namespace (the kernel's PROC_PID_INIT_INO, 0xEFFFFFFC):
#: a process elsewhere (a container without ``--pid=host``) sees its own PIDs, not the host's
INIT_PID_NS = "pid:[4026531836]"


def in_host_pid_ns(proc_root: str = "/proc") -> bool | None:
    """Whether vtop runs in the host's (init) PID namespace: NVML's PIDs are the host's, so only
    then are they this ``/proc``'s. None when it cannot be told."""
    ns = _ns("self", "pid", proc_root)
    return None if ns is None else ns == INIT_PID_NS


@dataclass
class Enricher:
    """Adds where each server runs to a discovery's servers (see the module doc). Keeps what it read
    of a container's files, by container ID; the DNAT rules for a minute."""

    proc_root: str = "/proc"
    env: Mapping[str, str] | None = None
    pod_log_root: str | None = None
    podman_roots: tuple[str, ...] = ("/var/lib/containers/storage",)
    #: run ``iptables-save -t nat`` for a server no docker-proxy publishes (root only)
    read_dnat: bool = True
    dnat_every_s: float = 60.0
    _info: dict[str, RuntimeInfo | None] = dataclasses.field(default_factory=dict)
    _dnat: tuple[float, list[Forward]] | None = None

    def enrich(self, servers: Sequence[ServerProcess], records: Sequence[Any]) -> list[ServerProcess]:
        env = os.environ if self.env is None else self.env
        my_pid_ns = _ns("self", "pid", self.proc_root)
        my_net_ns = _ns("self", "net", self.proc_root)
        roots: list[str] | None = None
        proxies = [f for f in (parse_docker_proxy(tuple(getattr(r, "cmdline", ()) or ())) for r in records)
                   if f is not None]
        out: list[ServerProcess] = []
        for sp in servers:
            kw: dict[str, Any] = {}
            cg = parse_cgroup(_read(f"{self.proc_root}/{sp.pid}/cgroup") or "")
            info: RuntimeInfo | None = None
            if cg.kind in ("docker", "pod", "podman") and cg.container_id:
                if cg.container_id not in self._info:
                    if cg.kind == "docker":
                        roots = roots if roots is not None else docker_roots(records, env)
                        self._info[cg.container_id] = docker_info(cg.container_id, roots)
                    elif cg.kind == "pod":
                        root = self.pod_log_root or env.get("VTOP_POD_LOG_ROOT") or POD_LOG_ROOT
                        self._info[cg.container_id] = pod_info(cg.pod_uid or "", cg.container_id, root)
                    else:
                        self._info[cg.container_id] = podman_info(cg.container_id, self.podman_roots)
                info = self._info[cg.container_id]
                kw["container_id"] = cg.container_id
            label = placement_label(cg, info)
            if label is not None:
                kw["placement"] = label
            if my_pid_ns is not None and _ns(sp.pid, "pid", self.proc_root) not in (None, my_pid_ns):
                kw["ns_pid"] = self._ns_pid(sp.pid)
                kw["children"] = tuple(dataclasses.replace(c, ns_pid=self._ns_pid(c.pid)) for c in sp.children)
            net = _ns(sp.pid, "net", self.proc_root)
            if my_net_ns is not None and net is not None and net != my_net_ns:
                kw.update(self._reach(sp, proxies))
            out.append(dataclasses.replace(sp, **kw) if kw else sp)
        if my_pid_ns is not None and my_pid_ns != INIT_PID_NS:
            # vtop in a container: these PIDs are this namespace's, NVML's the host's. No process here
            # is said to hold a GPU (a host PID of the same number would be another process).
            out = [dataclasses.replace(sp, gpu_pids=(), gpu_pids_guessed=False,
                                       children=tuple(dataclasses.replace(c, holds_gpu=False) for c in sp.children))
                   for sp in out]
        return out

    def runtime_info(self, container_id: str | None) -> RuntimeInfo | None:
        """What was read of a container's files (its log path and driver), by its ID."""
        return self._info.get(container_id or "")

    def _ns_pid(self, pid: int) -> int | None:
        ids = parse_nspid(_read(f"{self.proc_root}/{pid}/status") or "")
        return ids[-1] if len(ids) > 1 else None

    def _reach(self, sp: ServerProcess, proxies: list[Forward]) -> dict[str, Any]:
        """How this box reaches a server in another network namespace: a published port on the host
        (its URL then), else its own address there."""
        from vtop.sources.discovery import url_for

        addrs = parse_fib_trie_local(_read(f"{self.proc_root}/{sp.pid}/net/fib_trie") or "")
        fwd = [f for f in proxies if f.to_port == sp.port and f.to_ip in addrs]
        if not fwd and addrs:
            fwd = [f for f in self._dnat_rules() if f.to_port == sp.port and f.to_ip in addrs]
        kw: dict[str, Any] = {"own_netns": True, "listen_port": sp.port}
        published = tuple(dict.fromkeys(f.published for f in fwd))
        if published:
            host, port = published[0].rsplit(":", 1)
            h, url = url_for(host, int(port))
            kw.update(host=h, port=int(port), url=url, published=published)
        elif addrs and (sp.bind_host in (None, "", "0.0.0.0", "::") or sp.bind_host in addrs):
            h, url = url_for(addrs[0], sp.port)
            kw.update(host=h, url=url)
        if kw.get("port", sp.port) == sp.port:
            kw["listen_port"] = None
        return kw

    def _dnat_rules(self) -> list[Forward]:
        if not self.read_dnat or os.geteuid() != 0:
            return []
        now = time.monotonic()
        if self._dnat is not None and now - self._dnat[0] < self.dnat_every_s:
            return self._dnat[1]
        rules: list[Forward] = []
        try:
            r = subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True, timeout=2.0,
                               check=False)
            rules = parse_dnat(r.stdout) if r.returncode == 0 else []
        except (OSError, subprocess.SubprocessError):
            rules = []
        self._dnat = (now, rules)
        return rules


def child_ns_pids(children: Iterable[VllmChild]) -> dict[int, int]:
    """``{pid in its namespace: host pid}`` of a tree's children that have one."""
    return {c.ns_pid: c.pid for c in children if c.ns_pid is not None}


# --------------------------------------------------------------------------- the log a runtime keeps


@dataclass(frozen=True)
class ContainerLog:
    """Where the runtime around a server keeps its stdout and stderr."""

    kind: str | None
    """``docker-json`` (docker's json-file driver), ``cri`` (kubelet's CRI files, podman's k8s-file),
    ``journal`` (journald: a systemd unit, docker's journald driver), or None (none vtop can read)."""
    label: str
    """What it is, for the screen: ``docker json-file of vllm-0``."""
    path: str | None = None
    match: str | None = None
    """The journal match (``_SYSTEMD_UNIT=vllm.service``)."""
    message: str = ""
    """Why there is none to read, and what to do instead."""


def container_log(sp: ServerProcess, info: RuntimeInfo | None = None, *, proc_root: str = "/proc",
                  records: Sequence[Any] = ()) -> ContainerLog | None:
    """The log the runtime around ``sp`` keeps (see :class:`ContainerLog`); None when ``sp`` runs in no
    container, pod or unit vtop knows. ``info``: what was read of its container's files already."""
    cg = parse_cgroup(_read(f"{proc_root}/{sp.pid}/cgroup") or "")
    where = sp.placement or placement_label(cg, info) or "it"
    if cg.kind == "unit" and cg.unit:
        field = "_SYSTEMD_USER_UNIT" if cg.user_unit else "_SYSTEMD_UNIT"
        return ContainerLog("journal", f"journal of {where}", match=f"{field}={cg.unit}")
    if cg.kind not in ("docker", "pod", "podman") or not cg.container_id:
        return None
    if info is None:
        if cg.kind == "docker":
            info = docker_info(cg.container_id, docker_roots(records))
        elif cg.kind == "pod":
            info = pod_info(cg.pod_uid or "", cg.container_id, os.environ.get("VTOP_POD_LOG_ROOT") or POD_LOG_ROOT)
        else:
            info = podman_info(cg.container_id)
    short = cg.container_id[:12]
    if cg.kind == "docker":
        driver = info.log_driver if info is not None else None
        if info is None:
            return ContainerLog(None, where, message=(
                f"vLLM runs in docker container {short}, whose files vtop did not find (is docker's data root "
                "elsewhere? set VTOP_DOCKER_ROOT); pipe its log: "
                f"`docker logs -f {short} 2>&1 | vtop --log -`"))
        if driver in (None, "json-file") and info.log_path:
            return ContainerLog("docker-json", f"docker json-file of {info.name or short}", path=info.log_path)
        if driver == "journald":
            return ContainerLog("journal", f"journal of {where} (docker's journald driver)",
                                match=f"CONTAINER_ID_FULL={cg.container_id}")
        return ContainerLog(None, where, message=(
            f"vLLM runs in {where}, whose log driver ({driver}) keeps no file vtop reads; pipe it: "
            f"`docker logs -f {info.name or short} 2>&1 | vtop --log -`"))
    if info is not None and info.log_path:
        what = "CRI log" if cg.kind == "pod" else "podman k8s-file log"
        ctr = f" (container {info.container})" if cg.kind == "pod" and info.container else ""
        return ContainerLog("cri", f"{what} of {where}{ctr}", path=info.log_path)
    if cg.kind == "podman":
        return ContainerLog("journal", f"journal of {where} (podman's journald driver)",
                            match=f"CONTAINER_ID_FULL={cg.container_id}")
    return ContainerLog(None, where, message=(
        f"vLLM runs in {where}, whose CRI log vtop did not find under /var/log/pods (set VTOP_POD_LOG_ROOT, or "
        f"pipe it: `kubectl logs -f POD 2>&1 | vtop --log -`)"))
