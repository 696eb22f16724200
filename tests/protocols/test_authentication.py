"""Sender authentication (``make_sum(..., authenticate=True)``): every envelope signed with its
sender's registered Ed25519 key and checked by its receiver. Tampered, forged, re-addressed,
unsigned, replayed and cross-run messages each get one typed error naming the sender, change
nothing, and the sum stays exact over the honest survivors."""

import numpy as np
import pytest

from protocols import SERVER, LocalNetwork, VectorSpec, make_sum
from protocols.faults import Tamper, TamperingNetwork
from protocols.identity import Authenticator, Directory, Identity, make_identities
from protocols.network import Message
from protocols.wire import Envelope

N = 6
SPEC = VectorSpec(length=5, bound=20, summands=N)
WEAK = {"key_bits": 1024, "allow_weak_keys": True}
OPTIONS = {"plain": {}, "masking": {}, "secagg+": {"degree": 4}, "paillier": WEAK}
PROTOCOLS = list(OPTIONS)


def inputs_for(seed=0):
    rng = np.random.default_rng(seed)
    return {i: rng.integers(0, 21, SPEC.length) for i in range(N)}


def plain_sum(inputs, parties):
    return np.sum([inputs[p] for p in parties], axis=0)


def session_for(name, network=None, **extra):
    return make_sum(name, clients=range(N), network=network, authenticate=True, **OPTIONS[name], **extra)


def rewrite(predicate, change):
    """An interceptor that rewrites the envelopes ``predicate`` picks (keeping their signature)."""

    def interceptor(data, message):
        env = message.envelope
        if env is not None and predicate(env):
            return change(env).to_bytes()
        return data

    return interceptor


def env_with(env, **changes):
    fields = {"protocol": env.protocol, "stage": env.stage, "run_id": env.run_id, "sender": env.sender,
              "receiver": env.receiver, "payload": env.payload, "signature": env.signature} | changes
    return Envelope(**fields)


@pytest.mark.parametrize("name", PROTOCOLS)
def test_authenticated_sums_are_exact_and_every_message_is_signed(name):
    seen = []
    network = LocalNetwork(interceptor=lambda data, message: seen.append(message.envelope) or data)
    inputs = inputs_for()
    out = session_for(name, network).sum(inputs, spec=SPEC)
    assert np.array_equal(out.total, plain_sum(inputs, range(N)))
    assert seen and all(len(env.signature) == 64 for env in seen)


@pytest.mark.parametrize("name", PROTOCOLS)
def test_a_tampered_upload_is_refused_naming_its_sender(name):
    inputs = inputs_for(1)
    network = TamperingNetwork(Tamper("upload", 2))
    out = session_for(name, network).sum(inputs, spec=SPEC)
    assert network.applied == 1
    assert out.dropped == (2,)
    assert out.excluded[2].startswith("AuthenticationError: client-2's stage")
    assert out.excluded[2].endswith("message failed to verify")
    assert np.array_equal(out.total, plain_sum(inputs, [c for c in range(N) if c != 2]))


@pytest.mark.parametrize("name", PROTOCOLS)
def test_a_forged_sender_is_refused(name):
    """Client 4's input relabelled as client 1's: the signature is client 4's, not client 1's."""
    inputs = inputs_for(2)
    network = TamperingNetwork(Tamper("forge", 1))
    out = session_for(name, network).sum(inputs, spec=SPEC)
    assert network.applied == 1
    assert out.dropped == (1,)
    assert "AuthenticationError: client-1's" in out.excluded[1]
    assert np.array_equal(out.total, plain_sum(inputs, [c for c in range(N) if c != 1]))


@pytest.mark.parametrize("name", PROTOCOLS)
def test_a_replayed_upload_is_refused_and_counted_once(name):
    inputs = inputs_for(3)
    network = TamperingNetwork(Tamper("replay", 3))
    out = session_for(name, network).sum(inputs, spec=SPEC)
    assert network.applied == 1
    assert any(r.startswith("ReplayError: party 3 already sent") for r in out.rejected), out.rejected
    assert np.array_equal(out.total, plain_sum(inputs, range(N)))


def test_a_message_from_another_run_is_refused():
    """Client 0's upload of one run, signed and valid there, injected into the next run."""
    captured = {}

    def interceptor(data, message):
        env = message.envelope
        if env.stage == 3 and env.sender == 0:
            if "old" not in captured:
                captured["old"] = data
            else:
                return captured["old"]
        return data

    inputs = inputs_for(4)
    session = session_for("masking", LocalNetwork(interceptor=interceptor))
    session.sum(inputs, spec=SPEC)
    out = session.sum(inputs, spec=SPEC, round=1)
    assert out.dropped == (0,)
    assert out.excluded[0].startswith("StageError: message belongs to another protocol run")
    assert np.array_equal(out.total, plain_sum(inputs, range(1, N)))


@pytest.mark.parametrize("how", ["flip", "readdress", "strip", "resign"])
def test_a_server_message_altered_on_its_way_is_refused_by_the_client(how):
    other = Identity(SERVER)  # a key the directory does not register
    meant_for_3 = {}

    def change(env):
        if how == "flip":
            return env_with(env, payload=env.payload[:-1] + bytes([env.payload[-1] ^ 1]))
        if how == "readdress":  # client 3's share_keys message, addressed to client 4 instead
            return env_with(meant_for_3["env"], receiver=4)
        if how == "strip":
            return env.unsigned()
        unsigned = env.unsigned()
        return unsigned.with_signature(other.sign(Authenticator.statement(unsigned)))

    def pick(env):
        if env.sender == SERVER and env.receiver == 3 and env.stage == 2:
            meant_for_3["env"] = env
        return env.sender == SERVER and env.receiver == 4 and env.stage == 2

    inputs = inputs_for(5)
    out = session_for("masking", LocalNetwork(interceptor=rewrite(pick, change))).sum(inputs, spec=SPEC)
    assert out.dropped == (4,)
    reason = out.excluded[4]
    assert reason.startswith("refused: AuthenticationError: server's stage 2 message"), reason
    assert np.array_equal(out.total, plain_sum(inputs, [c for c in range(N) if c != 4]))


def test_the_flipped_bit_that_plain_masking_misses_is_caught():
    """Without authentication a flipped bit in a masked upload changes the sum undetected
    (``test_a_flipped_bit_in_a_masked_upload_is_detected`` is an expected failure); with it,
    the upload is refused and its sender left out."""
    inputs = inputs_for(6)
    out = session_for("masking", TamperingNetwork(Tamper("upload", 0))).sum(inputs, spec=SPEC)
    assert out.dropped == (0,)
    assert np.array_equal(out.total, plain_sum(inputs, range(1, N)))


def test_identities_and_directories_are_checked():
    identities, directory = make_identities(range(3))
    with pytest.raises(ValueError):
        Authenticator(Identity(1), directory)  # not the registered key
    with pytest.raises(ValueError):
        Directory({0: b"short"})
    auth = Authenticator(identities[1], directory)
    env = Envelope("plain", 3, bytes(16), 1, SERVER, b"payload")
    signed = auth.seal(env)
    assert Envelope.from_bytes(signed.to_bytes()) == signed
    server = Authenticator(identities[SERVER], directory)
    assert server.check(Envelope.from_bytes(signed.to_bytes())) == signed
    with pytest.raises(Exception, match="cannot sign a message as"):
        auth.seal(env_with(env, sender=2))
    assert repr(identities[1]) == "Identity(client-1)"
    assert Message  # the network type carries the signed bytes unchanged
