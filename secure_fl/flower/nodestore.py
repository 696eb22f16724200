"""A client node's own storage of its state between rounds, on its own disk (``state-path``).

A run on a Flower engine is resumable only if every node can go back to where the server's
checkpoint is: the server keeps its own state in the run store, and each node keeps its
:meth:`~secure_fl.runtime.node.ClientNode.snapshot` (its protocol keys, the method's state,
what it learned) in the directory its node config names — never on the server. One file per
run and round::

    STATE-PATH/RUN-ID/round-000003.node

written atomically (a temporary file in the same directory, then :func:`os.replace`), mode
0600 in 0700 directories, the newest two rounds kept. The file is::

    magic "SFLNODE1" | blob run id | u32 partition | i64 round | blob run digest
    | blob snapshot | blob identity (raw Ed25519 private key, or empty) | SHA-256 of the rest

:meth:`NodeStore.load` restores the newest file at or before the round the server asks for
and refuses, with a typed :class:`NodeStateError`, a missing file, a file of another run,
client or config (*foreign*), and a file whose checksum or fields do not hold (*tampered*).
The checksum catches corruption and edits by mistake; whoever can write the directory can also
read the client's secrets in it, so it is the node operator's to protect (docs/deployment.md).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from protocols import WireError
from protocols.wire import Reader, Writer

__all__ = ["ForeignState", "MissingState", "NodeStateError", "NodeStore", "StoredNode", "TamperedState",
           "node_state_root"]

MAGIC: Final = b"SFLNODE1"
KEEP: Final = 2
"""Rounds kept per run: the newest (maybe a round in flight) and the one before it (a checkpoint's)."""
_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NAME = re.compile(r"round-(\d{6,})\.node")
_DIGEST: Final = 32


class NodeStateError(ValueError):
    """This node cannot restore the state the server asked for; the node is a dropout, with this reason."""


class MissingState(NodeStateError):
    """No stored state of this run at or before the round."""


class ForeignState(NodeStateError):
    """A stored state of another run, client or config."""


class TamperedState(NodeStateError):
    """A stored state whose checksum or fields do not hold."""


@dataclass(frozen=True)
class StoredNode:
    """One stored round of a node: its snapshot and its signing key (empty without ``authenticate``)."""

    round: int
    snapshot: bytes
    identity: bytes = b""


def node_state_root(workspace: Path) -> Path:
    """``WORKSPACE/node-state`` (0700): where the nodes an engine starts on this machine keep their state,
    ``client-<i>`` each (the simulation's nodes, ``deploy local``'s SuperNodes): it outlives the engine."""
    root = workspace / "node-state"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    return root


def _check_run_id(run_id: str) -> str:
    if not _RUN_ID.fullmatch(run_id):
        raise ForeignState(f"run id {run_id!r} is not a run id (letters, digits, '-' and '_', at most 64)")
    return run_id


class NodeStore:
    """The state directory of one node (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str], *, partition: int) -> None:
        self.path = Path(path)
        self.partition = partition

    def _dir(self, run_id: str, *, create: bool = False) -> Path:
        directory = self.path / _check_run_id(run_id)
        if create:
            for d in (self.path, directory):
                d.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.chmod(d, 0o700)
        return directory

    def rounds(self, run_id: str) -> list[int]:
        """The rounds stored for ``run_id``, oldest first."""
        directory = self._dir(run_id)
        if not directory.is_dir():
            return []
        found = (_NAME.fullmatch(p.name) for p in directory.iterdir())
        return sorted(int(m[1]) - 1 for m in found if m)  # round -1 (the fresh state) is file 000000

    def save(self, run_id: str, round: int, *, digest: bytes, node: StoredNode) -> Path:
        """Store ``node`` as the state after (the last exchange of) ``round``; keep the newest two."""
        if round < -1:
            raise ValueError(f"round {round} < -1")
        directory = self._dir(run_id, create=True)
        body = (Writer().raw(MAGIC).blob(run_id.encode()).u32(self.partition).i64(round).blob(digest)
                .blob(node.snapshot).blob(node.identity).finish())
        path = directory / f"round-{round + 1:06d}.node"
        temp = directory / f".{path.name}.{secrets.token_hex(8)}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(body + hashlib.sha256(body).digest())
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, path)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        for old in self.rounds(run_id)[:-KEEP]:
            (directory / f"round-{old + 1:06d}.node").unlink(missing_ok=True)
        return path

    def load(self, run_id: str, round: int, *, digest: bytes) -> StoredNode:
        """The newest stored state of ``run_id`` at or before ``round`` (typed errors otherwise)."""
        stored = [r for r in self.rounds(run_id) if r <= round]
        if not stored:
            raise MissingState(f"client {self.partition}: no stored state of run {run_id} at or before round "
                               f"{round} in {self.path}")
        found = stored[-1]
        try:
            data = (self._dir(run_id) / f"round-{found + 1:06d}.node").read_bytes()
        except OSError as error:
            raise MissingState(f"client {self.partition}: stored state of round {found} unreadable: "
                               f"{error.strerror}") from None
        body, checksum = data[:-_DIGEST], data[-_DIGEST:]
        if len(data) < len(MAGIC) + _DIGEST or not secrets.compare_digest(hashlib.sha256(body).digest(), checksum):
            raise TamperedState(f"client {self.partition}: stored state of round {found} fails its checksum")
        try:
            reader = Reader(body)
            if reader.raw(len(MAGIC)) != MAGIC:
                raise WireError("not a node state file")
            fields = (reader.blob().decode(), reader.u32(), reader.i64(), reader.blob())
            snapshot, identity = reader.blob(), reader.blob()
            reader.end()
        except (WireError, UnicodeDecodeError) as error:
            raise TamperedState(f"client {self.partition}: stored state of round {found} unreadable: {error}") from None
        if fields != (run_id, self.partition, found, digest):
            raise ForeignState(f"client {self.partition}: the state stored as run {run_id}, round {found} is of "
                               f"run {fields[0]!r}, client {fields[1]}, round {fields[2]}"
                               f"{'' if fields[3] == digest else ', another config'}")
        if identity and len(identity) != 32:
            raise TamperedState(f"client {self.partition}: stored state of round {found}: a signing key of "
                                f"{len(identity)} bytes")
        return StoredNode(round=found, snapshot=snapshot, identity=identity)
