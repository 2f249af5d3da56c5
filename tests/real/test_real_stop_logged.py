"""Issue 41: ``x`` on a server that logs its requests (``--enable-log-requests``): vLLM's own log shows the abort.

vLLM 0.32 writes ``Aborted request(s) ID.`` (``AsyncLLM.abort``, only when request logging is on); with it
off (``test_real_stop.py``, vLLM's default) it writes nothing, and the stop is read from the gauges. Here the
streaming runaway is stopped from its alert through the confirmation (Pilot), a bounded request in flight
beside it goes on and finishes, and vLLM's log names the runaway's id as aborted, after vtop's stop and
not before; the bundle records the stop with that id (request logging on: the id is known).
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.real import Runaway, Watch, app_for
from tests.real.test_real_stop import OTHER_TOKENS, THRESHOLDS, Bounded, _bundle_records, _running, _stop_confirmed

pytestmark = pytest.mark.real


def _short_completion(srv: Any) -> None:
    body = {"model": srv.model, "prompt": "Say hello.", "max_tokens": 32, "ignore_eos": True}
    with httpx.Client(timeout=120.0) as c:
        c.post(srv.url + "/v1/completions", json=body)


ABORTED = re.compile(r"Aborted request\(s\) (\S+?)\.?$", re.M)


@pytest.mark.vllm_server(max_model_len=65536)
async def test_x_on_a_logging_server_and_vllm_logs_the_abort(real_vllm: Any, tmp_path: Path) -> None:
    srv = real_vllm
    app = app_for(srv, tmp_path, "stop-logged", snapshot_dir=str(tmp_path / "snaps"))
    app.diagnoser.thresholds = THRESHOLDS
    async with app.run_test(size=(120, 40)) as pilot:
        w = Watch(app, srv.url)
        await w.until(pilot, lambda: (v := w.view()) is not None and v.state == "up", 60, "the server up")
        # the alert names the oldest request: a request an earlier test on this server left running would be it
        await w.until(pilot, lambda: _running(w) == 0, 120, "no request left running by an earlier test")
        # issue 38, seen in a clean-clone run: a 32-token completion logged 0.9 s before the runaway was
        # closer to its connection's arrival than the runaway's own line, and the runaway was named after it
        # ("a long request whose client set max_tokens", no alert). Here one comes 0.5 s before it, always.
        short = threading.Thread(target=_short_completion, args=(srv,), daemon=True)
        short.start()
        await pilot.pause(0.5)
        with Runaway(srv) as ra:
            await w.until(pilot, lambda: ra.client is not None and ra.id is not None, 60, "the runaway's first chunk")
            assert ra.client is not None and ra.id is not None
            client = f"{ra.client[0]}:{ra.client[1]}"
            rid = ra.id
            try:
                await w.until(pilot, lambda: any(a.rule == "runaway" and (client in a.title or rid in a.title)
                                                 for a in app.alerts), 120, "the runaway alert")
            except AssertionError as e:
                # what vtop believed instead (two full-tier runs once got no alert naming the runaway here)
                ans = app.diagnoser.in_flight.get(srv.url)
                raise AssertionError(
                    f"{e}; runaway {rid} from {client}; alerts {[(a.rule, a.severity, a.title) for a in app.alerts]}; "
                    f"oldest {ans.oldest if ans is not None else None}; logged open "
                    f"{[(r.request_id, r.max_tokens, r.age_max_s) for r in ans.logged] if ans is not None else None}"
                ) from None
            aborted_before = ABORTED.findall(srv.log_text())
            with Bounded(srv) as other:
                await w.until(pilot, lambda: (_running(w) or 0) >= 2, 60, "the bounded request running beside it")
                await pilot.press("x")
                screen, t0, _before = await _stop_confirmed(pilot, app, w, client, "logged")
                await w.until(pilot, lambda: ra.error is not None or ra.finish is not None, 15,
                              "the runaway's stream to end")
                assert ra.finish is None, ra.finish

                def logged() -> list[str]:
                    return [x for x in ABORTED.findall(srv.log_text()) if x not in aborted_before]

                await w.until(pilot, lambda: bool(logged()), 20, "vLLM's abort line in its log")
                new = logged()
                t_log = time.monotonic() - t0
                await w.until(pilot, other.done.is_set, 180, "the bounded request to finish")
        assert other.status == 200 and other.finish == "length" and other.tokens == OTHER_TOKENS, \
            (other.status, other.finish, other.tokens, other.error)
        # vLLM's id of the request is the id its stream carried, maybe with a suffix of its own
        assert any(x.split(",")[0].startswith(rid) for x in new), (rid, new)
        assert not any(rid in x for x in aborted_before), aborted_before
        print(f"logged: vLLM's abort line {new} within {t_log:.1f} s of the confirmation; "
              f"result: {screen.result_line}")
        rec = await _bundle_records(pilot, app, w, client, "Tell me a very long story")
        assert rec["request_id"] is not None and (rec["request_id"] in rid or rid in rec["request_id"]), (rec, rid)
