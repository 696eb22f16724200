"""The embedded federated runtime: rounds of select → broadcast → local training →
(secure) aggregation → evaluation → store, in one process, deterministic from a seed.

* :class:`Simulation` — one run's live state and its rounds (:mod:`.simulation`);
* :func:`build_simulation` — from a :class:`~secure_fl.config.RunConfig` (:mod:`.build`);
* :func:`run_experiment` / :func:`execute_run` / :func:`summarize` — runs in turn, written to
  the :class:`~secure_fl.store.RunStore` round by round, resumable (:mod:`.runner`), or several at
  once in worker processes (:class:`Workers`, :mod:`.parallel`);
* :data:`SELECTION_STRATEGIES` — client selection by name (from :mod:`secure_fl.selection`);
* :class:`Seeds` — every random draw keyed by (stream, round, client) (:mod:`.rng`).
"""

from secure_fl.runtime.build import (
    build_simulation,
    client_data,
    load_run_dataset,
    local_training,
    prepare_partition,
)
from secure_fl.runtime.parallel import Workers
from secure_fl.runtime.rng import Seeds
from secure_fl.runtime.runner import RunObserver, RunSummary, execute_run, run_experiment, summarize
from secure_fl.runtime.simulation import RoundResult, Simulation, dump_state, load_state
from secure_fl.selection.basic import RandomSelection
from secure_fl.selection.strategy import (
    SELECTION_STRATEGIES,
    SelectionContext,
    SelectionStrategy,
    make_selection,
    register_selection,
    selection_class,
)

__all__ = [
    "SELECTION_STRATEGIES",
    "RandomSelection",
    "RoundResult",
    "RunObserver",
    "RunSummary",
    "Seeds",
    "SelectionContext",
    "SelectionStrategy",
    "Simulation",
    "Workers",
    "build_simulation",
    "client_data",
    "dump_state",
    "execute_run",
    "load_run_dataset",
    "load_state",
    "local_training",
    "make_selection",
    "prepare_partition",
    "register_selection",
    "run_experiment",
    "selection_class",
    "summarize",
]
