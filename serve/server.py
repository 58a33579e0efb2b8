"""One worker process: ``python -m glmlab.serve.server --config JSON`` (started by the supervisor).

Loads the checkpoint into an engine as the worker config says (``Engine.from_pretrained``), wraps
it in the role's worker (worker.py), and serves its HTTP API on the instance's port, plus, for a
prefill worker, the bootstrap listener on its bootstrap port, both in one asyncio loop. SIGTERM /
SIGINT stop both servers, then the engine thread.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import torch
import uvicorn

from glmlab.serve.api import build_app
from glmlab.serve.config import Role, WorkerConfig


def _server(app, host: str, port: int) -> uvicorn.Server:
    cfg = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                         timeout_keep_alive=30, lifespan="off")
    return uvicorn.Server(cfg)


async def serve(wc: WorkerConfig) -> None:
    from glmlab.serve.worker import load_worker

    worker = load_worker(wc)
    servers = [_server(build_app(worker), wc.spec.host, wc.spec.port)]
    if wc.spec.role is Role.PREFILL:
        servers.append(_server(worker.bootstrap_app(), wc.spec.host, wc.spec.bootstrap_port))
    try:
        await asyncio.gather(*(s.serve() for s in servers))
    finally:
        for s in servers:
            s.should_exit = True
        await worker.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", required=True, help="WorkerConfig as JSON")
    wc = WorkerConfig.from_json(p.parse_args(argv).config)
    if wc.spec.device == "cpu":
        torch.set_num_threads(wc.torch_threads)  # several workers share the cores
    print(f"glmlab {wc.spec.name}: {wc.spec.role.value} worker on {wc.spec.url}"
          + (f", bootstrap port {wc.spec.bootstrap_port}" if wc.spec.bootstrap_port else ""),
          flush=True)
    asyncio.run(serve(wc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
