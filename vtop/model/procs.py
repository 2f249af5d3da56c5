"""A vLLM server process and its children as discovery finds them (plain frozen
dataclasses; the scan itself is :mod:`vtop.sources.discovery`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class VllmChild:
    """A process below a server (or an orphan with a vLLM title).

    ``role``: ``engine`` (EngineCore, DPEngineCore), ``worker``
    (Worker_TPn, VllmWorkerProcess), ``api_server`` (APIServer_N with
    ``--api-server-count>1``), ``coordinator`` (DPCoordinator), ``helper``
    (multiprocessing resource tracker), ``child`` (untitled, e.g. a forked
    V0 engine). ``ranks`` holds what the title says, e.g.
    ``(("dp", 1), ("tp", 0))``; ``rank`` is the TP rank of a worker or the
    DP rank of an engine, when known.
    """

    pid: int
    ppid: int
    title: str
    role: str
    rank: int | None
    ranks: tuple[tuple[str, int], ...]
    create_time: float
    holds_gpu: bool = False
    #: depth below the server (1 = direct child)
    depth: int = 1
    #: user + system CPU seconds so far (None: not read, or not readable)
    cpu: float | None = None
    #: its PID in its own PID namespace (a container's), as its log says ``(EngineCore pid=245)``;
    #: None when that is the PID vtop sees (same namespace) or it was not read
    ns_pid: int | None = None
    #: the state letter of /proc/PID/stat (T: stopped by a signal); None: not read
    state: str | None = None


@dataclass(frozen=True, slots=True)
class ServerProcess:
    """One vLLM API server found in the process table."""

    pid: int
    create_time: float
    #: ``serve`` (``vllm serve``) or ``api_server`` (the module form)
    form: str
    #: host to connect to (0.0.0.0/:: mapped to 127.0.0.1)
    host: str
    port: int
    url: str
    #: ``--host`` as given, None when absent (all interfaces)
    bind_host: str | None
    model: str | None
    served_model_names: tuple[str, ...]
    tensor_parallel_size: int | None
    data_parallel_size: int | None
    pipeline_parallel_size: int | None
    max_model_len: int | None
    max_num_seqs: int | None
    gpu_memory_utilization: float | None
    headless: bool
    children: tuple[VllmChild, ...]
    gpu_pids: tuple[int, ...]
    #: True when gpu_pids come from a heuristic (no vLLM titles to go by)
    gpu_pids_guessed: bool
    #: the raw command line; may hold ``--api-key`` (hence repr=False)
    argv: tuple[str, ...] = field(repr=False)
    api_key: str | None = field(default=None, repr=False)
    #: user + system CPU seconds of this process so far (None: not read, or not readable)
    cpu: float | None = None
    #: where it runs, for the cards and ``P``: ``container vllm-0``, ``pod default/vllm-7d9f``,
    #: ``unit vllm.service`` (from its cgroup and the runtime's own files); None on the bare host
    placement: str | None = None
    #: the container's ID (64 hex digits) when it runs in one, else None
    container_id: str | None = None
    #: its PID in its own PID namespace (None: the same as ``pid``, or not read)
    ns_pid: int | None = None
    #: True when it listens in a network namespace other than vtop's (a container without
    #: ``--network host``): its connections are read in that namespace
    own_netns: bool = False
    #: the port it listens on in its own namespace, when ``port`` is one published on the host
    #: (docker-proxy, a DNAT rule) or its container address is used; None when they are the same
    listen_port: int | None = None
    #: other ``host:port`` that reach it (every published port); a URL given for one of them is its
    published: tuple[str, ...] = ()
    #: the state letter of /proc/PID/stat of this process (T: stopped by a signal); None: not read
    state: str | None = None
    #: which engine's server: "vllm" or "sglang" (by its command line)
    engine: str = "vllm"

    @property
    def inner_port(self) -> int:
        """The port vLLM listens on in its own network namespace (what its connections carry)."""
        return self.listen_port if self.listen_port is not None else self.port

    def host_pid(self, ns_pid: int) -> int | None:
        """The PID vtop sees of the process of this tree that its log names ``ns_pid`` (a container's
        own PID); ``ns_pid`` itself when the tree is in vtop's namespace; None when no process of the
        tree has it (never a host process that merely has that number)."""
        if self.ns_pid is None:
            return ns_pid
        if self.ns_pid == ns_pid:
            return self.pid
        for c in self.children:
            if c.ns_pid == ns_pid:
                return c.pid
        return None

    @property
    def key(self) -> tuple[int, float]:
        """Identity across polls: a restart gives a new create_time."""
        return (self.pid, self.create_time)

    @property
    def tp(self) -> int:
        return self.tensor_parallel_size or 1

    @property
    def dp(self) -> int:
        return self.data_parallel_size or 1

    @property
    def served_name(self) -> str | None:
        """What vLLM reports as ``model_name`` / ``/v1/models`` id."""
        return self.served_model_names[0] if self.served_model_names else self.model

    def engine_pids(self) -> tuple[int, ...]:
        return tuple(c.pid for c in self.children if c.role == "engine")

    def worker_pids(self) -> tuple[int, ...]:
        return tuple(c.pid for c in self.children if c.role == "worker")

    def cpu_by_pid(self) -> dict[int, float]:
        """User + system CPU seconds of each process of the tree (the server and its children) that
        has a reading; empty when none has (an old recording, a process vtop may not read)."""
        out = {c.pid: c.cpu for c in self.children if c.cpu is not None}
        if self.cpu is not None:
            out[self.pid] = self.cpu
        return out

    def state_by_pid(self) -> dict[int, str]:
        """The state letter of each process of the tree that has one (``T``: stopped by a signal)."""
        out = {c.pid: c.state for c in self.children if c.state is not None}
        if self.state is not None:
            out[self.pid] = self.state
        return out

    def display_argv(self) -> str:
        """The command line for display, with secrets masked."""
        from vtop.model.redact import redact_argv  # its some twenty patterns: only where a command line is shown

        return " ".join(redact_argv(self.argv))
