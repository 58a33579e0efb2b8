"""Real services for the serving tests: worker processes, sglang-router, NIXL over UCX TCP, all on
127.0.0.1 with free ports. The shared 1P1D and mixed services start once per session; tests that
kill processes start their own."""

from __future__ import annotations

import contextlib
import io
import json
import urllib.error
import urllib.request

import pytest

from glmlab.checkpoint.presets_dir import preset_checkpoint
from glmlab.cli import main as glmlab_main
from glmlab.config import ModelConfig
from glmlab.serve.config import Role, ServeConfig, TransferConfig
from glmlab.serve.kvplan import AUX_WIDTH
from glmlab.serve.limits import HttpLimits
from glmlab.serve.router import free_ports
from glmlab.serve.supervisor import Service

# small pools start fast; 16-token pages make short prompts span several pages
ENGINE = {"page_size": 16, "cache_bytes": 24 << 20}
PAGE = ENGINE["page_size"]
STREAM_SEND_TIMEOUT_S = 2.0  # the shared PD service's (HttpLimits)


def pd_service(tmp_path, transfer: TransferConfig | None = None,
               engine: dict | None = None, **service_kw) -> Service:
    """``service_kw``: Service's own (``supervision``, ``limits``)."""
    router, metrics, prefill, boot, decode = free_ports(5)
    cfg = ServeConfig(port=router, router_metrics_port=metrics, prefill_ports=(prefill,),
                      bootstrap_ports=(boot,), decode_ports=(decode,), log_dir=str(tmp_path),
                      startup_timeout_s=120,
                      transfer=transfer or TransferConfig(transfer_timeout_s=20,
                                                          peer_check_interval_s=0.2))
    engine = engine or ENGINE
    return Service(cfg, preset_checkpoint("tiny"), "tiny",
                   {Role.PREFILL: engine, Role.DECODE: engine}, quiet=True, **service_kw)


def mixed_service(tmp_path, engine: dict | None = None, **service_kw) -> Service:
    (port,) = free_ports(1)
    cfg = ServeConfig(mode="mixed", mixed_ports=(port,), launch_router=False,
                      log_dir=str(tmp_path), startup_timeout_s=120)
    return Service(cfg, preset_checkpoint("tiny"), "tiny", {Role.MIXED: engine or ENGINE},
                   quiet=True, **service_kw)


def http(url: str, body=None, raw: bytes | None = None, timeout: float = 60.0):
    """(status, parsed JSON or text) for a GET (no body) or POST."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def generate(url: str, ids: list[int], n: int, **extra) -> dict:
    """Greedy /generate of ``n`` tokens (EOS ignored); asserts a 200."""
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0,
                                                  "ignore_eos": True}, **extra}
    status, out = http(f"{url}/generate", body)
    assert status == 200, out
    return out


def cli_generate(ids: list[int], n: int, *flags: str) -> list[int]:
    """The same greedy continuation from ``glmlab generate`` (one in-process engine)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert glmlab_main(["generate", "--model", "tiny", "--prompt-ids",
                            ",".join(map(str, ids)), "--max-new-tokens", str(n),
                            "--ignore-eos", "--json", "--page-size", str(PAGE), *flags]) == 0
    return json.loads(buf.getvalue().strip().splitlines()[-1])["output_ids"]


def transfer_bytes(kv_fp8: bool = False, index_fp8: bool = False) -> tuple[int, int]:
    """(bytes of one page, bytes of one request's state rows + the aux row) that PD must move
    for the tiny model on the CPU (fp32 model), from the model config and the documented cache
    formats alone: FP8 latent = R e4m3 + one fp32 scale per 128 channels (or per row below 128);
    FP8 pooled keys = DI e4m3 + one fp32 scale per pool, the raw tail rows then bf16."""
    cfg = ModelConfig.from_hf(preset_checkpoint("tiny"))
    d, k = cfg.dsa, cfg.kda
    dsa_layers = len(cfg.dsa_layers) + (cfg.mtp_layer is not None)
    latent = d.kv_lora_rank + 4 * max(1, d.kv_lora_rank // 128) if kv_fp8 else d.kv_lora_rank * 4
    pool = d.index_head_dim + 4 if index_fp8 else d.index_head_dim * 4
    page = dsa_layers * (latent * PAGE + pool * (PAGE // d.index_kpool))
    state = dsa_layers * d.index_kpool * 2 * d.index_head_dim * (2 if index_fp8 else 4)
    state += len(cfg.kda_layers) * (k.conv_channels * (k.conv_kernel - 1)
                                    + k.num_heads * k.head_dim * k.head_dim) * 4
    return page, state + AUX_WIDTH * 8  # + one aux row (float64: first token, top-20)


def sse_events(text: str) -> list:
    out = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


@pytest.fixture(scope="session")
def pd(tmp_path_factory):
    # a short send timeout: test_disconnect's stalled reader is dropped in seconds
    with pd_service(tmp_path_factory.mktemp("pd"),
                    limits=HttpLimits(stream_send_timeout_s=STREAM_SEND_TIMEOUT_S)) as svc:
        yield svc


@pytest.fixture(scope="session")
def mixed(tmp_path_factory):
    with mixed_service(tmp_path_factory.mktemp("mixed")) as svc:
        yield svc
