"""A vLLM server process as discovery makes it, for the tests of issue 39 (containers, pods, units)."""

from __future__ import annotations

from vtop.model.procs import ServerProcess, VllmChild


def server(pid: int, port: int = 8000, children: tuple[VllmChild, ...] = ()) -> ServerProcess:
    return ServerProcess(pid=pid, create_time=1.0, form="serve", host="127.0.0.1", port=port,
                         url=f"http://127.0.0.1:{port}", bind_host=None, model="m", served_model_names=(),
                         tensor_parallel_size=None, data_parallel_size=None, pipeline_parallel_size=None,
                         max_model_len=None, max_num_seqs=None, gpu_memory_utilization=None, headless=False,
                         children=children, gpu_pids=tuple(c.pid for c in children if c.holds_gpu),
                         gpu_pids_guessed=False, argv=("vllm", "serve", "m"))
