"""glmlab.serve: the HTTP service around the Engine, mixed or disaggregated (prefill + decode).

Pieces: ``api`` + ``oai`` + ``schemas`` (FastAPI app speaking SGLang's /generate and OpenAI's /v1),
``worker`` (an Engine on its own thread, ``loop``), ``adapter`` (the narrow Engine contract),
``pd`` / ``decode`` (the two PD roles), ``bootstrap`` (pairing by ``bootstrap_room``), ``kvplan``
(which cache rows a request sends), ``transfer`` (NIXL WRITE), ``router`` (sglang-router in PD
mode), ``supervisor`` (the processes of one service), ``server`` (one worker process),
``timeline`` (per-request PD traces). ``glmlab serve`` is ``glmlab/commands/serve.py``.
"""
