"""Record real vLLM CPU-build /metrics payloads and log lines for issue #29's families.

One scenario per run: start ``vllm serve`` on loopback with the scenario's flags, scrape
/metrics idle, during a bounded load (one scrape a second, the busiest kept) and after,
then stop the server.  Everything lands in ``--out/<scenario>/``:

* ``metrics-idle.txt``, ``metrics-load.txt``, ``metrics-after.txt`` (byte for byte),
* ``log-lines.txt``: the server log's lines that matter here (stats, spec-decode, LoRA,
  sleep, errors), ``result.json``: flags, timings, HTTP statuses, what failed.

Scenarios: ``spec-prefix`` (n-gram speculative decoding, prefix caching on, repeated
prompts), ``lora`` (a rank-8 q_proj/v_proj adapter of zeros written here), ``sleep``
(``--enable-sleep-mode``, POST /sleep and /wake_up with VLLM_SERVER_DEV_MODE=1).

Stdlib only; run with any python:  python tools/record_signals.py spec-prefix --out /tmp/sig
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import lzma
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

VENV = Path(os.environ.get("VTOP_VLLM_VENV", "/tmp/vllmcpu"))
MODEL = Path(os.environ.get("VTOP_VLLM_MODEL", "/tmp/tinyllama"))
HOST = "127.0.0.1"

SPEC = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3,"prompt_lookup_min":1}'
FLAGS = {
    "spec-prefix": ["--speculative-config", SPEC, "--enable-prefix-caching"],
    # the same server, sampled at temperature 1 from varied prompts: the random-weight model's
    # tokens rarely repeat, so the n-gram drafts are mostly rejected (acceptance near zero)
    "spec-random": ["--speculative-config", SPEC, "--enable-prefix-caching"],
    "lora": ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "2"],  # + --lora-modules
    "sleep": ["--enable-sleep-mode"],
    "kv-offload": ["--enable-prefix-caching", "--kv-offloading-size", "1"],
}
KEEP = (
    "Engine 0", "SpecDecoding", "spec", "Speculative", "prefix", "Prefix", "LoRA", "lora", "sleep", "Sleep",
    "wake", "Wake", "ERROR", "Error", "Traceback", "refus", "not supported", "NotImplemented", "cache_config",
    "KV cache", "Avg prompt throughput", "POST /sleep", "POST /wake_up", "Started server", "Application startup",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def write_lora(path: Path, rank: int = 8) -> None:
    """A LoRA adapter of zeros for the tiny Llama (hidden 256, 2 layers): PEFT's file layout."""
    cfg = json.loads((MODEL / "config.json").read_text())
    hidden, layers = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
    kv_out = int(cfg["num_key_value_heads"]) * int(cfg.get("head_dim") or hidden // int(cfg["num_attention_heads"]))
    tensors: dict[str, tuple[list[int], int]] = {}
    for i in range(layers):
        pre = f"base_model.model.model.layers.{i}.self_attn"
        tensors[f"{pre}.q_proj.lora_A.weight"] = ([rank, hidden], rank * hidden)
        tensors[f"{pre}.q_proj.lora_B.weight"] = ([hidden, rank], hidden * rank)
        tensors[f"{pre}.v_proj.lora_A.weight"] = ([rank, hidden], rank * hidden)
        tensors[f"{pre}.v_proj.lora_B.weight"] = ([kv_out, rank], kv_out * rank)
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, (shape, n) in tensors.items():
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + 4 * n]}
        off += 4 * n
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    path.mkdir(parents=True, exist_ok=True)
    with open(path / "adapter_model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        f.write(b"\0" * off)
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 16, "lora_dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"], "bias": "none", "base_model_name_or_path": str(MODEL),
        "fan_in_fan_out": False, "inference_mode": True,
    }, indent=1))


def get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError as e:
        return 0, repr(e)


def post(url: str, body: dict | None, timeout: float = 300.0) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else b""
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError as e:
        return 0, repr(e)


PREFIX = ("The quick brown fox jumps over the lazy dog. " * 24)


def prompts(n: int) -> list[str]:
    # A long shared prefix (prefix-cache hits) and repeated words (n-gram drafts find matches).
    return [PREFIX + f"Request {i % 4}: the fox and the dog and the fox and the dog" for i in range(n)]


def load(base: str, model: str, n: int, conc: int, max_tokens: int, temperature: float = 0.0) -> dict[int, int]:
    statuses: dict[int, int] = {}

    def one(p: str) -> int:
        st, _ = post(f"{base}/v1/completions", {"model": model, "prompt": p, "max_tokens": max_tokens,
                                                 "temperature": temperature, "ignore_eos": True})
        return st

    ps = prompts(n) if temperature == 0 else [
        " ".join(f"w{(i * 7919 + j * 104729) % 3989}" for j in range(40)) for i in range(n)]
    with concurrent.futures.ThreadPoolExecutor(conc) as ex:
        for st in ex.map(one, ps):
            statuses[st] = statuses.get(st, 0) + 1
    return statuses


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", choices=sorted(FLAGS))
    ap.add_argument("--extra", default="", help="more vllm serve flags, space-separated")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--startup-timeout", type=float, default=600)
    a = ap.parse_args()
    out = a.out / a.scenario
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base = f"http://{HOST}:{port}"
    args = list(FLAGS[a.scenario]) + a.extra.split()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(VLLM_CPU_KVCACHE_SPACE="1", VLLM_HOST_IP=HOST, VLLM_CACHE_ROOT=str(VENV / "cache"),
               HF_HOME=str(VENV / "hf"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1", PYTHONUNBUFFERED="1", PATH=f"{VENV / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}")
    served_lora = None
    if a.scenario == "lora":
        lora_dir = out / "tiny-lora-r8"
        write_lora(lora_dir)
        served_lora = "tiny-lora"
        args += ["--lora-modules", f"{served_lora}={lora_dir}"]
    if a.scenario == "sleep":
        env["VLLM_SERVER_DEV_MODE"] = "1"
    cmd = [str(VENV / "bin" / "vllm"), "serve", str(MODEL), "--host", HOST, "--port", str(port),
           "--max-model-len", "2048", "--dtype", "bfloat16", *args]
    result: dict[str, object] = {"scenario": a.scenario, "cmd": cmd[1:], "started_utc": time.strftime("%FT%TZ", time.gmtime())}
    log_path = out / "server.log"
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                process_group=0)
    try:
        while True:
            if proc.poll() is not None:
                result["failed"] = f"server exited with {proc.returncode} before healthy"
                return 1
            if get(f"{base}/health", 2)[0] == 200:
                break
            if time.monotonic() - t0 > a.startup_timeout:
                result["failed"] = "not healthy in time"
                return 1
            time.sleep(1)
        result["healthy_after_s"] = round(time.monotonic() - t0, 1)
        (out / "metrics-idle.txt").write_text(get(f"{base}/metrics")[1])
        model = served_lora or json.loads(get(f"{base}/v1/models")[1])["data"][0]["id"]
        if served_lora:
            # Some requests to the base model too, so both paths run.
            result["base_model_statuses"] = load(base, json.loads(get(f"{base}/v1/models")[1])["data"][0]["id"],
                                                  4, 2, 16)
        best, best_running, scrapes = "", -1.0, 0
        timeline = lzma.open(out / "metrics-timeline.jsonl.xz", "wt")
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            fut = ex.submit(load, base, model, a.requests, a.concurrency, a.max_tokens,
                            1.0 if a.scenario == "spec-random" else 0.0)
            while not fut.done():
                t = time.time()
                st, text = get(f"{base}/metrics")
                timeline.write(json.dumps({"t": round(t, 3), "status": st, "text": text}) + "\n")
                scrapes += 1
                if st == 200:
                    running = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                                  if line.startswith("vllm:num_requests_running{"))
                    if running >= best_running:
                        best, best_running = text, running
                time.sleep(1)
            result["load_statuses"] = fut.result()
        for _ in range(12):  # the last stats intervals after the load (the log's 10 s stats lines)
            t = time.time()
            st, text = get(f"{base}/metrics")
            timeline.write(json.dumps({"t": round(t, 3), "status": st, "text": text}) + "\n")
            time.sleep(1)
        timeline.close()
        result["load_scrapes"] = scrapes
        (out / "metrics-load.txt").write_text(best)
        time.sleep(3)  # one more stats interval
        if a.scenario == "sleep":
            for step, path in (("sleep", "/sleep?level=1"), ("is_sleeping", None), ("wake_up", "/wake_up"),
                               ("is_sleeping_after", None)):
                if path is None:
                    result[step] = get(f"{base}/is_sleeping")
                else:
                    result[step] = post(f"{base}{path}", None, 120)
                    if step == "sleep":
                        time.sleep(3)
                        (out / "metrics-sleeping.txt").write_text(get(f"{base}/metrics")[1])
            result["after_wake_load"] = load(base, model, 4, 2, 16)
        time.sleep(2)
        (out / "metrics-after.txt").write_text(get(f"{base}/metrics")[1])
        return 0
    finally:
        try:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(60)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        result["elapsed_s"] = round(time.monotonic() - t0, 1)
        text = log_path.read_text(errors="replace")
        (out / "log-lines.txt").write_text("".join(line + "\n" for line in text.splitlines()
                                                   if any(k in line for k in KEEP)))
        (out / "result.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(json.dumps(result, default=str)[:2000])


if __name__ == "__main__":
    sys.exit(main())
