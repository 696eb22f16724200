"""SecAgg and SecAgg+ end to end: exact sums under dropouts at every stage, aborts below the
threshold, tampering and fuzzed messages, the unmasking policy, what a client checks before it
joins, uniform masks, and cryptographic randomness only."""

import dataclasses
import math
import random
import secrets

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from protocols import (
    SERVER,
    AbortedError,
    DropoutPlan,
    LocalNetwork,
    PolicyError,
    ProtocolError,
    Reveal,
    StageError,
    SumRequest,
    ThresholdError,
    VectorSpec,
    Visibility,
    WireError,
    descriptor,
    errors,
    make_sum,
)
from protocols.encoding import encode
from protocols.masking import (
    CompleteClientSession,
    CompleteServerSession,
    GroupParameters,
    MaskingClient,
    MaskingOptions,
    MaskingServer,
    SealedShares,
    SparseServerSession,
    Stage,
    UnmaskRequest,
    harary_graph,
    harary_neighbours,
    sparse_graph_parameters,
    upload_from_bytes,
    word_dtype,
)
from protocols.messages import ReleasedSum
from protocols.wire import OPEN, Envelope

PROTOCOLS = ["masking", "secagg+"]
STAGES = ["advertise_keys", "share_keys", "upload", "unmasking", "result"]


def inputs_for(n, length, bound, seed=0):
    rng = np.random.default_rng(seed)
    return {i: rng.integers(0, bound + 1, length) for i in range(n)}


def plain_sum(inputs, parties):
    return np.sum([inputs[p] for p in parties], axis=0)


def error_kinds(out):
    """The error class behind each rejection, whether the server rejected a message
    (``"WireError: ..."``) or a client refused one (``"client 3 refused: WireError: ..."``)."""
    return [r.split("refused: ", 1)[-1].split(":")[0] for r in out.rejected]


# --- exact sums -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", PROTOCOLS)
@pytest.mark.parametrize("n", [1, 2, 5, 12])
def test_sum_equals_plain_sum_without_dropouts(name, n):
    spec = VectorSpec(length=40, bound=1000, summands=n)
    inputs = inputs_for(n, 40, 1000, seed=n)
    out = make_sum(name, clients=range(n)).sum(inputs, spec=spec)
    assert np.array_equal(out.total, plain_sum(inputs, range(n)))
    assert out.contributors == tuple(range(n)) and out.dropped == ()
    assert out.learned_by == frozenset({SERVER, *range(n)})
    assert out.rejected == ()


@pytest.mark.parametrize("name, options", [("masking", {}), ("secagg+", {"degree": 8, "threshold": 5})])
@pytest.mark.parametrize("stage", STAGES)
def test_dropouts_at_each_stage_keep_the_sum_exact(name, options, stage):
    n = 20
    spec = VectorSpec(length=30, bound=50, summands=n)
    inputs = inputs_for(n, 30, 50, seed=3)
    lost = [3, 11, 17]
    out = make_sum(name, clients=range(n), **options).sum(
        inputs, spec=spec, dropouts=DropoutPlan({c: stage for c in lost}))
    # Lost before upload: their pairwise masks are rebuilt and they are left out; lost after
    # upload: their self masks are rebuilt from the others' shares and they are counted.
    counted = [c for c in range(n) if c not in lost] if stage in STAGES[:3] else list(range(n))
    assert out.contributors == tuple(counted)
    assert np.array_equal(out.total, plain_sum(inputs, counted))
    if stage == "result":
        assert not set(lost) & out.learned_by


@pytest.mark.parametrize("name", PROTOCOLS)
def test_dropouts_spread_over_every_stage(name):
    n = 30
    spec = VectorSpec(length=25, bound=100, summands=n)
    inputs = inputs_for(n, 25, 100, seed=4)
    plan = {0: "advertise_keys", 7: "share_keys", 13: "upload", 21: "unmasking", 29: "result"}
    options = {"degree": 10, "threshold": 6} if name == "secagg+" else {}
    out = make_sum(name, clients=range(n), **options).sum(inputs, spec=spec, dropouts=DropoutPlan(plan))
    counted = [c for c in range(n) if c not in (0, 7, 13)]
    assert out.dropped == (0, 7, 13)
    assert np.array_equal(out.total, plain_sum(inputs, counted))


@pytest.mark.parametrize("name", PROTOCOLS)
def test_hundred_clients_with_dropouts(name):
    n = 100
    spec = VectorSpec(length=8, bound=255, summands=n)
    inputs = inputs_for(n, 8, 255, seed=5)
    plan = {c: "upload" for c in (5, 50, 95)} | {c: "unmasking" for c in (6, 60)}
    session = make_sum(name, clients=range(n))
    out = session.sum(inputs, spec=spec, dropouts=DropoutPlan(plan))
    counted = [c for c in range(n) if c not in (5, 50, 95)]
    assert np.array_equal(out.total, plain_sum(inputs, counted))
    if name == "secagg+":
        params = session.server.parameters(n)
        assert params.degree < 30 and params.threshold <= params.degree


def test_only_the_selected_clients_take_part():
    session = make_sum("masking", clients=range(10))
    inputs = {c: np.full(5, c) for c in (1, 4, 6, 9)}
    out = session.sum(inputs, spec=VectorSpec(length=5, bound=10, summands=10))
    assert out.contributors == (1, 4, 6, 9)
    assert np.array_equal(out.total, np.full(5, 20))
    assert session.server.parameters(4).threshold == 3  # ceil(2 * 4 / 3): counted among participants
    # The run opens at the participants only: nobody else hears of it.
    entries = session.transcript.select(run_id=out.run_id)
    assert {e.receiver for e in entries if e.sender == SERVER} == {1, 4, 6, 9}


@pytest.mark.parametrize("name", PROTOCOLS)
@pytest.mark.parametrize("frac_bits, words", [(20, np.uint32), (40, np.uint64)])
def test_signed_float_specs_decode_correctly(name, frac_bits, words):
    n = 9
    rng = np.random.default_rng(7)
    spec = VectorSpec(length=64, bound=4.0, summands=n, kind="float", signed=True, frac_bits=frac_bits)
    assert word_dtype(spec.slot_bits) == words
    inputs = {i: rng.uniform(-4, 4, 64) for i in range(n)}
    out = make_sum(name, clients=range(n)).sum(inputs, spec=spec, dropouts=DropoutPlan({2: "upload"}))
    expected = np.sum([inputs[i] for i in range(n) if i != 2], axis=0)
    assert np.max(np.abs(out.total - expected)) <= spec.sum_error_bound(n - 1)


@pytest.mark.parametrize("bound, summands", [(2**31 - 1, 2), (1, 1), (2**40, 4)])
def test_word_size_edges(bound, summands):
    spec = VectorSpec(length=6, bound=bound, summands=summands)
    inputs = {i: np.array([bound, 0, bound // 2, 1, bound - 1, 0]) for i in range(summands)}
    out = make_sum("masking", clients=range(summands)).sum(inputs, spec=spec)
    assert np.array_equal(out.total, plain_sum(inputs, range(summands)))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), name=st.sampled_from(PROTOCOLS), n=st.integers(1, 7), length=st.integers(1, 12),
       bits=st.integers(1, 40))
def test_property_sum_equals_plain_sum(data, name, n, length, bits):
    bound = (1 << bits) - 1
    inputs = {i: np.array(data.draw(st.lists(st.integers(0, bound), min_size=length, max_size=length)))
              for i in range(n)}
    spec = VectorSpec(length=length, bound=bound, summands=n)
    out = make_sum(name, clients=range(n)).sum(inputs, spec=spec)
    assert out.total.tolist() == [float(sum(int(inputs[i][j]) for i in range(n))) for j in range(length)]


# --- aborts below the threshold ---------------------------------------------------------------------

@pytest.mark.parametrize("stage", STAGES[:4])
def test_complete_graph_aborts_below_threshold_at_every_stage(stage):
    n = 6  # threshold ceil(2 * 6 / 3) = 4
    session = make_sum("masking", clients=range(n))
    assert session.server.parameters(n).threshold == 4
    with pytest.raises(ThresholdError):
        session.sum(inputs_for(n, 5, 9), spec=VectorSpec(length=5, bound=9, summands=n),
                    dropouts=DropoutPlan({c: stage for c in (0, 2, 4)}))


def test_exactly_threshold_survivors_suffice():
    n = 6
    inputs = inputs_for(n, 5, 9)
    out = make_sum("masking", clients=range(n)).sum(
        inputs, spec=VectorSpec(length=5, bound=9, summands=n), dropouts=DropoutPlan({0: "upload", 4: "upload"}))
    assert np.array_equal(out.total, plain_sum(inputs, [1, 2, 3, 5]))


def test_sparse_graph_aborts_when_a_lost_clients_key_has_too_few_holders():
    # degree 4 and threshold 5: every holder of a lost client's key must survive, which
    # its 4 neighbours cannot (the client itself is gone).
    session = make_sum("secagg+", clients=range(20), degree=4, threshold=5)
    with pytest.raises(ThresholdError):
        session.sum(inputs_for(20, 5, 9), spec=VectorSpec(length=5, bound=9, summands=20),
                    dropouts=DropoutPlan({7: "upload"}))


def test_sparse_graph_never_releases_partial_sums():
    # A ring (degree 2): two lost clients either split the survivors into two arcs (which
    # would reveal each arc's sum) or leave a key with one holder; both abort.
    session = make_sum("secagg+", clients=range(8), degree=2, threshold=2)
    for _ in range(3):
        with pytest.raises(AbortedError):
            session.sum(inputs_for(8, 5, 9), spec=VectorSpec(length=5, bound=9, summands=8),
                        dropouts=DropoutPlan({1: "upload", 5: "upload"}))


def test_absolute_threshold_above_the_participants_aborts():
    session = make_sum("masking", clients=range(10), threshold=8)
    with pytest.raises(ThresholdError):
        session.sum(inputs_for(5, 3, 9), spec=VectorSpec(length=3, bound=9, summands=10))


# --- tampering and misrouting ------------------------------------------------------------------------

def flip_last_byte(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 0x01])


def test_tampered_share_drops_its_owner_and_the_sum_stays_exact():
    """A share pair that fails to open at its holder costs its owner (named by the holder in its
    upload), not the holder: the holder masks with the owner anyway and the server rebuilds the
    owner's key from the other holders, as for any client lost after sharing."""
    victim = 3

    def interceptor(data, message):
        env = message.envelope
        if env.stage == Stage.UPLOAD and env.sender == SERVER and env.receiver == victim:
            return flip_last_byte(data)  # the tag of the last sealed share: client 7's
        return data

    n = 8
    inputs = inputs_for(n, 10, 20)
    session = make_sum("masking", clients=range(n), network=LocalNetwork(interceptor=interceptor))
    out = session.sum(inputs, spec=VectorSpec(length=10, bound=20, summands=n))
    assert "AuthenticationError" in error_kinds(out)
    assert out.dropped == (7,)
    assert "failed to open at client 3" in out.excluded[7]
    assert np.array_equal(out.total, plain_sum(inputs, range(7)))


def test_swapped_shares_fail_to_open_at_both_recipients():
    owner, a, b = 0, 2, 5
    n = 10

    def interceptor(data, message):
        env = message.envelope
        if env.stage == Stage.SHARE_KEYS and env.sender == owner:
            parties = frozenset(range(n))
            bundle = dict(SealedShares.from_bytes(env.payload, parties=parties).entries)
            bundle[a], bundle[b] = bundle[b], bundle[a]
            forged = Envelope(env.protocol, env.stage, env.run_id, env.sender, env.receiver,
                              SealedShares(tuple(sorted(bundle.items()))).to_bytes())
            return forged.to_bytes()
        return data

    inputs = inputs_for(n, 10, 20, seed=2)
    session = make_sum("masking", clients=range(n), network=LocalNetwork(interceptor=interceptor))
    out = session.sum(inputs, spec=VectorSpec(length=10, bound=20, summands=n))
    assert error_kinds(out) == ["AuthenticationError"]
    assert out.dropped == (owner,)
    assert out.excluded[owner].endswith("failed to open at clients 2, 5")
    assert np.array_equal(out.total, plain_sum(inputs, [c for c in range(n) if c != owner]))


class Misrouting(LocalNetwork):
    """Delivers the share bundle meant for one client to another as well, addressed to it."""

    def __init__(self, meant_for, delivered_to):
        super().__init__()
        self.meant_for, self.delivered_to = meant_for, delivered_to

    def exchange(self, outbox):
        moved = {party: list(messages) for party, messages in outbox.items()}
        for message in list(moved.get(self.meant_for, [])):
            env = message.envelope
            if env.stage == Stage.UPLOAD:
                moved[self.meant_for].remove(message)
                rerouted = Envelope(env.protocol, env.stage, env.run_id, env.sender, self.delivered_to, env.payload)
                moved[self.delivered_to].append(type(message)(rerouted.to_bytes(), message.label))
        return super().exchange(moved)


def test_misrouted_share_bundle_is_rejected():
    meant_for, delivered_to = 1, 6
    n = 8
    inputs = inputs_for(n, 10, 20, seed=3)
    session = make_sum("masking", clients=range(n), network=Misrouting(meant_for, delivered_to))
    out = session.sum(inputs, spec=VectorSpec(length=10, bound=20, summands=n))
    assert any(kind in ("AuthenticationError", "StageError", "ReplayError") for kind in error_kinds(out))
    assert out.dropped == (meant_for,)
    assert np.array_equal(out.total, plain_sum(inputs, [c for c in range(n) if c != meant_for]))


def test_tampering_with_many_shares_aborts_cleanly():
    def interceptor(data, message):
        env = message.envelope
        if env.stage == Stage.UPLOAD and env.sender == SERVER and env.receiver < 4:
            return flip_last_byte(data)
        return data

    session = make_sum("masking", clients=range(6), network=LocalNetwork(interceptor=interceptor))
    with pytest.raises(ThresholdError):
        session.sum(inputs_for(6, 4, 9), spec=VectorSpec(length=4, bound=9, summands=6))


def test_malformed_and_replayed_uploads_are_rejected():
    def interceptor(data, message):
        env = message.envelope
        if env.stage == Stage.UPLOAD and env.receiver == SERVER and env.sender == 2:
            return data[:-1]  # truncated masked vector
        return data

    n = 6
    inputs = inputs_for(n, 10, 20, seed=9)
    session = make_sum("masking", clients=range(n), network=LocalNetwork(interceptor=interceptor))
    out = session.sum(inputs, spec=VectorSpec(length=10, bound=20, summands=n))
    assert error_kinds(out) == ["WireError"]
    assert np.array_equal(out.total, plain_sum(inputs, [0, 1, 3, 4, 5]))


def test_copied_and_low_order_public_keys_are_refused_at_advertisement():
    adverts = {}

    def interceptor(data, message):
        env = message.envelope
        if env.stage == Stage.ADVERTISE_KEYS:
            adverts[env.sender] = env.payload
            if env.sender == 1:  # replays client 0's keys as its own
                payload = adverts[0]
            elif env.sender == 2:  # a low-order point as mask key
                payload = env.payload[:32] + bytes(32)
            else:
                return data
            return Envelope(env.protocol, env.stage, env.run_id, env.sender, env.receiver, payload).to_bytes()
        return data

    n = 7
    inputs = inputs_for(n, 6, 9, seed=11)
    session = make_sum("masking", clients=range(n), network=LocalNetwork(interceptor=interceptor))
    out = session.sum(inputs, spec=VectorSpec(length=6, bound=9, summands=n))
    assert error_kinds(out) == ["WireError", "WireError"]
    assert out.dropped == (1, 2)
    assert np.array_equal(out.total, plain_sum(inputs, [0, 3, 4, 5, 6]))


def test_clients_refuse_a_run_whose_parameters_are_not_theirs():
    n = 6
    forged_params = GroupParameters(n, n - 1, 2).to_bytes()  # a threshold of 2 instead of 4

    def interceptor(data, message):
        env = message.envelope
        if env.stage == OPEN and env.receiver in (0, 1):
            request = SumRequest.from_bytes(env.payload, clients=range(n))
            payload = dataclasses.replace(request, params=forged_params).to_bytes(clients=range(n))
            return Envelope(env.protocol, env.stage, env.run_id, env.sender, env.receiver, payload).to_bytes()
        return data

    inputs = inputs_for(n, 4, 9, seed=12)
    session = make_sum("masking", clients=range(n), network=LocalNetwork(interceptor=interceptor))
    out = session.sum(inputs, spec=VectorSpec(length=4, bound=9, summands=n))
    assert error_kinds(out) == ["PolicyError", "PolicyError"]
    assert out.dropped == (0, 1)
    assert np.array_equal(out.total, plain_sum(inputs, range(2, n)))


def test_a_client_joins_only_a_run_it_can_check():
    clients = tuple(range(6))
    spec = VectorSpec(length=3, bound=9, summands=6)
    values = encode(spec, np.ones(3)).values
    client = CompleteClientSession(0, clients=clients, options=MaskingOptions())
    request = SumRequest(kind="sum", statistic="sum", round=0, spec=spec, reveal=Reveal(), participants=clients)
    good = dataclasses.replace(request, params=client.parameters(6).to_bytes())
    assert isinstance(client.join(run_id=bytes(16), request=good, values=values), MaskingClient)
    stricter = CompleteServerSession(clients=clients, options=MaskingOptions(threshold=5))
    with pytest.raises(PolicyError, match="parameters"):  # the server runs other options
        client.join(run_id=bytes(16), request=dataclasses.replace(request, params=stricter.params(request)),
                    values=values)
    with pytest.raises(PolicyError, match="parameters"):  # or says nothing about them
        client.join(run_id=bytes(16), request=request, values=values)
    with pytest.raises(PolicyError, match="server"):
        client.join(run_id=bytes(16), request=dataclasses.replace(good, reveal=Reveal(server=False)),
                    values=values)
    others = dataclasses.replace(good, participants=clients[1:], params=client.parameters(5).to_bytes())
    with pytest.raises(StageError):
        client.join(run_id=bytes(16), request=others, values=values)
    with pytest.raises(StageError):
        client.join(run_id=bytes(16), request=good, values=None)
    with pytest.raises(ValueError, match="parameters"):  # a server session refuses foreign parameters too
        stricter.open(run_id=bytes(16), request=good)


def test_a_released_sum_that_contradicts_the_unmasking_request_is_refused():
    n, victim = 6, 2

    def interceptor(data, message):
        env = message.envelope
        if env.stage == Stage.RESULT and env.receiver == victim:
            released = ReleasedSum.from_bytes(env.payload, spec, parties=range(n))
            forged = ReleasedSum(tuple(c for c in released.contributors if c != 5), released.encoded_sum)
            return Envelope(env.protocol, env.stage, env.run_id, env.sender, env.receiver,
                            forged.to_bytes(parties=range(n))).to_bytes()
        return data

    spec = VectorSpec(length=4, bound=9, summands=n)
    inputs = {c: np.ones(4) for c in range(n)}  # small enough for 5 contributors: only the list gives it away
    session = make_sum("masking", clients=range(n), network=LocalNetwork(interceptor=interceptor))
    out = session.sum(inputs, spec=spec)
    assert any(r.startswith(f"client {victim} refused: WireError") and "contradict" in r for r in out.rejected)
    assert out.learned_by == frozenset({SERVER, *range(n)}) - {victim}
    assert np.array_equal(out.total, np.full(4, n))


# --- fuzzing: random byte mutations of any message ----------------------------------------------------

FUZZ_CLIENTS = 6
FUZZ_SPEC = VectorSpec(length=3, bound=50, summands=FUZZ_CLIENTS)
FUZZ_INPUTS = inputs_for(FUZZ_CLIENTS, 3, 50, seed=21)
FUZZ_RUNS = {"masking": {}, "secagg+": {"degree": 2, "threshold": 2}}  # secagg+ on a ring: really sparse
_message_counts = {}


def messages_per_run(name):
    """How many messages cross the network in one undisturbed run (the same in every run)."""
    if name not in _message_counts:
        counted = []
        network = LocalNetwork(interceptor=lambda data, message: counted.append(data) or data)
        make_sum(name, clients=range(FUZZ_CLIENTS), network=network, **FUZZ_RUNS[name]).sum(
            FUZZ_INPUTS, spec=FUZZ_SPEC)
        _message_counts[name] = len(counted)
    return _message_counts[name]


def mutate(data, mutation):
    kind, arg = mutation
    if kind == "flip":
        out = bytearray(data)
        for position, mask in arg:
            out[position % len(out)] ^= mask
        return bytes(out)
    if kind == "truncate":
        return data[: arg % len(data)]
    return data + arg


MUTATIONS = st.one_of(
    st.tuples(st.just("flip"), st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(1, 255)),
                                        min_size=1, max_size=4)),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 20)),
    st.tuples(st.just("extend"), st.binary(min_size=1, max_size=8)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), name=st.sampled_from(PROTOCOLS), mutation=MUTATIONS)
def test_fuzzed_messages_get_typed_errors_and_never_a_wrong_sum(data, name, mutation):
    """One message of a run (any stage, either direction, header or payload) is mutated.

    Every receiver raises only :class:`ProtocolError` subclasses (anything else would escape
    the endpoint or the server's driver and fail this test), and the run ends in an abort or a
    sum. The sum is exact whenever the receiver rejected the mutated message (a rejection
    changes nothing) and whenever the mutation hit sealed shares (they are authenticated end
    to end). A mutation the receiver accepts in the unauthenticated parts (a masked vector, a
    relayed public key, a revealed share, the request or the released sum) can change the sum:
    their integrity is the network's (see ``test_a_flipped_bit_in_a_masked_upload_is_detected``).
    """
    index = data.draw(st.integers(0, messages_per_run(name) - 1), label="message")
    seen, target = [], {}

    def interceptor(raw, message):
        seen.append(None)
        if len(seen) - 1 != index:
            return raw
        env = message.envelope
        target.update(stage=env.stage, receiver=env.receiver)
        return mutate(raw, mutation)

    session = make_sum(name, clients=range(FUZZ_CLIENTS), network=LocalNetwork(interceptor=interceptor),
                       **FUZZ_RUNS[name])
    try:
        out = session.sum(FUZZ_INPUTS, spec=FUZZ_SPEC)
    except AbortedError:
        assert target
        event("aborted")
        return  # no sum was released
    assert target
    for endpoint in session.endpoints.values():  # what the endpoints could not even answer
        assert all(issubclass(getattr(errors, e.split(":")[0]), ProtocolError) for e in endpoint.errors)
    receiver = target["receiver"]
    if receiver == SERVER:
        rejected = any(not r.startswith("client ") for r in out.rejected)
    else:
        rejected = bool(session.endpoints[receiver].errors) or any(
            r.startswith(f"client {receiver} refused") for r in out.rejected)
    sealed = (target["stage"], receiver == SERVER) in {(Stage.SHARE_KEYS, True), (Stage.UPLOAD, False)}
    event("rejected" if rejected else "sealed" if sealed else "accepted")
    if rejected or sealed:
        assert np.array_equal(out.total, plain_sum(FUZZ_INPUTS, out.contributors))
        for party in session.parties().values():
            if party.result is not None:
                assert party.contributors == out.contributors


def test_fuzzing_reaches_every_stage_in_both_directions():
    kinds = set()

    def interceptor(data, message):
        env = message.envelope
        kinds.add((env.stage, env.receiver == SERVER))
        return data

    make_sum("masking", clients=range(FUZZ_CLIENTS), network=LocalNetwork(interceptor=interceptor)).sum(
        FUZZ_INPUTS, spec=FUZZ_SPEC)
    to_client = {OPEN, Stage.SHARE_KEYS, Stage.UPLOAD, Stage.UNMASKING, Stage.RESULT}
    to_server = {Stage.ADVERTISE_KEYS, Stage.SHARE_KEYS, Stage.UPLOAD, Stage.UNMASKING}
    assert kinds == {(s, False) for s in to_client} | {(s, True) for s in to_server}


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="without make_sum(authenticate=True) masked uploads carry no authentication: their "
                          "integrity is the network's (TLS); test_authentication.py shows the authenticated case")
def test_a_flipped_bit_in_a_masked_upload_is_detected():
    def interceptor(data, message):
        env = message.envelope
        if env.stage == Stage.UPLOAD and env.sender == 0:
            return mutate(data, ("flip", [(len(data) - 4 * FUZZ_SPEC.length, 1)]))  # the first word's low bit
        return data

    session = make_sum("masking", clients=range(FUZZ_CLIENTS), network=LocalNetwork(interceptor=interceptor))
    out = session.sum(FUZZ_INPUTS, spec=FUZZ_SPEC)  # FUZZ_SPEC's words are uint32
    assert np.array_equal(out.total, plain_sum(FUZZ_INPUTS, out.contributors))


# --- driving the state machines by hand ----------------------------------------------------------------

def build(n=6, length=4, name="masking", **options):
    """A run's server and client parties, built the way the endpoints build them: the server
    session opens the run, and each client joins with what it parsed from its ``open``."""
    d = descriptor(name)
    opts, clients = d.options(**options), tuple(range(n))
    spec = VectorSpec(length=length, bound=9, summands=n)
    request = SumRequest(kind="sum", statistic="sum", round=0, spec=spec, reveal=Reveal(), participants=clients)
    server = d.server_session(clients=clients, options=opts).open(run_id=secrets.token_bytes(16), request=request)
    parties = {}
    for message in server.start():
        env = message.envelope
        assert env.stage == OPEN
        joined = SumRequest.from_bytes(env.payload, clients=clients)
        session = d.client_session(env.receiver, clients=clients, options=opts)
        values = encode(spec, np.full(length, env.receiver % 10)).values
        parties[env.receiver] = session.join(run_id=env.run_id, request=joined, values=values)
    return server, parties


def deliver(parties, messages):
    out = []
    for m in messages:
        out.extend(parties[m.envelope.receiver].receive(m.envelope))
    return out


def run_to_unmasking(server, clients):
    parties = {SERVER: server, **clients}
    pending = [m for c in clients.values() for m in c.start()]
    for _ in range(2):  # advertise keys, then share keys
        assert not deliver(parties, pending)
        pending = deliver(parties, server.advance())
    assert not deliver(parties, pending)  # the masked uploads
    return server.advance()  # the unmasking requests


def test_client_refuses_to_reveal_both_shares_of_one_client():
    server, clients = build()
    requests = {m.envelope.receiver: m.envelope for m in run_to_unmasking(server, clients)}
    client = clients[0]
    genuine = requests[0]

    def crafted(survivors, dropped):
        return Envelope(genuine.protocol, Stage.UNMASKING, genuine.run_id, SERVER, 0,
                        UnmaskRequest(tuple(survivors), tuple(dropped)).to_bytes())

    with pytest.raises(PolicyError, match="both"):
        client.receive(crafted(range(6), [3]))  # 3 named as survivor and as lost
    with pytest.raises(PolicyError):
        client.receive(crafted(range(1, 6), [0]))  # its own mask key
    with pytest.raises(PolicyError):
        client.receive(crafted([0, 1, 2], [3, 4, 5]))  # fewer survivors than the threshold
    with pytest.raises(PolicyError):
        client.receive(crafted(range(1, 6), []))  # treats this client as lost
    # Nothing was revealed or changed by the refusals: the genuine request still works.
    (response,) = client.receive(genuine)
    assert response.envelope.stage == Stage.UNMASKING and response.envelope.receiver == SERVER
    with pytest.raises(StageError):
        client.receive(genuine)  # and only once


def test_client_checks_requests_against_the_shares_it_holds():
    server, clients = build()
    run_to_unmasking(server, clients)
    client = clients[1]
    assert isinstance(client, MaskingClient)
    client.check_request(UnmaskRequest((0, 1, 2, 3, 4, 5), ()))
    with pytest.raises(PolicyError):
        client.check_request(UnmaskRequest((0, 1, 2, 3, 4), (4,)))


def test_server_never_asks_for_both_shares():
    server, clients = build(n=9)
    clients[4].start = list  # lost before advertising: sends nothing
    parties = {SERVER: server, **clients}
    pending = [m for c in clients.values() for m in c.start()]
    deliver(parties, pending)
    shares = deliver(parties, server.advance())
    assert not deliver(parties, shares)
    uploads = deliver(parties, server.advance())
    deliver(parties, [u for u in uploads if u.envelope.sender != 7])  # 7 lost at upload
    requests = server.advance()
    assert isinstance(server, MaskingServer)
    for m in requests:
        request = UnmaskRequest.from_bytes(m.envelope.payload, parties=frozenset(range(9)))
        assert not set(request.survivors) & set(request.dropped)
        assert request.dropped == (7,)
        assert 4 not in request.survivors
    assert shares  # share bundles went to the server, sealed


# --- what the server sees ----------------------------------------------------------------------------

def test_masked_uploads_are_uniform_even_for_constant_inputs():
    captured = []

    def interceptor(data, message):
        env = message.envelope
        if env.stage == Stage.UPLOAD and env.receiver == SERVER:
            captured.append(env.payload)
        return data

    n, length = 4, 1 << 14
    spec = VectorSpec(length=length, bound=1000, summands=n)  # slot_bits = 12: masks mod 4096
    inputs = {i: np.full(length, 1000) for i in range(n)}
    make_sum("masking", clients=range(n), network=LocalNetwork(interceptor=interceptor)).sum(
        inputs, spec=spec)
    assert len(captured) == n
    buckets = 1 << 8
    for payload in captured:
        complaints, words = upload_from_bytes(payload, spec=spec, dtype=word_dtype(spec.slot_bits),
                                              owners=frozenset(range(n)))
        assert complaints == ()
        assert int(words.max()) < spec.modulus
        counts = np.bincount(words >> (spec.slot_bits - 8), minlength=buckets)
        expected = length / buckets
        chi2 = float(((counts - expected) ** 2).sum() / expected)
        assert chi2 < (buckets - 1) + 6 * math.sqrt(2 * (buckets - 1))


@pytest.mark.parametrize("name", PROTOCOLS)
def test_transcript_shows_only_public_sealed_and_masked_to_the_server(name):
    session = make_sum(name, clients=range(7))
    spec = VectorSpec(length=20, bound=5, summands=7)
    out = session.sum(inputs_for(7, 20, 5), spec=spec, statistic="hist", round=3)
    entries = session.transcript.select(run_id=out.run_id)
    to_server = [e for e in entries if e.receiver == SERVER]
    assert {e.visibility for e in to_server} == {Visibility.PUBLIC, Visibility.SEALED, Visibility.MASKED}
    masked = [e for e in to_server if e.visibility == Visibility.MASKED]
    assert sorted(e.owner for e in masked) == list(range(7))
    assert all(e.dimension == 20 and e.stage == "upload" for e in masked)
    sealed = [e for e in to_server if e.visibility == Visibility.SEALED]
    assert all(e.owner == e.sender and e.stage == "share_keys" for e in sealed)
    released = [e for e in entries if e.visibility == Visibility.AGGREGATE]
    assert len(released) == 7 and all(e.k == 7 and e.sender == SERVER for e in released)
    assert not [e for e in entries if e.visibility == Visibility.CLEAR]
    assert out.timings.client_upload_median > 0 and out.timings.finalize > 0 and out.timings.aggregate > 0


def test_reveal_to_the_server_only_and_never_to_nobody_but_clients():
    session = make_sum("masking", clients=range(4))
    spec = VectorSpec(length=3, bound=5, summands=4)
    out = session.sum(inputs_for(4, 3, 5), spec=spec, reveal=Reveal(clients=False))
    assert out.learned_by == frozenset({SERVER})
    with pytest.raises(ValueError, match="server"):
        session.sum(inputs_for(4, 3, 5), spec=spec, reveal=Reveal(server=False))


def test_every_sum_uses_fresh_keys():
    adverts = []

    def interceptor(data, message):
        if message.envelope.stage == Stage.ADVERTISE_KEYS:
            adverts.append(message.envelope.payload)
        return data

    session = make_sum("secagg+", clients=range(5), network=LocalNetwork(interceptor=interceptor))
    spec = VectorSpec(length=3, bound=5, summands=5)
    first = session.sum(inputs_for(5, 3, 5), spec=spec)
    second = session.sum(inputs_for(5, 3, 5), spec=spec)
    assert first.run_id != second.run_id
    assert len(adverts) == 10 and len(set(adverts)) == 10


# --- no non-cryptographic randomness -------------------------------------------------------------------

def test_no_non_cryptographic_rng_is_reachable(monkeypatch):
    n = 12
    inputs = inputs_for(n, 16, 100)  # drawn before the generators are disabled
    spec = VectorSpec(length=16, bound=100, summands=n)

    def forbidden(*args, **kwargs):
        raise AssertionError("a non-cryptographic generator was used")

    for attr in ("random", "randint", "randrange", "getrandbits", "randbytes", "shuffle", "choice",
                 "choices", "sample", "uniform", "seed", "Random"):
        monkeypatch.setattr(random, attr, forbidden)
    for attr in ("default_rng", "random", "rand", "randn", "randint", "random_sample", "bytes", "shuffle",
                 "permutation", "choice", "seed", "RandomState", "Generator", "SeedSequence"):
        if hasattr(np.random, attr):
            monkeypatch.setattr(np.random, attr, forbidden)
    for name in PROTOCOLS:
        out = make_sum(name, clients=range(n)).sum(inputs, spec=spec, dropouts=DropoutPlan({3: "upload"}))
        assert np.array_equal(out.total, plain_sum(inputs, [c for c in range(n) if c != 3]))


# --- parameters, options, graphs -----------------------------------------------------------------------

def test_options_are_frozen_keyword_only_and_validated():
    options = MaskingOptions(threshold=0.75)
    with pytest.raises(AttributeError):
        options.threshold = 0.5  # type: ignore[misc]
    with pytest.raises(TypeError):
        MaskingOptions(0.5)  # type: ignore[misc]
    for bad in ({"threshold": 0.0}, {"threshold": 1.5}, {"threshold": 0}, {"threshold": True},
                {"degree": 1}, {"dropout_rate": 1.0}, {"dropout_rate": 0.6, "corruption_rate": 0.4},
                {"degree": 4, "threshold": 6}, {"security_bits": 0}):
        with pytest.raises(ValueError):
            MaskingOptions(**bad)
    assert MaskingOptions(degree=5, threshold=7).threshold == 7  # degree 5 rounds up to 6: 7 holders
    with pytest.raises(ValueError, match="secagg"):
        make_sum("masking", clients=range(4), degree=4)
    with pytest.raises(ValueError):
        make_sum("masking", clients=range(4), threshold=1).sum(
            inputs_for(4, 2, 3), spec=VectorSpec(length=2, bound=3, summands=4))


def test_threshold_resolution():
    complete = make_sum("masking", clients=range(100)).server
    assert isinstance(complete, CompleteServerSession)
    assert complete.parameters(100) == GroupParameters(100, 99, 67)
    assert complete.parameters(3) == GroupParameters(3, 2, 2)
    assert complete.parameters(1) == GroupParameters(1, 0, 1)
    assert make_sum("masking", clients=range(10), threshold=0.6).server.parameters(10).threshold == 6
    with pytest.raises(ValueError, match="not a strict majority of the 10 holders"):
        make_sum("masking", clients=range(10), threshold=0.5).server.parameters(10)
    with pytest.raises(ValueError, match="use at least 5"):
        MaskingOptions(degree=8, threshold=4)
    assert make_sum("masking", clients=range(10), threshold=7).server.parameters(10).threshold == 7
    sparse_sum = make_sum("secagg+", clients=range(10), degree=5, threshold=0.6)
    sparse = sparse_sum.server
    assert isinstance(sparse, SparseServerSession)
    assert sparse.parameters(10) == GroupParameters(10, 6, 5)  # degree rounds up to even
    assert sparse.parameters(4).degree == 3  # never beyond the complete graph
    # Clients compute the same parameters themselves, from the same public options.
    assert sparse_sum.client_session(3).parameters(10) == sparse.parameters(10)


def test_sparse_degree_follows_bell_et_al_bounds():
    for n in (50, 100, 1000, 10_000, 1_000_000):
        k, low, high = sparse_graph_parameters(n, dropout_rate=0.1, corruption_rate=0.05)
        assert k % 2 == 0 and 2 <= low <= high <= k < n - 1
        assert k <= 3 * math.log2(n) + 10  # O(log n)
        params = make_sum("secagg+", clients=range(4)).server.parameters(n)
        assert params.degree == k and low <= params.threshold <= high
    # SecAgg+ at n = 1000 masks with at most 1/20 of the complete graph's neighbours.
    assert make_sum("secagg+", clients=range(4)).server.parameters(1000).degree + 1 <= 1000 / 20
    # Higher rates need more neighbours; tiny groups fall back to the complete graph.
    assert sparse_graph_parameters(1000, dropout_rate=0.3, corruption_rate=0.1)[0] > 36
    assert make_sum("secagg+", clients=range(4)).server.parameters(5).degree == 4


def test_harary_graph_is_regular_symmetric_connected_and_random():
    members = list(range(40))
    graphs = [harary_graph(members, 6) for _ in range(3)]
    for graph in graphs:
        assert all(len(neighbours) == 6 and u not in neighbours for u, neighbours in graph.items())
        assert all(u in graph[v] for u, neighbours in graph.items() for v in neighbours)
    assert graphs[0] != graphs[1] or graphs[1] != graphs[2]
    assert harary_graph([3, 9, 12], 6) == {3: (9, 12), 9: (3, 12), 12: (3, 9)}


def test_one_clients_row_of_the_seeded_graph_is_its_row_of_the_whole_graph():
    for members, degree in [(list(range(40)), 6), ([40, 3, 17, 8, 21, 5], 2), ([9, 2, 7], 6), (list(range(101)), 100)]:
        seed = secrets.token_bytes(32)
        graph = harary_graph(members, degree, seed=seed)
        assert list(graph) == sorted(graph) or degree < len(members) - 1
        for u in members:
            assert harary_neighbours(members, degree, u, seed=seed) == graph[u]
        with pytest.raises(KeyError):
            harary_neighbours(members, degree, 1000, seed=seed)


def test_sparse_clients_talk_to_few_neighbours():
    n = 40
    spec = VectorSpec(length=4, bound=5, summands=n)
    costs = {}
    for name in PROTOCOLS:
        session = make_sum(name, clients=range(n))
        out = session.sum(inputs_for(n, 4, 5), spec=spec)
        entries = session.transcript.select(run_id=out.run_id)
        costs[name] = sum(e.bytes for e in entries if e.stage == "share_keys" and e.sender == 0)
    assert costs["secagg+"] * 3 < costs["masking"]


def test_wire_payloads_are_strict():
    parties = frozenset(range(5))
    with pytest.raises(WireError):
        UnmaskRequest.from_bytes(UnmaskRequest((2, 1), ()).to_bytes(), parties=parties)  # unsorted
    with pytest.raises(WireError):
        UnmaskRequest.from_bytes(UnmaskRequest((1, 7), ()).to_bytes(), parties=parties)  # outsider
    with pytest.raises(WireError):
        UnmaskRequest.from_bytes(UnmaskRequest((1,), ()).to_bytes() + b"\x00", parties=parties)
    with pytest.raises(WireError):
        SealedShares.from_bytes(SealedShares(((1, b"x" * 10),)).to_bytes(), parties=parties)
