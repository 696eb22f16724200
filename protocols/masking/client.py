"""A masking client's side of one run: fresh keys, shared secrets, the masked upload, and the
policy that decides which shares it reveals.

The client holds only its input (as mask words, overwritten by the masked vector), the run's
secrets it drew itself (two X25519 keys, the self-mask seed ``b``), the shares its neighbours
sealed for it, and what it parsed from the server's messages. Its :class:`GroupParameters`
come from the public options and the request's participants, never from the server.
"""

from __future__ import annotations

import secrets

import numpy as np

from ..base import Outgoing, Party, Reveal, StageGate
from ..encoding import VectorSpec, decode_sum
from ..errors import AuthenticationError, EncodingError, PolicyError, StageError, WireError
from ..identity import Directory, Identity
from ..messages import ReleasedSum
from ..primitives import shamir, sodium
from ..primitives.channel import ChannelKey, open_sealed, seal
from ..primitives.prg import MaskExpander, Words
from ..transcript import Exposure
from ..wire import SERVER, Envelope, PartyId
from .keys import (
    SHARE_PLAINTEXT_BYTES,
    SHARE_PURPOSE,
    advert_statement,
    agree,
    consistency_statement,
    pair_seed,
    seed_commitment,
    self_seed,
    share_associated,
)
from .messages import (
    ConsistencyRequest,
    KeyAdvert,
    NeighbourKeys,
    SealedShares,
    Stage,
    UnmaskRequest,
    UnmaskResponse,
    upload_to_bytes,
)
from .parameters import GroupParameters, graph_seed, harary_neighbours, word_dtype

__all__ = ["MaskingClient"]


class MaskingClient(Party):
    """One client of one run. Holds its input as mask words, its keys, and the shares it keeps.

    :attr:`timings` covers all of its work, one label per stage (``advertise_keys``,
    ``share_keys``, ``open_shares``, ``upload``, ``consistency``, ``unmasking``, ``result``):
    ``upload`` is the masked vector alone (agreement, expansion, masking, serialisation);
    opening the shares relayed with the upload request is ``open_shares``.
    """

    def __init__(self, party_id: PartyId, *, protocol: str, run_id: bytes, spec: VectorSpec, reveal: Reveal,
                 words: Words, params: GroupParameters, participants: tuple[PartyId, ...],
                 clients: tuple[PartyId, ...], identity: Identity | None = None,
                 directory: Directory | None = None) -> None:
        super().__init__(party_id)
        if params.active and (identity is None or directory is None):
            raise PolicyError("the active-server setting needs this client's registered signing key and the "
                              "directory of everyone's")
        self.identity, self.directory = identity, directory
        self.protocol, self.run_id, self.spec, self.params = protocol, run_id, spec, params
        self.reveal, self.clients = reveal, clients
        self.participants = frozenset(participants)
        self.dtype = word_dtype(spec.slot_bits)
        if words.dtype != self.dtype or words.shape != (spec.length,):
            raise EncodingError(f"expected {spec.length} words of type {self.dtype}")
        self._words: Words | None = words
        self.gate = StageGate(run_id, protocol, party_id)
        self._channel: ChannelKey | None = None
        self._mask_private: bytes = b""
        self._mask_public: bytes = b""
        """The raw mask key pair (the private key is shared among the neighbours and agrees the
        pairwise seeds)."""
        self._neighbours: dict[PartyId, tuple[bytes, bytes]] = {}
        """Each neighbour's advertised channel key and mask key (raw)."""
        self._seed: bytes | None = None
        self._own_shares: tuple[int, int] | None = None
        self._held: dict[PartyId, tuple[int, int]] = {}
        self._answered: UnmaskRequest | None = None
        """The unmasking request this client answered: the released sum must agree with it."""
        self._advertised: tuple[PartyId, ...] = ()
        self._told: tuple[PartyId, ...] | None = None
        self._statement: bytes = b""
        self._signature: bytes = b""
        """Active-server setting: the advertised set, the survivor set this client signed, the
        statement and its signature."""

    @property
    def active(self) -> bool:
        return self.params.active

    def start(self) -> list[Outgoing]:
        """Stage ``advertise_keys``, in reply to ``open``: two fresh public keys."""
        with self.timed("advertise_keys"):
            return self._advertise()

    def _advertise(self) -> list[Outgoing]:
        self._channel = ChannelKey()
        self._mask_private = sodium.x25519_private()
        self._mask_public = sodium.x25519_public(self._mask_private)
        self._seed = secrets.token_bytes(shamir.SECRET_BYTES)
        commitment = seed_commitment(self._seed, protocol=self.protocol, run_id=self.run_id, owner=self.party_id)
        advert = KeyAdvert(self._channel.public_bytes, self._mask_public, commitment)
        if self.active:
            assert self.identity is not None
            advert = KeyAdvert(advert.channel_key, advert.mask_key, commitment, self.identity.sign(advert_statement(
                self.protocol, self.run_id, self.party_id, advert.channel_key, advert.mask_key, commitment)))
        self.gate.open = {Stage.SHARE_KEYS}
        return [self._send(Stage.ADVERTISE_KEYS, advert.to_bytes(), Exposure.public())]

    def receive(self, env: Envelope) -> list[Outgoing]:
        self.gate.check(env, allowed_senders=[SERVER])
        if env.stage == Stage.SHARE_KEYS:
            with self.timed("share_keys"):
                return self._share_keys(env)
        if env.stage == Stage.UPLOAD:
            return self._upload(env)  # timed as open_shares + upload
        if env.stage == Stage.CONSISTENCY:
            with self.timed("consistency"):
                return self._consistency(env)
        if env.stage == Stage.UNMASKING:
            with self.timed("unmasking"):
                return self._unmask(env)
        with self.timed("result"):
            return self._result(env)

    def _send(self, stage: Stage, payload: bytes, exposure: Exposure) -> Outgoing:
        return Outgoing(Envelope(self.protocol, stage, self.run_id, self.party_id, SERVER, payload), exposure)

    # share_keys: split b and s_sk among the neighbours and seal one pair of shares for each.
    def _share_keys(self, env: Envelope) -> list[Outgoing]:
        assert self._channel is not None and self._mask_private and self._seed is not None
        keys = NeighbourKeys.from_bytes(env.payload, parties=self.participants, signed=self.active)
        own = {self._channel.public_bytes, self._mask_public}
        ids = [pid for pid, _ in keys.entries]
        if self.party_id in ids:
            raise WireError("a client is not its own neighbour")
        if self.active:
            self._check_neighbourhood(keys)
        if len(ids) > self.params.degree:
            raise PolicyError(f"{len(ids)} neighbours exceed the run's degree {self.params.degree}")
        if len(ids) + 1 < self.params.threshold:
            raise PolicyError(f"sharing among {len(ids) + 1} holders is below the threshold {self.params.threshold}")
        published = [k for _, advert in keys.entries for k in (advert.channel_key, advert.mask_key)]
        if len(set(published)) != len(published) or own & set(published):
            raise WireError("neighbour keys repeat")
        neighbours = {pid: (advert.channel_key, advert.mask_key) for pid, advert in keys.entries}
        seed, mask_private = self._seed, self._mask_private
        holders = sorted([*ids, self.party_id])
        xs = [pid + 1 for pid in holders]
        seed_ys, key_ys = shamir.split_many([seed, mask_private], xs, self.params.threshold)
        seed_shares, key_shares = dict(zip(holders, seed_ys)), dict(zip(holders, key_ys))
        sealed = []
        for pid in ids:
            plaintext = shamir.share_to_bytes(seed_shares[pid]) + shamir.share_to_bytes(key_shares[pid])
            associated = share_associated(self.protocol, self.run_id, self.party_id, pid)
            try:
                box = seal(self._channel, neighbours[pid][0], plaintext, associated=associated,
                           purpose=SHARE_PURPOSE)
            except ValueError:
                raise WireError(f"neighbour {pid}'s channel key is unusable") from None
            sealed.append((pid, box))
        self.gate.record(env)
        self._neighbours = neighbours
        self._advertised = keys.advertised
        self._own_shares = (seed_shares[self.party_id], key_shares[self.party_id])
        self.gate.open = {Stage.UPLOAD}
        return [self._send(Stage.SHARE_KEYS, SealedShares(tuple(sealed)).to_bytes(),
                           Exposure.sealed(self.party_id))]

    def _check_neighbourhood(self, keys: NeighbourKeys) -> None:
        """Active-server setting: every neighbour's advertisement carries its registered
        signature, and the neighbours are exactly this client's in the graph every client derives
        from the run id and the advertised set (the server cannot pick or vary them)."""
        assert self.directory is not None
        if self.party_id not in keys.advertised:
            raise PolicyError("the advertised set leaves out this client although it advertised")
        for pid, advert in keys.entries:
            statement = advert_statement(self.protocol, self.run_id, pid, advert.channel_key, advert.mask_key,
                                         advert.commitment)
            self.directory.verify(pid, statement, advert.signature, what="advertised keys")
        row = harary_neighbours(keys.advertised, self.params.degree, self.party_id,
                                seed=graph_seed(self.protocol, self.run_id, keys.advertised))
        if tuple(pid for pid, _ in keys.entries) != row:
            raise PolicyError("the neighbours the server named are not this client's in the run's graph")

    # upload: open the shares held for others, then mask with exactly the neighbours whose shares
    # opened. A share pair that fails to open is its owner's fault (or the network's): this client
    # names the owner in its upload (the server drops the owner) and goes on without it.
    def _upload(self, env: Envelope) -> list[Outgoing]:
        with self.timed("open_shares"):
            held, complaints = self._open_shares(env)
        with self.timed("upload"):
            return self._masked_upload(env, held, complaints)

    def _open_shares(self, env: Envelope) -> tuple[dict[PartyId, tuple[int, int]], list[PartyId]]:
        assert self._channel is not None
        relayed = SealedShares.from_bytes(env.payload, parties=self.participants)
        held: dict[PartyId, tuple[int, int]] = {}
        complaints: list[PartyId] = []
        for owner, box in relayed.entries:
            if owner not in self._neighbours:
                raise StageError(f"party {owner} is not a neighbour of this client")
            associated = share_associated(self.protocol, self.run_id, owner, self.party_id)
            try:
                plaintext = open_sealed(self._channel, self._neighbours[owner][0], box,
                                        associated=associated, purpose=SHARE_PURPOSE)
                if len(plaintext) != SHARE_PLAINTEXT_BYTES:
                    raise WireError("a share pair has the wrong length")
                held[owner] = (shamir.share_from_bytes(plaintext[: shamir.SHARE_BYTES]),
                               shamir.share_from_bytes(plaintext[shamir.SHARE_BYTES :]))
            except (ValueError, AuthenticationError, WireError):
                complaints.append(owner)
        if len(held) + 1 < self.params.threshold:
            raise PolicyError(f"only {len(held)} neighbours' shares opened here; the threshold is "
                              f"{self.params.threshold}")
        return held, complaints

    def _masked_upload(self, env: Envelope, held: dict[PartyId, tuple[int, int]],
                       complaints: list[PartyId]) -> list[Outgoing]:
        assert self._mask_private and self._seed is not None and self._words is not None
        add = [self_seed(self._seed, protocol=self.protocol, run_id=self.run_id, owner=self.party_id)]
        subtract: list[bytes] = []
        for owner in held:  # not with an owner whose shares failed to open: the server drops it
            shared = agree(self._mask_private, self._neighbours[owner][1])
            seed = pair_seed(shared, protocol=self.protocol, run_id=self.run_id, u=self.party_id, v=owner)
            (add if self.party_id < owner else subtract).append(seed)
        words = self._words  # consumed: the masked vector is written over the input
        MaskExpander(self.spec.length, self.dtype).accumulate(words, add=add, subtract=subtract)
        if self.spec.slot_bits < 8 * self.dtype.itemsize:
            np.bitwise_and(words, self.dtype.type((1 << self.spec.slot_bits) - 1), out=words)
        payload = upload_to_bytes(words, complaints)
        self.gate.record(env)
        self._words = None
        self._held = held
        self.gate.open = {Stage.CONSISTENCY} if self.active else {Stage.UNMASKING}
        return [self._send(Stage.UPLOAD, payload, Exposure.masked(self.spec.length, self.party_id))]

    # consistency (active-server setting): sign the survivor set the server tells this client.
    def _consistency(self, env: Envelope) -> list[Outgoing]:
        assert self.identity is not None
        told = ConsistencyRequest.from_bytes(env.payload, parties=self.participants).survivors
        if self.party_id not in told:
            raise PolicyError("the survivor set leaves out this client although it uploaded")
        if not set(told) <= set(self._advertised):
            raise PolicyError("the survivor set names clients that never advertised")
        if 1 + sum(pid in told for pid in self._held) < self.params.threshold:
            raise PolicyError(f"fewer than {self.params.threshold} survivors among this client's neighbourhood")
        statement = consistency_statement(self.protocol, self.run_id, self._advertised, told)
        self.gate.record(env)
        self._told, self._statement = told, statement
        self._signature = self.identity.sign(statement)
        self.gate.open = {Stage.UNMASKING}
        return [self._send(Stage.CONSISTENCY, self._signature, Exposure.public())]

    def check_consistency(self, request: UnmaskRequest) -> None:
        """Active-server setting: reveal only along the survivor set this client signed, and only
        with ``t`` signatures of its neighbourhood (itself included) on the same statement."""
        assert self._told is not None and self.directory is not None
        told = set(self._told)
        if not set(request.survivors) <= told:
            raise PolicyError("asked for the seed share of a client outside the survivor set this client signed")
        if set(request.dropped) & told:
            raise PolicyError("asked for the key share of a client inside the survivor set this client signed")
        neighbourhood = set(self._neighbours) | {self.party_id}
        signers = [signer for signer, _ in request.signatures]
        if not set(signers) <= told & neighbourhood:
            raise PolicyError("consistency signatures from outside this client's surviving neighbourhood")
        # This client's own signature counts without a verification (it is compared with what it
        # signed); then others' until t match: the rest need no checking.
        valid = 0
        others = []
        for signer, signature in request.signatures:
            if signer != self.party_id:
                others.append((signer, signature))
            elif signature != self._signature:
                raise AuthenticationError("this client's own consistency signature came back altered")
            else:
                valid = 1
        for signer, signature in others:
            if valid >= self.params.threshold:
                break
            self.directory.verify(signer, self._statement, signature, what="consistency signature")
            valid += 1
        if valid < self.params.threshold:
            raise PolicyError(f"only {valid} consistency signatures; revealing needs {self.params.threshold}")

    # unmasking: reveal one share per party, never both of one party.
    def _unmask(self, env: Envelope) -> list[Outgoing]:
        assert self._own_shares is not None
        request = UnmaskRequest.from_bytes(env.payload, parties=self.participants, signed=self.active)
        self.check_request(request)
        if self.active:
            self.check_consistency(request)
        b_shares = tuple(self._own_shares[0] if pid == self.party_id else self._held[pid][0]
                         for pid in request.survivors)
        s_shares = tuple(self._held[pid][1] for pid in request.dropped)
        self.gate.record(env)
        # Nothing secret is needed any more: forget it.
        self._seed, self._own_shares, self._held = None, None, {}
        self._mask_private = b""
        self._statement = self._signature = b""
        self._answered = request
        self.gate.open = {Stage.RESULT} if self.reveal.clients else set()
        self.done = not self.gate.open  # a sum only the server learns: nothing comes back, forget the run
        return [self._send(Stage.UNMASKING, UnmaskResponse(b_shares, s_shares).to_bytes(), Exposure.public())]

    def check_request(self, request: UnmaskRequest) -> None:
        """Refuse any request that could unmask an individual input."""
        both = set(request.survivors) & set(request.dropped)
        if both:
            raise PolicyError(f"asked for both the self-mask and the key share of parties {sorted(both)}")
        if self.party_id in request.dropped:
            raise PolicyError("asked for this client's own mask key although it uploaded")
        if self.party_id not in request.survivors:
            raise PolicyError("the request treats this client as lost although it uploaded")
        if len(request.survivors) < self.params.threshold:
            raise PolicyError(f"only {len(request.survivors)} survivors named; the threshold is "
                              f"{self.params.threshold}")
        unknown = (set(request.survivors) | set(request.dropped)) - set(self._held) - {self.party_id}
        if unknown:
            raise StageError(f"this client holds no shares of parties {sorted(unknown)}")

    def _result(self, env: Envelope) -> list[Outgoing]:
        assert self._answered is not None
        released = ReleasedSum.from_bytes(env.payload, self.spec, parties=self.clients)
        counted = set(released.contributors)
        if self.party_id not in counted:
            raise WireError("the released sum leaves out this client although it uploaded")
        if not counted <= self.participants:
            raise WireError("the released sum counts clients that were not asked for an input")
        # Whoever the server asked this client to unmask as a survivor uploaded; whoever it
        # named as lost did not. On the complete graph every uploader is a neighbour.
        survivors, lost = set(self._answered.survivors), set(self._answered.dropped)
        if not survivors <= counted or lost & counted or (self.params.complete and counted != survivors):
            raise WireError("the released sum's contributors contradict the unmasking request")
        try:
            result = decode_sum(self.spec, released.encoded_sum, contributors=len(released.contributors))
        except EncodingError as error:
            raise WireError(f"released sum is impossible: {error}") from error
        self.gate.record(env)
        self.gate.open = set()
        self.result, self.contributors = result, released.contributors
        return []
