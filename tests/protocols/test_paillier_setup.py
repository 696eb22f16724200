"""Paillier key set-up as messages, parties that share only bytes, client snapshots."""

from __future__ import annotations

from types import SimpleNamespace

import gmpy2
import numpy as np
import pytest

from protocols import (
    SERVER,
    AbortedError,
    AuthenticationError,
    DropoutPlan,
    ForeignKeyError,
    LocalNetwork,
    PolicyError,
    Reveal,
    StageError,
    SumRequest,
    VectorSpec,
    WireError,
    make_sum,
)
from protocols import paillier as paillier_session
from protocols.descriptors import descriptor
from protocols.paillier import PaillierClientSession, PaillierOptions, PaillierServerSession, Stage
from protocols.paillier_common import (
    read_setup_params,
    seal_associated,
    secret_width,
    write_public_key,
    write_setup_params,
)
from protocols.paillier_setup import SetupMember
from protocols.primitives import paillier as raw
from protocols.primitives.channel import ChannelKey, seal
from protocols.wire import Envelope, Writer

WEAK = {"key_bits": 1024, "allow_weak_keys": True}
STAGES = descriptor("paillier").stages


class CountingNetwork(LocalNetwork):
    """A local network that counts exchanges (round trips) and keeps every message's bytes."""

    def __init__(self) -> None:
        super().__init__(interceptor=self._keep)
        self.exchanges = 0
        self.seen: list[tuple[Envelope, bytes]] = []

    def _keep(self, data, message):
        self.seen.append((message.envelope, data))
        return data

    def exchange(self, outbox):
        self.exchanges += 1
        return super().exchange(outbox)


def inputs_for(n, length, bound, seed=0):
    rng = np.random.default_rng(seed)
    return {i: rng.integers(0, bound + 1, length) for i in range(n)}


@pytest.mark.parametrize(("keyholder", "exchanges"), [("server", 1), ("agent", 2), ("all", 3)])
def test_setup_is_messages_in_few_exchanges(keyholder, exchanges):
    network = CountingNetwork()
    session = make_sum("paillier", clients=range(5), network=network, keyholder=keyholder, **WEAK)
    session.setup()
    assert network.exchanges == exchanges
    server = session.server
    assert isinstance(server, PaillierServerSession) and server.ready
    stages = {(STAGES[env.stage], env.sender == SERVER) for env, _ in network.seen}
    if keyholder == "server":
        assert server.agent is None and server.holders == frozenset()
        assert stages == {("open", True), ("public_key", True), ("key_ready", False)}
    else:
        agent = server.agent
        assert agent in range(5)
        senders = {env.sender for env, _ in network.seen if STAGES[env.stage] == "public_key" and env.sender != SERVER}
        assert senders == {agent}  # the agent's key, relayed: no party but the agent made it
    if keyholder == "all":
        assert server.holders == frozenset(range(5))
        assert ("advertise", False) in stages and ("sealed_key", True) in stages
    if keyholder == "agent":
        assert server.holders == frozenset({server.agent})
    assert server.keys is not None and server.keys.ready == frozenset(range(5))


@pytest.mark.parametrize("keyholder", ["agent", "all"])
def test_the_server_never_holds_the_factors(keyholder):
    network = CountingNetwork()
    session = make_sum("paillier", clients=range(4), network=network, keyholder=keyholder, **WEAK)
    session.setup()
    server = session.server
    assert server.keys.private_key is None
    agent_keys = session.client_session(server.agent).keys
    p, q = agent_keys.private_key.export_secret()
    width = secret_width(1024)
    for _env, data in network.seen:  # every byte that reached or left the server
        for prime in (p, q):
            assert prime.to_bytes(width, "big")[1:] not in data
    assert not any(isinstance(v, raw.PrivateKey) for v in vars(server).values())


def test_each_client_holds_only_its_own_parsed_keys():
    session = make_sum("paillier", clients=range(4), keyholder="all", **WEAK)
    session.setup()
    keys = [session.client_session(c).keys for c in range(4)]
    assert len({id(k) for k in keys}) == 4 and len({id(k.public_key) for k in keys}) == 4
    assert len({id(k.private_key) for k in keys}) == 4
    assert len({k.public_key for k in keys}) == 1 and session.server.public_key == keys[0].public_key
    assert session.server.public_key is not keys[0].public_key
    agent_mode = make_sum("paillier", clients=range(4), keyholder="agent", **WEAK)
    agent_mode.setup()
    holders = {c for c in range(4) if agent_mode.client_session(c).holds_key}
    assert holders == {agent_mode.server.agent}


def test_setup_params_are_parsed_strictly():
    data = write_setup_params("all", 7)
    assert read_setup_params(data) == ("all", 7)
    for bad in (data + b"\x00", data[:-1], bytes([3]) + data[1:]):
        with pytest.raises(WireError):
            read_setup_params(bad)


def _member(keyholder="agent", agent=0, party=1, run_id=b"r" * 16):
    installed = []
    member = SetupMember(party, run_id=run_id, options=PaillierOptions(keyholder=keyholder, **WEAK), agent=agent,
                         install=lambda keys, owner: installed.append((keys, owner)))
    return member, installed


def _public_key_env(payload, run_id=b"r" * 16, receiver=1):
    return Envelope("paillier", Stage.PUBLIC_KEY, run_id, SERVER, receiver, payload)


def _key_payload(key, owner=0):
    return write_public_key(Writer(), owner, key).finish()


def test_a_malformed_key_is_refused_and_changes_nothing(keypair_1024):
    pk, _ = keypair_1024
    good = _key_payload(pk)
    n_bytes = pk.to_bytes()
    prime = int(gmpy2.next_prime(gmpy2.mpz(2) ** 1023 + 12345))  # a 1024-bit prime: odd, right length
    bad_payloads = {
        "truncated": good[:-1],
        "extended": good + b"\x00",
        "fingerprint": good[:4] + bytes([good[4] ^ 1]) + good[5:],
        "even": good[:-1] + bytes([good[-1] ^ 1]),
        "short": Writer().u32(0).raw(pk.fingerprint).blob(n_bytes[1:]).finish(),
        "prime": Writer().u32(0).raw(raw.fingerprint_of(prime)).blob(prime.to_bytes(128, "big")).finish(),
    }
    member, installed = _member()
    for name, payload in bad_payloads.items():
        with pytest.raises(WireError):
            member.receive(_public_key_env(payload))
        assert member.gate.open == {Stage.PUBLIC_KEY} and not installed, name
    with pytest.raises(ForeignKeyError):  # a key owned by another party than this run's agent
        member.receive(_public_key_env(_key_payload(pk, owner=3)))
    out = member.receive(_public_key_env(good))
    assert installed[0][0].public_key == pk and installed[0][1] == 0
    assert out[0].envelope.stage == Stage.KEY_READY and out[0].envelope.payload == pk.fingerprint


def _sealed_env(member, agent_channel, p, q, *, run_id=b"r" * 16, agent=0, receiver=1):
    width = secret_width(1024)
    secret = Writer().uint(p, width).uint(q, width).finish()
    sealed = seal(agent_channel, member._channel.public_bytes, secret,
                  associated=seal_associated(run_id, agent, receiver), purpose=b"paillier-sk")
    return Envelope("paillier", Stage.SEALED_KEY, b"r" * 16, SERVER, 1, agent_channel.public_bytes + sealed)


def test_a_sealed_key_must_factor_the_public_key_and_be_sealed_for_this_client(keypair_1024):
    pk, sk = keypair_1024
    member, installed = _member(keyholder="all")
    assert member.start()[0].envelope.stage == Stage.ADVERTISE
    member.receive(_public_key_env(_key_payload(pk)))
    agent_channel = ChannelKey()
    _, other = raw.generate_keypair(1024, allow_weak=True)
    with pytest.raises(ForeignKeyError):
        member.receive(_sealed_env(member, agent_channel, *other.export_secret()))
    with pytest.raises(AuthenticationError):  # sealed for client 2: the associated data differs
        member.receive(_sealed_env(member, agent_channel, *sk.export_secret(), receiver=2))
    assert not installed and member.gate.open == {Stage.SEALED_KEY}
    out = member.receive(_sealed_env(member, agent_channel, *sk.export_secret()))
    keys, agent = installed[0]
    assert agent == 0 and keys.private_key is not None and keys.private_key.public_key == pk
    assert out[0].envelope.stage == Stage.KEY_READY


def test_a_client_refuses_a_setup_for_another_key_holder_mode():
    client = PaillierClientSession(1, clients=range(3), options=PaillierOptions(keyholder="all", **WEAK))
    request = SumRequest(kind="setup", statistic="setup", round=0, spec=None, reveal=Reveal(),
                         participants=(0, 1, 2), params=write_setup_params("server", SERVER))
    with pytest.raises(PolicyError):
        client.join(run_id=b"r" * 16, request=request, values=None)
    unknown_agent = SumRequest(kind="setup", statistic="setup", round=0, spec=None, reveal=Reveal(),
                               participants=(0, 1, 2), params=write_setup_params("all", 9))
    with pytest.raises(WireError):
        client.join(run_id=b"r" * 16, request=unknown_agent, values=None)


def test_a_lost_agent_aborts_the_setup():
    network = LocalNetwork()
    session = make_sum("paillier", clients=range(4), network=network, keyholder="all", **WEAK)
    network.plan("paillier", DropoutPlan({c: "public_key" for c in range(4)}), STAGES)
    with pytest.raises(AbortedError, match="did not publish"):
        session.setup()
    assert not session.server.ready


def _draw_agent(monkeypatch: pytest.MonkeyPatch, agent: int) -> None:
    """Fix the server's draw of the key agent (``secrets.choice`` in ``protocols.paillier`` only)."""
    monkeypatch.setattr(paillier_session, "secrets", SimpleNamespace(choice=lambda clients: agent))


def test_a_lost_agent_during_setup_aborts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _draw_agent(monkeypatch, 3)  # the agent itself vanishes: nobody can get a sealed key
    network = LocalNetwork()
    session = make_sum("paillier", clients=range(5), network=network, keyholder="all", **WEAK)
    network.plan("paillier", DropoutPlan({3: "sealed_key"}), STAGES)
    with pytest.raises(AbortedError, match="agent"):
        session.setup()
    assert not session.server.ready


def test_a_client_lost_during_setup_sits_out_the_sums(monkeypatch: pytest.MonkeyPatch) -> None:
    _draw_agent(monkeypatch, 0)  # any agent but the lost client (the lost agent is the test above)
    network = LocalNetwork()
    session = make_sum("paillier", clients=range(5), network=network, keyholder="all", **WEAK)
    network.plan("paillier", DropoutPlan({3: "sealed_key"}), STAGES)
    session.setup()
    assert session.server.agent == 0
    network.plan("paillier", None, STAGES)
    assert session.server.holders == frozenset({0, 1, 2, 4}) and session.client_session(3).keys is None
    inputs = inputs_for(5, 6, 3)
    out = session.sum(inputs, spec=VectorSpec(length=6, bound=3, summands=5), reveal=Reveal(server=False))
    assert out.dropped == (3,) and any("refused" in r for r in out.rejected)
    assert np.array_equal(out.total, np.sum([inputs[c] for c in (0, 1, 2, 4)], axis=0))


def test_results_and_aggregates_go_to_the_participants_only():
    network = CountingNetwork()
    session = make_sum("paillier", clients=range(6), network=network, keyholder="agent", **WEAK)
    session.setup()
    agent = session.server.agent
    participants = [c for c in range(6) if c != agent][:3]
    network.seen.clear()
    network.exchanges = 0
    inputs = inputs_for(6, 5, 2)
    out = session.sum({c: inputs[c] for c in participants}, spec=VectorSpec(length=5, bound=2, summands=6))
    receivers = {env.receiver for env, _ in network.seen if env.sender == SERVER}
    assert receivers == {*participants, agent}
    to_agent = [STAGES[env.stage] for env, _ in network.seen if env.receiver == agent]
    assert to_agent == ["open", "aggregate"]  # one exchange for the agent that does not contribute
    assert network.exchanges == 3  # open/upload, aggregate/release, result
    assert out.learned_by == frozenset({SERVER, agent, *participants})


def test_a_client_refuses_to_release_a_sum_declared_for_the_clients(keypair_1024):
    session = make_sum("paillier", clients=range(3), keyholder="all", **WEAK)
    session.setup()
    spec = VectorSpec(length=4, bound=1, summands=3)
    request = SumRequest(kind="sum", statistic="sum", round=0, spec=spec, reveal=Reveal(server=False),
                         participants=(0, 1, 2))
    run_id = b"q" * 16
    server = session.server.open(run_id=run_id, request=request)
    server.start()
    clients = {c: session.client_session(c).join(run_id=run_id, request=request, values=np.ones(4, np.uint64))
               for c in range(3)}
    for party in clients.values():
        server.receive(party.start()[0].envelope)
    aggregate = next(o.envelope for o in server.advance() if o.envelope.receiver == 0)
    forged = Envelope(aggregate.protocol, aggregate.stage, run_id, SERVER, 0,
                      aggregate.payload[:16] + b"\x01" + aggregate.payload[17:])
    with pytest.raises(PolicyError):
        clients[0].receive(forged)
    clients[0].receive(aggregate)
    assert clients[0].result.tolist() == [3.0] * 4


def test_pool_is_filled_when_the_keys_arrive():
    session = make_sum("paillier", clients=range(3), keyholder="all", pool_size=2, **WEAK)
    session.setup()
    pools = [session.client_session(c).keys.pool for c in range(3)]
    assert [len(p) for p in pools] == [2, 2, 2] and all(p.private_key is not None for p in pools)
    session.sum(inputs_for(3, 4, 1), spec=VectorSpec(length=4, bound=1, summands=3))
    assert all(p.hits == 1 and p.misses == 0 for p in pools)


# --- snapshots ----------------------------------------------------------------------------------

@pytest.mark.parametrize("keyholder", ["agent", "all", "server"])
def test_client_snapshots_round_trip_and_keep_working(keyholder):
    session = make_sum("paillier", clients=range(4), keyholder=keyholder, **WEAK)
    session.setup()
    for c in range(4):
        original = session.client_session(c)
        data = original.to_bytes()
        restored = PaillierClientSession(c, clients=range(4), options=original.opts)
        restored.load_bytes(data)
        assert restored.to_bytes() == data
        assert restored.agent == original.agent and restored.keys.public_key == original.keys.public_key
        assert restored.holds_key == original.holds_key
        if original.holds_key:
            assert restored.keys.private_key.export_secret() == original.keys.private_key.export_secret()
        else:
            assert data[-1] == 0  # ends with "no private key": a non-holder's snapshot has no secret
        session.sessions[c] = restored
        session.endpoints[c].sessions["paillier"] = restored
    inputs = inputs_for(4, 6, 2)
    out = session.sum(inputs, spec=VectorSpec(length=6, bound=2, summands=4))
    assert np.array_equal(out.total, np.sum(list(inputs.values()), axis=0))


def test_a_fresh_client_snapshot_has_no_keys():
    client = PaillierClientSession(0, clients=range(2), options=PaillierOptions(**WEAK))
    data = client.to_bytes()
    other = PaillierClientSession(0, clients=range(2), options=PaillierOptions(**WEAK))
    other.load_bytes(data)
    assert other.keys is None and other.to_bytes() == data


def test_snapshots_are_parsed_strictly():
    session = make_sum("paillier", clients=range(3), keyholder="all", **WEAK)
    session.setup()
    data = session.client_session(1).to_bytes()

    def fresh(keyholder="all", party=1):
        return PaillierClientSession(party, clients=range(3), options=PaillierOptions(keyholder=keyholder, **WEAK))

    for bad in (data[:-1], data + b"\x00", b"", bytes([2]) + data[1:]):
        client = fresh()
        with pytest.raises(WireError):
            client.load_bytes(bad)
        assert client.keys is None
    with pytest.raises(WireError):
        fresh(keyholder="agent").load_bytes(data)  # taken under another mode
    flipped = data[:-3] + bytes([data[-3] ^ 0x10]) + data[-2:]  # a bit of q
    with pytest.raises(ForeignKeyError):
        fresh().load_bytes(flipped)
    other = make_sum("paillier", clients=range(3), keyholder="agent", **WEAK)
    other.setup()
    member = next(c for c in range(3) if c != other.server.agent)
    snapshot = other.client_session(member).to_bytes()
    assert fresh("agent", member).load_bytes(snapshot) is None
    holder = fresh("agent", other.server.agent)
    with pytest.raises(WireError, match="mode"):  # the agent of agent mode must hold the key
        holder.load_bytes(snapshot)


def test_a_client_without_keys_refuses_sums():
    client = PaillierClientSession(0, clients=range(2), options=PaillierOptions(**WEAK))
    request = SumRequest(kind="sum", statistic="sum", round=0, spec=VectorSpec(length=2, bound=1, summands=2),
                         reveal=Reveal(), participants=(0, 1))
    with pytest.raises(StageError):
        client.join(run_id=b"r" * 16, request=request, values=None)
