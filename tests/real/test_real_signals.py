"""Issue #29 on a live real vLLM server (CPU build): one start with n-gram speculative decoding and
prefix caching on, a bounded load of repeated prompts, and vtop (the app, ``--no-gpu``) shows the
spec-decode acceptance and the prefix-cache hit rate of the window, folded and in detail (key ``i``).

``VTOP_RECORD_DIR=DIR`` keeps vtop's recording (committed as ``tests/fixtures/cpu-incidents/spec-prefix-load.jsonl.gz``
for the screenshots); ``VTOP_SCREENSHOTS=DIR`` keeps SVGs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.helpers.real import Watch, app_for, shot

pytestmark = pytest.mark.real

SPEC = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3,"prompt_lookup_min":1}'
PROMPT = "The quick brown fox jumps over the lazy dog. " * 24 + "The fox and the dog and the fox and the dog"


@pytest.mark.vllm_server(extra_args=["--speculative-config", SPEC, "--enable-prefix-caching"])
async def test_live_spec_decode_acceptance_and_prefix_hit_rate(real_vllm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    srv = real_vllm
    app = app_for(srv, tmp_path, "spec-prefix-load")
    async with app.run_test(size=(120, 40)) as pilot:
        w = Watch(app, srv.url)
        await w.until(pilot, lambda: (v := w.view()) is not None and v.state == "up", 60, "the server up")
        v0 = w.view()
        assert v0.spec is not None, "the spec-decode family is exported from the start (zeros)"
        assert v0.spec.acceptance is None  # no draft token yet: no rate, not a zero
        # ~25 s of load on the 2-core box (48 requests took 7 s): long enough for the histograms (read
        # every 5 s) to have a window, and for the recording's screenshots to catch it mid-way
        fut = srv.start_load(160, 6, 256, prompt=PROMPT, temperature=0.0)

        def shown() -> bool:
            v = w.view()
            return (v is not None and v.spec is not None and v.spec.acceptance is not None
                    and (v.spec.draft_tokens or 0) > 200 and v.prefix_hit_rate is not None)

        await w.until(pilot, shown, 180, "spec acceptance and prefix hit rate on the card")
        res = await asyncio.to_thread(fut.result, 300)
        assert res.ok == 160, res.errors
        await pilot.pause(2.0)
        v = w.view()
        m = v.metrics
        sp = v.spec
        # the window's figures against the server's own lifetime counters (all traffic is inside the window)
        assert m.spec_draft_tokens_total and sp.draft_tokens <= m.spec_draft_tokens_total
        life = m.spec_accepted_tokens_total / m.spec_draft_tokens_total
        assert 0.5 < sp.acceptance <= 1.0 and abs(sp.acceptance - life) < 0.1, (sp, life)
        assert sp.mean_len is not None and 1.0 < sp.mean_len <= 4.0 and len(sp.per_pos) == 3
        assert 0.5 < v.prefix_hit_rate <= 1.0  # one shared 264-token prefix
        assert v.prompt_by_source and v.prompt_by_source.get("local_cache_hit", 0) > 0
        card = app.cards[srv.url]
        text = "\n".join("".join(r[0] for r in row) for row in card.all_lines(118))
        assert f"spec acc {100 * sp.acceptance:.0f}%" in text and "hit " in text, text
        shot(app, "real-spec-prefix-card")
        await pilot.press("i")
        await pilot.pause(0.5)
        text = "\n".join("".join(r[0] for r in row) for row in card.all_lines(118))
        assert "spec: accepted" in text and "per pos" in text, text
        assert "prefix cache: hit" in text and "cached" in text and "cache: block" in text, text
        print(f"live: acceptance {sp.acceptance:.3f} (lifetime {life:.3f}), mean length {sp.mean_len:.2f}, "
              f"per position {sp.per_pos}, prefix hit {v.prefix_hit_rate:.3f}, "
              f"queue p50 {v.queue.p50} p99 {v.queue.p99}")
        shot(app, "real-spec-prefix-card-detail")
