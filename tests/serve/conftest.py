"""Real services for the serving tests: worker processes, sglang-router, NIXL over UCX TCP, all on
127.0.0.1 with free ports. The shared 1P1D and mixed services start once per session; tests that
kill processes start their own."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from glmlab.checkpoint.presets_dir import preset_checkpoint
from glmlab.serve.config import Role, ServeConfig, TransferConfig
from glmlab.serve.router import free_ports
from glmlab.serve.supervisor import Service

# small pools start fast; 16-token pages make short prompts span several pages
ENGINE = {"page_size": 16, "cache_bytes": 24 << 20}
PAGE = ENGINE["page_size"]


def pd_service(tmp_path, transfer: TransferConfig | None = None) -> Service:
    router, metrics, prefill, boot, decode = free_ports(5)
    cfg = ServeConfig(port=router, router_metrics_port=metrics, prefill_ports=(prefill,),
                      bootstrap_ports=(boot,), decode_ports=(decode,), log_dir=str(tmp_path),
                      startup_timeout_s=120,
                      transfer=transfer or TransferConfig(transfer_timeout_s=20,
                                                          peer_check_interval_s=0.2))
    return Service(cfg, preset_checkpoint("tiny"), "tiny",
                   {Role.PREFILL: ENGINE, Role.DECODE: ENGINE}, quiet=True)


def mixed_service(tmp_path) -> Service:
    (port,) = free_ports(1)
    cfg = ServeConfig(mode="mixed", mixed_ports=(port,), launch_router=False,
                      log_dir=str(tmp_path), startup_timeout_s=120)
    return Service(cfg, preset_checkpoint("tiny"), "tiny", {Role.MIXED: ENGINE}, quiet=True)


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


def sse_events(text: str) -> list:
    out = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


@pytest.fixture(scope="session")
def pd(tmp_path_factory):
    with pd_service(tmp_path_factory.mktemp("pd")) as svc:
        yield svc


@pytest.fixture(scope="session")
def mixed(tmp_path_factory):
    with mixed_service(tmp_path_factory.mktemp("mixed")) as svc:
        yield svc
