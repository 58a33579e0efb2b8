"""Per-request timelines: each worker's recent events (``Timeline``, served at ``/pd_trace``), and
PD timelines from both sides' events, paired by ``bootstrap_room`` (``pd_timeline``).

A PD row is one phase of one request on one side, with start and end in seconds from the first
event: decode ``wait for admission``, ``transfer`` (room sent -> cache landed) and ``decode``
(first token -> finish); prefill ``wait for room``, ``prefill`` (room received -> WRITE posted)
and ``write`` (posted -> done). Rows are plain dicts, ready for a DataFrame or a plotly timeline.
"""

from __future__ import annotations

import collections
import json
import time
import urllib.request

_PHASES = {  # (side, phase): (start event, end event)
    ("decode", "transfer"): ("room_sent", "transfer_landed"),
    ("decode", "decode"): ("first_token", "finish"),
    ("prefill", "wait for room"): ("waiting_room", "room_received"),
    ("prefill", "prefill"): ("room_received", "write_posted"),
    ("prefill", "write"): ("write_posted", "write_done"),
}


class Timeline:
    """Recent per-request events (admitted, bootstrap, transfer, first token, finish)."""

    def __init__(self, role: str, keep: int = 4096):
        self.role, self.events = role, collections.deque(maxlen=keep)

    def add(self, rid: str, what: str, **fields) -> None:
        self.events.append({"t": time.time(), "role": self.role, "rid": rid, "event": what,
                            **fields})

    def recent(self) -> list[dict]:
        return list(self.events)


def fetch_events(url: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/pd_trace", timeout=10) as r:
        return json.loads(r.read())["events"]


def pd_timeline(prefill_events: list[dict], decode_events: list[dict]) -> list[dict]:
    by_rid: dict[tuple[str, str], dict[str, float]] = {}
    room_of: dict[tuple[str, str], int] = {}
    for e in [*prefill_events, *decode_events]:
        key = (e["role"], e["rid"])
        by_rid.setdefault(key, {}).setdefault(e["event"], e["t"])
        if "room" in e:
            room_of[key] = e["room"]
    if not by_rid:
        return []
    t0 = min(t for ev in by_rid.values() for t in ev.values())
    rows = []
    for (side, rid), ev in by_rid.items():
        room = room_of.get((side, rid))
        if room is None:
            continue
        for (s, phase), (a, b) in _PHASES.items():
            if s == side and a in ev and b in ev:
                rows.append({"room": room, "request": f"{room % 100000:05d}", "side": side,
                             "phase": phase, "start": ev[a] - t0, "end": ev[b] - t0})
    return sorted(rows, key=lambda r: (r["room"], r["start"]))
