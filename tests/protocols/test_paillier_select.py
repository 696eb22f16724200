"""The private argmin over encrypted tentative selections (protocols.argmin), on 1024-bit test keys."""

from __future__ import annotations

import numpy as np
import pytest

from protocols import (
    SERVER,
    AbortedError,
    ClientEndpoint,
    DropoutPlan,
    LocalNetwork,
    PolicyError,
    Reveal,
    SecureSum,
    StageError,
    SumRequest,
    VectorSpec,
    Visibility,
    make_sum,
)
from protocols.argmin import (
    MAX_TRIES,
    ArgminCoordinator,
    ArgminSession,
    Stage,
    argmin_index,
    score_groups,
)
from protocols.encoding import encode
from protocols.paillier import PaillierClientSession, PaillierOptions, PaillierServerSession
from protocols.primitives import paillier as raw
from protocols.wire import Envelope, Writer

N = 12
C = 4


def _session(keyholder: str = "all", network: LocalNetwork | None = None) -> SecureSum:
    session = make_sum("paillier", clients=list(range(N)), network=network, key_bits=1024,
                       allow_weak_keys=True, keyholder=keyholder)
    session.setup()
    return session


@pytest.fixture(scope="module")
def session() -> SecureSum:
    return _session()


@pytest.fixture(scope="module")
def counts() -> dict[int, np.ndarray]:
    rng = np.random.default_rng(7)
    return {k: rng.integers(0, 40, C) for k in range(N)}


def _plain_choice(counts: dict[int, np.ndarray], candidates: list[list[tuple[int, ...]]]) -> int:
    sums = [[np.sum([counts[k] for k in members], axis=0) for members in group] for group in candidates]
    return argmin_index(score_groups(sums))


def test_score_groups_is_distance_of_the_mean_distribution() -> None:
    uniform = [np.array([5, 5, 5, 5])]
    skewed = [np.array([10, 0, 0, 0])]
    assert score_groups([uniform, skewed]).tolist() == pytest.approx([0.0, 1.5])
    # Two opposite tries average to uniform: the paper's ‖E_h p_o,h − p_u‖₁ is 0 there.
    pair = [np.array([2, 2, 0, 0]), np.array([0, 0, 3, 3])]
    assert score_groups([pair])[0] == pytest.approx(0.0)
    assert score_groups([[np.zeros(4)]])[0] == np.inf
    assert argmin_index(np.array([0.3, 0.1, 0.1])) == 1


def test_argmin_matches_the_plain_decision(session: SecureSum, counts: dict[int, np.ndarray]) -> None:
    argmin = ArgminSession(session, length=C, bound=100, max_try_size=N)
    argmin.upload(counts, round=0)
    rng = np.random.default_rng(3)
    for round in range(4):
        tries = [tuple(sorted(rng.choice(N, size=4, replace=False).tolist())) for _ in range(5)]
        candidates = [[t] for t in tries]
        outcome = argmin.argmin(candidates, round=round)
        assert outcome.index == _plain_choice(counts, candidates)
        assert outcome.try_sizes == ((4,),) * 5
        assert outcome.missing == ()
    # Groups of several tries: the parameter search's criterion.
    groups = [[tuple(sorted(rng.choice(N, size=3, replace=False).tolist())) for _ in range(3)] for _ in range(4)]
    assert argmin.argmin(groups, round=9).index == _plain_choice(counts, groups)


def test_server_receives_only_ciphertexts_and_one_index(counts: dict[int, np.ndarray]) -> None:
    network = LocalNetwork()
    session = _session(network=network)
    argmin = ArgminSession(session, length=C, bound=100, max_try_size=N)
    argmin.upload(counts, round=0, statistic="try_counts")
    argmin.argmin([[(0, 1, 2)], [(3, 4, 5)], [(6, 7, 8, 9)]], round=1, statistic="try_argmin")
    to_server = [e for e in network.transcript if e.receiver == SERVER and e.statistic.startswith("try_")]
    uploads = [e for e in to_server if e.stage == "try_upload"]
    answers = [e for e in to_server if e.stage == "argmin"]
    assert len(uploads) == N and all(e.visibility == Visibility.CIPHERTEXT for e in uploads)
    assert len(answers) == 1 and answers[0].dimension == 1 and answers[0].k == 3
    assert len(to_server) == N + 1
    # The agent alone gets the try sums, as aggregates of >= 3 clients; nobody else hears of them.
    to_agent = [e for e in network.transcript if e.stage == "try_aggregates"]
    assert len(to_agent) == 1 and to_agent[0].sender == SERVER and to_agent[0].receiver != SERVER
    assert to_agent[0].visibility == Visibility.AGGREGATE and to_agent[0].k == 3
    assert to_agent[0].dimension == 3 * C
    # Every upload message is one packed ciphertext, not one per class.
    sizes = {e.bytes for e in uploads}
    assert len(sizes) == 1 and sizes.pop() < 2 * session.server.public_key.ciphertext_bytes  # type: ignore[attr-defined]


def test_tries_below_min_contributors_are_refused_before_sending(session: SecureSum,
                                                                 counts: dict[int, np.ndarray]) -> None:
    argmin = ArgminSession(session, length=C, bound=100, max_try_size=N, min_contributors=3)
    argmin.upload(counts, round=0)
    before = len(session.transcript)
    with pytest.raises(AbortedError, match="decrypts only tries"):
        argmin.argmin([[(0, 1, 2)], [(4, 5)]], round=1)
    assert len(session.transcript) == before


def test_agent_refuses_a_forged_small_try(counts: dict[int, np.ndarray]) -> None:
    """A server that asks the agent to decrypt a single client's ciphertext gets no index."""
    network = LocalNetwork()
    session = _session(network=network)
    argmin = ArgminSession(session, length=C, bound=100, max_try_size=N, min_contributors=2)
    argmin.upload(counts, round=0)

    def forge(data: bytes, message: object) -> bytes:
        env = Envelope.from_bytes(data)
        if env.stage != Stage.TRY_AGGREGATES:
            return data
        key = session.server.public_key  # type: ignore[attr-defined]
        assert key is not None
        # The run's own request digest, then one candidate of one try of one client.
        body = Writer().raw(env.payload[:16]).u32(1).u32(1).u32(1).raw(key.fingerprint).u32(1)
        single = argmin.server.ciphertexts(0)[0]
        payload = body.uint(int(single), key.ciphertext_bytes).finish()
        return Envelope(env.protocol, env.stage, env.run_id, env.sender, env.receiver, payload).to_bytes()

    network.interceptor = forge
    with pytest.raises(AbortedError):
        argmin.argmin([[(0, 1)], [(2, 3)]], round=1)
    asked = [e for e in network.transcript if e.stage == "try_aggregates"][-1]
    refusals = [e for e in network.transcript if e.stage == "refuse" and e.run_id == asked.run_id]
    assert [e.sender for e in refusals] == [asked.receiver]  # the agent itself refused it


def test_missing_uploads_are_left_out_and_reported(session: SecureSum, counts: dict[int, np.ndarray]) -> None:
    argmin = ArgminSession(session, length=C, bound=100, max_try_size=N)
    outcome = argmin.upload(counts, round=0, dropouts=DropoutPlan({5: "try_upload"}))
    assert outcome.dropped == (5,) and 5 not in argmin.stored
    result = argmin.argmin([[(4, 5, 6)], [(7, 8, 9)]], round=1)
    assert result.missing == (5,) and result.try_sizes == ((2,), (3,))
    reduced = {k: v for k, v in counts.items() if k != 5}
    assert result.index == _plain_choice(reduced, [[(4, 6)], [(7, 8, 9)]])


def test_lost_agent_aborts(session: SecureSum, counts: dict[int, np.ndarray]) -> None:
    argmin = ArgminSession(session, length=C, bound=100, max_try_size=N)
    argmin.upload(counts, round=0)
    with pytest.raises(AbortedError, match="agent did not release"):
        argmin.argmin([[(0, 1)], [(2, 3)]], round=1, agent=6, dropouts=DropoutPlan({6: "try_aggregates"}))


def test_store_follows_the_key_and_forget(counts: dict[int, np.ndarray]) -> None:
    session = _session()
    argmin = ArgminSession(session, length=C, bound=100, max_try_size=N)
    with pytest.raises(StageError, match="upload first"):
        argmin.argmin([[(0, 1)]], round=0)
    argmin.upload(counts, round=0)
    assert argmin.stored == frozenset(range(N))
    argmin.forget([0, 1])
    assert argmin.stored == frozenset(range(2, N))
    argmin.forget()
    assert argmin.stored == frozenset()
    with pytest.raises(StageError):
        argmin.argmin([[(2, 3)]], round=0)


def test_out_of_bound_counts_raise(session: SecureSum) -> None:
    argmin = ArgminSession(session, length=C, bound=10, max_try_size=N)
    with pytest.raises(ValueError):
        argmin.upload({0: np.array([11, 0, 0, 0])}, round=0)


def test_needs_a_client_side_key_holder() -> None:
    server_keys = make_sum("paillier", clients=list(range(3)), key_bits=1024, allow_weak_keys=True,
                           keyholder="server")
    assert isinstance(server_keys, SecureSum)
    with pytest.raises(ValueError, match="keyholder='server'"):
        ArgminSession(server_keys, length=C, bound=10, max_try_size=3)


def test_agent_mode_uses_the_key_holder(counts: dict[int, np.ndarray]) -> None:
    session = _session(keyholder="agent")
    argmin = ArgminSession(session, length=C, bound=100, max_try_size=N)
    argmin.upload(counts, round=0)
    outcome = argmin.argmin([[(0, 1, 2)], [(3, 4, 5)]], round=1)
    assert outcome.agent == session.server.agent  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="no secret key"):
        other = next(c for c in session.clients if c != session.server.agent)  # type: ignore[attr-defined]
        argmin.argmin([[(0, 1, 2)], [(3, 4, 5)]], round=2, agent=other)


def test_registry_sum_with_shared_key_stays_with_the_clients(session: SecureSum) -> None:
    """The packed registry sum Dubhe uses: equals the plain sum, reaches every client, not the server."""
    rng = np.random.default_rng(1)
    registries = np.zeros((N, 56), dtype=np.int64)
    registries[np.arange(N), rng.integers(0, 56, N)] = 1
    spec = VectorSpec(length=56, bound=1, summands=N)
    outcome = session.sum({k: registries[k] for k in range(N)}, spec=spec, statistic="registry",
                          reveal=Reveal(server=False, clients=True))
    assert np.array_equal(outcome.total, registries.sum(axis=0))
    assert SERVER not in outcome.learned_by and outcome.learned_by == frozenset(range(N))
    entries = session.transcript.select(run_id=outcome.run_id)
    assert all(e.visibility == Visibility.CIPHERTEXT for e in entries if e.receiver == SERVER)


def test_argmin_stages_are_paillier_stages_8_to_10() -> None:
    """One wire code, one stage table: the argmin's stages keep 8-10 and share no number or name."""
    from protocols.descriptors import descriptor
    from protocols.paillier import Stage as SumStage

    assert Stage is SumStage
    assert [int(Stage.TRY_UPLOAD), int(Stage.TRY_AGGREGATES), int(Stage.ARGMIN)] == [8, 9, 10]
    names = descriptor("paillier").stages
    assert [names[s] for s in (8, 9, 10)] == ["try_upload", "try_aggregates", "argmin"]
    assert len(set(names.values())) == len(names) == len(SumStage) + 2  # plus open and refuse
    assert MAX_TRIES >= 1 << 10


def test_an_impossible_index_is_rejected(counts: dict[int, np.ndarray]) -> None:
    network = LocalNetwork()
    session = _session(network=network)
    argmin = ArgminSession(session, length=C, bound=100, max_try_size=N)
    argmin.upload(counts, round=0)

    def tamper(data: bytes, message: object) -> bytes:
        env = Envelope.from_bytes(data)
        if env.stage != Stage.ARGMIN:
            return data
        return Envelope(env.protocol, env.stage, env.run_id, env.sender, env.receiver,
                        Writer().raw(env.payload[:16]).u32(99).finish()).to_bytes()

    network.interceptor = tamper
    with pytest.raises(AbortedError, match="names no candidate"):
        argmin.argmin([[(0, 1)], [(2, 3)]], round=1)


def _bare_clients(network: LocalNetwork, counts: dict[int, np.ndarray], spec: VectorSpec,
                  options: PaillierOptions) -> dict[int, PaillierClientSession]:
    """Clients as a deployment has them: each its own session and endpoint, nothing shared."""
    sessions = {}
    for pid in range(N):
        session = PaillierClientSession(pid, clients=range(N), options=options)
        endpoint = ClientEndpoint(pid, sessions={"paillier": session},
                                  contribute=lambda protocol, request, pid=pid: encode(spec, counts[pid]).values)
        network.attach(pid, lambda data, endpoint=endpoint: [m for d in data for m in endpoint.handle(d)])
        sessions[pid] = session
    return sessions


def test_the_coordinator_holds_only_server_state_and_runs_over_a_network(counts: dict[int, np.ndarray]) -> None:
    options = PaillierOptions(key_bits=1024, allow_weak_keys=True, keyholder="all")
    network = LocalNetwork()
    server = PaillierServerSession(clients=range(N), options=options)
    coordinator = ArgminCoordinator(server, network, length=C, bound=100, max_try_size=5, min_contributors=1)
    sessions = _bare_clients(network, counts, coordinator.spec, options)
    outcome = coordinator.upload(range(N), round=0)  # the key set-up runs first, as messages
    assert server.ready and outcome.contributors == tuple(range(N)) and len(outcome.run_ids) == 3  # 5 + 5 + 2
    assert coordinator.stored == frozenset(range(N))
    candidates = [[(0, 1, 2)], [(3, 4, 5, 6)], [(7, 8)]]
    result = coordinator.argmin(candidates, round=1)
    assert result.index == _plain_choice(counts, candidates) and result.agent in range(N)
    assert result.agent_seconds is None  # the server cannot time a client
    assert server.keys is not None and server.keys.private_key is None
    assert not any(isinstance(v, raw.PrivateKey) for v in [*vars(server).values(), *vars(coordinator).values()])
    # Each agent applies its own floor, whatever the server's: a try of one client is refused.
    for session in sessions.values():
        assert session.min_contributors == 2
    with pytest.raises(AbortedError, match="did not release an index"):
        coordinator.argmin([[(0,)], [(1, 2)]], round=2)


def test_a_client_without_the_private_key_refuses_to_be_the_agent(counts: dict[int, np.ndarray]) -> None:
    session = _session(keyholder="agent")
    member = next(c for c in session.clients if c != session.server.agent)  # type: ignore[attr-defined]
    client = session.client_session(member)
    spec = VectorSpec(length=C, bound=100, summands=N)
    request = SumRequest(kind="argmin", statistic="try_argmin", round=0, spec=spec,
                         reveal=Reveal(server=True, clients=False), participants=(member,))
    with pytest.raises(PolicyError, match="no secret key"):
        client.join(run_id=b"a" * 16, request=request, values=None)
