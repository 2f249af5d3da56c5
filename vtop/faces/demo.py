"""Where ``vtop demo`` finds its recording (shipped inside the package)."""

from __future__ import annotations

from pathlib import Path

DEMO_FILE = "demo-h200-vllm-0.26.0.jsonl.gz"


def demo_path() -> Path:
    p = Path(__file__).parent.parent / "data" / DEMO_FILE
    if not p.exists():
        raise FileNotFoundError(p)
    return p
