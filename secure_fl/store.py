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

Schema versions (``meta.schema``): 2 added ``round_metrics``, ``round_privacy`` and
``checkpoints.privacy``; 3 ``round_releases``; 4 ``runs.error`` (why a run failed) and
``round_releases.entries`` (entries per contributor, so a clipped fraction needs nothing
else); 5 (this version) ``round_stage_bytes`` (bytes per statistic and protocol stage). An older file is migrated in place when opened for writing, in one transaction
(tables and nullable columns added, nothing rewritten), so older runs stay readable and
resumable; opened read-only (:meth:`RunStore.open_readonly`, what ``secure-fl runs`` and
``secure-fl report`` use) it is read as it is, never changed.

Every failure to read or write the file is one :class:`StoreError` naming it: a file that is not
a run store (corrupt, or another SQLite file), one locked by another process for longer than
the timeout (``$SECURE_FL_STORE_TIMEOUT`` seconds, default 30), a read-only file or folder, a
schema newer than this code. Such a file is checked before anything is written to it, and never
written.
"""

from __future__ import annotations

import functools
import json
import math
import os
import secrets
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, Self, TypeVar

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
TIMEOUT_ENV = "SECURE_FL_STORE_TIMEOUT"
DEFAULT_WORKSPACE = "runs"
DB_NAME = "secure-fl.sqlite"
SCHEMA_VERSION = 5

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
    updated REAL NOT NULL,
    error TEXT
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
    bytes INTEGER NOT NULL, entries INTEGER,
    PRIMARY KEY (run_id, round, seq)
);
CREATE TABLE IF NOT EXISTS round_stage_bytes (
    run_id TEXT NOT NULL, round INTEGER NOT NULL, statistic TEXT NOT NULL, stage TEXT NOT NULL, bytes INTEGER NOT NULL,
    PRIMARY KEY (run_id, round, statistic, stage)
);
CREATE TABLE IF NOT EXISTS round_privacy (
    run_id TEXT NOT NULL, round INTEGER NOT NULL, name TEXT NOT NULL, epsilon REAL, delta REAL NOT NULL,
    epsilon_mean REAL, releases INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, round, name)
);
"""

STATUSES = ("pending", "running", "done", "failed")


class StoreError(RuntimeError):
    """The store cannot do what was asked (unknown run, a finished run resumed, a newer schema, a
    corrupt, locked or read-only file); the message names the file."""


P = ParamSpec("P")
R = TypeVar("R")


def _describe(path: Path, error: sqlite3.Error) -> str:
    """One line saying what went wrong with the file and what to do."""
    text = str(error)
    lowered = text.lower()
    if "locked" in lowered or "busy" in lowered:
        return (f"{path} is locked by another process (a run writing to it?); try again when it is done, "
                f"or wait longer with ${TIMEOUT_ENV}=SECONDS")
    if "not a database" in lowered or "malformed" in lowered or "corrupt" in lowered:
        return f"{path} is not a readable secure-fl run store ({text}); move it aside to start a new store"
    if "readonly" in lowered or "read-only" in lowered:
        return f"{path} is read-only ({text}); use a writable --workspace"
    if "unable to open" in lowered:
        return f"cannot open {path} ({text}); check that the folder exists and is readable"
    return f"{path}: {text}"


def _store_errors(method: Callable[P, R]) -> Callable[P, R]:
    """Turn SQLite's errors into one :class:`StoreError` naming the file."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except sqlite3.Error as error:
            store = args[0]
            assert isinstance(store, RunStore)
            raise StoreError(_describe(store.path, error)) from None

    return wrapper


def _timeout() -> float:
    text = os.environ.get(TIMEOUT_ENV)
    if not text:
        return 30.0
    try:
        value = float(text)
    except ValueError:
        raise StoreError(f"${TIMEOUT_ENV} must be a number of seconds, got {text!r}") from None
    if not (value >= 0 and math.isfinite(value)):
        raise StoreError(f"${TIMEOUT_ENV} must be a number of seconds >= 0, got {text!r}")
    return value


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
    error: str | None = None
    """Why the run failed (``status == "failed"``), one line; ``None`` otherwise."""


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
    entries: int | None = None
    """Entries of one contributor's vector (the declared length; ``None`` in stores before schema 4)."""

    @property
    def values(self) -> int | None:
        """Entries summed in all: entries × contributors (``None`` when entries is unknown)."""
        return None if self.entries is None else self.entries * self.contributors

    def as_dict(self) -> dict[str, Any]:
        return {"statistic": self.statistic, "protocol": self.protocol, "contributors": self.contributors,
                "dropouts": self.dropouts, "clipped": self.clipped, "bytes": self.bytes, "entries": self.entries}


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
    stage_bytes: dict[str, dict[str, int]] = field(default_factory=dict)
    """Bytes by statistic, then by protocol stage (``upload``, ``advertise_keys``, ...): ``bytes`` split
    further (empty in stores before schema 5)."""

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
    """Access to one workspace's SQLite file; one writer at a time, readers any time (WAL).

    ``RunStore(path)`` opens the file for writing (creating or migrating it);
    :meth:`open_readonly` for reading only — it never writes, so it works on a read-only file
    or folder and leaves an older schema as it is.
    """

    def __init__(self, path: str | os.PathLike[str], *, readonly: bool = False,
                 timeout: float | None = None) -> None:
        self.path = Path(path)
        self.readonly = readonly
        timeout = _timeout() if timeout is None else timeout
        if readonly:
            self._db = self._connect_readonly(timeout)
        else:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise StoreError(f"cannot create the workspace {self.path.parent}: "
                                 f"{error.strerror or error}") from None
            if self.path.exists() and not os.access(self.path, os.R_OK | os.W_OK):
                raise StoreError(f"{self.path} is read-only (or unreadable) for this user; use a writable "
                                 "--workspace (secure-fl runs and report read it as it is)")
            try:
                self._db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None)
            except sqlite3.Error as error:
                raise StoreError(_describe(self.path, error)) from None
        self._db.row_factory = sqlite3.Row
        try:
            self.schema = self._open(readonly)
        except StoreError:
            self._db.close()
            raise
        except sqlite3.Error as error:
            self._db.close()
            raise StoreError(_describe(self.path, error)) from None

    def _connect_readonly(self, timeout: float) -> sqlite3.Connection:
        if not self.path.is_file():
            raise StoreError(f"no run store at {self.path}")
        if not os.access(self.path, os.R_OK):
            raise StoreError(f"{self.path} is not readable by this user")
        uri = "file:" + urllib.parse.quote(str(self.path.resolve()))
        # WAL readers need the -shm file: where it cannot be made (a read-only folder), read the
        # file as immutable (a snapshot; nobody can be writing to a folder no one may write to)
        immutable = not os.access(self.path.parent, os.W_OK) or not os.access(self.path, os.W_OK)
        try:
            return sqlite3.connect(uri + ("?immutable=1" if immutable else "?mode=ro"), uri=True,
                                   timeout=timeout, isolation_level=None)
        except sqlite3.Error as error:
            raise StoreError(_describe(self.path, error)) from None

    def _open(self, readonly: bool) -> int:
        """Check the file before anything is written, then (writable) create or migrate it."""
        self._tables = {r["name"] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        found: int | None = None
        if self._tables:
            if "meta" not in self._tables:
                raise StoreError(f"{self.path} is an SQLite file but not a secure-fl run store (no schema "
                                 "version); move it aside or pick another --workspace")
            row = self._db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            try:
                found = int(row["value"]) if row is not None else None
            except ValueError:
                found = None
            if found is None:
                raise StoreError(f"{self.path} has no valid schema version; it is not a secure-fl run store")
            if found > SCHEMA_VERSION:
                raise StoreError(f"{self.path} has schema {found}, newer than this secure-fl's "
                                 f"({SCHEMA_VERSION}); use a newer secure-fl, or another --workspace")
        if readonly:
            if found is None:
                raise StoreError(f"{self.path} is empty: no run store yet")
            self._columns = {t: {r["name"] for r in self._db.execute(f"PRAGMA table_info({t})")}
                             for t in self._tables}
            return found
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        with self._transaction() as db:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            self._migrate(db)
            db.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        self._tables = {r["name"] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        self._columns = {t: {r["name"] for r in self._db.execute(f"PRAGMA table_info({t})")} for t in self._tables}
        return SCHEMA_VERSION

    @staticmethod
    def _migrate(db: sqlite3.Connection) -> None:
        """Bring an older file to this schema: new tables come from ``_SCHEMA``; new nullable
        columns are added here (schema 1: ``checkpoints.privacy``; schema 4: ``runs.error``,
        ``round_releases.entries``)."""
        for table, column, kind in (("checkpoints", "privacy", "BLOB"), ("runs", "error", "TEXT"),
                                    ("round_releases", "entries", "INTEGER")):
            columns = {r["name"] for r in db.execute(f"PRAGMA table_info({table})")}
            if column not in columns:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")

    @classmethod
    def open_workspace(cls, workspace: str | os.PathLike[str] | None = None) -> RunStore:
        return cls(workspace_path(workspace) / DB_NAME)

    @classmethod
    def open_readonly(cls, path: str | os.PathLike[str]) -> RunStore:
        """The store at ``path`` for reading only (never written, whatever its schema)."""
        return cls(path, readonly=True)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _has(self, table: str) -> bool:
        return table in self._tables

    def _column(self, table: str, column: str) -> bool:
        return column in self._columns.get(table, set())

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        if self.readonly:
            raise StoreError(f"{self.path} is open read-only; nothing can be written to it")
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

    @_store_errors
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

    def _rows(self, table: str, query: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """``query``'s rows, none when an older schema lacks ``table``."""
        return self._db.execute(query, tuple(params)).fetchall() if self._has(table) else []

    @staticmethod
    def _run_row(row: sqlite3.Row) -> RunRow:
        data = dict(row)
        data["config"] = json.loads(data["config"])
        return RunRow(**data)

    @_store_errors
    def run(self, run_id: str) -> RunRow:
        row = self._db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise StoreError(f"no run {run_id!r} in {self.path} (secure-fl runs lists the stored runs)")
        return self._run_row(row)

    @_store_errors
    def batch_runs(self, batch_id: str) -> list[RunRow]:
        rows = self._db.execute("SELECT * FROM runs WHERE batch_id = ? ORDER BY position", (batch_id,)).fetchall()
        return [self._run_row(r) for r in rows]

    @_store_errors
    def list_runs(self, *, limit: int | None = None) -> list[RunRow]:
        query = "SELECT * FROM runs ORDER BY created DESC, batch_id, position"
        rows = self._db.execute(query + (" LIMIT ?" if limit else ""), ((limit,) if limit else ())).fetchall()
        return [self._run_row(r) for r in rows]

    @_store_errors
    def rounds(self, run_id: str) -> list[RoundRow]:
        bytes_by_round: dict[int, dict[str, int]] = {}
        for row in self._rows(
            "round_bytes", "SELECT round, statistic, bytes FROM round_bytes WHERE run_id = ? ORDER BY round, statistic",
            (run_id,)
        ):
            bytes_by_round.setdefault(row["round"], {})[row["statistic"]] = row["bytes"]
        metrics = self.round_metrics(run_id)
        privacy = self.round_privacy(run_id)
        releases: dict[int, list[ReleaseRow]] = {}
        for row in self._rows("round_releases", "SELECT * FROM round_releases WHERE run_id = ? ORDER BY round, seq",
                              (run_id,)):
            releases.setdefault(row["round"], []).append(ReleaseRow(
                statistic=row["statistic"], protocol=row["protocol"], contributors=row["contributors"],
                dropouts=row["dropouts"], clipped=row["clipped"], bytes=row["bytes"],
                entries=row["entries"] if self._column("round_releases", "entries") else None))
        stages: dict[int, dict[str, dict[str, int]]] = {}
        for row in self._rows("round_stage_bytes", "SELECT round, statistic, stage, bytes FROM round_stage_bytes "
                              "WHERE run_id = ? ORDER BY round, statistic, stage", (run_id,)):
            stages.setdefault(row["round"], {}).setdefault(row["statistic"], {})[row["stage"]] = row["bytes"]
        out = []
        for row in self._db.execute("SELECT * FROM rounds WHERE run_id = ? ORDER BY round", (run_id,)):
            out.append(RoundRow(
                round=row["round"], accuracy=row["accuracy"], minority_accuracy=row["minority_accuracy"],
                auc=row["auc"], train_loss=row["train_loss"], test_loss=row["test_loss"],
                per_class_accuracy=json.loads(row["per_class"]), clients=json.loads(row["clients"]),
                clipped=row["clipped"], seconds=row["seconds"], bytes=bytes_by_round.get(row["round"], {}),
                metrics=metrics.get(row["round"], {}), privacy=privacy.get(row["round"], {}),
                releases=releases.get(row["round"], []), stage_bytes=stages.get(row["round"], {}),
            ))
        return out

    @_store_errors
    def round_metrics(self, run_id: str) -> dict[int, dict[str, float | None]]:
        """round → the method's metrics of that round (``Algorithm.round_metrics``)."""
        out: dict[int, dict[str, float | None]] = {}
        for row in self._rows(
            "round_metrics", "SELECT round, name, value FROM round_metrics WHERE run_id = ? ORDER BY round, name",
            (run_id,)
        ):
            out.setdefault(row["round"], {})[row["name"]] = row["value"]
        return out

    @_store_errors
    def round_privacy(self, run_id: str) -> dict[int, dict[str, RoundPrivacy]]:
        """round → scope (``model``, a statistic name, ``run``) → privacy spent up to that round."""
        out: dict[int, dict[str, RoundPrivacy]] = {}
        for row in self._rows(
            "round_privacy", "SELECT * FROM round_privacy WHERE run_id = ? ORDER BY round, name", (run_id,)
        ):
            out.setdefault(row["round"], {})[row["name"]] = RoundPrivacy(
                epsilon=row["epsilon"], delta=row["delta"], epsilon_mean=row["epsilon_mean"],
                releases=row["releases"],
            )
        return out

    @_store_errors
    def declarations(self, run_id: str) -> dict[str, dict[str, Any]]:
        rows = self._rows("statistics", "SELECT name, declaration FROM statistics WHERE run_id = ? ORDER BY name",
                          (run_id,))
        return {r["name"]: json.loads(r["declaration"]) for r in rows}

    @_store_errors
    def checkpoint(self, run_id: str) -> Checkpoint | None:
        if not self._has("checkpoints"):
            return None
        row = self._db.execute("SELECT * FROM checkpoints WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            return None
        clients = {
            r["client"]: bytes(r["state"])
            for r in self._rows("client_states", "SELECT client, state FROM client_states WHERE run_id = ?", (run_id,))
        }
        privacy = row["privacy"] if self._column("checkpoints", "privacy") else None
        return Checkpoint(round=row["round"], model=bytes(row["model"]), algorithm=bytes(row["algorithm"]),
                          selection=bytes(row["selection"]), clients=clients,
                          privacy=bytes(privacy) if privacy is not None else b"")

    # --- writing ------------------------------------------------------------------------------

    @_store_errors
    def set_status(self, run_id: str, status: str, *, device: str | None = None, error: str | None = None) -> None:
        """``status`` of a run; a failed run keeps ``error`` (why, one line), any other status clears it."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        if error is not None and status != "failed":
            raise ValueError("only a failed run has an error")
        with self._transaction() as db:
            db.execute("UPDATE runs SET status = ?, device = COALESCE(?, device), updated = ?, error = ? WHERE id = ?",
                       (status, device, time.time(), error, run_id))

    @_store_errors
    def record_declarations(self, run_id: str, declarations: Mapping[str, Mapping[str, Any]]) -> None:
        with self._transaction() as db:
            for name, declaration in declarations.items():
                db.execute("INSERT OR REPLACE INTO statistics VALUES (?, ?, ?)",
                           (run_id, name, json.dumps(declaration, sort_keys=True)))

    @_store_errors
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
            db.executemany("INSERT INTO round_stage_bytes VALUES (?, ?, ?, ?, ?)",
                           [(run_id, row.round, name, stage, int(n)) for name, by_stage in sorted(row.stage_bytes.items())
                            for stage, n in sorted(by_stage.items())])
            db.executemany("INSERT INTO round_releases (run_id, round, seq, statistic, protocol, contributors,"
                           " dropouts, clipped, bytes, entries) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           [(run_id, row.round, seq, r.statistic, r.protocol, int(r.contributors), int(r.dropouts),
                             None if r.clipped is None else int(r.clipped), int(r.bytes),
                             None if r.entries is None else int(r.entries))
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

    @_store_errors
    def drop_state(self, run_id: str) -> None:
        """Forget a finished run's checkpoint and client states (metrics stay)."""
        with self._transaction() as db:
            db.execute("DELETE FROM checkpoints WHERE run_id = ?", (run_id,))
            db.execute("DELETE FROM client_states WHERE run_id = ?", (run_id,))
