"""glmlab.serve: the HTTP service around the Engine, mixed or disaggregated (prefill + decode).

Pieces: ``api`` (FastAPI app speaking SGLang's /generate and OpenAI's /v1 APIs), ``worker`` (a role
around an Engine), ``bootstrap`` (pairing prefill and decode by ``bootstrap_room``), ``transfer``
(NIXL WRITE of cache rows), ``router`` (sglang-router in PD mode), ``supervisor`` (the processes of
one service), ``cli`` (``glmlab serve``).
"""
