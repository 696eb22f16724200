"""Verified aggregates for the SEAL sums (``verify_aggregate``, on with ``authenticate=True``):
a decryptor decrypts only an aggregate every contributor attested with signed linear tags of its
own upload, so an active server that alters the aggregate is caught on ciphertexts and
signatures — before anything is decrypted, whatever the plaintext — and the decryptor never
receives a single upload."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tenseal")

from protocols import SERVER, AbortedError, DropoutPlan, LocalNetwork, Reveal, VectorSpec, make_sum
from protocols.base import Outgoing
from protocols.errors import AuthenticationError
from protocols.primitives import seal_tags
from protocols.seal_messages import (
    Stage,
    read_result,
    read_upload,
    read_verified_aggregate,
    release_statement,
    write_result,
)
from protocols.seal_sum import SealClient, SealServer, TamperedAggregateError, _primes
from protocols.session import SumRequest

N = 5
SPEC = VectorSpec(length=12, bound=100, summands=N)
SCHEMES = ["ckks", "bfv"]


def inputs_for(seed: int = 0, n: int = N) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i: rng.integers(0, 101, SPEC.length) for i in range(n)}


def plain(inputs: dict[int, np.ndarray], parties: Any) -> np.ndarray:
    return np.sum([inputs[p] for p in parties], axis=0)


def verified(name: str, *, network: LocalNetwork | None = None, **options: Any) -> Any:
    return make_sum(name, clients=range(N), network=network, authenticate=True, **options)


def decryptor_of(session: Any) -> int:
    return session.server.agent if session.server.options.keyholder == "agent" else 0


@pytest.mark.parametrize("keyholder", ["agent", "all"])
@pytest.mark.parametrize("name", SCHEMES)
def test_honest_verified_sums_are_exact_and_the_decryptor_never_receives_an_upload(name: str, keyholder: str) -> None:
    captured: list[Any] = []
    network = LocalNetwork(interceptor=lambda data, message: captured.append(message.envelope) or data)
    session = verified(name, network=network, keyholder=keyholder)
    inputs = inputs_for(1)
    out = session.sum(inputs, spec=SPEC)
    assert np.array_equal(out.total, plain(inputs, range(N)))
    assert out.dropped == () and out.rejected == ()
    run = [e for e in session.transcript if e.run_id == out.run_id]
    # every contributor attested once (stage challenge, then its signed tags)
    assert sorted(e.receiver for e in run if e.stage == "challenge") == list(range(N))
    assert sorted(e.sender for e in run if e.stage == "tag") == list(range(N))
    # what the decryptor received: the open, a challenge for its own upload, one aggregate of all N
    decryptor = decryptor_of(session)
    received = [e for e in run if e.receiver == decryptor]
    assert [e.stage for e in received] == ["open", "challenge", "aggregate"]
    assert (received[-1].visibility.value, received[-1].k) == ("aggregate", N)
    assert not any(e.stage == "upload" and e.receiver != SERVER for e in session.transcript)
    # the aggregate carries the sum's ciphertexts and, per contributor, its tags and signature: nothing else
    (env,) = [e for e in captured if e.stage == Stage.AGGREGATE and e.receiver == decryptor
              and e.run_id.hex() == out.run_id]
    assert received[-1].bytes == len(env.to_bytes())
    keys = session.sessions[decryptor].keys
    primes = _primes(keys.parameters)
    _, contributors, _streams, body, attempt, signed = read_verified_aggregate(
        env.payload, keys.public, SPEC, tuple(range(N)), keys.parameters.chunks(SPEC.length), primes)
    assert contributors == tuple(range(N)) and attempt == 1 and len(signed) == N
    assert len(env.payload) == 1 + 4 + len(body) + 4 + N * (seal_tags.tag_bytes(len(primes)) + 64)
    unverified = make_sum(name, clients=range(N), authenticate=True, keyholder=keyholder, verify_aggregate=False)
    assert np.array_equal(unverified.sum(inputs, spec=SPEC).total, out.total)
    assert not any(e.stage in ("challenge", "tag") for e in unverified.transcript)


class AlteringServer(SealServer):
    """An active server: ``how`` names what it does to the aggregate the decryptors get."""

    how = "add"
    delta: np.ndarray | None = None

    def _shifted(self) -> None:
        """Add an encryption of ``delta`` (the public key suffices): the classic malleability attack."""
        assert self.aggregate is not None and self.delta is not None
        streams = self.context.encrypt(self.delta)
        self.context.add_into(self.aggregate, [self.context.load(s, size) for s, size in zip(streams, self.sizes)])

    def _challenge(self) -> Any:
        if self.how == "add" and self.attempt == 0:
            self._shifted()  # altered before the challenge: contributors attest tags of the altered digest
        return super()._challenge()

    def _conclude_challenge(self) -> Any:
        if self.how == "add":
            return self._send_aggregate()  # skips its own check, which would blame the contributors
        return super()._conclude_challenge()

    def receive(self, env: Any) -> Any:
        if env.stage == Stage.UPLOAD and not self.uploads:
            self.kept = (env.sender, read_upload(env.payload, self.context, len(self.sizes)))
        return super().receive(env)

    def _send_aggregate(self) -> Any:
        if self.how == "add" and not self.verified:
            self._shifted()
        elif self.how == "substitute":  # one client's upload as "the sum of all"
            self.aggregate = self._load(*self.kept)
            tags, attempt = self._tags, self.attempt
            self._body = self._dump()
            self._tags, self.attempt = tags, attempt
        elif self.how == "drop-tag":
            self._tags = {**self._tags, self.contributors[-1]: self._tags[self.contributors[0]]}
        return super()._send_aggregate()


def alter(session: Any, how: str, delta: np.ndarray | None = None) -> list[AlteringServer]:
    opened: list[AlteringServer] = []
    original = session.server.open

    def open_(*, run_id: bytes, request: SumRequest) -> Any:
        party = original(run_id=run_id, request=request)
        party.__class__ = AlteringServer
        party.how, party.delta = how, delta
        opened.append(party)
        return party

    session.server.open = open_
    return opened


REASONS = {
    "add": "the aggregate is not the sum of the uploads its contributors attested",
    "substitute": "relayed an aggregate client-0 did not attest",
    "drop-tag": f"relayed an aggregate client-{N - 1} did not attest",
}


@pytest.mark.parametrize("how", list(REASONS))
@pytest.mark.parametrize("name", SCHEMES)
def test_an_altering_server_is_named_before_anything_is_decrypted(name: str, how: str) -> None:
    session = verified(name)
    opened = alter(session, how, delta=np.full(SPEC.length, 1, dtype=np.uint64))
    with pytest.raises(AbortedError):
        session.sum(inputs_for(2), spec=SPEC)
    decryptor = session.parties()[decryptor_of(session)]
    assert isinstance(decryptor, SealClient)
    assert decryptor.result is None and "finalize" not in decryptor.timings  # never decrypted
    reason = opened[0].rejected_from[decryptor.party_id]
    assert reason.startswith(f"refused: TamperedAggregateError: server: {REASONS[how]}")
    assert issubclass(TamperedAggregateError, AuthenticationError)


@pytest.mark.parametrize("name", SCHEMES)
def test_whether_the_decryptor_refuses_no_longer_depends_on_the_plaintext(name: str) -> None:
    """The server adds an encryption of delta to the aggregate. Without verification the key holder's
    answer depends on the plaintext: a sum that stays within the bound after the shift is released
    (wrong), one pushed past it is refused — one bit per query. With verification both are the same
    refusal, naming the server, decided before decrypting."""
    low = {i: np.zeros(SPEC.length, dtype=np.int64) for i in range(N)}
    high = {i: np.full(SPEC.length, 100, dtype=np.int64) for i in range(N)}  # the largest sum, 500
    delta = np.full(SPEC.length, 10, dtype=np.uint64)
    outcomes: dict[tuple[bool, str], str] = {}
    for verify in (False, True):
        for label, values in (("low", low), ("high", high)):
            session = make_sum(name, clients=range(N), authenticate=True, verify_aggregate=verify)
            opened = alter(session, "add", delta=delta)
            try:
                out = session.sum(values, spec=SPEC)
                outcomes[verify, label] = f"released {int(np.asarray(out.total)[0])}"
            except AbortedError:
                decryptor = session.parties()[decryptor_of(session)]
                assert decryptor.result is None
                reason = opened[0].rejected_from[decryptor.party_id].split(":")[1].strip()
                when = "after" if "finalize" in decryptor.timings else "before"
                outcomes[verify, label] = f"{reason} {when} decrypting"
    assert outcomes[False, "low"] == "released 10"  # a wrong sum, undetected
    assert outcomes[False, "high"] == "CiphertextError after decrypting"  # the oracle's other answer
    assert outcomes[True, "low"] == outcomes[True, "high"] == "TamperedAggregateError before decrypting"


@pytest.mark.parametrize("name", SCHEMES)
def test_a_server_passing_one_upload_off_as_the_sum_reads_it_unless_verified(name: str) -> None:
    """Without verification the agent decrypts one client's upload presented as the sum of all and
    releases that input to the server; verified, the agent refuses before decrypting."""
    inputs = inputs_for(8)
    leaked = make_sum(name, clients=range(N), authenticate=True, verify_aggregate=False)
    opened = alter(leaked, "substitute")
    out = leaked.sum(inputs, spec=SPEC)
    assert np.array_equal(out.total, inputs[opened[0].kept[0]]) and out.contributors == tuple(range(N))
    guarded = verified(name)
    alter(guarded, "substitute")
    with pytest.raises(AbortedError):
        guarded.sum(inputs, spec=SPEC)
    assert all(p.result is None for p in guarded.parties().values())


class LyingClient(SealClient):
    """Attests tags of another ciphertext than the one it uploaded (validly signed)."""

    def _attest(self, env: Any) -> Any:
        if self._words is None:
            seeded = self.symmetric and self.keys.secret is not None
            from protocols.seal_sum import _upload_words

            words = _upload_words(self.keys.public, self._uploaded or [], self.sizes, seeded)
            words[0] = words[0].copy()
            words[0][0, 0, 0] = (words[0][0, 0, 0] + np.uint64(1)) % np.uint64(_primes(self.params)[0])
            self._words = words
        return super()._attest(env)


@pytest.mark.parametrize("keyholder", ["agent", "all"])
@pytest.mark.parametrize("name", SCHEMES)
def test_a_client_with_a_wrong_tag_or_none_is_left_out_and_the_sum_exact_over_the_rest(name: str,
                                                                                      keyholder: str) -> None:
    session = verified(name, keyholder=keyholder)
    session.server.check(spec=SPEC, reveal=Reveal())
    session.setup()
    others = [p for p in range(N) if p != session.server.agent]
    liar, silent = others[1], others[2]
    session.sessions[liar].client_party = LyingClient  # type: ignore[attr-defined]
    inputs = inputs_for(4)
    out = session.sum(inputs, spec=SPEC, dropouts=DropoutPlan({silent: "challenge"}))
    survivors = [p for p in range(N) if p not in (liar, silent)]
    assert out.dropped == tuple(sorted((liar, silent)))
    assert out.excluded[liar] == "its tag does not match its upload"
    assert out.excluded[silent] == "no tag: it did not attest its upload"
    assert np.array_equal(out.total, plain(inputs, survivors))
    challenges = [e for e in session.transcript if e.run_id == out.run_id and e.stage == "challenge"]
    # attempt 1 (the silent one gets nothing), attempt 2 without it (the sum of tags fails: each is
    # checked against its upload), attempt 3 to the survivors only
    assert len(challenges) == (N - 1) + (N - 1) + len(survivors)


def test_the_option_is_checked_and_follows_registered_keys() -> None:
    with pytest.raises(ValueError, match="verify_aggregate must be true, false or unset"):
        make_sum("ckks", clients=range(2), verify_aggregate="yes")
    unregistered = make_sum("ckks", clients=range(2), verify_aggregate=True)
    with pytest.raises(ValueError, match="registered signing keys"):
        unregistered.sum(inputs_for(5, 2), spec=VectorSpec(length=12, bound=100, summands=2))
    default = make_sum("bfv", clients=range(2))
    default.sum(inputs_for(5, 2), spec=VectorSpec(length=12, bound=100, summands=2))
    assert not any(e.stage in ("challenge", "tag") for e in default.transcript)
    # a client refuses a run whose verification is not what its own options say
    session = verified("ckks")
    session.server.options = type(session.server.options)(verify_aggregate=False)
    with pytest.raises(AbortedError):
        session.sum(inputs_for(6), spec=SPEC)
    refusals = [e for e in session.transcript if e.stage == "refuse"]
    assert len(refusals) == N


def test_tags_are_linear_and_reveal_nothing_the_ciphertext_did_not() -> None:
    """Tags of two encryptions of the same vector differ (the uniform half of a ciphertext masks
    the plaintext) and tags add like the ciphertexts they come from."""
    session = verified("ckks")
    session.sum(inputs_for(7), spec=SPEC)
    keys = session.sessions[0].keys
    assert keys is not None
    params = keys.parameters
    primes = _primes(params)
    vector = np.arange(SPEC.length, dtype=np.uint64)
    sizes = params.chunk_sizes(SPEC.length)
    from protocols.seal_sum import _upload_words, _words

    digest = bytes(range(32))
    first = seal_tags.tag(_upload_words(keys.public, keys.public.encrypt(vector), sizes, False), primes, digest)
    again = seal_tags.tag(_upload_words(keys.public, keys.public.encrypt(vector), sizes, False), primes, digest)
    assert not np.array_equal(first, again)
    a, b = keys.public.encrypt(vector), keys.public.encrypt(2 * vector)
    loaded = [keys.public.load(s, size) for s, size in zip(a, sizes)]
    keys.public.add_into(loaded, [keys.public.load(s, size) for s, size in zip(b, sizes)])
    summed = seal_tags.tag(_words(keys.public, [keys.public.dump(v) for v in loaded]), primes, digest)
    ta = seal_tags.tag(_words(keys.public, a), primes, digest)
    tb = seal_tags.tag(_words(keys.public, b), primes, digest)
    assert np.array_equal(summed, (ta.astype(object) + tb.astype(object)) % primes[0])
    assert Stage.UPLOAD < Stage.CHALLENGE < Stage.TAG < Stage.AGGREGATE < Stage.RESULT  # the order they happen


class RelayingLiar(SealServer):
    """Relays the agent's release to the other contributors with every entry raised by one."""

    def receive(self, env: Any) -> Any:
        out = super().receive(env)
        if env.stage != Stage.RESULT:
            return out
        body = env.payload[:-64] if self.verified else env.payload
        released = read_result(body, self.spec, self.clients)
        forged = write_result(released.contributors, released.encoded_sum + np.uint64(1), self.clients)
        forged += env.payload[-64:] if self.verified else b""
        return [Outgoing(dataclasses.replace(o.envelope, payload=forged), o.exposure) for o in out]


@pytest.mark.parametrize("verify", [False, True])
def test_a_release_relayed_by_the_server_carries_the_key_holders_signature(verify: bool) -> None:
    """Agent mode: the server relays the agent's released sum to the other contributors. Verified,
    the agent signs it and a contributor refuses a changed one (naming the server); unverified, a
    contributor takes the server's word."""
    session = make_sum("ckks", clients=range(N), authenticate=True, verify_aggregate=verify)
    original = session.server.open

    def open_(*, run_id: bytes, request: SumRequest) -> Any:
        party = original(run_id=run_id, request=request)
        party.__class__ = RelayingLiar
        return party

    session.server.open = open_
    inputs = inputs_for(9)
    truth = plain(inputs, range(N))
    if not verify:  # only the harness, which sees every party, notices
        with pytest.raises(AbortedError, match="parties learned different sums"):
            session.sum(inputs, spec=SPEC)
        others = [p for pid, p in session.parties().items() if pid != session.server.agent]
        assert all(np.array_equal(p.result, truth + 1) for p in others)  # a wrong sum, believed
        return
    out = session.sum(inputs, spec=SPEC)
    assert np.array_equal(out.total, truth)  # what the server learned
    others = [p for pid, p in session.parties().items() if pid != session.server.agent]
    assert all(p.result is None for p in others)
    refusals = [r for r in out.rejected if "refused" in r]
    assert len(refusals) == N - 1
    assert all("TamperedAggregateError: server: relayed a result the key holder did not release" in r
               for r in refusals)


class LyingReleaser(SealClient):
    """Releases its decrypted sum plus one, signed with its own key (it is a key holder)."""

    def _decrypt_aggregate(self, env: Any) -> Any:
        out = super()._decrypt_aggregate(env)
        if not out:
            return out
        body = out[0].envelope.payload[:-64] if self.verified else out[0].envelope.payload
        released = read_result(body, self.spec, self.clients)
        forged = write_result(released.contributors, released.encoded_sum + np.uint64(1), self.clients)
        if self.verified:
            assert self.identity is not None
            forged += self.identity.sign(release_statement(self.scheme.protocol, self.run_id, self.party_id, forged))
        return [Outgoing(dataclasses.replace(out[0].envelope, payload=forged), out[0].exposure)]


@pytest.mark.parametrize("verify", [False, True])
@pytest.mark.parametrize("name", SCHEMES)
def test_with_a_shared_key_two_contributors_release_one_failing_costs_nothing_two_disagreeing_abort(
        name: str, verify: bool) -> None:
    inputs = inputs_for(10)
    session = make_sum(name, clients=range(N), keyholder="all", authenticate=True, verify_aggregate=verify)
    out = session.sum(inputs, spec=SPEC, reveal=Reveal(clients=False), dropouts=DropoutPlan({0: "aggregate"}))
    assert np.array_equal(out.total, plain(inputs, range(N)))  # client 0 lost its aggregate; client 1 released
    assert out.learned_by == frozenset([SERVER, 1])
    liar = make_sum(name, clients=range(N), keyholder="all", authenticate=True, verify_aggregate=verify)
    liar.sessions[1].client_party = LyingReleaser  # type: ignore[attr-defined]
    with pytest.raises(AbortedError, match="released different sums of the same aggregate"):
        liar.sum(inputs, spec=SPEC, reveal=Reveal(clients=False))


def test_a_signed_release_is_read_by_the_transcript_reader() -> None:
    """The audit's reader (protocols.readers) reads released sums from captured messages; a verified
    release carries the agent's signature after the checksummed sum and still reads."""
    from protocols.readers import CkksReader

    captured: list[Any] = []
    network = LocalNetwork(interceptor=lambda data, message: captured.append(message.envelope) or data)
    session = verified("ckks", network=network)
    inputs = inputs_for(11)
    out = session.sum(inputs, spec=SPEC)
    opened = next(e for e in captured if e.stage == 0 and e.run_id.hex() == out.run_id)
    request = SumRequest.from_bytes(opened.payload, clients=tuple(range(N)))
    results = [e for e in captured if e.stage == Stage.RESULT and e.run_id.hex() == out.run_id]
    assert results and all(len(e.payload) > 64 for e in results)
    for env in results:
        reading = CkksReader().read("result", env, request, clients=tuple(range(N)))
        assert reading is not None and np.array_equal(reading.values, out.total)


@pytest.mark.parametrize(("bound", "values", "outcome"), [
    (2**53, (2**53 - 1, 1), 2**53),  # the largest sum float64 holds with its neighbour below
    (2**53, (2**53, 2**53), 2**54),
    (2**53, (2**53, 1), "CapacityError"),  # 2**53 + 1: no float64 holds it; refused, never rounded
    (2**62, (2**62, 0), "CapacityError"),  # more than 63 bits per slot
])
def test_bfv_sums_of_big_integers_are_exact_or_refused(bound: int, values: tuple[int, int], outcome: Any) -> None:
    """Issue 22 item 6 through the SEAL sums (verified): BFV carries every integer sum its plaintext
    modulus holds; what float64 cannot hold is a CapacityError. CKKS refuses such specs up front."""
    from protocols.errors import CapacityError

    inputs = {pid: np.full(3, v, dtype=np.int64) for pid, v in enumerate(values)}
    session = make_sum("bfv", clients=range(2), authenticate=True)
    if outcome == "CapacityError":
        with pytest.raises((CapacityError, AbortedError), match="CapacityError|bits per slot"):
            session.sum(inputs, spec=VectorSpec(length=3, bound=bound, summands=2))
        return
    spec = VectorSpec(length=3, bound=bound, summands=2)
    assert [int(x) for x in session.sum(inputs, spec=spec).total] == [outcome] * 3
    with pytest.raises(CapacityError):
        make_sum("ckks", clients=range(2)).sum(inputs, spec=spec)
