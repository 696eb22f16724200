"""Where a deployed round's wall time goes: the ServerApp's events against the nodes' logs.

The ServerApp appends ``{"round", "stage", "event": "sent" | "received", "time"}`` around each
exchange. Each SuperNode (run with ``FLWR_LOG_LEVEL=DEBUG``, which timestamps its log lines)
logs when it has received a message and when its reply is sent. Per exchange:

* ``wall``: sent → all replies received, as the server sees it;
* ``node``: the longest a node held the exchange's message (received → reply sent: a fresh
  ClientApp process, restoring the node's snapshot, its work);
* ``waiting = wall - node``: the time messages spent between the parties, which on loopback is
  the two polling loops (the SuperNode pulls the Fleet API, the ServerApp pulls the replies);
* between exchanges, ``server``: the ServerApp's own work.

A round's polling share is ``Σ waiting / round wall``; its round trips are its exchanges.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["NodeSpan", "node_spans", "read_events", "round_timings"]

_LINE = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\S*\s*:\s+(Received successfully|Sent successfully)")


@dataclass(frozen=True)
class NodeSpan:
    """A node held a message from ``received`` to ``sent`` (epoch seconds)."""

    node: int
    received: float
    sent: float


def read_events(path: Path) -> list[dict[str, Any]]:
    """The ServerApp's events (complete JSON lines; others skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and {"round", "stage", "event", "time"} <= set(event):
            out.append(event)
    return out


def node_spans(node: int, text: str) -> list[NodeSpan]:
    """The (received, reply sent) pairs of one SuperNode's DEBUG log (local-time stamps)."""
    spans = []
    received: float | None = None
    for match in _LINE.finditer(re.sub(r"\x1b\[[0-9;]*m", "", text)):
        stamp = datetime.datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if match[2].startswith("Received"):
            received = stamp
        elif received is not None:
            spans.append(NodeSpan(node=node, received=received, sent=stamp))
            received = None
    return spans


def round_timings(events: Sequence[dict[str, Any]], spans: Iterable[NodeSpan]) -> list[dict[str, Any]]:
    """Per round: ``round`` (1-based), ``wall``, ``round_trips``, ``waiting``, ``waiting_share``,
    ``server`` and ``stages`` (``[{"stage", "wall", "node", "waiting"}]``), seconds."""
    spans = list(spans)
    exchanges: list[dict[str, Any]] = []
    open_: dict[tuple[int, str], float] = {}
    for event in sorted(events, key=lambda e: float(e["time"])):
        key = (int(event["round"]), str(event["stage"]))
        if event["event"] == "sent":
            open_[key] = float(event["time"])
        elif event["event"] == "received" and key in open_:
            exchanges.append({"round": key[0], "stage": key[1], "start": open_.pop(key), "end": float(event["time"])})
    out = []
    for rnd in sorted({e["round"] for e in exchanges}):
        mine = [e for e in exchanges if e["round"] == rnd]
        following = [e["start"] for e in exchanges if e["round"] > rnd]
        start, end = mine[0]["start"], min(following) if following else mine[-1]["end"]
        stages = []
        for e in mine:
            # a span belongs to the exchange in which the node received its message; its reply may be
            # logged a moment after the server pulled it, so the span is cut at the exchange's end
            held = [min(s.sent, e["end"]) - s.received for s in spans if e["start"] <= s.received <= e["end"]]
            node = max(held, default=0.0)
            stages.append({"stage": e["stage"], "wall": e["end"] - e["start"], "node": node,
                           "waiting": max(0.0, e["end"] - e["start"] - node)})
        wall = end - start
        waiting = sum(s["waiting"] for s in stages)
        out.append({"round": rnd + 1, "wall": wall, "round_trips": len(mine), "waiting": waiting,
                    "waiting_share": waiting / wall if wall > 0 else 0.0,
                    "server": wall - sum(s["wall"] for s in stages), "stages": stages})
    return out
