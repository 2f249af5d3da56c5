"""``vtop replay FILE --csv`` (issue 26, item 11): the recording's GPU and server samples as CSV."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from vtop.cli import main
from vtop.faces.demo import demo_path
from vtop.faces.export_csv import COLUMNS, write_csv
from vtop.sources.recording.record import load


def test_demo_as_csv_has_every_sample_and_gaps_stay_empty() -> None:
    out = io.StringIO()
    n = write_csv(str(demo_path()), out)
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert tuple(rows[0].keys()) == COLUMNS and len(rows) == n
    _h, events = load(str(demo_path()))
    gpu_samples = sum(len(e.data.gpus) for e in events if e.kind == "gpu")
    server_polls = sum(1 for e in events if e.kind == "server")
    gpu = [r for r in rows if r["kind"] == "gpu"]
    srv = [r for r in rows if r["kind"] == "server"]
    assert (len(gpu), len(srv)) == (gpu_samples, server_polls)
    # oldest first, and the burst's memory (71.5 GiB on the 140 GiB H200) is there in MiB
    assert [float(r["epoch_s"]) for r in rows] == sorted(float(r["epoch_s"]) for r in rows)
    assert 72_000 < max(float(r["memory_used_mib"]) for r in gpu) < 74_000
    assert max(float(r["waiting"]) for r in srv if r["waiting"]) == 791
    # a scrape that failed (the server still starting) has no numbers: empty, not 0
    failed = [r for r in srv if r["scrape_ok"] == "0"]
    assert failed and all(r["running"] == "" and r["waiting"] == "" for r in failed)
    assert all(r["running"] == "" for r in gpu)


def test_cli_writes_the_file(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "demo.csv"
    assert main(["replay", str(demo_path()), "--csv", str(out)]) == 0
    assert out.read_text().splitlines()[0] == ",".join(COLUMNS)
    assert "rows" in capsys.readouterr().err
