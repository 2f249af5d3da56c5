"""The real tier's containers: a real docker daemon (docker.io 20.10 from Debian: runc, the cgroupfs
driver, the vfs storage driver, docker-proxy for published ports) of the test's own, and the real
vLLM CPU server run in a container of it.

The box has no image registry to pull from and needs none: the image is empty (``docker import`` of
an empty tar) and the host's ``/usr``, ``/lib``, the Python the vLLM venv was made with, the venv and
the model are bind-mounted read-only (the venv's cache writable). The container has its own PID,
network, mount, IPC and UTS namespaces and its own cgroup (``/docker/<id>``, or under
``--cgroup-parent``), as any ``docker run`` does; its port is published with ``-p`` (docker-proxy
and a DNAT rule).

Its network is its own: a bridge ``vtb<pid>`` made here with a /24 out of 10.213.0.0/16 that no
route or address of the host overlaps, given to dockerd with ``--bridge`` (docker's "build your own
bridge"): its default network is on that bridge, not on ``docker0``, whose 172.17.0.0/16 every
daemon of the box would share. (Not ``--bridge none`` and a ``docker network create``: with the
bridge disabled dockerd deletes the host's ``docker0`` at its start, a system docker's too.) Before a
daemon starts, what dead test daemons left is cleaned (:func:`clean_leftovers`): a killed run left its
container's network namespace bind-mounted (``exec/netns/<id>``, nsfs) with a veth and 172.17.0.2
still on ``docker0``, and every later daemon's first container got 172.17.0.2 again: docker-proxy's
connections went to the dead namespace and the published port never answered (CI failed twice so).

iptables stays on, as on any docker host. Every daemon's start flushes the shared ``DOCKER`` chains
(another running test daemon loses its DNAT rules: seen with two daemons here), which does not part
two test daemons: their published ports are on 127.0.0.1, where docker-proxy, not the DNAT rule,
carries a connection (docker's ``OUTPUT`` jump leaves 127.0.0.0/8 alone; the first daemon's port
answered through and after the second's start and stop), and each has a bridge of its own. A
dead daemon's folder can also hold its data root bind-mounted on itself; every mount under it goes.

If ``dockerd`` is not installed, :meth:`Docker.start` raises :class:`NoDocker` with what to install.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.helpers.vllm_env import SERVER_ENV

IMAGE = "vtop-empty"
#: what the container needs of the host, read-only (the venv's python links into pyenv)
HOST_DIRS = ("/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc/ssl", "/etc/alternatives", "/root/.pyenv")
#: where a test daemon's network is picked: a /24 of it that nothing on the host overlaps
SUBNET_POOL = ipaddress.IPv4Network("10.213.0.0/16")
#: a test daemon's folder is ``/tmp/vtop-docker-<pid of the test process>``
ROOT_PREFIX = "vtop-docker-"
#: the daemon's default network, on its own bridge (a name in the daemon's data root)
NETWORK = "bridge"


class NoDocker(RuntimeError):
    pass


class Docker:
    """One dockerd of the test's own (its data root, exec root and socket under ``root``) and its own
    bridge (:attr:`bridge` on :attr:`subnet`, the daemon's network :data:`NETWORK`)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data_root = root / "data"
        self.sock = root / "docker.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.env = {**os.environ, "DOCKER_HOST": f"unix://{self.sock}"}
        self.network = NETWORK
        self.bridge = f"vtb{os.getpid()}"[:15]  # an interface name has 15 characters at most
        self.subnet: ipaddress.IPv4Network | None = None
        self.cleaned: list[Leftover] = []

    def cli(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(["docker", *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args[:3])}... failed ({r.returncode}): {r.stderr.strip()[-800:]}")
        return r

    def start(self, timeout: float = 60) -> None:
        if shutil.which("dockerd") is None or shutil.which("docker") is None:
            raise NoDocker("docker is not installed here (apt-get install docker.io runc containerd iptables)")
        self.cleaned = clean_leftovers(self.root.parent, me=os.getpid())
        for lo in self.cleaned:
            print(f"dockerd: cleaned what a dead test daemon left: {lo}")
        self.root.mkdir(parents=True, exist_ok=True)
        self._make_bridge()
        try:
            self._start_daemon(timeout)
        except BaseException:
            self.stop()  # the bridge goes with it
            raise

    def _start_daemon(self, timeout: float) -> None:
        log = open(self.root / "dockerd.log", "ab")  # noqa: SIM115 - the daemon's, closed with it
        self.proc = subprocess.Popen(
            ["dockerd", "--exec-opt", "native.cgroupdriver=cgroupfs", "--storage-driver", "vfs",
             "--data-root", str(self.data_root), "--exec-root", str(self.root / "exec"),
             "-H", f"unix://{self.sock}", "--pidfile", str(self.root / "dockerd.pid"), "--bridge", self.bridge],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise NoDocker(f"dockerd exited ({self.proc.returncode}): "
                               + (self.root / "dockerd.log").read_text(errors="replace")[-1500:])
            if self.cli("info", timeout=10, check=False).returncode == 0:
                break
            time.sleep(0.5)
        else:
            raise NoDocker("dockerd did not answer in time: " + (self.root / "dockerd.log").read_text()[-1500:])
        if self.cli("image", "inspect", IMAGE, check=False).returncode != 0:
            subprocess.run(["docker", "import", "-", IMAGE], input=_empty_tar(), env=self.env, check=True,
                           capture_output=True, timeout=60)

    def _make_bridge(self, tries: int = 5) -> None:
        """The daemon's bridge on a /24 that no route or address of the host overlaps; made again
        elsewhere if another daemon took the same /24 meanwhile (checked once the bridge has its
        address)."""
        (self.root / "bridge").write_text(self.bridge + "\n")  # named before made: a leftover's is found
        _del_link(self.bridge)  # a dead run of a test process with this pid left it
        rng = random.Random()
        for _ in range(tries):
            subnet = pick_subnet(host_networks(), rng)
            gateway = f"{next(subnet.hosts())}/{subnet.prefixlen}"
            for cmd in (["link", "add", self.bridge, "type", "bridge"], ["addr", "add", gateway, "dev", self.bridge],
                        ["link", "set", self.bridge, "up"]):
                r = subprocess.run(["ip", *cmd], capture_output=True, text=True, timeout=30)
                if r.returncode != 0:
                    _del_link(self.bridge)
                    raise NoDocker(f"ip {' '.join(cmd)} failed: {r.stderr.strip()}")
            others = [(ifname, net) for ifname, net in _addr_networks(_ip_json("addr"))
                      if ifname != self.bridge and net.overlaps(subnet)]
            if not others:
                self.subnet = subnet
                return
            _del_link(self.bridge)
        raise NoDocker(f"no free /24 in {SUBNET_POOL} for the test daemon's bridge after {tries} tries")

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            ids = self.cli("ps", "-aq", check=False, timeout=30).stdout.split()
            if ids:
                self.cli("rm", "-f", *ids, check=False, timeout=60)
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        with contextlib.suppress(OSError):  # what the daemon did not undo itself
            _unmount(mounts_under(Path("/proc/self/mountinfo").read_text(), self.root))
        _del_link(self.bridge)

    def inspect(self, name: str) -> dict[str, Any]:
        return json.loads(self.cli("inspect", name).stdout)[0]  # type: ignore[no-any-return]

    def ip(self, name: str) -> str:
        """The container's address on the daemon's network (``NetworkSettings.Networks``: a container on
        a user-defined network has no ``NetworkSettings.IPAddress``)."""
        return str(self.inspect(name)["NetworkSettings"]["Networks"][self.network]["IPAddress"])

    def why_unreachable(self, name: str, port: int = 8000) -> str:
        """What helps the next person when a published port never answers: whether the container's own
        address answers, the end of dockerd's log, the host's interfaces."""
        out: list[str] = []
        try:
            ip = self.ip(name)
            try:
                r = httpx.get(f"http://{ip}:{port}/v1/models", timeout=5)
                out.append(f"the container's address {ip}:{port} answers directly: HTTP {r.status_code}")
            except httpx.HTTPError as e:
                out.append(f"the container's address {ip}:{port} does not answer either: {e!r}")
        except Exception as e:  # noqa: BLE001 - a diagnosis says what it could not read
            out.append(f"no address of {name} on {self.network}: {e}")
        with contextlib.suppress(OSError):
            tail = (self.root / "dockerd.log").read_text(errors="replace").splitlines()[-6:]
            out.append("dockerd.log ends: " + " | ".join(ln[-300:] for ln in tail))
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out.append("ip -br addr: " + subprocess.run(["ip", "-br", "addr"], capture_output=True, text=True,
                                                         timeout=10).stdout.strip().replace("\n", " | "))
        return "\n".join(out)


# --------------------------------------------------------------------------- the host's networks


def _ip_json(what: str) -> list[dict[str, Any]]:
    """``ip -4 -j WHAT`` (``route show table all``, ``addr``); [] when ``ip`` cannot say."""
    args = ["route", "show", "table", "all"] if what == "route" else [what]
    try:
        r = subprocess.run(["ip", "-4", "-j", *args], capture_output=True, text=True, timeout=10)
        return json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else []
    except (OSError, subprocess.SubprocessError, ValueError):
        return []


def _addr_networks(addrs: Iterable[dict[str, Any]]) -> list[tuple[str, ipaddress.IPv4Network]]:
    out: list[tuple[str, ipaddress.IPv4Network]] = []
    for link in addrs:
        for a in link.get("addr_info", ()):
            if a.get("family") == "inet" and "local" in a:
                with contextlib.suppress(ValueError):
                    out.append((str(link.get("ifname", "")),
                                ipaddress.IPv4Interface(f"{a['local']}/{a.get('prefixlen', 32)}").network))
    return out


def route_networks(routes: Iterable[dict[str, Any]], addrs: Iterable[dict[str, Any]]) -> list[ipaddress.IPv4Network]:
    """The IPv4 networks the host routes or has addresses in (``ip -j route show table all`` and
    ``ip -j addr``, parsed); the default route is not one."""
    out: list[ipaddress.IPv4Network] = []
    for r in routes:
        dst = str(r.get("dst", ""))
        if dst in ("", "default"):
            continue
        with contextlib.suppress(ValueError):
            net = ipaddress.ip_network(dst, strict=False)
            if isinstance(net, ipaddress.IPv4Network) and net.prefixlen > 0:
                out.append(net)
    out += [net for _, net in _addr_networks(addrs)]
    return out


def host_networks() -> list[ipaddress.IPv4Network]:
    """The host's networks now: its routes and addresses (psutil's addresses when ``ip`` says none)."""
    nets = route_networks(_ip_json("route"), _ip_json("addr"))
    if not nets:
        for addrs in psutil.net_if_addrs().values():
            for a in addrs:
                if a.netmask and a.family.name == "AF_INET":
                    with contextlib.suppress(ValueError):
                        nets.append(ipaddress.IPv4Interface(f"{a.address}/{a.netmask}").network)
    return nets


def pick_subnet(taken: Collection[ipaddress.IPv4Network], rng: random.Random,
                pool: ipaddress.IPv4Network = SUBNET_POOL, prefix: int = 24) -> ipaddress.IPv4Network:
    """A random /``prefix`` of ``pool`` that overlaps none of ``taken``; ValueError when none is free."""
    free = [n for n in pool.subnets(new_prefix=prefix) if not any(n.overlaps(t) for t in taken)]
    if not free:
        raise ValueError(f"every /{prefix} of {pool} overlaps a route or an address of the host")
    return rng.choice(free)


# --------------------------------------------------------------------------- what dead daemons left


@dataclass(frozen=True)
class Leftover:
    """A dead test daemon's folder: its mounts (deepest first) and its bridge, if it had one of ours."""

    root: Path
    mounts: tuple[str, ...]
    bridge: str | None

    def __str__(self) -> str:
        return f"{self.root} ({len(self.mounts)} mounts, bridge {self.bridge or 'none'})"


def _unescape(field: str) -> str:
    """A mountinfo path: a space, tab, newline or backslash is written as an octal escape."""
    for code, ch in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, ch)
    return field


def mounts_under(mountinfo: str, root: Path) -> list[str]:
    """The mount points of ``/proc/self/mountinfo`` text at or under ``root``, deepest first (a
    container's network namespace bind-mounted at ``exec/netns/<id>``, nsfs; its ``/dev/shm``)."""
    base = str(root).rstrip("/") + "/"
    out = []
    for line in mountinfo.splitlines():
        parts = line.split(" ")
        if len(parts) >= 5:
            mp = _unescape(parts[4])
            if mp.startswith(base) and mp not in out:
                out.append(mp)
    return sorted(out, key=lambda m: m.count("/"), reverse=True)


def _pid_in(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def find_leftovers(tmp: Path, mountinfo: str, alive: Callable[[int], bool], me: int,
                   cmdlines: Iterable[str] = ()) -> list[Leftover]:
    """The folders ``tmp/vtop-docker-<pid>`` of dead test daemons. A folder is alive (never touched)
    while the test process that made it (the pid in its name; a daemon starting has no pid file yet),
    its ``dockerd.pid`` or its ``containerd.pid`` runs, or a process's command line names it (a
    container's shim outlives a killed daemon); ``me``'s own folder is never in use before its start."""
    cmds = list(cmdlines)
    out: list[Leftover] = []
    for d in sorted(tmp.glob(ROOT_PREFIX + "*")):
        owner = d.name[len(ROOT_PREFIX):]
        if not d.is_dir() or not owner.isdigit():
            continue
        pids = [_pid_in(d / "dockerd.pid"), _pid_in(d / "exec" / "containerd" / "containerd.pid")]
        if int(owner) != me:
            pids.append(int(owner))
        if any(p is not None and alive(p) for p in pids) or any(f"{d}/" in c for c in cmds):
            continue
        bridge = (d / "bridge").read_text().strip() if (d / "bridge").is_file() else None
        out.append(Leftover(d, tuple(mounts_under(mountinfo, d)), bridge or None))
    return out


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cmdlines() -> list[str]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error, TypeError):
            out.append(" ".join(p.info["cmdline"] or ()))
    return out


def _unmount(mounts: Iterable[str]) -> None:
    for m in mounts:
        if subprocess.run(["umount", m], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", m], capture_output=True, timeout=30)


def _del_link(name: str) -> None:
    if name and Path(f"/sys/class/net/{name}").exists():
        subprocess.run(["ip", "link", "del", name], capture_output=True, timeout=30)


def clean_leftovers(tmp: Path, me: int) -> list[Leftover]:
    """Unmount what dead test daemons left mounted (a dead container's network namespace holds its
    address on the bridge while it is mounted), delete their bridges, remove their folders."""
    found = find_leftovers(tmp, Path("/proc/self/mountinfo").read_text(), _alive, me, _cmdlines())
    for lo in found:
        _unmount(lo.mounts)
        if lo.bridge:
            _del_link(lo.bridge)
        shutil.rmtree(lo.root, ignore_errors=True)
    return found


def _empty_tar() -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w"):
        pass
    return buf.getvalue()


def run_args(name: str, venv: Path, model_dir: Path, *, publish: int, network: str, port: int = 8000,
             extra: tuple[str, ...] = (), vllm_args: tuple[str, ...] = ()) -> list[str]:
    """``docker run`` arguments of the real vLLM CPU server in a container named ``name`` on ``network``
    (the daemon's :attr:`Docker.network`)."""
    mounts: list[str] = []
    for d in HOST_DIRS:
        if os.path.exists(d):
            mounts += ["-v", f"{d}:{d}:ro"]
    for f in ("/etc/passwd", "/etc/group"):  # getpass.getuser() (torch's caches) needs the user's entry
        mounts += ["-v", f"{f}:{f}:ro"]
    mounts += ["-v", f"{venv}:{venv}", "-v", f"{model_dir}:{model_dir}:ro"]
    env = {
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT", str(venv / "cache")),
        "HF_HOME": str(venv / "hf"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1",
        "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "USER": "root",
        # as the real tier's own server (tests/real/conftest.py): its engine's sockets on the loopback
        "VLLM_HOST_IP": "127.0.0.1",
        **SERVER_ENV,
    }
    envs = [x for k, v in env.items() for x in ("-e", f"{k}={v}")]
    cmd = [str(venv / "bin" / "vllm"), "serve", str(model_dir), "--host", "0.0.0.0", "--port", str(port),
           "--dtype", "bfloat16", *vllm_args]
    return ["run", "-d", "--name", name, "--network", network, "--shm-size", "2g", "-p", f"127.0.0.1:{publish}:{port}",
            "-w", "/tmp", *mounts, *envs, *extra, IMAGE, *cmd]
