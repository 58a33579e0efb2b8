"""1P1D with two ranks per role (gloo processes on the CPU) and MTP speculation on decode, started
the way a user does (``glmlab serve --prefill-tp 2 --decode-tp 2 --decode-ep 2
--speculative-algorithm mtp``): each rank pushes its own cache shard over NIXL into the same
rank of decode, decode's leader admits a request once every rank's rows have landed.

- greedy tokens equal ``glmlab generate`` (one process, no speculation and with MTP, whose
  acceptance per cycle the service must reproduce: same drafts, so the drafter state arrived);
- every rank's bytes crossed (the per-rank shard sizes follow from the model config alone);
- a prefill killed while decode waits for its transfers: decode fails the rooms and every rank of
  decode returns its pages and state slots (the leak check walks each rank's pools).
This module's service ends with the kill: the kill test runs last.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from glmlab.bench.client import run_load
from glmlab.bench.workloads import BenchRequest
from glmlab.checkpoint.presets_dir import preset_checkpoint
from glmlab.cli import build_parser
from glmlab.commands.serve import build_service
from glmlab.config import ModelConfig
from glmlab.serve.kvplan import AUX_WIDTH
from glmlab.serve.router import free_ports
from tests.serve.conftest import ENGINE, PAGE, cli_generate, generate, http

PROMPT = [(i * 37 + 11) % 250 for i in range(40)]  # 3 pages of 16
NEW = 8
MTP = ("--speculative-algorithm", "mtp", "--speculative-num-steps", "2")
TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def tp_service(tmp_path_factory):
    router, metrics, prefill, boot, decode = map(str, free_ports(5))
    args = build_parser().parse_args([
        "serve", "--model", "tiny", "--prefill-tp", "2", "--decode-tp", "2", "--decode-ep", "2",
        *MTP,
        "--page-size", str(PAGE), "--cache-bytes", str(ENGINE["cache_bytes"]),
        "--port", router, "--router-metrics-port", metrics, "--prefill-ports", prefill,
        "--bootstrap-ports", boot, "--decode-ports", decode, "--startup-timeout-s", "240",
        "--log-dir", str(tmp_path_factory.mktemp("pd-tp")),
        "--transfer-transfer-timeout-s", str(TIMEOUT_S),
        "--transfer-peer-check-interval-s", "0.2"])
    with build_service(args, quiet=True) as svc:
        yield svc


def shard_bytes(num_pages: int, tp: int) -> int:
    """Every rank's WRITE of a prompt of ``num_pages`` pages, from the config and the documented
    cache formats (fp32 on the CPU): latent rows and pooled keys whole on each rank, the KDA
    state split by heads, the indexer tails whole, the MTP chain start (hidden + first draft)
    on each rank, the aux row on rank 0 only."""
    cfg = ModelConfig.from_hf(preset_checkpoint("tiny"))
    d, k = cfg.dsa, cfg.kda
    dsa = len(cfg.dsa_layers) + 1  # + the MTP layer
    page = dsa * (d.kv_lora_rank * 4 * PAGE + d.index_head_dim * 4 * (PAGE // d.index_kpool))
    tail = dsa * d.index_kpool * 2 * d.index_head_dim * 4
    kda = len(cfg.kda_layers) * (k.conv_channels * (k.conv_kernel - 1)
                                 + k.num_heads * k.head_dim * k.head_dim) * 4  # all heads
    mtp = cfg.hidden_size * 4 + 8
    return tp * (num_pages * page + tail + mtp) + kda + AUX_WIDTH * 8  # aux: float64


def test_tp2_pd_with_mtp_equals_one_process_greedy(tp_service):
    svc = tp_service
    out = generate(svc.url, PROMPT, NEW)
    assert out["output_ids"] == cli_generate(PROMPT, NEW)
    sent = out["meta_info"]["pd_transfer"]
    assert sent["ranks"] == 2 and sent["pages"] == 3
    assert sent["bytes"] == shard_bytes(3, 2)
    decode = http(svc.worker("decode0").url + "/server_info")[1]
    prefill = http(svc.worker("prefill0").url + "/server_info")[1]
    assert decode["tp_size"] == prefill["tp_size"] == 2 and decode["ep_size"] == 2
    assert decode["engine"]["speculative"]["algorithm"] == "mtp"
    state = decode["internal_states"][0]
    assert prefill["internal_states"][0]["transfer_bytes_sent"] == sent["bytes"]
    assert decode["leak_check"] == prefill["leak_check"] == "ok"
    # one request on a fresh service: its acceptance is what one process measures for it
    assert state["spec_cycles"] > 0
    reference = cli_generate_spec(PROMPT, NEW)
    assert reference["output_ids"] == out["output_ids"]
    assert state["spec_cycles"] == reference["spec"]["cycles"]
    assert state["avg_spec_accept_length"] == pytest.approx(
        reference["spec"]["accepted_per_cycle"])
    metrics = http(svc.worker("decode0").url + "/metrics")[1]
    assert "spec_accept_length" in metrics


def cli_generate_spec(ids: list[int], n: int) -> dict:
    import contextlib
    import io
    import json

    from glmlab.cli import main as glmlab_main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert glmlab_main(["generate", "--model", "tiny", "--prompt-ids",
                            ",".join(map(str, ids)), "--max-new-tokens", str(n), "--ignore-eos",
                            "--json", "--page-size", str(PAGE), *MTP]) == 0
    return json.loads(buf.getvalue().strip().splitlines()[-1])


def test_killing_prefill_mid_transfer_frees_every_decode_rank(tp_service):
    svc = tp_service
    decode = svc.worker("decode0").url
    reqs = [BenchRequest(None, tuple((i * 31 + j) % 250 for j in range(1500)), 1500, 4)
            for i in range(4)]
    box = {}
    t = threading.Thread(target=lambda: box.update(
        out=asyncio.run(run_load(svc.url, "sglang", reqs, "tiny", timeout_s=60))))
    t.start()
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:  # decode holds rooms (pages, slots on both ranks)
        state = http(decode + "/server_info")[1]["internal_states"][0]
        if state["transfers_waiting"] >= 3:
            break
        time.sleep(0.05)
    assert state["transfers_waiting"] >= 3, state
    svc.worker("prefill0").proc.kill()  # its follower dies with it
    t.join(TIMEOUT_S + 10)
    assert not t.is_alive(), "clients still waiting after the transfer timeout"
    results, _ = box["out"]
    assert any(not r.success for r in results)
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        info = http(decode + "/server_info")[1]
        if info["internal_states"][0]["transfers_waiting"] == 0 and info["leak_check"] != "busy":
            break
        time.sleep(0.1)
    state = info["internal_states"][0]
    assert info["leak_check"] == "ok", info["leak_check"]  # rank 0 and rank 1's pools
    assert [r["rank"] for r in info["ranks"]] == [1]
    assert all(r["leaks"] == [] and r["running"] == r["parked"] == 0 for r in info["ranks"])
    assert state["transfers_waiting"] == 0 and state["num_parked_reqs"] == 0
    assert state["transfer_failures"] >= 1
