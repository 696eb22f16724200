"""Child processes of one local federation, found and stopped by PID.

Flower's SuperLink and SuperNodes start their own children in new sessions (SuperExec, then a
fresh ServerApp / ClientApp process per run or message), so a process group does not hold them.
Every process this module starts carries a random token in its environment
(``SECURE_FL_DEPLOY``) and, for a SuperNode, its node index (``SECURE_FL_DEPLOY_NODE``); both are
inherited by everything it starts. :meth:`ProcessSet.pids` finds the set's processes as the
union of the descendants of the children it started (``/proc/PID/stat``'s parent) and the
processes of this user whose environment holds the token, so a grandchild re-parented to init
is still found. Teardown sends SIGTERM to each PID, waits a bounded time and sends SIGKILL to
what is left; nothing is stopped by name.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

__all__ = ["NODE_ENV", "TOKEN_ENV", "Child", "ProcessSet", "Terminated", "terminate_on_signals"]

log = logging.getLogger("secure_fl.flower.deploy")

TOKEN_ENV = "SECURE_FL_DEPLOY"
NODE_ENV = "SECURE_FL_DEPLOY_NODE"
PROC = Path("/proc")


@dataclass(frozen=True)
class Child:
    """One process this set started: its name (``superlink``, ``node-3``...), the Popen and its log."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    node: int | None = None

    @property
    def pid(self) -> int:
        return self.process.pid


def _parent(pid: int) -> int | None:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces: split after the last ')'
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[1]) if fields[0] != "Z" else None


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key in (TOKEN_ENV.encode(), NODE_ENV.encode()):
            out[key.decode()] = value.decode(errors="replace")
    return out


def _all_pids() -> list[int]:
    return [int(p.name) for p in PROC.iterdir() if p.name.isdigit()]


@dataclass
class ProcessSet:
    """Processes of one federation: start them with the set's token, find them, stop them.

    ``env`` is the environment every child gets (the token and node index are added).
    """

    env: Mapping[str, str]
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    children: list[Child] = field(default_factory=list)
    _closed: bool = False

    def start(self, name: str, argv: Sequence[str], *, log_path: Path, node: int | None = None,
              cwd: Path | None = None, env: Mapping[str, str] | None = None) -> Child:
        """Start ``argv`` in its own session (a Ctrl-C at the terminal reaches only us; we stop it),
        stdout and stderr to ``log_path``."""
        if self._closed:
            raise RuntimeError("this federation's processes were already stopped")
        environ = {**self.env, **(env or {}), TOKEN_ENV: self.token}
        if node is not None:
            environ[NODE_ENV] = str(node)
        with log_path.open("ab") as out:
            process = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=environ, cwd=cwd, start_new_session=True)
        child = Child(name=name, process=process, log_path=log_path, node=node)
        self.children.append(child)
        log.debug("started %s (pid %d): %s", name, process.pid, " ".join(argv))
        return child

    def pids(self, *, node: int | None = None) -> set[int]:
        """Live processes of this set (of one node when ``node`` is given)."""
        roots = {c.pid for c in self.children if node is None or c.node == node}
        parents: dict[int, int | None] = {}
        found: set[int] = set()
        for pid in _all_pids():
            if pid == os.getpid():
                continue
            env = _environ(pid)
            if env.get(TOKEN_ENV) == self.token and (node is None or env.get(NODE_ENV) == str(node)):
                found.add(pid)
            parents[pid] = _parent(pid)
        # descendants of the roots (a child that scrubbed its environment is still found)
        frontier = {pid for pid in roots if pid in parents}
        while frontier:
            found |= frontier
            frontier = {pid for pid, parent in parents.items() if parent in frontier and pid not in found}
        return {pid for pid in found if parents.get(pid) is not None}  # zombies and gone ones left out

    def kill_node(self, node: int) -> list[int]:
        """SIGKILL every process of SuperNode ``node`` at once (a machine that dies)."""
        pids = sorted(self.pids(node=node))
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        for child in self.children:
            if child.node == node:
                _reap(child.process, 1.0)
        log.info("killed node %d (pids %s)", node, ", ".join(map(str, pids)))
        return pids

    def close(self, *, grace: float = 5.0) -> list[int]:
        """Stop every process of the set: SIGTERM, up to ``grace`` seconds, SIGKILL; returns the PIDs
        that were still alive after that (empty when all are gone)."""
        if self._closed:
            return []
        self._closed = True
        pids = self.pids()
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in self.children:
            _reap(child.process, max(0.0, deadline - time.monotonic()))
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.05)
        for _ in range(3):  # late children of dying parents: look again
            left = self.pids() | {pid for pid in pids if _alive(pid)}
            if not left:
                break
            for pid in left:
                _signal(pid, signal.SIGKILL)
            for child in self.children:
                _reap(child.process, 1.0)
            time.sleep(0.1)
        remaining = sorted(pid for pid in self.pids() | pids if _alive(pid))
        if remaining:
            log.warning("processes still alive after teardown: %s", ", ".join(map(str, remaining)))
        return remaining


def _alive(pid: int) -> bool:
    """Running and not a zombie."""
    return _parent(pid) is not None


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(process: subprocess.Popen[bytes], timeout: float) -> None:
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: unwinds like Ctrl-C so that every ``finally`` runs."""


@contextmanager
def terminate_on_signals() -> Iterator[None]:
    """Inside the block SIGTERM and SIGHUP raise :class:`Terminated` (Ctrl-C already raises
    KeyboardInterrupt), so the teardown in the callers' ``finally`` runs; handlers restored after."""
    def handler(signum: int, frame: FrameType | None) -> None:
        raise Terminated(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
