"""Packed Paillier secure sum with a client as key holder.

Roles: clients encrypt packed plaintexts; the server only multiplies ciphertexts and never
holds the secret key (unless ``keyholder="server"``, a weaker mode the audit flags); the key
holder decrypts. Key holder modes:

* ``agent`` (default): one client, picked by the server with ``secrets``, generates the key
  pair and decrypts aggregates; it releases the decoded sum through the server, so the server
  learns the sum (only use it for statistics the server may learn);
* ``all``: the agent seals the secret key to every client over channels relayed by the server
  (Dubhe's scheme); the server relays the aggregate ciphertext and every contributor decrypts
  it itself, so the server learns the sum only if asked;
* ``server``: the server generates and holds the key — a client's ciphertext is then readable
  by the server, i.e. no protection; kept for comparison.

Key set-up is a run of messages (:mod:`protocols.paillier_setup`); a sum is another
(:mod:`protocols.paillier_sum`); Dubhe's private argmin runs under the same wire code
(:mod:`protocols.argmin`). This module holds each side's long-lived state: the server's
(:class:`PaillierServerSession`: the public key, who holds the private one) and one client's
(:class:`PaillierClientSession`: its keys and obfuscator pool, serialisable for its snapshot).

Many entries share one plaintext (see :class:`~protocols.encoding.PackingLayout`), and each
client can precompute its obfuscators r^n offline (:attr:`PaillierOptions.pool_size`).
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Sequence
from typing import Any, Final

import numpy.typing as npt

from .base import Party, Reveal, ServerParty
from .encoding import PackingLayout, VectorSpec
from .errors import PolicyError, StageError, WireError
from .paillier_common import (
    KEYHOLDERS,
    PROTOCOL,
    ClientKeys,
    Keyholder,
    PaillierOptions,
    Stage,
    options_of,
    private_key,
    read_public_key,
    read_setup_params,
    secret_width,
    write_public_key,
    write_setup_params,
)
from .paillier_setup import KeySetup, SetupAgent, SetupMember, SetupServer
from .paillier_sum import PaillierClient, PaillierServer
from .primitives import paillier as raw
from .session import ClientSession, ServerSession, SumRequest, as_encoded
from .wire import SERVER, PartyId, Reader, Writer

__all__ = [
    "PROTOCOL", "ClientKeys", "Keyholder", "PaillierClientSession", "PaillierOptions", "PaillierServerSession",
    "Stage",
]

SNAPSHOT_VERSION: Final = 1

def layout_for(spec: VectorSpec, key_bits: int) -> PackingLayout:
    """Packing of ``spec`` under a ``key_bits``-bit modulus (plaintexts stay below n)."""
    return PackingLayout.for_spec(spec, capacity_bits=key_bits - 1)


class PaillierServerSession(ServerSession):
    """The server's long-lived state: the public key, the agent, who confirmed which key.

    It never holds p or q, except under ``keyholder="server"``.
    """

    name = PROTOCOL

    def __init__(self, *, clients: Sequence[PartyId], options: Any = None) -> None:
        super().__init__(clients=clients, options=options_of(options))
        self.opts: PaillierOptions = self.options
        self.keys: KeySetup | None = None

    @property
    def ready(self) -> bool:
        return self.keys is not None

    @property
    def public_key(self) -> raw.PublicKey | None:
        return None if self.keys is None else self.keys.public_key

    @property
    def agent(self) -> PartyId | None:
        """The client that generated the key (``None`` before set-up and under ``keyholder="server"``)."""
        if self.keys is None or self.keys.agent == SERVER:
            return None
        return self.keys.agent

    @property
    def holders(self) -> frozenset[PartyId]:
        """Clients known to hold the private key."""
        return frozenset() if self.keys is None else self.keys.holders

    def setup(self, *, run_id: bytes, round: int = -1, statistic: str = "setup") -> ServerParty | None:
        if self.keys is not None:
            return None
        mode = self.opts.keyholder
        server_key = None
        if mode == "server":
            server_key = raw.generate_keypair(self.opts.key_bits, allow_weak=self.opts.allow_weak_keys)
            agent = SERVER
        else:
            agent = secrets.choice(self.clients)
        request = SumRequest(kind="setup", statistic=statistic, round=round, spec=None, reveal=Reveal(),
                             participants=self.clients, params=write_setup_params(mode, agent), session=self.tag)
        return SetupServer(run_id=run_id, request=request, clients=self.clients, options=self.opts, agent=agent,
                           on_done=self._installed, server_key=server_key)

    def _installed(self, setup: KeySetup) -> None:
        self.keys = setup

    def layout(self, spec: VectorSpec) -> PackingLayout:
        return layout_for(spec, self.opts.key_bits)

    def check(self, *, spec: VectorSpec, reveal: Reveal) -> None:
        if self.opts.keyholder == "agent" and not reveal.server:
            raise ValueError("keyholder='agent' releases sums through the server; use keyholder='all' "
                             "for a sum the server must not learn")
        self.layout(spec)

    def open(self, *, run_id: bytes, request: SumRequest) -> ServerParty:
        if request.kind != "sum":
            raise ValueError(f"a Paillier session opens sums; {request.kind!r} runs belong to protocols.argmin")
        keys = self.keys
        if keys is None:
            raise StageError("run the key set-up before summing")
        if request.spec is None:
            raise ValueError("a sum needs a spec")
        self.check(spec=request.spec, reveal=request.reveal)
        request = dataclasses.replace(request, session=self.tag)
        return PaillierServer(run_id=run_id, request=request, clients=self.clients, mode=keys.mode,
                              public_key=keys.public_key, agent=keys.agent, holders=keys.holders,
                              private_key=keys.private_key)


class PaillierClientSession(ClientSession):
    """One client's keys: the public key, its obfuscator pool, and the private key if it holds one."""

    name = PROTOCOL

    def __init__(self, party: PartyId, *, clients: Sequence[PartyId], options: Any = None) -> None:
        super().__init__(party, clients=clients, options=options_of(options))
        self.opts: PaillierOptions = self.options
        self.keys: ClientKeys | None = None
        self.agent: PartyId | None = None
        """Who generated this client's key (:data:`~protocols.wire.SERVER` under the weak mode)."""
        self.min_contributors = self.opts.min_contributors
        """This client's floor as an argmin agent: the smallest try sum it decrypts."""

    @property
    def holds_key(self) -> bool:
        return self.keys is not None and self.keys.private_key is not None

    def fill_pool(self, count: int) -> None:
        """Precompute ``count`` more obfuscators now (offline), e.g. before a timed sum."""
        if self.keys is None:
            raise StageError("no key yet: run the key set-up first")
        self.keys.pool.fill(count)

    def layout(self, spec: VectorSpec) -> PackingLayout:
        return layout_for(spec, self.opts.key_bits)

    def _install(self, keys: ClientKeys, agent: PartyId) -> None:
        """A completed set-up run's keys replace this client's (the pool starts afresh)."""
        keys.pool.fill(self.opts.pool_size)
        self.keys, self.agent = keys, agent

    def join(self, *, run_id: bytes, request: SumRequest, values: npt.NDArray[Any] | None) -> Party:
        if request.kind == "setup":
            return self._join_setup(run_id, request)
        keys = self.keys
        if keys is None:
            raise StageError("no Paillier key at this client: the key set-up has not reached it")
        spec = request.spec
        if spec is None or request.params:
            raise WireError("a Paillier run carries a spec and no parameters")
        layout = PackingLayout.for_spec(spec, capacity_bits=keys.public_key.plaintext_capacity_bits)
        if request.kind == "sum":
            return PaillierClient(self.party_id, run_id=run_id, request=request, layout=layout, keys=keys,
                                  encoded=as_encoded(values, spec), clients=self.clients,
                                  server_holds_key=self.agent == SERVER,
                                  agent=self.opts.keyholder == "agent" and self.agent == self.party_id)
        from .argmin_parties import ArgminAgent, StoreClient

        if request.kind == "store":
            return StoreClient(self.party_id, run_id=run_id, request=request, layout=layout, keys=keys,
                               encoded=as_encoded(values, spec), clients=self.clients)
        if request.participants != (self.party_id,):
            raise StageError("an argmin run names its agent as its only participant")
        if keys.private_key is None:
            raise PolicyError(f"client {self.party_id} holds no secret key and cannot act as the agent")
        return ArgminAgent(self.party_id, run_id=run_id, request=request, layout=layout, keys=keys,
                           clients=self.clients, min_contributors=self.min_contributors)

    def _join_setup(self, run_id: bytes, request: SumRequest) -> Party:
        mode, agent = read_setup_params(request.params)
        if mode != self.opts.keyholder:
            raise PolicyError(f"a set-up for keyholder={mode!r}; this client runs keyholder={self.opts.keyholder!r}")
        if (mode == "server") != (agent == SERVER) or (agent != SERVER and agent not in request.participants):
            raise WireError(f"party {agent} cannot generate the key of this set-up")
        if self.party_id not in request.participants:
            raise StageError("a set-up run that leaves this client out")
        if agent == self.party_id:
            return SetupAgent(self.party_id, run_id=run_id, options=self.opts, clients=self.clients,
                              install=self._install)
        return SetupMember(self.party_id, run_id=run_id, options=self.opts, agent=agent, install=self._install)

    # --- snapshot: this client's own state, secrets included; it never leaves the client ------

    def to_bytes(self) -> bytes:
        """Version, mode, argmin floor, then the public key with its agent and, if held, p and q.
        Obfuscators are not kept: a restored client computes them on demand."""
        writer = Writer().u8(SNAPSHOT_VERSION).u8(KEYHOLDERS.index(self.opts.keyholder)).u32(self.min_contributors)
        if self.keys is None or self.agent is None:
            return writer.u8(0).finish()
        write_public_key(writer.u8(1), self.agent, self.keys.public_key)
        private = self.keys.private_key
        if private is None:
            return writer.u8(0).finish()
        width = secret_width(self.opts.key_bits)
        p, q = private.export_secret()
        return writer.u8(1).uint(p, width).uint(q, width).finish()

    def load_bytes(self, data: bytes) -> None:
        """Restore :meth:`to_bytes`, checked as strictly as a message; nothing changes on error."""
        reader = Reader(data)
        if reader.u8() != SNAPSHOT_VERSION:
            raise WireError("unknown Paillier snapshot version")
        mode_code = reader.u8()
        if mode_code >= len(KEYHOLDERS) or KEYHOLDERS[mode_code] != self.opts.keyholder:
            raise WireError("the snapshot was taken under another key holder mode")
        floor = reader.u32()
        if floor < 1:
            raise WireError("an argmin floor must be at least 1")
        has_keys = reader.u8()
        if has_keys not in (0, 1):
            raise WireError("bad key flag")
        keys: ClientKeys | None = None
        agent: PartyId | None = None
        if has_keys:
            agent, public = read_public_key(reader, bits=self.opts.key_bits)
            keys = ClientKeys(public)
            has_private = reader.u8()
            if has_private not in (0, 1):
                raise WireError("bad private key flag")
            if has_private:
                width = secret_width(self.opts.key_bits)
                keys.private_key = private_key(public, reader.uint(width), reader.uint(width))
            self._check_holding(agent, bool(has_private))
        reader.end()
        self.min_contributors, self.keys, self.agent = floor, keys, agent

    def _check_holding(self, agent: PartyId, has_private: bool) -> None:
        mode = self.opts.keyholder
        if (mode == "server") != (agent == SERVER) or (agent != SERVER and agent not in self.clients):
            raise WireError(f"party {agent} cannot have generated this client's key")
        should = mode == "all" or (mode == "agent" and agent == self.party_id)
        if has_private != should:
            raise WireError("the snapshot's private key does not fit the key holder mode")
