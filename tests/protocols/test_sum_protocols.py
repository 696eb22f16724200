"""Plain and Paillier sessions end to end: correctness, dropouts, tampering, transcript."""

import numpy as np
import pytest

from protocols import (
    SERVER,
    AbortedError,
    DropoutPlan,
    LocalNetwork,
    Reveal,
    SumRequest,
    VectorSpec,
    Visibility,
    make_sum,
)
from protocols.paillier import Stage
from protocols.wire import Envelope

WEAK = {"key_bits": 1024, "allow_weak_keys": True}


def inputs_for(n, length, bound, seed=0):
    rng = np.random.default_rng(seed)
    return {i: rng.integers(0, bound + 1, length) for i in range(n)}


@pytest.fixture(scope="module")
def agent_session():
    session = make_sum("paillier", clients=range(12), **WEAK)
    session.setup()
    return session


@pytest.mark.parametrize("keyholder", ["agent", "all", "server"])
def test_paillier_equals_plain_sum(keyholder):
    inputs = inputs_for(8, 300, 1000)
    spec = VectorSpec(length=300, bound=1000, summands=8)
    session = make_sum("paillier", clients=range(8), keyholder=keyholder, **WEAK)
    plain = make_sum("plain", clients=range(8))
    out = session.sum(inputs, spec=spec)
    assert np.array_equal(out.total, plain.sum(inputs, spec=spec).total)
    assert np.array_equal(out.total, np.sum(list(inputs.values()), axis=0))
    assert SERVER in out.learned_by and set(range(8)) <= out.learned_by


def test_signed_floats_through_paillier(agent_session):
    rng = np.random.default_rng(3)
    spec = VectorSpec(length=50, bound=4.0, summands=12, kind="float", signed=True, frac_bits=20)
    inputs = {i: rng.uniform(-4, 4, 50) for i in range(12)}
    out = agent_session.sum(inputs, spec=spec)
    assert np.max(np.abs(out.total - np.sum(list(inputs.values()), axis=0))) <= spec.sum_error_bound(12)


def test_dropouts_exclude_the_lost_and_keep_the_sum_exact(agent_session):
    spec = VectorSpec(length=20, bound=5, summands=12)
    inputs = inputs_for(12, 20, 5, seed=1)
    lost = [c for c in range(12) if c != agent_session.server.agent][:3]
    out = agent_session.sum(inputs, spec=spec, dropouts=DropoutPlan({c: "upload" for c in lost}))
    assert out.dropped == tuple(sorted(lost))
    assert np.array_equal(out.total, np.sum([inputs[c] for c in range(12) if c not in lost], axis=0))


def test_lost_agent_aborts_cleanly(agent_session):
    spec = VectorSpec(length=4, bound=5, summands=12)
    with pytest.raises(AbortedError):
        agent_session.sum(inputs_for(12, 4, 5), spec=spec,
                          dropouts=DropoutPlan({agent_session.server.agent: "aggregate"}))


def test_shared_key_mode_hides_sum_from_server_when_asked():
    session = make_sum("paillier", clients=range(5), keyholder="all", **WEAK)
    spec = VectorSpec(length=56, bound=1, summands=5)
    out = session.sum(inputs_for(5, 56, 1), spec=spec, reveal=Reveal(server=False))
    assert SERVER not in out.learned_by and out.learned_by == frozenset(range(5))
    server_reads = {e.visibility for e in session.transcript if e.receiver == SERVER}
    assert server_reads <= {Visibility.CIPHERTEXT, Visibility.PUBLIC, Visibility.SEALED}


def test_agent_mode_refuses_a_sum_the_server_must_not_learn(agent_session):
    with pytest.raises(ValueError, match="keyholder='all'"):
        agent_session.sum(inputs_for(12, 4, 1), spec=VectorSpec(length=4, bound=1, summands=12),
                          reveal=Reveal(server=False))


def test_transcript_records_every_upload_as_ciphertext_to_the_server(agent_session):
    spec = VectorSpec(length=56, bound=1, summands=12)
    out = agent_session.sum(inputs_for(12, 56, 1), spec=spec, statistic="registry", round=7)
    entries = agent_session.transcript.select(run_id=out.run_id)
    uploads = [e for e in entries if e.stage == "upload"]
    assert len(uploads) == 12 and all(e.receiver == SERVER for e in uploads)
    assert all(e.visibility == Visibility.CIPHERTEXT and e.statistic == "registry" and e.round == 7
               for e in uploads)
    assert all(e.bytes > 0 for e in entries)
    to_agent = [e for e in entries if e.stage == "aggregate"]
    assert len(to_agent) == 1 and to_agent[0].k == 12 and to_agent[0].visibility == Visibility.AGGREGATE


def tamper(match, mutate):
    """An interceptor that mutates the first message matching ``match``."""
    state = {"done": False}

    def interceptor(data, message):
        if not state["done"] and match(message.envelope):
            state["done"] = True
            return mutate(data)
        return data
    return interceptor, state


def _is_upload_from(client):
    return lambda env: env.stage == Stage.UPLOAD and env.sender == client


@pytest.mark.parametrize("name,mutate", [
    ("flipped byte", lambda b: b[:-5] + bytes([b[-5] ^ 0x01]) + b[-4:]),
    ("truncated", lambda b: b[:-7]),
    ("extended", lambda b: b + b"\x00"),
    ("wrong length field", lambda b: b[:33] + (10).to_bytes(4, "big") + b[37:]),
])
def test_tampered_upload_is_rejected_and_run_stays_exact(name, mutate):
    n = 6
    spec = VectorSpec(length=56, bound=1, summands=n)
    inputs = inputs_for(n, 56, 1)
    session = make_sum("paillier", clients=range(n), **WEAK)
    session.setup()
    victim = next(c for c in range(n) if c != session.server.agent)
    session.network.interceptor, state = tamper(_is_upload_from(victim), mutate)
    try:
        out = session.sum(inputs, spec=spec)
    except AbortedError:
        # Paillier is malleable: a flipped bit can leave a valid unit mod n^2, caught only when the
        # aggregate decrypts to impossible slots. The key holder then refuses: a clean abort.
        assert name == "flipped byte"
        return
    assert state["done"]
    assert out.rejected and victim not in out.contributors
    assert np.array_equal(out.total, np.sum([inputs[c] for c in out.contributors], axis=0))


def test_foreign_key_ciphertexts_are_rejected():
    n = 4
    spec = VectorSpec(length=8, bound=1, summands=n)
    other = make_sum("paillier", clients=range(n), **WEAK)
    other.setup()
    captured = {}

    def record(data, message):
        if message.envelope.stage == Stage.UPLOAD:
            captured.setdefault(message.envelope.sender, data)
        return data

    other.network.interceptor = record
    other.sum(inputs_for(n, 8, 1), spec=spec)

    def swap(data, message):
        env = message.envelope
        if env.stage == Stage.UPLOAD and env.sender == 1:
            foreign = Envelope.from_bytes(captured[1])
            # This run's request digest, then the other key's fingerprint and ciphertexts.
            payload = env.payload[:16] + foreign.payload[16:]
            return Envelope(env.protocol, env.stage, env.run_id, env.sender, env.receiver, payload).to_bytes()
        return data

    session = make_sum("paillier", clients=range(n), network=LocalNetwork(interceptor=swap), **WEAK)
    out = session.sum(inputs_for(n, 8, 1), spec=spec)
    assert any("ForeignKeyError" in r for r in out.rejected)
    assert 1 not in out.contributors


def test_replay_and_out_of_stage_messages_are_refused():
    n = 4
    spec = VectorSpec(length=8, bound=1, summands=n)
    inputs = inputs_for(n, 8, 1)
    session = make_sum("paillier", clients=range(n), **WEAK)
    session.setup()
    sent = []

    def duplicate(data, message):
        sent.append((data, message))
        return data

    session.network.interceptor = duplicate
    run_id = b"\x01" * 16
    request = SumRequest(kind="sum", statistic="sum", round=0, spec=spec, reveal=Reveal(),
                         participants=tuple(range(n)))
    server = session.server.open(run_id=run_id, request=request)
    server.start()
    clients = {c: session.client_session(c).join(run_id=run_id, request=request,
                                                  values=inputs[c].astype(np.uint64))
               for c in range(n)}
    upload = clients[0].start()[0].envelope
    server.receive(Envelope.from_bytes(upload.to_bytes()))
    with pytest.raises(Exception) as replay:
        server.receive(Envelope.from_bytes(upload.to_bytes()))
    assert type(replay.value).__name__ == "ReplayError"
    # A result message before the aggregate stage is out of order.
    early = Envelope("paillier", Stage.RESULT, run_id, clients[0].party_id, SERVER, b"")
    with pytest.raises(Exception) as order:
        server.receive(early)
    assert type(order.value).__name__ == "StageError"
    # A message from another run is refused.
    foreign_run = Envelope("paillier", Stage.UPLOAD, b"\x02" * 16, 1, SERVER, upload.payload)
    with pytest.raises(Exception) as other_run:
        server.receive(foreign_run)
    assert type(other_run.value).__name__ == "StageError"
    assert set(server.gate.senders(Stage.UPLOAD)) == {0}  # state unchanged by the refusals


def test_wrong_length_input_is_a_clear_error(agent_session):
    with pytest.raises(Exception, match="length 56"):
        agent_session.sum({0: np.zeros(10)}, spec=VectorSpec(length=56, bound=1, summands=12))


def test_plain_transcript_shows_clear_values():
    session = make_sum("plain", clients=range(3))
    spec = VectorSpec(length=5, bound=9, summands=3)
    session.sum(inputs_for(3, 5, 9), spec=spec)
    uploads = [e for e in session.transcript if e.stage == "upload"]
    assert {e.visibility for e in uploads} == {Visibility.CLEAR}
    assert {e.owner for e in uploads} == {0, 1, 2}
    assert '"visibility": "clear"' in session.transcript.to_json()


def test_non_unit_ciphertext_is_dropped_at_aggregation():
    """A ciphertext sharing a factor with n passes the range check on receipt but not the product's."""
    n = 4
    spec = VectorSpec(length=8, bound=1, summands=n)
    inputs = inputs_for(n, 8, 1)
    session = make_sum("paillier", clients=range(n), **WEAK)
    session.setup()
    victim = next(c for c in range(n) if c != session.server.agent)
    key = session.server.public_key
    width = key.ciphertext_bytes

    def poison(data, message):
        env = message.envelope
        if env.stage == Stage.UPLOAD and env.sender == victim:
            payload = env.payload[:-width] + int(key.n).to_bytes(width, "big")
            return Envelope(env.protocol, env.stage, env.run_id, env.sender, env.receiver, payload).to_bytes()
        return data

    session.network.interceptor = poison
    out = session.sum(inputs, spec=spec)
    assert victim not in out.contributors
    assert any("not invertible" in r for r in out.rejected)
    assert np.array_equal(out.total, np.sum([inputs[c] for c in out.contributors], axis=0))


def test_server_held_key_is_recorded_as_clear_uploads():
    """The weaker mode gives the server every input; the transcript must not pretend otherwise."""
    session = make_sum("paillier", clients=range(3), keyholder="server", **WEAK)
    session.sum(inputs_for(3, 4, 1), spec=VectorSpec(length=4, bound=1, summands=3))
    uploads = [e for e in session.transcript if e.stage == "upload"]
    assert {e.visibility for e in uploads} == {Visibility.CLEAR}


@pytest.mark.parametrize("name", ["plain", "clear", "paillier", "masking", "secagg+"])
def test_a_client_forgets_a_run_once_nothing_comes_back(name):
    """A sum only the server learns sends the uploaders nothing back: each endpoint drops the party
    (and the input it held) at once. They used to wait for a result that never came, each client
    keeping its last 32 runs — 32 model-sized updates per client in a long run (7.5 GB at 500
    clients and a 118k-parameter MLP)."""
    session = make_sum(name, clients=range(4), **(WEAK if name == "paillier" else {}))
    session.setup()
    spec = VectorSpec(length=3, bound=7, summands=4, **({"kind": "float"} if name == "clear" else {}))
    for round_ in range(3):
        session.sum(inputs_for(4, 3, 7, seed=round_), spec=spec, round=round_, reveal=Reveal(server=True, clients=False))
    assert all(not e._live for e in session.endpoints.values())
    session.sum(inputs_for(4, 3, 7), spec=spec, round=3, reveal=Reveal(server=True, clients=True))
    assert all(not e._live for e in session.endpoints.values())  # those that learn the sum finish on it
