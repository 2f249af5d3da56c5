"""The line under the server cards (RequestsLine): the same facts at every width, in fewer words where
the whole line does not fit (at 80 columns the oldest request's age and limit were cut off)."""

from __future__ import annotations

from vtop.model.requests import InFlightRequest, ServerRequests
from vtop.ui.widgets.alerts_panel import RequestsLine


def _answer(request_id: str | None = "chatcmpl-9de525035798bf8a11", client: str | None = None) -> ServerRequests:
    o = InFlightRequest(server="http://127.0.0.1:8000", evidence=("log",), age_min_s=50.0, age_max_s=52.0,
                        request_id=request_id, client=client, max_tokens=130_917, client_set_max_tokens=False)
    return ServerRequests(server="http://127.0.0.1:8000", at=0.0, requests=(o,), oldest=o, count=1, running=1.0,
                          waiting=0.0, request_logging=True, received_recent=0)


def test_the_whole_line_where_it_fits() -> None:
    full = RequestsLine.line(_answer())
    assert full == RequestsLine.line(_answer(), width=len(full))
    assert full.startswith("requests in flight: 1 (vLLM: 1 running, 0 waiting) · oldest chatcmpl-9de525035798bf8 "
                           "running at least 50s, max_tokens 130,917 (no max_tokens from client)")


def test_at_80_columns_the_oldest_requests_age_and_limit_are_there() -> None:
    for width in (118, 100, 78, 62):
        text = RequestsLine.line(_answer(), width=width)
        assert len(text) <= width, (width, text)
        assert ("at least 50s" in text or "≥50s" in text) and "max_tokens 130,917" in text, text
        assert "from client" in text or "client: unset" in text, text
    assert RequestsLine.line(_answer(), width=78) == \
        "1 in flight · oldest chatcmpl-9de5… ≥50s, max_tokens 130,917 (client: unset)"
    # narrower still: the shortest form, clipped by the screen
    assert RequestsLine.line(_answer(), width=40) == "1 in flight · oldest ≥50s, max_tokens 130,917 (client: unset)"


def test_a_client_address_is_never_cut() -> None:
    text = RequestsLine.line(_answer(request_id=None, client="10.1.2.3:50312"), width=78)
    assert text == "1 in flight · oldest 10.1.2.3:50312 ≥50s, max_tokens 130,917 (client: unset)", text


def test_a_down_server_at_80_columns_says_how_old_the_gauges_above_are() -> None:
    from vtop.core.server import LastSeen

    down = LastSeen("down", 4.0, 0.0, 0.0, 21.0, died=True)
    full = RequestsLine.line(None, down)
    assert full.startswith("requests in flight: none (server DOWN; 4 running, 0 waiting")
    assert RequestsLine.line(None, down, width=len(full)) == full
    narrow = RequestsLine.line(None, down, width=78)
    assert len(narrow) <= 78 and narrow == "none in flight (server DOWN) · last seen 21 s ago: 4 running, 0 waiting"
