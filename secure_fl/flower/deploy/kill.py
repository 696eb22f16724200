"""``--kill NODE@ROUND[:STAGE]``: SIGKILL a SuperNode at a point of the run.

NODE is the node's index (its ``partition-id``, the client it holds), ROUND is 1-based as in
the run's table, STAGE the name of a protocol stage as the ServerApp writes it to its events
file. Without a stage the node is killed when the round's first exchange is sent: the message
that carries its training, so the node dies while it trains and never answers that round.
The node's whole process tree dies at once (the SuperNode, its SuperExec and any ClientApp
process), as when the machine fails.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

__all__ = ["KillSpec", "KillSpecError", "KillWatcher", "parse_kill"]

log = logging.getLogger("secure_fl.flower.deploy")

_PATTERN = re.compile(r"^(\d+)@(\d+)(?::([A-Za-z][A-Za-z0-9_.-]*))?$")


class KillSpecError(ValueError):
    """A ``--kill`` value that is not NODE@ROUND[:STAGE] or names a node or round that does not exist."""


@dataclass(frozen=True, kw_only=True)
class KillSpec:
    node: int
    round: int
    """1-based, as printed in the run's table."""
    stage: str | None = None

    def __str__(self) -> str:
        return f"{self.node}@{self.round}" + (f":{self.stage}" if self.stage else "")

    def check(self, *, nodes: int, rounds: int) -> None:
        """Refuse a node index or round the deployment does not have."""
        if self.node >= nodes:
            raise KillSpecError(f"--kill {self}: node {self.node} does not exist (nodes are 0..{nodes - 1})")
        if self.round > rounds:
            raise KillSpecError(f"--kill {self}: round {self.round} does not exist (the run has {rounds} rounds)")

    def matches(self, event: dict[str, Any]) -> bool:
        """The ServerApp's event at which this kill fires: the stage (or the round's first) being sent."""
        if event.get("event") != "sent" or event.get("round") != self.round - 1:
            return False
        return self.stage is None or event.get("stage") == self.stage


def parse_kill(text: str) -> KillSpec:
    """``3@2`` or ``3@2:upload`` → KillSpec; anything else is a :class:`KillSpecError`."""
    match = _PATTERN.match(text.strip())
    if not match:
        raise KillSpecError(f"--kill expects NODE@ROUND[:STAGE] (e.g. 3@2 or 3@2:upload), got {text!r}")
    node, rnd, stage = int(match[1]), int(match[2]), match[3]
    if rnd < 1:
        raise KillSpecError(f"--kill {text}: rounds count from 1")
    return KillSpec(node=node, round=rnd, stage=stage)


@dataclass
class Fired:
    spec: KillSpec
    time: float
    pids: list[int]


class KillWatcher:
    """Follows the ServerApp's events file in a thread and calls ``kill(node)`` at each spec's point.

    Reads only complete lines; a line that is not JSON is skipped (the file is the ServerApp's).
    """

    def __init__(self, events: Path, specs: tuple[KillSpec, ...], kill: Callable[[int], list[int]],
                 *, interval: float = 0.05) -> None:
        self.events = events
        self.pending = list(specs)
        self.fired: list[Fired] = []
        self._kill = kill
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="kill-watcher", daemon=True)

    def __enter__(self) -> Self:
        if self.pending:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def feed(self, event: dict[str, Any]) -> None:
        """One event: fire the specs it matches."""
        for spec in [s for s in self.pending if s.matches(event)]:
            self.pending.remove(spec)
            pids = self._kill(spec.node)
            self.fired.append(Fired(spec=spec, time=time.time(), pids=pids))
            log.info("--kill %s: node %d killed at round %d, stage %s", spec, spec.node, spec.round,
                     event.get("stage"))

    def _follow(self) -> None:
        offset = 0
        buffer = b""
        while not self._stop.is_set() and self.pending:
            try:
                with self.events.open("rb") as handle:
                    handle.seek(offset)
                    chunk = handle.read()
            except FileNotFoundError:
                chunk = b""
            offset += len(chunk)
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    self.feed(event)
            self._stop.wait(self._interval)
