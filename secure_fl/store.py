"""The run store: one embedded SQLite file per workspace, written as each round ends.

Per run it keeps the resolved config, the per-round metrics (overall, per-class and
minority accuracy, AUC, train and test loss, seconds), the bytes each statistic cost that
round (from the transcript), the method's own per-round metrics (``round_metrics``), the
privacy spent so far when DP is on (``round_privacy``: DP-SGD's max and mean client ε, each
noised statistic's ε, the run's composition), the declarations of the statistics the method
asked for, and enough state to resume: the latest checkpoint (global model, algorithm and
selection state, the privacy ledger) and each client's persistent state. A round's metrics, bytes and checkpoint are committed in
one transaction, so a run killed at any instant resumes from its last complete round.

Runs started by one ``secure-fl run`` invocation form a *batch*; resuming any run of a batch
continues the batch. The store holds bytes, never live objects: the runtime serialises
checkpoints (``torch.save``) and loads them back with ``weights_only=True``.

The file lives at ``<workspace>/secure-fl.sqlite``; the workspace is ``--workspace``, else
``$SECURE_FL_WORKSPACE``, else ``./runs``.

Schema 2 (this version) added ``round_metrics``, ``round_privacy`` and
``checkpoints.privacy``; a schema-1 file is migrated in place when opened (tables and a
nullable column added, nothing rewritten), so older runs stay readable and resumable.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

__all__ = [
    "DB_NAME",
    "WORKSPACE_ENV",
    "Checkpoint",
    "ReleaseRow",
    "RoundPrivacy",
    "RoundRow",
    "RunRow",
    "RunStore",
    "StoreError",
    "workspace_path",
]

WORKSPACE_ENV = "SECURE_FL_WORKSPACE"
DEFAULT_WORKSPACE = "runs"
DB_NAME = "secure-fl.sqlite"
SCHEMA_VERSION = 3

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, source TEXT NOT NULL, created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    batch_id TEXT NOT NULL REFERENCES batches(id),
    position INTEGER NOT NULL,
    name TEXT NOT NULL,
    label TEXT NOT NULL,
    config TEXT NOT NULL,
    method TEXT NOT NULL,
    loss TEXT NOT NULL,
    protocol TEXT NOT NULL,
    update_protocol TEXT NOT NULL,
    seed INTEGER NOT NULL,
    rounds INTEGER NOT NULL,
    rounds_done INTEGER NOT NULL DEFAULT 0,
    status TEXT NOT NULL,
    device TEXT,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_by_batch ON runs(batch_id, position);
CREATE TABLE IF NOT EXISTS rounds (
    run_id TEXT NOT NULL REFERENCES runs(id),
    round INTEGER NOT NULL,
    accuracy REAL,
    minority_accuracy REAL,
    auc REAL,
    train_loss REAL,
    test_loss REAL,
    per_class TEXT NOT NULL,
    clients TEXT NOT NULL,
    clipped INTEGER NOT NULL DEFAULT 0,
    seconds REAL NOT NULL,
    PRIMARY KEY (run_id, round)
);
CREATE TABLE IF NOT EXISTS round_bytes (
    run_id TEXT NOT NULL, round INTEGER NOT NULL, statistic TEXT NOT NULL, bytes INTEGER NOT NULL,
    PRIMARY KEY (run_id, round, statistic)
);
CREATE TABLE IF NOT EXISTS statistics (
    run_id TEXT NOT NULL, name TEXT NOT NULL, declaration TEXT NOT NULL, PRIMARY KEY (run_id, name)
);
CREATE TABLE IF NOT EXISTS checkpoints (
    run_id TEXT PRIMARY KEY, round INTEGER NOT NULL, model BLOB NOT NULL, algorithm BLOB NOT NULL,
    selection BLOB NOT NULL, privacy BLOB
);
CREATE TABLE IF NOT EXISTS client_states (
    run_id TEXT NOT NULL, client INTEGER NOT NULL, state BLOB NOT NULL, PRIMARY KEY (run_id, client)
);
CREATE TABLE IF NOT EXISTS round_metrics (
    run_id TEXT NOT NULL, round INTEGER NOT NULL, name TEXT NOT NULL, value REAL,
    PRIMARY KEY (run_id, round, name)
);
CREATE TABLE IF NOT EXISTS round_releases (
    run_id TEXT NOT NULL, round INTEGER NOT NULL, seq INTEGER NOT NULL, statistic TEXT NOT NULL,
    protocol TEXT NOT NULL, contributors INTEGER NOT NULL, dropouts INTEGER NOT NULL, clipped INTEGER,
    bytes INTEGER NOT NULL,
    PRIMARY KEY (run_id, round, seq)
);
CREATE TABLE IF NOT EXISTS round_privacy (
    run_id TEXT NOT NULL, round INTEGER NOT NULL, name TEXT NOT NULL, epsilon REAL, delta REAL NOT NULL,
    epsilon_mean REAL, releases INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, round, name)
);
"""

STATUSES = ("pending", "running", "done", "failed")


class StoreError(RuntimeError):
    """The store cannot do what was asked (unknown run, a finished run resumed, a newer schema)."""


def workspace_path(workspace: str | os.PathLike[str] | None = None) -> Path:
    """``workspace``, else ``$SECURE_FL_WORKSPACE``, else ``./runs``."""
    if workspace is not None:
        return Path(workspace)
    return Path(os.environ.get(WORKSPACE_ENV) or DEFAULT_WORKSPACE)


@dataclass(frozen=True)
class RunRow:
    id: str
    batch_id: str
    position: int
    name: str
    label: str
    config: dict[str, Any]
    method: str
    loss: str
    protocol: str
    update_protocol: str
    seed: int
    rounds: int
    rounds_done: int
    status: str
    device: str | None
    created: float
    updated: float


@dataclass(frozen=True)
class RoundPrivacy:
    """Privacy spent up to the end of a round, for one scope.

    Scopes (keys of ``RoundRow.privacy``): ``"model"`` — DP-SGD, ``epsilon`` the largest
    client ε, ``epsilon_mean`` the mean over the clients that have trained so far,
    ``releases`` the worst client's private steps; a statistic name — its noisy releases
    composed (``releases`` of them); ``"run"`` — every release and the worst client's DP-SGD
    composed. ``epsilon`` is ``None`` when infinite.
    """

    epsilon: float | None
    delta: float
    epsilon_mean: float | None = None
    releases: int = 0


@dataclass(frozen=True)
class ReleaseRow:
    """One statistic release of a round as the server knows it: the protocol it went through,
    how many clients it holds and lost, what they clipped (``None``: not counted, e.g. noised)."""

    statistic: str
    protocol: str
    contributors: int
    dropouts: int
    clipped: int | None
    bytes: int

    def as_dict(self) -> dict[str, Any]:
        return {"statistic": self.statistic, "protocol": self.protocol, "contributors": self.contributors,
                "dropouts": self.dropouts, "clipped": self.clipped, "bytes": self.bytes}


@dataclass(frozen=True)
class RoundRow:
    """One evaluated round. Accuracies are fractions; ``bytes`` maps statistic → bytes;
    ``metrics`` holds the method's own numbers (``ServerMethod.round_metrics``; ``None`` for a
    non-finite value); ``privacy`` the privacy spent so far when DP is on (:class:`RoundPrivacy`);
    ``releases`` the round's statistic releases (:class:`ReleaseRow`); ``bytes`` counts every
    message of the round, broadcasts and training messages included."""

    round: int
    accuracy: float | None
    minority_accuracy: float | None
    auc: float | None
    train_loss: float | None
    test_loss: float | None
    per_class_accuracy: list[float | None]
    clients: list[int]
    clipped: int
    seconds: float
    bytes: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, float | None] = field(default_factory=dict)
    privacy: dict[str, RoundPrivacy] = field(default_factory=dict)
    releases: list[ReleaseRow] = field(default_factory=list)
    """The round's statistic releases in order (set-up releases are in round 0)."""

    @property
    def bytes_total(self) -> int:
        return sum(self.bytes.values())

    @property
    def dp_epsilon(self) -> float | None:
        """DP-SGD's largest client ε after this round (``None`` without DP-SGD)."""
        model = self.privacy.get("model")
        return None if model is None else model.epsilon


@dataclass(frozen=True)
class Checkpoint:
    """Serialised state after ``round`` (bytes from the runtime, opaque to the store)."""

    round: int
    model: bytes
    algorithm: bytes
    selection: bytes
    clients: Mapping[int, bytes] = field(default_factory=dict)
    """Client states changed in this round only; the store keeps the latest of each client."""
    privacy: bytes = b""
    """The run's privacy accounting (ledger of noisy releases), empty without DP."""


def _finite_or_none(value: float | None) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


class RunStore:
    """Access to one workspace's SQLite file; one writer at a time, readers any time (WAL)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        with self._transaction() as db:
            db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            found = SCHEMA_VERSION if row is None else int(row["value"])
            if found <= SCHEMA_VERSION:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                self._migrate(db)
                db.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        if found > SCHEMA_VERSION:
            raise StoreError(f"{self.path} has schema {found}, newer than this secure-fl ({SCHEMA_VERSION})")

    @staticmethod
    def _migrate(db: sqlite3.Connection) -> None:
        """Bring an older file to this schema: new tables (schema 3's ``round_releases``) come from
        ``_SCHEMA``; schema 1 lacks one column."""
        columns = {r["name"] for r in db.execute("PRAGMA table_info(checkpoints)")}
        if "privacy" not in columns:
            db.execute("ALTER TABLE checkpoints ADD COLUMN privacy BLOB")

    @classmethod
    def open_workspace(cls, workspace: str | os.PathLike[str] | None = None) -> RunStore:
        return cls(workspace_path(workspace) / DB_NAME)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # --- creating runs ------------------------------------------------------------------------

    def _new_id(self, table: str) -> str:
        while True:
            candidate = secrets.token_hex(4)
            if self._db.execute(f"SELECT 1 FROM {table} WHERE id = ?", (candidate,)).fetchone() is None:
                return candidate

    def create_batch(self, *, name: str, source: str, runs: Sequence[Mapping[str, Any]]) -> tuple[str, list[str]]:
        """Register an invocation's runs (each a dict with config, label and summary fields)."""
        now = time.time()
        with self._transaction() as db:
            batch_id = self._new_id("batches")
            db.execute("INSERT INTO batches VALUES (?, ?, ?, ?)", (batch_id, name, source, now))
            ids = []
            for position, run in enumerate(runs):
                run_id = self._new_id("runs")
                db.execute(
                    "INSERT INTO runs (id, batch_id, position, name, label, config, method, loss, protocol,"
                    " update_protocol, seed, rounds, rounds_done, status, device, created, updated)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 'pending', NULL, ?, ?)",
                    (run_id, batch_id, position, run["name"], run.get("label", ""),
                     json.dumps(run["config"], sort_keys=True), run["method"], run["loss"], run["protocol"],
                     run["update_protocol"], int(run["seed"]), int(run["rounds"]), now, now),
                )
                ids.append(run_id)
        return batch_id, ids

    # --- reading ------------------------------------------------------------------------------

    @staticmethod
    def _run_row(row: sqlite3.Row) -> RunRow:
        data = dict(row)
        data["config"] = json.loads(data["config"])
        return RunRow(**data)

    def run(self, run_id: str) -> RunRow:
        row = self._db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise StoreError(f"no run {run_id!r} in {self.path}")
        return self._run_row(row)

    def batch_runs(self, batch_id: str) -> list[RunRow]:
        rows = self._db.execute("SELECT * FROM runs WHERE batch_id = ? ORDER BY position", (batch_id,)).fetchall()
        return [self._run_row(r) for r in rows]

    def list_runs(self, *, limit: int | None = None) -> list[RunRow]:
        query = "SELECT * FROM runs ORDER BY created DESC, batch_id, position"
        rows = self._db.execute(query + (" LIMIT ?" if limit else ""), ((limit,) if limit else ())).fetchall()
        return [self._run_row(r) for r in rows]

    def rounds(self, run_id: str) -> list[RoundRow]:
        bytes_by_round: dict[int, dict[str, int]] = {}
        for row in self._db.execute(
            "SELECT round, statistic, bytes FROM round_bytes WHERE run_id = ? ORDER BY round, statistic", (run_id,)
        ):
            bytes_by_round.setdefault(row["round"], {})[row["statistic"]] = row["bytes"]
        metrics = self.round_metrics(run_id)
        privacy = self.round_privacy(run_id)
        releases: dict[int, list[ReleaseRow]] = {}
        for row in self._db.execute("SELECT * FROM round_releases WHERE run_id = ? ORDER BY round, seq", (run_id,)):
            releases.setdefault(row["round"], []).append(ReleaseRow(
                statistic=row["statistic"], protocol=row["protocol"], contributors=row["contributors"],
                dropouts=row["dropouts"], clipped=row["clipped"], bytes=row["bytes"]))
        out = []
        for row in self._db.execute("SELECT * FROM rounds WHERE run_id = ? ORDER BY round", (run_id,)):
            out.append(RoundRow(
                round=row["round"], accuracy=row["accuracy"], minority_accuracy=row["minority_accuracy"],
                auc=row["auc"], train_loss=row["train_loss"], test_loss=row["test_loss"],
                per_class_accuracy=json.loads(row["per_class"]), clients=json.loads(row["clients"]),
                clipped=row["clipped"], seconds=row["seconds"], bytes=bytes_by_round.get(row["round"], {}),
                metrics=metrics.get(row["round"], {}), privacy=privacy.get(row["round"], {}),
                releases=releases.get(row["round"], []),
            ))
        return out

    def round_metrics(self, run_id: str) -> dict[int, dict[str, float | None]]:
        """round → the method's metrics of that round (``Algorithm.round_metrics``)."""
        out: dict[int, dict[str, float | None]] = {}
        for row in self._db.execute(
            "SELECT round, name, value FROM round_metrics WHERE run_id = ? ORDER BY round, name", (run_id,)
        ):
            out.setdefault(row["round"], {})[row["name"]] = row["value"]
        return out

    def round_privacy(self, run_id: str) -> dict[int, dict[str, RoundPrivacy]]:
        """round → scope (``model``, a statistic name, ``run``) → privacy spent up to that round."""
        out: dict[int, dict[str, RoundPrivacy]] = {}
        for row in self._db.execute(
            "SELECT * FROM round_privacy WHERE run_id = ? ORDER BY round, name", (run_id,)
        ):
            out.setdefault(row["round"], {})[row["name"]] = RoundPrivacy(
                epsilon=row["epsilon"], delta=row["delta"], epsilon_mean=row["epsilon_mean"],
                releases=row["releases"],
            )
        return out

    def declarations(self, run_id: str) -> dict[str, dict[str, Any]]:
        rows = self._db.execute("SELECT name, declaration FROM statistics WHERE run_id = ? ORDER BY name", (run_id,))
        return {r["name"]: json.loads(r["declaration"]) for r in rows}

    def checkpoint(self, run_id: str) -> Checkpoint | None:
        row = self._db.execute("SELECT * FROM checkpoints WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            return None
        clients = {
            r["client"]: bytes(r["state"])
            for r in self._db.execute("SELECT client, state FROM client_states WHERE run_id = ?", (run_id,))
        }
        return Checkpoint(round=row["round"], model=bytes(row["model"]), algorithm=bytes(row["algorithm"]),
                          selection=bytes(row["selection"]), clients=clients,
                          privacy=bytes(row["privacy"]) if row["privacy"] is not None else b"")

    # --- writing ------------------------------------------------------------------------------

    def set_status(self, run_id: str, status: str, *, device: str | None = None) -> None:
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        with self._transaction() as db:
            db.execute("UPDATE runs SET status = ?, device = COALESCE(?, device), updated = ? WHERE id = ?",
                       (status, device, time.time(), run_id))

    def record_declarations(self, run_id: str, declarations: Mapping[str, Mapping[str, Any]]) -> None:
        with self._transaction() as db:
            for name, declaration in declarations.items():
                db.execute("INSERT OR REPLACE INTO statistics VALUES (?, ?, ?)",
                           (run_id, name, json.dumps(declaration, sort_keys=True)))

    def record_round(self, run_id: str, row: RoundRow, checkpoint: Checkpoint,
                     declarations: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """Metrics, bytes and checkpoint of one finished round, atomically."""
        if checkpoint.round != row.round:
            raise ValueError(f"checkpoint of round {checkpoint.round} stored with metrics of round {row.round}")
        per_class = [_finite_or_none(v) for v in row.per_class_accuracy]
        with self._transaction() as db:
            done = db.execute("SELECT rounds_done FROM runs WHERE id = ?", (run_id,)).fetchone()
            if done is None:
                raise StoreError(f"no run {run_id!r} in {self.path}")
            if done["rounds_done"] != row.round:
                raise StoreError(f"run {run_id} has {done['rounds_done']} rounds stored; cannot store round {row.round}")
            db.execute(
                "INSERT INTO rounds VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, row.round, _finite_or_none(row.accuracy), _finite_or_none(row.minority_accuracy),
                 _finite_or_none(row.auc), _finite_or_none(row.train_loss), _finite_or_none(row.test_loss),
                 json.dumps(per_class), json.dumps(list(row.clients)), int(row.clipped), float(row.seconds)),
            )
            db.executemany("INSERT INTO round_bytes VALUES (?, ?, ?, ?)",
                           [(run_id, row.round, name, int(n)) for name, n in sorted(row.bytes.items())])
            db.executemany("INSERT INTO round_releases VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           [(run_id, row.round, seq, r.statistic, r.protocol, int(r.contributors), int(r.dropouts),
                             None if r.clipped is None else int(r.clipped), int(r.bytes))
                            for seq, r in enumerate(row.releases)])
            db.executemany("INSERT INTO round_metrics VALUES (?, ?, ?, ?)",
                           [(run_id, row.round, str(name), _finite_or_none(value))
                            for name, value in sorted(row.metrics.items())])
            db.executemany(
                "INSERT INTO round_privacy (run_id, round, name, epsilon, delta, epsilon_mean, releases)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(run_id, row.round, str(name), _finite_or_none(p.epsilon), float(p.delta),
                  _finite_or_none(p.epsilon_mean), int(p.releases)) for name, p in sorted(row.privacy.items())],
            )
            db.execute(
                "INSERT OR REPLACE INTO checkpoints (run_id, round, model, algorithm, selection, privacy)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, checkpoint.round, checkpoint.model, checkpoint.algorithm, checkpoint.selection,
                 checkpoint.privacy or None),
            )
            db.executemany("INSERT OR REPLACE INTO client_states VALUES (?, ?, ?)",
                           [(run_id, int(c), state) for c, state in sorted(checkpoint.clients.items())])
            for name, declaration in (declarations or {}).items():
                db.execute("INSERT OR REPLACE INTO statistics VALUES (?, ?, ?)",
                           (run_id, name, json.dumps(declaration, sort_keys=True)))
            db.execute("UPDATE runs SET rounds_done = ?, status = 'running', updated = ? WHERE id = ?",
                       (row.round + 1, time.time(), run_id))

    def drop_state(self, run_id: str) -> None:
        """Forget a finished run's checkpoint and client states (metrics stay)."""
        with self._transaction() as db:
            db.execute("DELETE FROM checkpoints WHERE run_id = ?", (run_id,))
            db.execute("DELETE FROM client_states WHERE run_id = ?", (run_id,))
