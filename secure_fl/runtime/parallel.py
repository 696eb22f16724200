"""A batch's runs in worker processes (``secure-fl run --jobs N``).

The runs of one config are independent experiments, so a machine with more cores than one run
uses can run several at once. Each worker is a fresh (``spawn``) interpreter that opens the
batch's store itself, loads its run's dataset and plays the run with the same executor as the
sequential path; nothing but the store's path, the run's id and its config (plain data) crosses
into it, and only its exit status comes back: rounds, checkpoints and summaries go through the
store (SQLite in WAL mode, so runs write their rounds side by side). A run is therefore the same
experiment, to the bit, whichever path or worker plays it with the same number of torch threads,
and ``--resume`` continues a parallel batch like any other.

Why processes and not threads: training holds the GIL between torch calls, and the protocols'
Python work is most of a round's time in the statistics-heavy configs.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from secure_fl.config import RunConfig
    from secure_fl.runtime.runner import Executor, RunObserver
    from secure_fl.store import RunRow

__all__ = ["RunFailedError", "Workers"]

log = logging.getLogger("secure_fl.run")


@dataclass(frozen=True, kw_only=True)
class Workers:
    """How many runs play at once, and what each worker process sets up first.

    ``setup`` and ``observer`` cross into the workers, so they must be picklable (module-level
    functions, or ``functools.partial`` of them): the CLI passes its logging set-up and a
    progress observer that writes one line per round."""

    count: int
    threads: int
    """torch intra-op threads in each worker."""
    setup: Callable[[], None] | None = None
    observer: Callable[[], RunObserver] | None = None

    def __post_init__(self) -> None:
        for name in ("count", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"workers: {name} must be a positive integer, got {value!r}")


class RunFailedError(RuntimeError):
    """A run played in a worker failed (its reason is in the store and was logged by the worker)."""


STOP_WAIT = 30.0
"""Seconds a worker gets, after its own SIGINT, to mark its run interrupted before it is terminated."""


def run_in_workers(runs: Sequence[tuple[int, RunRow, RunConfig]], *, total: int, store_path: str, device: str,
                   workers: Workers, executor: Executor | None,
                   on_failure: Literal["raise", "continue", "stop"]) -> None:
    """Play ``runs`` (the batch's unfinished runs: position in the batch of ``total``, stored row,
    config) ``workers.count`` at a time, one process per run; returns when every started run has
    ended. A failed run is marked in the store and logged by its worker; ``on_failure``: the others
    go on (``continue``), or runs not started yet stay pending (``stop``; ``raise`` then raises
    :class:`RunFailedError` for the first failure). On Ctrl-C (any exception here) the workers get
    SIGINT, so that each marks its run interrupted as the sequential path does, and are waited for
    (terminated after :data:`STOP_WAIT` seconds); then the exception propagates."""
    context = multiprocessing.get_context("spawn")
    queue = list(runs)
    running: dict[str, BaseProcess] = {}
    failed: list[str] = []
    try:
        while queue or running:
            while queue and len(running) < workers.count and not (failed and on_failure != "continue"):
                position, row, config = queue.pop(0)
                process = context.Process(target=_play, name=f"secure-fl run {row.id}", daemon=False,
                                          args=(store_path, row.id, config.to_dict(), position, total, device,
                                                workers, executor))
                process.start()
                running[row.id] = process
            if not running:
                break
            wait([worker.sentinel for worker in running.values()])
            for run_id, worker in list(running.items()):
                if worker.exitcode is not None:
                    worker.join()
                    del running[run_id]
                    if worker.exitcode != 0:
                        failed.append(run_id)
    except BaseException:
        _stop(list(running.values()))
        raise
    if failed and on_failure == "raise":
        raise RunFailedError(f"run {failed[0]} failed (its reason: `secure-fl runs`); "
                             f"{len(failed)} of {len(runs)} runs played here failed")


def _stop(processes: Sequence[BaseProcess]) -> None:
    """Interrupt the workers like the sequential path's Ctrl-C, and never leave one behind. A
    terminal's Ctrl-C reached them already; they take only the first SIGINT (:func:`_interrupt_once`)."""
    for process in processes:
        if process.exitcode is None and process.pid is not None:
            os.kill(process.pid, signal.SIGINT)
    wait([p.sentinel for p in processes], timeout=STOP_WAIT)
    for process in processes:
        if process.exitcode is None:
            process.terminate()
        process.join()


def _play(store_path: str, run_id: str, config: dict[str, Any], position: int, total: int, device: str,
          workers: Workers, executor: Executor | None) -> None:
    """One run in its worker process (its own store connection, dataset and torch threads); the
    exit status says whether it finished (0), failed (1) or was interrupted (130)."""
    signal.signal(signal.SIGINT, _interrupt_once)
    if workers.setup is not None:
        workers.setup()
    import torch

    from secure_fl.config import RunConfig
    from secure_fl.device import configure_threads
    from secure_fl.runtime.runner import describe_error, execute_run
    from secure_fl.store import RunStore

    try:
        configure_threads(workers.threads)
        observer = workers.observer() if workers.observer is not None else None
        with RunStore(store_path) as store:
            (executor or execute_run)(store, run_id, RunConfig.from_dict(config), device=torch.device(device),
                                      observer=observer, position=position, total=total)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as error:  # marked failed in the store by execute_run; one line here, as in turn
        log.error("run %s (%d/%d) failed: %s", run_id, position + 1, total, describe_error(error))
        log.debug("traceback of run %s", run_id, exc_info=True)
        sys.exit(1)


def _interrupt_once(signum: int, frame: object) -> None:
    """A worker's Ctrl-C: one KeyboardInterrupt (the terminal's and the command's forward may both
    arrive; a second must not interrupt the run being marked interrupted)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt
