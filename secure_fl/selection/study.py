"""The selection study: ‖p_o − p_u‖₁ of many selections on one Dubhe population, without training.

:func:`run_study` builds a population with :func:`~secure_fl.selection.base.dubhe_population`,
registers it with the chosen strategy, selects ``repeats`` times and reports the mean and
standard deviation of ‖p_o − p_u‖₁, the full-participation baseline ‖p_g − p_u‖₁, random
selection on the same population (for the reduction), and — for Dubhe on Paillier — the
seconds and transcript bytes of every step. :func:`per_entry_registration` times the paper's
way of encrypting a registry (one python-paillier ciphertext per entry) in the same process.

Random streams (all from ``seed``, none of them key material): the population, the
registration (search tries), each repeat's selection, and each repeat's random comparison.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from phe import paillier as phe_paillier

from protocols import SERVER, Transcript
from protocols.paillier import PaillierClientSession, PaillierServerSession
from protocols.primitives import paillier as raw
from secure_fl.data.partition import DubheProfile

from .base import Population, Selector, dubhe_population
from .baselines import RandomSelector
from .dubhe import STATISTICS, DubheParams
from .dubhe_embedded import DubheSelector, PaillierBackend
from .registry import expected_participants

__all__ = ["StudyConfig", "per_entry_registration", "run_study", "server_view"]

POPULATION, REGISTRATION, SELECTION, RANDOM = 0, 1, 2, 3
"""Stream keys under the study seed."""


@dataclass(frozen=True, kw_only=True)
class StudyConfig:
    strategy: str = "dubhe"
    clients: int = 1000
    per_round: int = 20
    rho: float = 10.0
    emd: float = 1.5
    profile: DubheProfile = "dirichlet"
    """How clients mix classes (:func:`secure_fl.data.dubhe_partition`)."""
    classes: int = 10
    samples_per_class: int = 6000
    repeats: int = 100
    seed: int = 0
    dubhe: DubheParams = field(default_factory=DubheParams)
    per_entry_sample: int = 0
    """Dubhe on Paillier: time the per-entry registry on this many clients (0 = skip)."""

    def __post_init__(self) -> None:
        if self.strategy not in ("random", "greedy", "dubhe"):
            raise ValueError(f"unknown strategy {self.strategy!r}")
        if self.clients < 2 or self.repeats < 1 or self.classes < 2:
            raise ValueError("need at least 2 clients, 2 classes and 1 repeat")
        if not 1 <= self.per_round <= self.clients:
            raise ValueError(f"per_round must lie in [1, {self.clients}]")
        if self.per_entry_sample < 0:
            raise ValueError("per_entry_sample must be >= 0")

log = logging.getLogger("secure_fl.select")


def make_population(config: StudyConfig) -> Population:
    return dubhe_population(num_clients=config.clients, rho=config.rho, emd_avg=config.emd,
                            rng=np.random.default_rng([config.seed, POPULATION]), num_classes=config.classes,
                            samples_per_class=config.samples_per_class, profile=config.profile)


def build_selector(config: StudyConfig) -> Selector:
    if config.strategy == "dubhe":
        return DubheSelector(config.dubhe)
    if config.strategy == "greedy":
        from .baselines import GreedySelector

        return GreedySelector()
    return RandomSelector()


def server_view(transcript: Transcript) -> dict[str, int]:
    """What reached the server, by visibility (argmin answers counted apart as ``index``)."""
    out: dict[str, int] = {}
    for e in transcript:
        if e.receiver != SERVER:
            continue
        kind = "index" if e.stage == "argmin" and e.dimension == 1 else e.visibility.value
        out[kind] = out.get(kind, 0) + 1
    return out


def run_study(config: StudyConfig, *, population: Population | None = None,
              selector: Selector | None = None) -> dict[str, Any]:
    """Register, select ``repeats`` times, and report (one JSON-able dict)."""
    pop = population if population is not None else make_population(config)
    sel = selector if selector is not None else build_selector(config)
    start = time.perf_counter()
    log.info("select: registering %d clients with %s%s", pop.num_clients, config.strategy,
             " (key set-up, parameter search, registries)" if config.strategy == "dubhe" else "")
    sel.register(pop, np.random.default_rng([config.seed, REGISTRATION]), per_round=config.per_round)
    registered = time.perf_counter()
    log.info("select: registered in %.1f s; selecting %d clients %d times", registered - start, config.per_round,
             config.repeats)
    l1 = []
    sizes = []
    step = max(1, config.repeats // 10)
    for r in range(config.repeats):
        chosen = sel.select(config.per_round, np.random.default_rng([config.seed, SELECTION, r]), round=r)
        sizes.append(len(chosen))
        l1.append(pop.l1(chosen))
        if (r + 1) % step == 0 or r + 1 == config.repeats:
            log.info("select: %d/%d selections (%.1f s)", r + 1, config.repeats, time.perf_counter() - registered)
    selected = time.perf_counter()
    rand = RandomSelector()
    rand.register(pop, np.random.default_rng(0), per_round=config.per_round)
    random_l1 = [pop.l1(rand.select(config.per_round, np.random.default_rng([config.seed, RANDOM, r])))
                 for r in range(config.repeats)]
    l1_mean = float(np.mean(l1))
    random_mean = float(np.mean(random_l1))
    result: dict[str, Any] = {
        "strategy": config.strategy,
        "l1_mean": l1_mean,
        "l1_std": float(np.std(l1)),
        "baseline_l1": pop.baseline_l1(),
        "random_l1_mean": random_mean,
        "reduction_vs_random": 1.0 - l1_mean / random_mean if random_mean > 0 else 0.0,
        "clients": pop.num_clients,
        "per_round": config.per_round,
        "repeats": config.repeats,
        "rho": config.rho,
        "emd_avg": config.emd,
        "seed": config.seed,
        "selected_sizes": sorted(set(sizes)),
    }
    timings = sel.timings
    seconds: dict[str, float] = {
        "registration": timings.get("registration", 0.0),
        "selection": timings.get("selection", selected - registered),
        "selection_per_round": timings.get("selection", selected - registered) / config.repeats,
        "total": selected - start,
    }
    cpu_seconds = dict(sel.cpu_timings)
    nbytes: dict[str, int] = {"registration_total": sel.transcript.total_bytes()}  # greedy: clear counts
    if isinstance(sel, DubheSelector):
        assert sel.sigma is not None and sel.codebook is not None and sel.overall is not None
        seconds.update({key: timings.get(key, 0.0) for key in ("setup", "counts_upload", "search")})
        by_stat = sel.transcript.bytes_by_statistic()
        nbytes = {
            "registration_total": by_stat.get(STATISTICS["registry"], 0),
            "setup": by_stat.get(STATISTICS["setup"], 0),
            "counts_upload": by_stat.get(STATISTICS["counts"], 0),
            "search": by_stat.get(STATISTICS["search_registry"], 0) + by_stat.get(STATISTICS["search"], 0),
            "selection_total": by_stat.get(STATISTICS["selection"], 0),
        }
        nbytes["selection_per_round"] = nbytes["selection_total"] // config.repeats
        params = config.dubhe
        result["dubhe"] = {
            "protocol": params.protocol,
            "key_bits": params.key_bits if params.protocol == "paillier" else None,
            "tries": params.tries,
            "uploads": params.uploads,
            "reference_set": list(sel.codebook.reference_set),
            "registry_length": sel.codebook.length,
            "sigma": {str(i): v for i, v in sel.sigma.items()},
            "searched": params.sigma is None,
            "search": params.search if params.sigma is None else None,
            "search_steps": [{"candidates": len(cands), "chosen": {str(i): v for i, v in cands[index].items()}}
                             for cands, index in sel.search_log],
            "search_tries": params.search_tries if params.sigma is None else 0,
            "nonzero_categories": int(np.count_nonzero(sel.overall)),
            "expected_participants": expected_participants(sel.probabilities(config.per_round)),
        }
        if params.protocol == "paillier":
            result["server_received"] = server_view(sel.transcript)
            if config.per_entry_sample:
                result["per_entry"] = per_entry_registration(sel, config.per_entry_sample)
    result["seconds"] = seconds
    result["bytes"] = nbytes
    result["cpu_seconds"] = cpu_seconds
    result["config"] = {k: v for k, v in asdict(config).items() if k != "dubhe"}
    return result


def per_entry_registration(selector: DubheSelector, sample: int) -> dict[str, Any]:
    """The paper's registration — one python-paillier ciphertext per registry entry — timed here.

    Clients' encryption and decryption are timed on ``sample`` clients and scaled to all N (every
    client encrypts its registry and decrypts R_A); the server's sum runs over all N·L
    ciphertexts (built from a few reused obfuscators: an addition costs the same for any r).
    Compared with this selector's own registration (encrypt, sum and decrypt, all N clients).
    All in CPU seconds of this process (both ways run here, so the ratio holds on a busy machine).
    """
    backend = selector.backend
    if not isinstance(backend, PaillierBackend) or selector.codebook is None or selector.categories is None:
        raise ValueError("the per-entry comparison needs a registered Dubhe selector on Paillier")
    session = backend.session
    assert isinstance(session.server, PaillierServerSession)
    pk = session.server.public_key
    assert pk is not None
    client = session.client_session(session.clients[0])
    assert isinstance(client, PaillierClientSession) and client.keys is not None
    private = client.keys.private_key
    assert private is not None
    phe_pk = phe_paillier.PaillierPublicKey(int(pk.n))
    p, q = private.export_secret()
    phe_sk = phe_paillier.PaillierPrivateKey(phe_pk, p, q)
    registries = selector.codebook.one_hot(selector.categories)
    n, length = registries.shape
    width = pk.ciphertext_bytes
    sample = min(sample, n)

    clock = time.process_time  # CPU seconds: every party runs in this process, a busy machine does not skew them
    encrypt_times = []
    for i in range(sample):
        t0 = clock()
        payload = b"".join(phe_pk.encrypt(int(x)).ciphertext(be_secure=False).to_bytes(width, "big")
                           for x in registries[i])
        encrypt_times.append(clock() - t0)
    upload_bytes = len(payload)

    obfuscators = [raw.obfuscator(pk) for _ in range(8)]
    cts = [[phe_paillier.EncryptedNumber(phe_pk, int(raw.encrypt_with(pk, int(x), obfuscators[(i + j) % 8])))
            for j, x in enumerate(registries[i])] for i in range(n)]
    t0 = clock()
    total = cts[0]
    for row in cts[1:]:
        total = [a + b for a, b in zip(total, row)]
    server_sum = clock() - t0

    decrypt_times = []
    for _ in range(sample):
        t0 = clock()
        values = [phe_sk.decrypt(c) for c in total]
        decrypt_times.append(clock() - t0)
    if not np.array_equal(np.asarray(values), registries.sum(axis=0)):
        raise AssertionError("per-entry registry sum is wrong")

    encrypt = statistics.median(encrypt_times)
    decrypt = statistics.median(decrypt_times)
    per_entry_total = n * (encrypt + decrypt) + server_sum
    ours = selector.cpu_timings.get("registration", 0.0)
    ours_bytes = selector.transcript.bytes_by_statistic().get(STATISTICS["registry"], 0)
    ours_uploads = [e.bytes for e in selector.transcript.select(statistic=STATISTICS["registry"])
                    if e.receiver == SERVER]
    return {
        "sample_clients": sample,
        "registry_length": length,
        "client_encrypt_seconds": encrypt,
        "client_decrypt_seconds": decrypt,
        "server_sum_seconds": server_sum,
        "upload_bytes": upload_bytes,
        "registration_cpu_seconds": per_entry_total,
        "packed_registration_cpu_seconds": ours,
        "packed_upload_bytes": statistics.median(ours_uploads) if ours_uploads else 0,
        "packed_registration_bytes": ours_bytes,
        "speedup": per_entry_total / ours if ours > 0 else float("inf"),
    }
