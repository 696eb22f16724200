"""The aggregator's side of a masking run: relay keys and sealed shares, add masked inputs,
decide who survived, and unmask only the sum.

The server holds public keys, sealed shares it cannot open, the running sum of masked inputs
and the shares clients reveal to it: for each client either its self-mask seed (it uploaded)
or its mask key (it was lost after sharing), never both. It checks every threshold and the
survivors' connectivity before asking for a share, so a run without enough survivors aborts
(:class:`~protocols.errors.ThresholdError`) instead of releasing a wrong or partial sum.
"""

from __future__ import annotations

import numpy as np

from ..base import Outgoing, ServerParty, StageGate
from ..encoding import decode_sum
from ..errors import AbortedError, EncodingError, ShareError, StageError, ThresholdError, WireError
from ..identity import Directory
from ..messages import ReleasedSum
from ..primitives import shamir, sodium
from ..primitives.prg import MaskExpander, Words
from ..session import SumRequest
from ..transcript import Exposure
from ..wire import SERVER, Envelope, PartyId
from .keys import (
    advert_statement,
    agree,
    check_public,
    consistency_statement,
    matches_commitment,
    pair_seed,
    self_seed,
)
from .messages import (
    ConsistencyRequest,
    KeyAdvert,
    NeighbourKeys,
    SealedShares,
    Stage,
    UnmaskRequest,
    UnmaskResponse,
    read_signature,
    upload_from_bytes,
)
from .parameters import GroupParameters, graph_seed, harary_graph, word_dtype

__all__ = ["MaskingServer"]


class MaskingServer(ServerParty):
    """The aggregator: relays keys and sealed shares, adds masked inputs, unmasks the sum."""

    def __init__(self, *, protocol: str, run_id: bytes, request: SumRequest, params: GroupParameters,
                 clients: tuple[PartyId, ...], directory: Directory | None = None) -> None:
        super().__init__(protocol=protocol, run_id=run_id, request=request, clients=clients,
                         audience=request.participants)
        assert request.spec is not None
        self.spec, self.params, self.reveal = request.spec, params, request.reveal
        self.participants = request.participants
        self.party_set = frozenset(request.participants)
        self.dtype = word_dtype(self.spec.slot_bits)
        self.gate = StageGate(run_id, protocol, SERVER)
        self.gate.open = {Stage.ADVERTISE_KEYS}
        self.stage = Stage.ADVERTISE_KEYS
        self.keys: dict[PartyId, KeyAdvert] = {}
        self._seen_keys: set[bytes] = set()
        self.graph: dict[PartyId, tuple[PartyId, ...]] = {}
        self.bundles: dict[PartyId, dict[PartyId, bytes]] = {}
        self.shared: tuple[PartyId, ...] = ()
        self.relayed: dict[PartyId, frozenset[PartyId]] = {}
        """Whose sealed shares went to each client that shared (it masks with those that opened)."""
        self.total: Words = np.zeros(self.spec.length, dtype=self.dtype)
        self._uploads: dict[PartyId, Words] = {}
        self.complaints: dict[PartyId, tuple[PartyId, ...]] = {}
        """Per uploader, the owners whose sealed shares failed to open there."""
        self.requests: dict[PartyId, UnmaskRequest] = {}
        self.responses: dict[PartyId, UnmaskResponse] = {}
        self.directory = directory
        """Registered client keys: in the active-server setting, adverts and consistency
        signatures are checked on arrival (the clients check them again themselves)."""
        self.advertised: tuple[PartyId, ...] = ()
        self.signatures: dict[PartyId, bytes] = {}
        self._checker = shamir.ShareChecker(params.threshold)

    @property
    def threshold(self) -> int:
        return self.params.threshold

    def _send(self, stage: Stage, receiver: PartyId, payload: bytes, exposure: Exposure) -> Outgoing:
        return Outgoing(Envelope(self.protocol, stage, self.run_id, SERVER, receiver, payload), exposure)

    def receive(self, env: Envelope) -> list[Outgoing]:
        if env.stage == Stage.ADVERTISE_KEYS:
            self.gate.check(env, allowed_senders=self.participants)
            advert = KeyAdvert.from_bytes(env.payload, signed=self.params.active)
            check_public(advert.channel_key)
            check_public(advert.mask_key)
            if self.params.active and self.directory is not None:
                self.directory.verify(env.sender, advert_statement(
                    self.protocol, self.run_id, env.sender, advert.channel_key, advert.mask_key, advert.commitment),
                    advert.signature, what="advertised keys")
            if advert.channel_key == advert.mask_key or {advert.channel_key, advert.mask_key} & self._seen_keys:
                raise WireError("a public key was advertised twice")
            self.gate.record(env)
            self.keys[env.sender] = advert
            self._seen_keys |= {advert.channel_key, advert.mask_key}
        elif env.stage == Stage.SHARE_KEYS:
            self.gate.check(env, allowed_senders=tuple(self.graph))
            bundle = SealedShares.from_bytes(env.payload, parties=self.party_set)
            if tuple(pid for pid, _ in bundle.entries) != self.graph[env.sender]:
                raise StageError("shares must go to exactly the sender's neighbours")
            self.gate.record(env)
            self.bundles[env.sender] = dict(bundle.entries)
        elif env.stage == Stage.UPLOAD:
            self.gate.check(env, allowed_senders=self.shared)
            complaints, words = upload_from_bytes(env.payload, spec=self.spec, dtype=self.dtype,
                                                  owners=self.relayed[env.sender])
            self.gate.record(env)
            with self.timed("aggregate"):
                np.add(self.total, words, out=self.total)
            self._uploads[env.sender] = words  # a view of the received bytes, kept to undo a dropped owner's
            if complaints:
                self.complaints[env.sender] = complaints
        elif env.stage == Stage.CONSISTENCY:
            self.gate.check(env, allowed_senders=self.contributors)
            signature = read_signature(env.payload)
            if self.directory is not None:
                self.directory.verify(env.sender, self._statement(env.sender), signature,
                                  what="consistency signature")
            self.gate.record(env)
            self.signatures[env.sender] = signature
        else:  # unmasking, once open; any other stage is refused by the gate
            self.gate.check(env, allowed_senders=tuple(self.requests))
            response = UnmaskResponse.from_bytes(env.payload, self.requests[env.sender])
            self.gate.record(env)
            self.responses[env.sender] = response
        return []

    def advance(self) -> list[Outgoing]:
        if self.stage == Stage.ADVERTISE_KEYS:
            return self._after_advertise()
        if self.stage == Stage.SHARE_KEYS:
            return self._after_share_keys()
        if self.stage == Stage.UPLOAD:
            return self._after_upload()
        if self.stage == Stage.CONSISTENCY:
            return self._after_consistency()
        if self.stage == Stage.UNMASKING:
            return self._after_unmasking()
        raise AbortedError("the run is already over")

    def _need(self, count: int, what: str) -> None:
        if count < self.threshold:
            raise ThresholdError(f"{what}: {count} < threshold {self.threshold}")

    def _after_advertise(self) -> list[Outgoing]:
        advertised = sorted(self.keys)
        self._need(len(advertised), "clients that advertised keys")
        self.advertised = tuple(advertised)
        seed = graph_seed(self.protocol, self.run_id, advertised) if self.params.active else None
        self.graph = harary_graph(advertised, self.params.degree, seed=seed)
        out = []
        for pid in advertised:
            entries = tuple((v, self.keys[v]) for v in self.graph[pid])
            keys = NeighbourKeys(entries, self.advertised if self.params.active else ())
            out.append(self._send(Stage.SHARE_KEYS, pid, keys.to_bytes(), Exposure.public()))
        self.stage = Stage.SHARE_KEYS
        self.gate.open = {Stage.SHARE_KEYS}
        return out

    def _after_share_keys(self) -> list[Outgoing]:
        shared = set(self.bundles)
        self._need(len(shared), "clients that shared their keys")
        for pid in shared:
            self._need(1 + sum(v in shared for v in self.graph[pid]), f"holders of client {pid}'s shares")
        self.shared = tuple(sorted(shared))
        out = []
        for pid in self.shared:
            entries = tuple((owner, self.bundles[owner][pid]) for owner in self.graph[pid] if owner in shared)
            self.relayed[pid] = frozenset(owner for owner, _ in entries)
            out.append(self._send(Stage.UPLOAD, pid, SealedShares(entries).to_bytes(), Exposure.sealed()))
        self.bundles = {}
        self.stage = Stage.UPLOAD
        self.gate.open = {Stage.UPLOAD}
        return out

    def _holds(self, holder: PartyId, owner: PartyId) -> bool:
        """Whether ``holder`` opened ``owner``'s sealed shares (it did not complain about them)."""
        return owner in self.relayed.get(holder, ()) and owner not in self.complaints.get(holder, ())

    def _drop_accused(self, uploaded: set[PartyId]) -> None:
        """A client whose sealed shares failed to open at a neighbour leaves the sum as a dropout:
        its upload (if any) is taken back out, and its key is rebuilt like any lost client's."""
        accused: dict[PartyId, list[PartyId]] = {}
        for holder, owners in self.complaints.items():
            for owner in owners:
                accused.setdefault(owner, []).append(holder)
        for owner, holders in sorted(accused.items()):
            reason = (f"its sealed shares failed to open at client{'s' if len(holders) > 1 else ''} "
                      f"{', '.join(map(str, holders))}")
            self.excluded[owner] = reason
            self.rejections.append(f"AuthenticationError: client {owner} dropped: {reason}")
            if owner in uploaded:
                with self.timed("aggregate"):
                    np.subtract(self.total, self._uploads[owner], out=self.total)
                uploaded.discard(owner)
        self._uploads = {}

    def _after_upload(self) -> list[Outgoing]:
        uploaded = set(self.gate.senders(Stage.UPLOAD))
        self._drop_accused(uploaded)
        lost = set(self.shared) - uploaded
        self._need(len(uploaded), "clients that uploaded")
        for pid in uploaded:
            self._need(1 + sum(v in uploaded and self._holds(v, pid) for v in self.graph[pid]),
                       f"surviving holders of client {pid}'s seed")
        for pid in lost:
            holders = sum(v in uploaded and self._holds(v, pid) for v in self.graph[pid])
            if holders:  # exactly the survivors that masked with it
                self._need(holders, f"surviving holders of lost client {pid}'s key")
        if not self._connected(uploaded):
            raise AbortedError("the surviving clients' masking graph fell apart: unmasking would "
                               "reveal partial sums")
        self.contributors = tuple(sorted(uploaded))
        if self.params.active:
            self.stage = Stage.CONSISTENCY
            self.gate.open = {Stage.CONSISTENCY}
            return [self._send(Stage.CONSISTENCY, pid, ConsistencyRequest(self.view(pid)).to_bytes(),
                               Exposure.public()) for pid in self.contributors]
        return self._unmasking_requests(self.contributors)

    def view(self, pid: PartyId) -> tuple[PartyId, ...]:
        """The survivor set the server tells ``pid``: the clients whose uploads it kept. (An
        honest server tells everyone the same; the tests' equivocating server overrides this.)"""
        return self.contributors

    def _statement(self, pid: PartyId) -> bytes:
        return consistency_statement(self.protocol, self.run_id, self.advertised, self.view(pid))

    def _unmasking_requests(self, asked: tuple[PartyId, ...]) -> list[Outgoing]:
        out = []
        for pid in asked:
            told = set(self.view(pid))
            survivors = tuple(sorted([pid, *(v for v in self.graph[pid] if v in told)]))
            dropped = tuple(v for v in self.graph[pid] if v in self.shared and v not in told and self._holds(pid, v))
            signatures: tuple[tuple[PartyId, bytes], ...] = ()
            if self.params.active:
                statement = self._statement(pid)
                signatures = tuple((w, self.signatures[w]) for w in sorted({pid, *self.graph[pid]})
                                   if w in self.signatures and self._statement(w) == statement)
            self.requests[pid] = UnmaskRequest(survivors, dropped, signatures)
            out.append(self._send(Stage.UNMASKING, pid, self.requests[pid].to_bytes(), Exposure.public()))
        self.stage = Stage.UNMASKING
        self.gate.open = {Stage.UNMASKING}
        return out

    def _after_consistency(self) -> list[Outgoing]:
        """Active-server setting: ask the clients that signed, each with its neighbourhood's
        signatures on the statement it signed."""
        signers = tuple(sorted(self.signatures))
        self._need(len(signers), "clients that signed the survivor set")
        return self._unmasking_requests(signers)

    def _connected(self, nodes: set[PartyId]) -> bool:
        if not nodes:
            return False
        start = min(nodes)
        seen, frontier = {start}, [start]
        while frontier:
            u = frontier.pop()
            for v in self.graph[u]:
                if v in nodes and v not in seen:
                    seen.add(v)
                    frontier.append(v)
        return seen == nodes

    def _revealed(self) -> tuple[dict[PartyId, list[shamir.Point]], dict[PartyId, list[shamir.Point]]]:
        """Revealed shares by owner: self-mask seeds, mask keys (one pass over the responses)."""
        seeds: dict[PartyId, list[shamir.Point]] = {}
        keys: dict[PartyId, list[shamir.Point]] = {}
        for holder, response in self.responses.items():
            request = self.requests[holder]
            for owner, y in zip(request.survivors, response.self_mask_shares):
                seeds.setdefault(owner, []).append((holder + 1, y))
            for owner, y in zip(request.dropped, response.key_shares):
                keys.setdefault(owner, []).append((holder + 1, y))
        return seeds, keys

    def _recover(self, owner: PartyId, points: list[shamir.Point], what: str) -> bytes:
        """``owner``'s secret from the revealed shares, every share checked (all on one
        polynomial of degree t - 1, the secret matching its commitment: the seed's hash, the
        key's advertised public key); shares off the polynomial are named and left out."""
        self._need(len(points), f"revealed shares of client {owner}'s {what}")
        advert = self.keys[owner]
        if what == "seed":
            def verify(secret: bytes) -> bool:
                return matches_commitment(secret, advert.commitment, protocol=self.protocol, run_id=self.run_id,
                                          owner=owner)
        else:
            def verify(secret: bytes) -> bool:
                return sodium.x25519_public(secret) == advert.mask_key
        try:
            recovered = shamir.recover(points, self.threshold, verify=verify, checker=self._checker)
        except ShareError as error:
            raise ShareError(f"client {owner}'s {what} could not be recovered: {error}") from error
        except WireError as error:
            raise AbortedError(f"client {owner}'s {what} could not be recovered: {error}") from error
        for x in recovered.bad:
            self.rejections.append(f"ShareError: client {x - 1} revealed a wrong share of client {owner}'s {what} "
                                   "(left out)")
            wrong = f"ShareError: a wrong share of client {owner}'s {what}"
            self.flagged[x - 1] = f"{self.flagged[x - 1]}; {wrong}" if x - 1 in self.flagged else wrong
        return recovered.secret

    def _after_unmasking(self) -> list[Outgoing]:
        self.gate.open = set()
        uploaded = set(self.contributors)
        lost = sorted(v for v in self.shared if v not in uploaded)
        with self.timed("finalize"):
            seeds, keys = self._revealed()
            add: list[bytes] = []
            subtract = [self_seed(self._recover(pid, seeds.get(pid, []), "seed"), protocol=self.protocol,
                                  run_id=self.run_id, owner=pid)
                        for pid in self.contributors]
            for pid in lost:
                survivors = [v for v in self.graph[pid] if v in uploaded and self._holds(v, pid)]
                if not survivors:
                    continue
                key = self._recover(pid, keys.get(pid, []), "key")
                for v in survivors:
                    seed = pair_seed(agree(key, self.keys[v].mask_key), protocol=self.protocol,
                                     run_id=self.run_id, u=pid, v=v)
                    # v added PRG(s) when v < pid and subtracted it otherwise: undo that.
                    (subtract if v < pid else add).append(seed)
            total = self.total
            MaskExpander(self.spec.length, self.dtype).accumulate(total, add=add, subtract=subtract)
            if self.spec.slot_bits < 8 * self.dtype.itemsize:
                np.bitwise_and(total, self.dtype.type((1 << self.spec.slot_bits) - 1), out=total)
            encoded = total.astype(np.uint64)
            try:
                self.result = decode_sum(self.spec, encoded, contributors=len(self.contributors))
            except EncodingError as error:
                raise AbortedError(f"the unmasked sum is impossible, refusing to release it: {error}") from error
        self.finished = True
        self.stage = Stage.RESULT
        if not self.reveal.clients:
            return []
        payload = ReleasedSum(self.contributors, encoded).to_bytes(parties=self.clients)
        exposure = Exposure.aggregate(len(self.contributors), self.spec.length)
        return [self._send(Stage.RESULT, pid, payload, exposure) for pid in self.contributors]
