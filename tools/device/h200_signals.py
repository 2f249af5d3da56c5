"""Record the signals of issue 29 from the real vLLM 0.26.0 on the H200 (run on the GPU machine).

    python3 -m tools.device.h200_signals --out DIR [--url http://127.0.0.1:8000] [--seconds 40]

The server must be running already (the shared recipe's serve.sh), started with the flags whose
metrics we want, e.g. ``-- --speculative-config '{"method": "ngram", ...}' --enable-prefix-caching``.
What it does, stdlib only (the GPU machine has no internet and vtop's wheels may be absent):

* ``/metrics`` before any load -> ``metrics-0-idle.txt``;
* 8 threads send ``/v1/completions`` for ``--seconds``: half of them the same long prompt again and
  again (prefix-cache hits), half a prompt made of a repeated phrase (what an n-gram proposer can
  draft from), max_tokens 64 -> ``metrics-1-load.txt`` (mid-load), ``metrics-2-after.txt``;
* ``/metrics`` after 5 s idle -> ``metrics-3-idle.txt``; ``requests.json``: counts, errors, the
  latency of each request.

The files are vLLM's own text, byte for byte; nothing secret is in them (no key on this server).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.request
from pathlib import Path


def get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def post(url: str, body: dict, timeout: float = 60.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--seconds", type=float, default=40.0)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model = json.loads(get(a.url + "/v1/models"))["data"][0]["id"]
    (out / "metrics-0-idle.txt").write_bytes(get(a.url + "/metrics"))
    shared = "You are a careful assistant. " * 60 + "Summarise the following: "
    phrase = "the quick brown fox jumps over the lazy dog " * 40
    stats: list[dict] = []
    lock = threading.Lock()
    stop = time.monotonic() + a.seconds

    def worker(i: int) -> None:
        n = 0
        while time.monotonic() < stop:
            prompt = shared + str(i % 2) if i % 2 == 0 else phrase
            t0 = time.monotonic()
            try:
                r = post(
                    a.url + "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 64, "temperature": 0}
                )
                rec = {
                    "worker": i,
                    "ok": True,
                    "s": round(time.monotonic() - t0, 3),
                    "tokens": r.get("usage", {}).get("completion_tokens"),
                }
            except Exception as e:  # noqa: BLE001 (recorded, the run goes on)
                rec = {"worker": i, "ok": False, "error": repr(e)[:200]}
            with lock:
                stats.append(rec)
            n += 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(a.seconds / 2)
    (out / "metrics-1-load.txt").write_bytes(get(a.url + "/metrics"))
    for t in threads:
        t.join(a.seconds + 70)
    (out / "metrics-2-after.txt").write_bytes(get(a.url + "/metrics"))
    time.sleep(5)
    (out / "metrics-3-idle.txt").write_bytes(get(a.url + "/metrics"))
    ok = sum(1 for s in stats if s["ok"])
    (out / "requests.json").write_text(json.dumps({"ok": ok, "failed": len(stats) - ok, "requests": stats}, indent=1))
    print(f"requests: {ok} ok, {len(stats) - ok} failed; files in {out}")
    for f in sorted(out.glob("metrics-*.txt")):
        fams = sorted({ln.split()[2] for ln in f.read_text().splitlines() if ln.startswith("# TYPE")})
        spec = [x for x in fams if "spec" in x or "prefix" in x]
        print(f"{f.name}: {len(fams)} families; spec/prefix: {', '.join(spec) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
