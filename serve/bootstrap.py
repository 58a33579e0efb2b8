"""Pairing prefill and decode by ``bootstrap_room``: the prefill's bootstrap listener, its client.

sglang-router sends the same request to a prefill and a decode worker, adding ``bootstrap_host``,
``bootstrap_port`` (the prefill's listener) and a random 63-bit ``bootstrap_room``
(docs/platform.md 2.5).
The two meet here:

- once per (decode, prefill) pair, decode fetches ``GET /route`` (the prefill's NIXL agents and
  cache layout, one per rank of a TP worker) and registers itself with ``PUT /peers`` (its agents'
  metadata and the addresses of their cache regions); both sides refuse a pair whose layouts
  differ (``pairing_problem``: TP degree, page size, drafter hand-off, every rank's regions);
- per request, decode posts ``POST /rooms/{room}`` with where the request's cache must land (its
  page ids for the part of the prompt it lacks, its state slot, an aux row per sample); the
  prefill worker handling the same room waits for that message, computes, and pushes;
- ``DELETE /rooms/{room}`` tells prefill that decode gave up on the room.

This module moves JSON and pairs rooms; it never touches the engine or NIXL itself: the worker
passes in the callbacks that do.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field

import httpx
from fastapi import FastAPI, HTTPException, Request

from glmlab.serve.transfer import Region


@dataclass(frozen=True)
class PeerInfo:
    """A worker's NIXL identity and cache layout, as exchanged at registration: rank 0's agent
    and regions, and those of the other ranks of a TP worker in ``ranks`` (rank 1, 2, ...)."""

    agent_name: str
    metadata: bytes
    regions: dict[str, Region]
    page_size: int
    drafter: str = ""  # what the drafter hand-off carries (``DraftHandoff.describe``); "" = none
    ranks: tuple[PeerInfo, ...] = ()

    def to_json(self) -> dict:
        return {"agent_name": self.agent_name,
                "metadata": base64.b64encode(self.metadata).decode(),
                "regions": [r.to_json() for r in self.regions.values()],
                "page_size": self.page_size, "drafter": self.drafter,
                "ranks": [r.to_json() for r in self.ranks]}

    @classmethod
    def from_json(cls, d: dict) -> PeerInfo:
        regions = [Region.from_json(r) for r in d["regions"]]
        return cls(str(d["agent_name"]), base64.b64decode(d["metadata"]),
                   {r.name: r for r in regions}, int(d["page_size"]), str(d.get("drafter", "")),
                   tuple(cls.from_json(r) for r in d.get("ranks", ())))

    @property
    def tp_size(self) -> int:
        return 1 + len(self.ranks)

    def rank(self, r: int) -> PeerInfo:
        return self if r == 0 else self.ranks[r - 1]

    def layout(self) -> dict[str, int]:
        return {n: r.row_bytes for n, r in self.regions.items()}


def pairing_problem(prefill: PeerInfo, decode: PeerInfo) -> str | None:
    """Why these two workers cannot transfer (None: they can). Rank r of prefill writes rank r
    of decode, row for row, so the ranks, pages, drafter state and every region must agree."""
    if prefill.tp_size != decode.tp_size:
        return (f"prefill runs {prefill.tp_size} rank(s) (tp {prefill.tp_size}), decode "
                f"{decode.tp_size}: each rank's cache shard lands on the same rank of decode, so "
                "serve both roles with the same TP degree (--prefill-tp, --decode-tp)")
    if prefill.page_size != decode.page_size:
        return f"page sizes differ: prefill {prefill.page_size}, decode {decode.page_size}"
    if prefill.drafter != decode.drafter:
        return (f"drafter state differs: prefill sends {prefill.drafter or 'none'}, decode "
                f"expects {decode.drafter or 'none'} (give both roles the same "
                "--speculative-* settings)")
    for r in range(prefill.tp_size):
        mine, theirs = prefill.rank(r).layout(), decode.rank(r).layout()
        if mine == theirs:
            continue
        only_p, only_d = sorted(set(mine) - set(theirs)), sorted(set(theirs) - set(mine))
        rows = sorted(n for n in set(mine) & set(theirs) if mine[n] != theirs[n])
        parts = ([f"only on prefill: {only_p[:4]}"] if only_p else []) + \
            ([f"only on decode: {only_d[:4]}"] if only_d else []) + \
            [f"{n}: {mine[n]} B rows on prefill, {theirs[n]} B on decode" for n in rows[:3]]
        return f"cache layouts differ on rank {r}: " + "; ".join(parts)
    return None


@dataclass(frozen=True)
class RoomMessage:
    """Decode's per-request message: where the request's cache must land."""

    room: int
    decode_agent: str
    prompt_len: int
    prompt_hash: str  # both sides tokenize; a mismatch must fail loudly, not corrupt the cache
    decode_prefix_len: int  # tokens decode already holds (page aligned): not sent again
    dst_pages: tuple[int, ...]  # decode pages for positions [decode_prefix_len, prompt_len)
    dst_state_slot: int
    # one aux row per sample (the prompt's n samples share one transfer): each sample's first
    # token lands in its own row, sample 0's first
    dst_aux_rows: tuple[int, ...]

    def to_json(self) -> dict:
        d = asdict(self)
        d["dst_pages"], d["dst_aux_rows"] = list(self.dst_pages), list(self.dst_aux_rows)
        return d

    @classmethod
    def from_json(cls, d: dict) -> RoomMessage:
        return cls(int(d["room"]), str(d["decode_agent"]), int(d["prompt_len"]),
                   str(d["prompt_hash"]), int(d["decode_prefix_len"]),
                   tuple(int(p) for p in d["dst_pages"]), int(d["dst_state_slot"]),
                   tuple(int(r) for r in d["dst_aux_rows"]))


@dataclass
class _Room:
    event: asyncio.Event = field(default_factory=asyncio.Event)
    message: RoomMessage | None = None
    cancelled: str | None = None
    created: float = field(default_factory=time.monotonic)


class RoomTable:
    """Rooms by id; either side (the request or decode's message) may arrive first."""

    def __init__(self, expire_s: float = 300.0):
        self._rooms: dict[int, _Room] = {}
        self._expire_s = expire_s

    def _room(self, room: int) -> _Room:
        self._expire()
        return self._rooms.setdefault(room, _Room())

    def put(self, msg: RoomMessage) -> None:
        r = self._room(msg.room)
        r.message = msg
        r.event.set()

    def cancel(self, room: int, reason: str) -> None:
        r = self._room(room)
        r.cancelled = reason
        r.event.set()

    async def wait(self, room: int, timeout_s: float) -> RoomMessage:
        r = self._room(room)
        try:
            await asyncio.wait_for(r.event.wait(), timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(f"room {room}: no message from decode within "
                               f"{timeout_s:.0f} s") from None
        finally:
            self._rooms.pop(room, None)
        if r.cancelled or r.message is None:
            raise ConnectionAbortedError(f"room {room}: decode cancelled ({r.cancelled})")
        return r.message

    def __len__(self) -> int:
        return len(self._rooms)

    def _expire(self) -> None:
        now = time.monotonic()
        for k in [k for k, r in self._rooms.items() if now - r.created > self._expire_s]:
            del self._rooms[k]


def bootstrap_app(info: Callable[[], PeerInfo], register: Callable[[PeerInfo], Awaitable[None]],
                  rooms: RoomTable, on_cancel: Callable[[int, str], Awaitable[dict]]) -> FastAPI:
    """The prefill worker's listener, served on its bootstrap port. ``on_cancel`` answers
    whether the room's WRITE was already posted (then decode must wait for its notification
    before reusing the pages)."""
    app = FastAPI(title="glmlab bootstrap", docs_url=None, redoc_url=None)
    registered: set[str] = set()  # decode agents registered with *this* process

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/route")
    async def route() -> dict:
        return info().to_json()

    @app.put("/peers")
    async def peers(request: Request) -> dict:
        try:
            peer = PeerInfo.from_json(await request.json())
        except (ValueError, KeyError, TypeError) as e:
            raise HTTPException(400, f"bad peer registration: {e}") from e
        mine = info()
        problem = pairing_problem(mine, peer)
        if problem:
            raise HTTPException(409, f"cannot pair: {problem}")
        await register(peer)
        registered.add(peer.agent_name)
        return {"status": "registered", "prefill_agent": mine.agent_name}

    @app.post("/rooms/{room}")
    async def post_room(room: int, request: Request) -> dict:
        try:
            msg = RoomMessage.from_json({**await request.json(), "room": room})
        except (ValueError, KeyError, TypeError) as e:
            raise HTTPException(400, f"bad room message: {e}") from e
        if msg.decode_agent not in registered:  # this prefill restarted since decode paired
            raise HTTPException(409, f"unknown decode agent {msg.decode_agent!r}: register "
                                     "again (PUT /peers)")
        rooms.put(msg)
        return {"status": "ok"}

    @app.delete("/rooms/{room}")
    async def delete_room(room: int, reason: str = "aborted") -> dict:
        rooms.cancel(room, reason)
        return await on_cancel(room, reason)

    return app


class BootstrapClient:
    """Decode's side: one registration per prefill listener, then room messages."""

    def __init__(self, mine: Callable[[], PeerInfo],
                 add_peer: Callable[[PeerInfo], Awaitable[str]], timeout_s: float = 10.0):
        self._mine, self._add_peer = mine, add_peer
        self._http = httpx.AsyncClient(timeout=timeout_s, trust_env=False)
        self._peers: dict[str, str] = {}  # listener base url -> prefill agent name
        self._locks: dict[str, asyncio.Lock] = {}

    @staticmethod
    def base_url(host: str, port: int) -> str:
        return f"http://{host}:{port}"

    async def connect(self, base: str) -> str:
        """The prefill agent's name, registering both ways on first contact."""
        lock = self._locks.setdefault(base, asyncio.Lock())
        async with lock:
            if base in self._peers:
                return self._peers[base]
            r = await self._http.get(f"{base}/route")
            r.raise_for_status()
            prefill = PeerInfo.from_json(r.json())
            problem = pairing_problem(prefill, self._mine())
            if problem:
                raise RuntimeError(f"refused to pair with the prefill at {base}: {problem}")
            name = await self._add_peer(prefill)
            r = await self._http.put(f"{base}/peers", json=self._mine().to_json())
            if r.status_code != 200:
                raise RuntimeError(f"prefill at {base} refused registration: {r.text}")
            self._peers[base] = name
            return name

    def forget(self, base: str) -> None:
        """Drop a listener after a failure, so the next request registers afresh."""
        self._peers.pop(base, None)

    async def send_room(self, base: str, msg: RoomMessage) -> None:
        r = await self._http.post(f"{base}/rooms/{msg.room}", json=msg.to_json())
        if r.status_code == 409 and "unknown decode agent" in r.text:
            self.forget(base)  # a restarted prefill: pair again, then send the room once more
            await self.connect(base)
            r = await self._http.post(f"{base}/rooms/{msg.room}", json=msg.to_json())
        if r.status_code != 200:
            raise RuntimeError(f"prefill at {base} refused room {msg.room}: {r.text}")

    async def cancel_room(self, base: str, room: int, reason: str) -> dict | None:
        """The prefill's answer ({"posted": bool}), or None when it does not answer."""
        with contextlib.suppress(httpx.HTTPError, ValueError):  # the prefill may be what failed
            r = await self._http.delete(f"{base}/rooms/{room}", params={"reason": reason},
                                        timeout=5.0)
            if r.status_code == 200:
                return r.json()
        return None

    async def alive(self, base: str) -> bool:
        try:
            return (await self._http.get(f"{base}/health", timeout=2.0)).status_code == 200
        except httpx.HTTPError:
            return False

    async def close(self) -> None:
        await self._http.aclose()
