"""1P1D with DFlash2 speculation on decode (a random draft written by ``glmlab init-checkpoint
--draft dflash2``): prefill's drafter projects each prompt into draft KV, those rows cross NIXL
with the pages they belong to, and decode verifies from its first step.

Greedy tokens equal ``glmlab generate`` without speculation; what crossed is exactly the cache's
rows plus the draft K/V rows of the same pages (sizes from the draft's config alone); decode
reports its acceptance per cycle in ``/server_info`` and ``/metrics``; both pools end empty.
(PD + MTP runs under TP in test_pd_tp.py; the hand-off itself, cycle by cycle against a mixed
engine, in test_pd_spec_handoff.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glmlab.checkpoint.presets_dir import preset_checkpoint
from glmlab.cli import main as glmlab_main
from tests.serve.conftest import ENGINE, PAGE, cli_generate, generate, http, pd_service
from tests.serve.conftest import transfer_bytes as cache_bytes

PROMPT = [(i * 37 + 11) % 250 for i in range(40)]  # 3 pages of 16
NEW = 8
BLOCK = 4


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("dflash2")
    assert glmlab_main(["init-checkpoint", "--draft", "dflash2", "--target",
                        str(preset_checkpoint("tiny")), "--out", str(out), "--block-size",
                        str(BLOCK)]) == 0
    return str(out)


def test_pd_with_dflash2_on_decode_equals_plain_greedy(tmp_path, draft_dir):
    spec = {"algorithm": "dflash2", "block_size": BLOCK, "draft_path": draft_dir}
    with pd_service(tmp_path, engine={**ENGINE, "speculative": spec}) as pd:
        out = generate(pd.url, PROMPT, NEW)
        assert out["output_ids"] == cli_generate(PROMPT, NEW)
        # every cache row and the draft K/V (bf16, at the same token slots) of the 3 pages
        cfg = json.loads(Path(draft_dir, "config.json").read_text())
        draft_per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] \
            * cfg["head_dim"] * 2
        page, fixed = cache_bytes()
        sent = out["meta_info"]["pd_transfer"]
        assert sent["pages"] == 3 and sent["bytes"] == 3 * (page + PAGE * draft_per_token) + fixed
        info = {w: http(pd.worker(w).url + "/server_info")[1] for w in ("prefill0", "decode0")}
        for w in info.values():
            assert w["engine"]["speculative"]["algorithm"] == "dflash2"
            assert w["leak_check"] == "ok"
        state = info["decode0"]["internal_states"][0]
        assert state["spec_cycles"] > 0 and state["spec_verified_requests"] == state["spec_cycles"]
        assert 1.0 <= state["avg_spec_accept_length"] <= BLOCK
        assert NEW - 1 >= state["spec_cycles"] >= (NEW - 1) / BLOCK  # tokens after the first
        metrics = http(pd.worker("decode0").url + "/metrics")[1]
        line = next(x for x in metrics.splitlines() if x.startswith("sglang:spec_accept_length"))
        assert float(line.split()[-1]) == pytest.approx(state["spec_accept_length"])
