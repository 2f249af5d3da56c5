"""The real tier's containers: a real docker daemon (docker.io 20.10 from Debian: runc, the cgroupfs
driver, the vfs storage driver, docker-proxy for published ports) of the test's own, and the real
vLLM CPU server run in a container of it.

The box has no image registry to pull from and needs none: the image is empty (``docker import`` of
an empty tar) and the host's ``/usr``, ``/lib``, the Python the vLLM venv was made with, the venv and
the model are bind-mounted read-only (the venv's cache writable). The container has its own PID,
network, mount, IPC and UTS namespaces and its own cgroup (``/docker/<id>``, or under
``--cgroup-parent``), as any ``docker run`` does; its port is published with ``-p`` (docker-proxy
and a DNAT rule).

If ``dockerd`` is not installed, :func:`start_daemon` raises :class:`NoDocker` with what to install.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

IMAGE = "vtop-empty"
#: what the container needs of the host, read-only (the venv's python links into pyenv)
HOST_DIRS = ("/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc/ssl", "/etc/alternatives", "/root/.pyenv")


class NoDocker(RuntimeError):
    pass


class Docker:
    """One dockerd of the test's own (its data root, exec root and socket under ``root``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data_root = root / "data"
        self.sock = root / "docker.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.env = {**os.environ, "DOCKER_HOST": f"unix://{self.sock}"}

    def cli(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(["docker", *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args[:3])}... failed ({r.returncode}): {r.stderr.strip()[-800:]}")
        return r

    def start(self, timeout: float = 60) -> None:
        if shutil.which("dockerd") is None or shutil.which("docker") is None:
            raise NoDocker("docker is not installed here (apt-get install docker.io runc containerd iptables)")
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root / "dockerd.log", "ab")  # noqa: SIM115 - the daemon's, closed with it
        self.proc = subprocess.Popen(
            ["dockerd", "--exec-opt", "native.cgroupdriver=cgroupfs", "--storage-driver", "vfs",
             "--data-root", str(self.data_root), "--exec-root", str(self.root / "exec"),
             "-H", f"unix://{self.sock}", "--pidfile", str(self.root / "dockerd.pid")],
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

    def inspect(self, name: str) -> dict[str, Any]:
        return json.loads(self.cli("inspect", name).stdout)[0]  # type: ignore[no-any-return]


def _empty_tar() -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w"):
        pass
    return buf.getvalue()


def run_args(name: str, venv: Path, model_dir: Path, *, publish: int, port: int = 8000,
             extra: tuple[str, ...] = (), vllm_args: tuple[str, ...] = ()) -> list[str]:
    """``docker run`` arguments of the real vLLM CPU server in a container named ``name``."""
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
    }
    envs = [x for k, v in env.items() for x in ("-e", f"{k}={v}")]
    cmd = [str(venv / "bin" / "vllm"), "serve", str(model_dir), "--host", "0.0.0.0", "--port", str(port),
           "--dtype", "bfloat16", *vllm_args]
    return ["run", "-d", "--name", name, "--shm-size", "2g", "-p", f"127.0.0.1:{publish}:{port}",
            "-w", "/tmp", *mounts, *envs, *extra, IMAGE, *cmd]
