"""How close a masking client runs to the PRG bound, and the work behind it.

A SecAgg/SecAgg+ client with ``n`` neighbours expands ``n + 1`` masks (one per neighbour
and its self mask) of ``d`` words each. Whatever else it does, it cannot be faster than
generating those ``(n + 1) * d * word`` bytes of AES-128-CTR keystream; this module
measures that bound with pyca/cryptography's CTR encryptor (``update_into`` a reused buffer)
and our client's ``upload`` stage (X25519 agreement, HKDF, expansion, masking, serialisation),
interleaved in this process: one bound repeat after each client's upload. Since masks of
2 MiB and more are made by OpenSSL's GCM encryptor (the same keystream, ~1/3 faster on a CPU
with VAES; :mod:`protocols.primitives.prg`), the CTR figure is a reference rather than a floor
there: the client's keystream alone takes ~3/4 of it.

    PYTHONPATH=. python bench/masking_bound.py [--neighbours 100] [--length 1000000]

``--active`` instead measures a masking client's whole per-run work against an active server
(:func:`active_work`): the active-server client of this tree vs the default client of the
tree at ``--baseline`` (a git commit), interleaved run by run in this process.

    PYTHONPATH=. python bench/masking_bound.py --active [--repeats 3] [--baseline COMMIT]
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchmarks import _harness as h

from protocols import SERVER, make_sum
from protocols.masking import word_dtype


def keystream_seconds(streams: int, nbytes: int, *, repeats: int = 3) -> list[float]:
    """Seconds to produce ``streams`` AES-128-CTR keystreams of ``nbytes`` into one reused buffer."""
    zeros = bytes(nbytes)
    out = bytearray(nbytes + 16)
    keys = [os.urandom(16) for _ in range(streams)]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for key in keys:
            cipher = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
            cipher.update_into(zeros, out)
        times.append(time.perf_counter() - t0)
    return times


def client_upload_seconds(neighbours: int, length: int, *, sample: int = 5,
                          protocol: str = "masking", bound_repeats: int = 0) -> dict[str, Any]:
    """Our masking clients' ``upload`` stage on the complete graph of ``neighbours + 1`` clients.

    Drives one run, its parties built through the client and server sessions, to the upload
    stage (key advertisement and sharing are not timed), then lets ``sample`` clients upload,
    each timed by the protocol itself (``Party.timings``). With ``bound_repeats``, each upload
    is followed by that many repeats of the PRG bound (:func:`keystream_seconds`) over the
    same bytes, so both see the same machine load.
    """
    clients = neighbours + 1
    session = make_sum(protocol, clients=list(range(clients)))
    spec = h.spec_for(clients, length)
    encoded = h.encoded_inputs(spec, clients)
    word_bytes = word_dtype(spec.slot_bits).itemsize
    run = h.Run(session, spec, encoded, run_id=os.urandom(16))
    times: list[float] = []
    bound: list[float] = []
    while run.next_event is not None and len(times) < sample:
        event, changed = run.step()
        if event.party != SERVER and "upload" in changed:
            times.append(changed["upload"])
            if bound_repeats:
                bound.extend(keystream_seconds(clients, length * word_bytes, repeats=bound_repeats))
    if not times:
        raise RuntimeError("no client uploaded")
    return {"times": times, "bound": bound, "word_bytes": word_bytes, "clients": clients}


def measure(neighbours: int = 100, length: int = 1_000_000, *, sample: int = 9) -> dict[str, Any]:
    """The ``masking-bound`` case: ``sample`` client uploads, each followed by one PRG-bound
    repeat (interleaved); the ratio of medians, and of minima in ``detail``."""
    ours = client_upload_seconds(neighbours, length, sample=sample, bound_repeats=1)
    nbytes = length * ours["word_bytes"]
    bound = ours["bound"]
    ours_median = statistics.median(ours["times"])
    bound_median = statistics.median(bound)
    return {
        "case": "masking-bound",
        "ours": ours_median,
        "peer": bound_median,
        "ratio": ours_median / bound_median,
        "unit": "seconds",
        "detail": {
            "neighbours": neighbours, "length": length, "word_bytes": ours["word_bytes"],
            "keystream_bytes": (neighbours + 1) * nbytes, "sample": len(ours["times"]),
            "ours_min": min(ours["times"]), "peer_min": min(bound),
            "ratio_of_minima": min(ours["times"]) / min(bound),
            "fraction_of_bound": bound_median / ours_median,
            "peer_is": "AES-128-CTR keystream of the same bytes (cryptography, update_into a reused buffer)",
            "interleaved": "one bound repeat after each timed upload",
            "keystream_gb_per_s": (neighbours + 1) * nbytes / min(bound) / 1e9,
            "load_average": os.getloadavg(),
        },
    }


# --- the active-server setting's cost: whole per-run client work ------------------------------

BASELINE = "f73d5a9"
"""The commit before the masking client's issue-22 speed work: its default (non-active) client
is the reference the active-server client is held to (``active <= 1.10 x default``)."""

ROOT = Path(__file__).resolve().parent.parent


def _take_protocols() -> dict[str, ModuleType]:
    """Remove and return every ``protocols`` module from ``sys.modules``."""
    names = [name for name in sys.modules if name == "protocols" or name.startswith("protocols.")]
    return {name: sys.modules.pop(name) for name in names}


def package_at(commit: str, root: Path = ROOT) -> dict[str, ModuleType]:
    """The ``protocols`` package as it was at ``commit`` (``git archive``), imported into its own
    set of modules (this process's ``protocols`` stays as it is; see :func:`using`)."""
    target = Path(tempfile.mkdtemp(prefix="masking-baseline-"))
    atexit.register(shutil.rmtree, target, ignore_errors=True)  # kept till then: lazy imports read it
    archive = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", commit, "protocols"],
                             check=True, capture_output=True).stdout
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    current = _take_protocols()
    sys.path.insert(0, str(target))
    try:
        importlib.import_module("protocols")
        importlib.import_module("protocols.masking")
        return _take_protocols()
    finally:
        sys.path.remove(str(target))
        sys.modules.update(current)


@contextmanager
def using(modules: dict[str, ModuleType]) -> Iterator[ModuleType]:
    """Within: ``protocols`` (and what it imports lazily, by name) is the package in ``modules``."""
    current = _take_protocols()
    sys.modules.update(modules)
    try:
        yield modules["protocols"]
    finally:
        modules.update(_take_protocols())  # keep what it imported meanwhile
        sys.modules.update(current)


def _harness_of(modules: dict[str, ModuleType]) -> ModuleType:
    """A copy of the asv harness (``benchmarks/_harness.py``) bound to the package in ``modules``."""
    path = Path(__file__).resolve().parent / "benchmarks" / "_harness.py"
    with using(modules):
        spec = importlib.util.spec_from_file_location("_harness_" + str(id(modules)), path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up by name
        spec.loader.exec_module(module)
    return module


class _Timed:
    """One masking run, stepped event by event (the asv harness's :class:`Run`), whose client
    parties' work is timed: the wall time of every call into a party (``start`` and each
    ``receive``: parsing, checks, signatures, shares, masking), summed per client."""

    def __init__(self, modules: dict[str, ModuleType], harness: ModuleType, clients: int, length: int, *,
                 active: bool) -> None:
        self.modules = modules
        self.spent: dict[int, float] = {}
        self.by_stage: dict[str, dict[int, float]] = {}
        self.timings: dict[int, float] = {}
        with using(modules) as package:
            self.client_class = modules["protocols.masking.client"].MaskingClient
            session = package.make_sum("masking", clients=list(range(clients)), active_server=active)
            spec = harness.spec_for(clients, length)
            self.run = harness.Run(session, spec, harness.encoded_inputs(spec, clients), run_id=os.urandom(16))

    @contextmanager
    def _timing(self) -> Iterator[None]:
        originals = {name: self.client_class.__dict__[name] for name in ("start", "receive")}
        spent, timings, by_stage = self.spent, self.timings, self.by_stage

        def timed(method: Any) -> Any:
            def call(party: Any, *args: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return method(party, *args)
                finally:
                    seconds = time.perf_counter() - t0
                    pid = party.party_id
                    spent[pid] = spent.get(pid, 0.0) + seconds
                    stage = by_stage.setdefault(f"stage {args[0].stage}" if args else "start", {})
                    stage[pid] = stage.get(pid, 0.0) + seconds
                    timings[pid] = sum(party.timings.values())
            return call

        for name, method in originals.items():
            setattr(self.client_class, name, timed(method))
        try:
            yield
        finally:
            for name, method in originals.items():
                setattr(self.client_class, name, method)

    @property
    def done(self) -> bool:
        return self.run.next_event is None

    def step(self) -> None:
        with using(self.modules), self._timing():
            self.run.step()


def active_work(clients: int = 101, length: int = 1_000_000, *, repeats: int = 3,
                baseline: str = BASELINE, reference: bool = False) -> dict[str, Any]:
    """The ``masking-active`` case: per-run work of one masking client (median over the run's
    clients) with ``active_server=True`` on this tree, vs the default client at ``baseline``.

    The two runs (and, for reference, this tree's default client) are stepped alternately one
    event at a time, so each client's calls of one run meet the same machine load as the other
    runs' matching calls; ``repeats`` fresh triples of runs. The ratio is of the medians over
    runs; ``ratio_of_minima`` in ``detail``. ``reference`` adds this tree's default client to the
    rotation (a third run alive at once: ~1.2 GB more at d = 1e6).
    """
    old = package_at(baseline)
    ours = {name: module for name, module in sys.modules.items()
            if name == "protocols" or name.startswith("protocols.")}
    harnesses = {"baseline_default": _harness_of(old), "active": h, "default": h}
    packages = {"baseline_default": old, "active": ours, **({"default": ours} if reference else {})}
    runs: dict[str, list[float]] = {kind: [] for kind in packages}
    stages: dict[str, list[float]] = {kind: [] for kind in packages}
    per_stage: dict[str, dict[str, list[float]]] = {kind: {} for kind in packages}
    paired: list[float] = []
    for _ in range(repeats):
        timed = {kind: _Timed(packages[kind], harnesses[kind], clients, length, active=kind == "active")
                 for kind in packages}
        while not all(t.done for t in timed.values()):
            for t in timed.values():
                if not t.done:
                    t.step()
        for kind, t in timed.items():
            if len(t.spent) != clients:
                raise RuntimeError(f"{kind}: {len(t.spent)} of {clients} clients took part")
            runs[kind].append(statistics.median(t.spent.values()))
            stages[kind].append(statistics.median(t.timings.values()))
            for stage, spent in t.by_stage.items():
                per_stage[kind].setdefault(stage, []).append(statistics.median(spent.values()))
        paired.extend(timed["active"].spent[pid] / timed["baseline_default"].spent[pid]
                      for pid in timed["active"].spent)
        del timed
    peer = statistics.median(runs["baseline_default"])
    active = statistics.median(runs["active"])
    return {
        "case": "masking-active",
        "ours": active,
        "peer": peer,
        "ratio": active / peer,
        "unit": "seconds",
        "detail": {
            "clients": clients, "length": length, "repeats": repeats, "baseline": baseline,
            "ours_is": "active-server client (this tree): per-run work, median over the run's clients",
            "peer_is": f"default client at {baseline}: per-run work, median over the run's clients",
            "work_is": "wall time of every call into the client's party (start, each receive)",
            "interleaved": "the runs stepped alternately, one event each",
            "runs_seconds": runs,
            "ratio_of_minima": min(runs["active"]) / min(runs["baseline_default"]),
            "paired_ratio_median": statistics.median(paired),
            "paired_is": "each client's active work over the same client id's baseline work in the same "
                         "(interleaved) repeat",
            "stage_medians_seconds": {kind: {stage: statistics.median(v) for stage, v in sorted(stages_.items())}
                                      for kind, stages_ in per_stage.items()},
            **({"default_vs_baseline": statistics.median(runs["default"]) / peer} if reference else {}),
            "party_timings_sum": {kind: statistics.median(v) for kind, v in stages.items()},
            "load_average": os.getloadavg(),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--neighbours", type=int, default=100)
    parser.add_argument("--length", type=int, default=1_000_000)
    parser.add_argument("--sample", type=int, default=9)
    parser.add_argument("--active", action="store_true", help="the active-server per-run work case")
    parser.add_argument("--repeats", type=int, default=3, help="--active: runs of each kind")
    parser.add_argument("--baseline", default=BASELINE, help="--active: the reference commit")
    parser.add_argument("--reference", action="store_true", help="--active: this tree's default client too")
    args = parser.parse_args()
    if args.active:
        print(json.dumps(active_work(args.neighbours + 1, args.length, repeats=args.repeats,
                                     baseline=args.baseline, reference=args.reference)))
    else:
        print(json.dumps(measure(args.neighbours, args.length, sample=args.sample)))


if __name__ == "__main__":
    main()
