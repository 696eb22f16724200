"""The exposure ledger: what every party can read, row by row, from the messages it received.

Every tapped message (:mod:`secure_fl.audit.tap`) carries its sender's label: what its
*receiver* can read of it (``visibility``, ``k``, ``owner``). The ledger turns that into one row
per party, round and value — the party's own inputs, another client's value in the clear, an
aggregate of ``k`` clients, a ciphertext, a masked vector, a sealed share or public material —
and adds what no single message says, from the protocols' descriptors and the runs' ``open``
requests (never from protocol names):

* **who holds a decryption key**: the client that published the public key in a set-up run
  (the descriptor's ``key_stage``) and those the secret key was sealed to (``sealed_key_stage``);
  the server when no client published it;
* **sums a party computes itself**: a protocol that adds or unmasks at the server
  (``server_learns_sum``), or a keyed run whose uploads the server reads (its senders labelled
  them ``clear``: the server holds the key), gets a ``computed`` row (0 bytes);
* **each run's collusion threshold**: what the protocol's reader makes of the run's request
  (masking's Shamir ``t`` is in the ``open``'s parameters), else one key holder.

From the rows it derives the per-run figures of the audit (:class:`LedgerSummary`):
bytes of per-client plaintext the server can read, ``k_min`` (smallest aggregate any
party other than the owner can read), the collusion threshold (fewest clients who,
with the server or alone, can read one honest client's value) and, per statistic,
which clients are *structurally recoverable* by differencing round sums — i.e. whose
unit vector lies in the row space of the statistic's participation matrix.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from protocols import (
    DESCRIPTORS,
    SERVER,
    ProtocolDescriptor,
    SumRequest,
    Transcript,
    TranscriptEntry,
    Visibility,
    descriptor,
)
from protocols.wire import OPEN, party_name
from secure_fl.audit.exposure import (
    AGGREGATE,
    CIPHERTEXT,
    CLEAR,
    KINDS,
    MASKED,
    OWN,
    PUBLIC,
    SEALED,
    ExposureRow,
    KeyHolders,
    LedgerSummary,
    RunInfo,
    StatisticSummary,
    party_label,
)

if TYPE_CHECKING:
    from secure_fl.audit.tap import Tapped

__all__ = [
    "ExposureRow",
    "KeyHolders",
    "Ledger",
    "LedgerSummary",
    "RunInfo",
    "StatisticSummary",
    "build_ledger",
    "recoverable_clients",
    "run_threshold",
]

# --- key holders -------------------------------------------------------------------------------

def _setup_key_holders(protocol: str, setup: Sequence[TranscriptEntry]) -> KeyHolders:
    """Who holds the secret key after one key set-up: the client that published the public key
    (the descriptor's ``key_stage``) and those the secret key was sealed to (``sealed_key_stage``);
    the server when no client published it."""
    d = descriptor(protocol)
    agent_sends = [e for e in setup if e.stage == d.key_stage and e.sender != SERVER and e.receiver == SERVER]
    if not agent_sends:
        return KeyHolders(protocol, "server", frozenset({SERVER}))
    agent = agent_sends[0].sender
    sealed = {e.receiver for e in setup if e.stage == d.sealed_key_stage and e.sender == SERVER}
    if sealed:
        return KeyHolders(protocol, "all", frozenset({agent, *sealed}), agent)
    return KeyHolders(protocol, "agent", frozenset({agent}), agent)


def _server_decrypts(d: ProtocolDescriptor, run: Sequence[TranscriptEntry]) -> bool:
    """Does the server read this run's sum itself? A protocol that adds or unmasks at the server
    says so (``server_learns_sum``); in a keyed protocol the server does exactly when it holds the
    key (Paillier ``keyholder="server"``), and then each client labels its input upload as readable
    by the server (``clear``)."""
    if d.server_learns_sum:
        return True
    return any(e.stage in d.input_stages and e.receiver == SERVER and e.visibility == Visibility.CLEAR for e in run)


def run_threshold(d: ProtocolDescriptor, request: SumRequest | None, *, server_decrypts: bool,
                  participants: int = 0, options: Mapping[str, Any] | None = None) -> int | None:
    """Fewest clients who, with the server, read one client's input to a run: the protocol
    reader's figure from the run's request (0 in the clear; masking's Shamir ``t`` from the
    run's parameters) — or, without the request, from the protocol's ``options`` for
    ``participants`` — else 0 when the server decrypted the run itself and 1 (one key holder)
    otherwise."""
    reader = d.message_reader()
    threshold = reader.threshold(request) if request is not None else reader.threshold_for(
        participants, d.options(**dict(options or {})))
    if threshold is not None:
        return int(threshold)
    if d.family == "clear":
        return 0
    if d.keyed:
        return 0 if server_decrypts else 1
    return None


# --- participation and structural recoverability ------------------------------------------------

def recoverable_clients(participation: np.ndarray, *, tol: float = 1e-8) -> np.ndarray:
    """Boolean per column: is the unit vector e_i in the row space of ``participation``?

    ``participation`` is (rounds, clients) with 1 where the client contributed to the
    round's sum. A client is recoverable when some linear combination of round sums equals
    its value alone — exactly the clients a least-squares disaggregation recovers exactly
    when their value is the same in every round.
    """
    a = np.asarray(participation, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"participation must be 2-D (rounds, clients), got shape {a.shape}")
    n = a.shape[1]
    if a.size == 0:
        return np.zeros(n, dtype=bool)
    projector = np.linalg.pinv(a) @ a  # orthogonal projector onto the row space
    result: np.ndarray = np.abs(np.diag(projector) - 1.0) < tol * max(1.0, n) * 10 + 1e-9
    return result


# --- the ledger ---------------------------------------------------------------------------------

@dataclass
class Ledger:
    """Exposure rows of one run and the protocol runs they came from."""

    rows: list[ExposureRow]
    runs: list[RunInfo]
    clients: tuple[int, ...]
    key_holders: dict[str, KeyHolders]
    thresholds: dict[str, int] = field(default_factory=dict)
    """Smallest protocol threshold seen per protocol."""

    # -- views ---------------------------------------------------------------------------------

    def parties(self) -> list[str]:
        seen = {r.party for r in self.rows}
        return sorted(seen, key=lambda p: (p != "server", int(p.split("-")[1]) if p != "server" else -1))

    def for_party(self, party: str) -> list[ExposureRow]:
        return [r for r in self.rows if r.party == party]

    def statistics(self) -> list[str]:
        return sorted({r.statistic for r in self.runs})

    def runs_of(self, statistic: str) -> list[RunInfo]:
        return [r for r in self.runs if r.statistic == statistic]

    def participation(self, statistic: str, *, learner: int = SERVER) -> tuple[list[int], np.ndarray]:
        """(rounds, matrix) of the sums of ``statistic`` that ``learner`` can read.

        One row per run the learner reads the sum of (several runs may share a round),
        one column per client of the run (in :attr:`clients` order).
        """
        index = {c: j for j, c in enumerate(self.clients)}
        runs = [r for r in self.runs_of(statistic) if learner in r.learners]
        matrix = np.zeros((len(runs), len(self.clients)), dtype=np.float64)
        for i, run in enumerate(runs):
            for c in run.contributors:
                matrix[i, index[c]] = 1.0
        return [r.round for r in runs], matrix

    def exposures(self, *, kinds: Sequence[str] = (OWN, CLEAR, AGGREGATE, CIPHERTEXT, MASKED)) -> list[dict[str, Any]]:
        """Rows grouped by (party, round, statistic, kind): how many values, of whom, how large.

        The compact per-party, per-round view of the ledger the report keeps (``sealed`` and
        ``public`` rows are left out by default: shares in transit, keys, the global model)."""
        groups: dict[tuple[str, int, str, str], dict[str, Any]] = {}
        for r in self.rows:
            if r.kind not in kinds:
                continue
            key = (r.party, r.round, r.statistic, r.kind)
            g = groups.get(key)
            if g is None:
                g = groups[key] = {"party": r.party, "role": r.role, "round": r.round, "statistic": r.statistic,
                                   "kind": r.kind, "values": 0, "bytes": 0, "k_min": None, "dimension": 0,
                                   "owners": set()}
            g["values"] += 1
            g["bytes"] += r.bytes
            g["dimension"] = max(g["dimension"], r.dimension)
            if r.kind == AGGREGATE:
                g["k_min"] = r.k if g["k_min"] is None else min(g["k_min"], r.k)
            if r.owner is not None:
                g["owners"].add(r.owner)
        out = []
        for key in sorted(groups, key=lambda k: (k[0] != "server", k[0], k[1], k[2], KINDS.index(k[3]))):
            g = groups[key]
            g["owners"] = sorted(g["owners"])
            out.append(g)
        return out

    def server_reads_individually(self, statistic: str, client: int, round: int | None = None) -> bool:
        """Does the server read ``client``'s own value of ``statistic`` (in ``round``)?"""
        owner = party_name(client)
        return any(
            r.party == "server" and r.statistic == statistic and r.owner == owner and r.kind == CLEAR
            and (round is None or r.round == round)
            for r in self.rows
        )

    # -- summary -------------------------------------------------------------------------------

    def summary(self, *, static: frozenset[str] | set[str] = frozenset()) -> LedgerSummary:
        """Per-run figures; ``static`` names statistics whose per-client value is the same in
        every round (the caller knows from the inputs; the transcript does not carry values),
        for which structurally recoverable clients are recovered exactly."""
        clients = self.clients
        readable_other = [r for r in self.rows if r.readable and r.kind in (CLEAR, AGGREGATE)]
        by_client: dict[int, int] = {c: 0 for c in clients}
        for r in self.rows:
            if r.party == "server" and r.kind == CLEAR and r.owner is not None and r.owner != "server":
                by_client[int(r.owner.split("-")[1])] = by_client.get(int(r.owner.split("-")[1]), 0) + r.bytes
        mean_bytes = float(sum(by_client.values())) / max(len(clients), 1)
        informative = [r for r in readable_other if r.k >= 1 and r.k_effective >= 1]
        k_values = [r.k for r in informative]
        k_eff = [r.k_effective for r in informative]
        k_min = min(k_values) if k_values else None
        k_min_eff = min(k_eff) if k_eff else None
        protocol_t = min(self.thresholds.values()) if self.thresholds else None
        collusion = protocol_t
        if k_min is not None:
            # A sum of k clients readable by a party: k - 1 colluding contributors (the reading
            # party among them when it contributed) isolate the remaining input.
            via_sums = k_min - 1
            collusion = via_sums if collusion is None else min(collusion, via_sums)
        stats = {name: self._statistic_summary(name) for name in self.statistics()}
        flags = self._flags(stats, k_min, static)
        return LedgerSummary(
            clients=clients,
            server_plaintext_bytes_per_client=mean_bytes,
            server_plaintext_bytes_by_client=by_client,
            k_min=k_min,
            k_min_effective=k_min_eff,
            collusion_threshold=collusion,
            protocol_collusion_threshold=protocol_t,
            key_holders=dict(self.key_holders),
            statistics=stats,
            flags=tuple(flags),
        )

    def _statistic_summary(self, statistic: str) -> StatisticSummary:
        runs = self.runs_of(statistic)
        rows = [r for r in self.rows if r.statistic == statistic and r.readable and r.kind in (CLEAR, AGGREGATE)]
        ks = [r.k for r in rows if r.k >= 1 and r.k_effective >= 1]
        thresholds = [t for t in (run.threshold for run in runs) if t is not None]
        _, matrix = self.participation(statistic)
        recoverable = recoverable_clients(matrix) if len(matrix) else np.zeros(len(self.clients), dtype=bool)
        participants = {c for run in runs for c in run.contributors}
        server_individual = any(r.party == "server" and r.kind == CLEAR for r in rows)
        return StatisticSummary(
            statistic=statistic,
            protocols=tuple(sorted({run.protocol for run in runs})),
            rounds=len({run.round for run in runs}),
            dimension=max((r.dimension for r in self.rows if r.statistic == statistic), default=0),
            k_min=min(ks) if ks else None,
            server_reads_individual=server_individual,
            server_learns_sum=any(SERVER in run.learners for run in runs),
            collusion_threshold=min(thresholds) if thresholds else None,
            participants=len(participants),
            recoverable=tuple(c for c, ok in zip(self.clients, recoverable) if ok and c in participants
                              and not server_individual),
        )

    def _flags(self, stats: Mapping[str, StatisticSummary], k_min: int | None,
               static: frozenset[str] | set[str]) -> list[str]:
        flags: list[str] = []
        for name, kh in sorted(self.key_holders.items()):
            if kh.mode == "server":
                flags.append(f"{name}: the server holds the secret key and reads every client's ciphertext")
        for name, s in stats.items():
            if s.server_reads_individual:
                flags.append(f"{name}: the server reads each client's value in the clear")
            elif s.k_min == 1:
                flags.append(f"{name}: some party reads a sum of a single client (k = 1)")
            if s.recoverable:
                how = ("exactly: the value is the same every round" if name in static else
                       "as a combination of round sums; the value changes between rounds, so attacks "
                       "recover it approximately")
                flags.append(
                    f"{name}: {len(s.recoverable)}/{s.participants} clients individually isolatable by "
                    f"differencing round sums ({how})"
                )
        if k_min is not None and k_min == 1 and not flags:
            flags.append("some party reads a single client's value")
        return flags


def _rows_for_entry(e: TranscriptEntry, *, agents: frozenset[int], contributors: tuple[int, ...]) -> ExposureRow:
    receiver = party_name(e.receiver)
    role = "server" if e.receiver == SERVER else ("agent" if e.receiver in agents else "client")
    vis = e.visibility
    owner = party_label(e.owner)
    note = ""
    k = e.k
    if vis == Visibility.CLEAR:
        kind, readable = (OWN if e.owner == e.receiver else CLEAR), True
        k = 1
    elif vis == Visibility.AGGREGATE:
        kind, readable = AGGREGATE, True
    elif vis == Visibility.CIPHERTEXT:
        kind, readable = CIPHERTEXT, False
    elif vis == Visibility.MASKED:
        kind, readable = MASKED, False
    elif vis == Visibility.SEALED:
        kind, readable = SEALED, False
    else:
        kind, readable, k = PUBLIC, False, 0
    k_eff = k - 1 if kind == AGGREGATE and e.receiver in contributors else k
    return ExposureRow(
        party=receiver, role=role, round=e.round, protocol=e.protocol, statistic=e.statistic,
        stage=e.stage, kind=kind, k=k, k_effective=k_eff, dimension=e.dimension, bytes=e.bytes,
        owner=owner if kind in (OWN, CLEAR, CIPHERTEXT, MASKED, SEALED) else None,
        readable=readable, run_id=e.run_id, note=note,
    )


def _requests(messages: Iterable[Tapped | TranscriptEntry], clients: Sequence[int]) -> dict[str, SumRequest]:
    """Each run's request, parsed from its ``open`` (every open of a run carries the same one)."""
    out: dict[str, SumRequest] = {}
    for m in messages:
        env = getattr(m, "envelope", None)
        if env is not None and env.stage == OPEN and env.run_id.hex() not in out:
            out[env.run_id.hex()] = SumRequest.from_bytes(env.payload, clients=clients)
    return out


def build_ledger(messages: Transcript | Iterable[Tapped | TranscriptEntry], *, clients: Sequence[int] | None = None,
                 protocol_options: Mapping[str, Mapping[str, Any]] | None = None) -> Ledger:
    """The exposure ledger of one run: its tapped messages (:mod:`secure_fl.audit.tap`) or, with
    less to go on, its transcript.

    ``clients`` are all client ids of the run (default: every client that sent or received).
    Every fact about a protocol comes from its descriptor and the run's own ``open``: which
    stages carry a client's input, who holds a key (the set-up's key and sealed-key stages),
    whether the server reads the sum, the run's collusion threshold (:func:`run_threshold`; from
    ``protocol_options`` when a transcript has no bytes to read the ``open`` from). Key holders
    are read per protocol run, so a run may hold several sessions of one protocol (e.g. a
    selection's own Paillier session beside the one summing the statistics). Messages outside
    any protocol (the runtime's model and broadcasts) are public rows.
    """
    items = list(messages)
    entries: list[TranscriptEntry] = [m if isinstance(m, TranscriptEntry) else m.entry for m in items]
    seen = {p for e in entries for p in (e.sender, e.receiver) if p != SERVER}
    all_clients = tuple(sorted(set(clients) if clients is not None else seen))
    requests = _requests(items, all_clients)
    options = {k: dict(v) for k, v in (protocol_options or {}).items()}
    groups: dict[str, list[TranscriptEntry]] = defaultdict(list)
    for e in entries:
        groups[e.run_id or f"{e.protocol}:{e.statistic}@{e.round}"].append(e)

    keyholders: dict[str, KeyHolders] = {}
    for es in groups.values():
        d = DESCRIPTORS.get(es[0].protocol)
        if d is None or d.key_stage is None or not any(e.stage == d.key_stage for e in es):
            continue
        setup_name = next(e.statistic for e in es if e.stage == d.key_stage)
        name = d.name if setup_name == "setup" else f"{d.name} ({setup_name})"
        while name in keyholders:
            name += "'"
        keyholders[name] = _setup_key_holders(d.name, es)
    agents = frozenset(kh.agent for kh in keyholders.values() if kh.agent is not None)

    rows: list[ExposureRow] = []
    runs: list[RunInfo] = []
    thresholds: dict[str, int] = {}
    for run_id, es in groups.items():
        first = es[0]
        d = DESCRIPTORS.get(first.protocol)
        if d is None:  # not a protocol run: the runtime's messages
            rows.extend(_rows_for_entry(e, agents=agents, contributors=()) for e in es)
            continue
        contrib = tuple(sorted({e.sender for e in es if e.stage in d.input_stages and e.sender != SERVER
                                and e.visibility in (Visibility.CLEAR, Visibility.CIPHERTEXT, Visibility.MASKED)}))
        rows.extend(_rows_for_entry(e, agents=agents, contributors=contrib) for e in es)
        if not contrib:
            continue  # key set-up, argmin bookkeeping and other runs without summed client inputs
        for e in es:  # the senders' own values
            if e.stage in d.input_stages and e.sender in contrib and e.owner == e.sender:
                rows.append(ExposureRow(
                    party=party_name(e.sender), role="agent" if e.sender in agents else "client", round=e.round,
                    protocol=d.name, statistic=e.statistic, stage="input", kind=OWN, k=1, k_effective=0,
                    dimension=e.dimension, bytes=0, owner=party_name(e.sender), readable=True,
                    run_id=e.run_id,
                ))
        server_decrypts = _server_decrypts(d, es)
        learners = {e.receiver for e in es if e.visibility == Visibility.AGGREGATE}
        if server_decrypts and SERVER not in learners:
            learners.add(SERVER)
            rows.append(ExposureRow(
                party="server", role="server", round=first.round, protocol=d.name, statistic=first.statistic,
                stage="computed", kind=AGGREGATE, k=len(contrib), k_effective=len(contrib),
                dimension=max(e.dimension for e in es), bytes=0, owner=None, readable=True,
                run_id=first.run_id, note="sum computed by the server from the uploads",
            ))
        threshold = run_threshold(d, requests.get(run_id), server_decrypts=server_decrypts,
                                  participants=len(contrib), options=options.get(d.name))
        if threshold is not None:
            thresholds[d.name] = min(thresholds.get(d.name, threshold), threshold)
        runs.append(RunInfo(
            protocol=d.name, statistic=first.statistic, round=first.round, run_id=first.run_id,
            contributors=contrib, learners=tuple(sorted(learners)), threshold=threshold,
        ))
    runs.sort(key=lambda r: (r.statistic, r.round, r.run_id))
    return Ledger(rows=rows, runs=runs, clients=all_clients, key_holders=keyholders, thresholds=thresholds)


def bytes_table(ledger: Ledger) -> dict[str, dict[str, int]]:
    """Bytes received per party and kind (for the report)."""
    table: dict[str, dict[str, int]] = defaultdict(lambda: {k: 0 for k in KINDS})
    for r in ledger.rows:
        table[r.party][r.kind] += r.bytes
    return {p: dict(v) for p, v in table.items()}

