"""The store is robust: corrupt, foreign, locked, newer-schema and read-only files give one
StoreError naming the file and are never written; older schemas migrate (schema 4: runs.error,
round_releases.entries; 5: round_stage_bytes) or are read as they are when opened read-only."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

import pytest

from secure_fl.store import (
    DB_NAME,
    SCHEMA_VERSION,
    Checkpoint,
    ReleaseRow,
    RoundRow,
    RunStore,
    StoreError,
)

from .test_store import checkpoint, describe, row


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_corrupt_file_is_refused_by_name_and_never_written(tmp_path: Path) -> None:
    path = tmp_path / DB_NAME
    path.write_bytes(b"this is not a database " * 200)
    before = digest(path)
    for open_ in (RunStore, RunStore.open_readonly):
        with pytest.raises(StoreError, match=f"{path} is not a readable secure-fl run store"):
            open_(path)
    assert digest(path) == before


def test_another_sqlite_file_is_not_taken_for_a_store(tmp_path: Path) -> None:
    path = tmp_path / DB_NAME
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE notes (text TEXT)")
    con.commit()
    con.close()
    before = digest(path)
    with pytest.raises(StoreError, match="not a secure-fl run store"):
        RunStore(path)
    assert digest(path) == before


def test_a_newer_schema_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    path = tmp_path / DB_NAME
    RunStore(path).close()
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=DELETE")  # no WAL: the file alone holds everything
    con.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
    con.commit()
    con.close()
    before = digest(path)
    for open_ in (RunStore, RunStore.open_readonly):
        with pytest.raises(StoreError, match=rf"{path} has schema 99, newer than this secure-fl's \({SCHEMA_VERSION}\)"):
            open_(path)
    assert digest(path) == before  # not even switched to WAL


def test_a_locked_store_is_one_error_after_the_timeout(tmp_path: Path) -> None:
    path = tmp_path / DB_NAME
    RunStore(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreError, match=f"{path} is locked by another process"):
            RunStore(path, timeout=0.05)
        with RunStore.open_readonly(path) as reader:  # WAL: readers never wait for the writer
            assert reader.list_runs() == []
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_read_only_opening_reads_and_never_writes(tmp_path: Path) -> None:
    path = tmp_path / DB_NAME
    with RunStore(path) as store:
        _, (run_id,) = store.create_batch(name="t", source="-", runs=[describe()])
        store.record_round(run_id, row(0), checkpoint(0))
    before = digest(path)
    with RunStore.open_readonly(path) as reader:
        assert reader.run(run_id).rounds_done == 1 and len(reader.rounds(run_id)) == 1
        with pytest.raises(StoreError, match="open read-only"):
            reader.set_status(run_id, "done")
    assert digest(path) == before
    with pytest.raises(StoreError, match="no run store at"):
        RunStore.open_readonly(tmp_path / "none" / DB_NAME)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes read-only files")
def test_a_read_only_folder_is_listed_but_not_written(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    with RunStore(folder / DB_NAME) as store:
        store.create_batch(name="t", source="-", runs=[describe()])
    os.chmod(folder / DB_NAME, 0o444)
    os.chmod(folder, 0o555)
    try:
        with RunStore.open_readonly(folder / DB_NAME) as reader:
            assert len(reader.list_runs()) == 1
        with pytest.raises(StoreError, match="read-only"):
            RunStore(folder / DB_NAME)
    finally:
        os.chmod(folder, 0o755)
        os.chmod(folder / DB_NAME, 0o644)


SCHEMA_3 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta VALUES ('schema', '3');
CREATE TABLE batches (id TEXT PRIMARY KEY, name TEXT NOT NULL, source TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE runs (id TEXT PRIMARY KEY, batch_id TEXT NOT NULL, position INTEGER NOT NULL, name TEXT NOT NULL,
    label TEXT NOT NULL, config TEXT NOT NULL, method TEXT NOT NULL, loss TEXT NOT NULL, protocol TEXT NOT NULL,
    update_protocol TEXT NOT NULL, seed INTEGER NOT NULL, rounds INTEGER NOT NULL,
    rounds_done INTEGER NOT NULL DEFAULT 0, status TEXT NOT NULL, device TEXT, created REAL NOT NULL,
    updated REAL NOT NULL);
CREATE TABLE rounds (run_id TEXT NOT NULL, round INTEGER NOT NULL, accuracy REAL, minority_accuracy REAL, auc REAL,
    train_loss REAL, test_loss REAL, per_class TEXT NOT NULL, clients TEXT NOT NULL,
    clipped INTEGER NOT NULL DEFAULT 0, seconds REAL NOT NULL, PRIMARY KEY (run_id, round));
CREATE TABLE round_releases (run_id TEXT NOT NULL, round INTEGER NOT NULL, seq INTEGER NOT NULL,
    statistic TEXT NOT NULL, protocol TEXT NOT NULL, contributors INTEGER NOT NULL, dropouts INTEGER NOT NULL,
    clipped INTEGER, bytes INTEGER NOT NULL, PRIMARY KEY (run_id, round, seq));
INSERT INTO batches VALUES ('b1', 'old', 'old.toml', 0);
INSERT INTO runs VALUES ('r1', 'b1', 0, 'old', '', '{}', 'fedavg', 'ce', 'plain', 'clear', 0, 2, 1, 'failed',
                         'cpu', 0, 0);
INSERT INTO rounds VALUES ('r1', 0, 0.5, NULL, 0.7, 1.0, 1.1, '[0.5]', '[0, 1]', 3, 0.1);
INSERT INTO round_releases VALUES ('r1', 0, 0, 'total_samples', 'paillier', 2, 0, 0, 1000);
"""


def schema_3(path: Path) -> None:
    con = sqlite3.connect(path)
    con.executescript(SCHEMA_3)
    con.commit()
    con.close()


def test_an_older_schema_is_read_as_it_is_read_only_and_migrated_writable(tmp_path: Path) -> None:
    path = tmp_path / DB_NAME
    schema_3(path)
    before = digest(path)
    with RunStore.open_readonly(path) as reader:  # tables and columns of later schemas are simply absent
        assert reader.schema == 3
        run = reader.run("r1")
        assert run.status == "failed" and run.error is None
        (round_,) = reader.rounds("r1")
        assert round_.releases == [ReleaseRow("total_samples", "paillier", 2, 0, 0, 1000, entries=None)]
        assert round_.metrics == {} and round_.privacy == {} and reader.checkpoint("r1") is None
    assert digest(path) == before
    with RunStore(path) as store:
        assert store.schema == SCHEMA_VERSION
        store.set_status("r1", "failed", error="ValueError: boom")
        assert store.run("r1").error == "ValueError: boom"
        assert store.rounds("r1")[0].releases[0].entries is None
    con = sqlite3.connect(path)
    try:
        assert con.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0] == str(SCHEMA_VERSION)
        assert "entries" in {r[1] for r in con.execute("PRAGMA table_info(round_releases)")}
    finally:
        con.close()


def test_a_failure_reason_and_release_entries_round_trip(tmp_path: Path) -> None:
    with RunStore(tmp_path / DB_NAME) as store:
        _, (run_id,) = store.create_batch(name="t", source="-", runs=[describe()])
        release = ReleaseRow("model_update", "masking", contributors=4, dropouts=0, clipped=10, bytes=9, entries=50)
        assert release.values == 200
        stages = {"model_update": {"upload": 7, "unmasking": 2}, "setup": {"advertise_keys": 5}}
        store.record_round(run_id, RoundRow(**{**row(0).__dict__, "releases": [release], "stage_bytes": stages}),
                           Checkpoint(round=0, model=b"m", algorithm=b"a", selection=b"s"))
        assert store.rounds(run_id)[0].releases == [release]
        assert store.rounds(run_id)[0].stage_bytes == stages
        store.set_status(run_id, "failed", error="interrupted")
        assert store.run(run_id).status == "failed" and store.run(run_id).error == "interrupted"
        store.set_status(run_id, "running")  # resumed: the reason goes
        assert store.run(run_id).error is None
        with pytest.raises(ValueError, match="only a failed run"):
            store.set_status(run_id, "done", error="x")
