"""BFV secure sum: exact against plain, parameters sized to the sum (plaintext modulus above every
sum, noise below what decrypts), dropouts, key set-up as messages, seeded uploads, tampering and
fuzzing (only protocol errors, never a wrong sum), client snapshots."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("tenseal")

from protocols import (
    SERVER,
    AbortedError,
    BoundError,
    CapacityError,
    DropoutPlan,
    EncodingError,
    ForeignKeyError,
    LocalNetwork,
    Message,
    PolicyError,
    ProtocolError,
    Reveal,
    SecureSum,
    StageError,
    SumRequest,
    VectorSpec,
    Visibility,
    WireError,
    descriptor,
    make_sum,
)
from protocols import errors as errors_module
from protocols.bfv import BfvClient, BfvClientSession, BfvOptions, BfvServerSession, Stage
from protocols.primitives import bfv as raw
from protocols.primitives import seal
from protocols.seal_messages import SumParams, _checksum, _write_ciphertexts, request_digest
from protocols.wire import Writer

PROTOCOL_ERRORS = {
    name for name, obj in vars(errors_module).items()
    if isinstance(obj, type) and issubclass(obj, ProtocolError)
}
Interceptor = Callable[[bytes, Message], "bytes | None"]


def counts(n: int, d: int, bound: int, seed: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i: rng.integers(0, bound + 1, d) for i in range(n)}


def plain_total(values: dict[int, np.ndarray], spec: VectorSpec) -> np.ndarray:
    return make_sum("plain", clients=sorted(values)).sum(values, spec=spec).total


def keyed(n: int, spec: VectorSpec, *, interceptor: Interceptor | None = None, **options: Any) -> SecureSum:
    """A BFV harness over ``n`` clients, its keys set up for sums of ``spec``."""
    session = make_sum("bfv", clients=list(range(n)), network=LocalNetwork(interceptor=interceptor), **options)
    session.server.check(spec=spec, reveal=Reveal())
    session.setup()
    return session


def server_of(session: SecureSum) -> BfvServerSession:
    assert isinstance(session.server, BfvServerSession)
    return session.server


def client_of(session: SecureSum, pid: int) -> BfvClientSession:
    client = session.client_session(pid)
    assert isinstance(client, BfvClientSession)
    return client


def agent_of(session: SecureSum) -> int:
    agent = server_of(session).agent
    assert agent is not None
    return agent


def params_of(session: SecureSum, spec: VectorSpec) -> raw.BfvParameters:
    params = server_of(session).parameters(spec)
    assert isinstance(params, raw.BfvParameters)
    return params


def rewrite(target: int, stage: Stage, change: Callable[[bytes], bytes]) -> Interceptor:
    def intercept(data: bytes, message: Message) -> bytes:
        env = message.envelope
        if env is not None and env.sender == target and env.stage == stage:
            return dataclasses.replace(env, payload=change(env.payload)).to_bytes()
        return data
    return intercept


# --- correctness ----------------------------------------------------------------------------------

@pytest.mark.parametrize("keyholder", ["agent", "all"])
def test_sums_equal_plain_bit_for_bit(keyholder: str) -> None:
    n, d = 12, 5000  # more entries than one ciphertext carries: chunked
    spec = VectorSpec(length=d, summands=n, bound=1000)
    values = counts(n, d, 1000)
    session = make_sum("bfv", clients=range(n), keyholder=keyholder)
    out = session.sum(values, spec=spec)
    assert np.array_equal(out.total, plain_total(values, spec))
    assert np.array_equal(out.total, np.sum(list(values.values()), axis=0))
    assert out.learned_by == frozenset([SERVER, *range(n)]) and out.dropped == ()
    assert session.tolerance(spec, n) == 0.0
    uploads = [e for e in session.transcript.select(run_id=out.run_id) if e.stage == "upload"]
    assert len(uploads) == n and all(e.visibility == Visibility.CIPHERTEXT for e in uploads)
    params = params_of(session, spec)
    assert params.chunks(d) == -(-d // params.poly_modulus_degree) >= 2
    budgets = [p.noise_budget for p in session.parties().values() if isinstance(p, BfvClient)
               and p.noise_budget is not None]
    assert budgets and min(budgets) >= params.min_budget(n, symmetric=keyholder == "all") >= 1


def test_signed_floats_are_exact_on_the_encodings_grid() -> None:
    n, d = 5, 40
    spec = VectorSpec(length=d, summands=n, bound=2.0, kind="float", signed=True, frac_bits=20)
    rng = np.random.default_rng(1)
    values = {i: rng.uniform(-2, 2, d) for i in range(n)}
    out = make_sum("bfv", clients=range(n)).sum(values, spec=spec)
    assert np.array_equal(out.total, plain_total(values, spec))
    assert np.max(np.abs(out.total - np.sum(list(values.values()), axis=0))) <= spec.sum_error_bound(n)


def test_the_largest_possible_sum_is_exact_and_the_plaintext_modulus_just_above_it() -> None:
    n, d = 7, 9
    spec = VectorSpec(length=d, summands=n, bound=2**16)
    session = make_sum("bfv", clients=range(n))
    out = session.sum({i: np.full(d, 2**16) for i in range(n)}, spec=spec)
    assert np.array_equal(out.total, np.full(d, n * 2**16))
    t = params_of(session, spec).plain_modulus
    top = n * 2**16
    assert top < t < 2 ** (top.bit_length() + 1)


CASES = [(100, 2**16, False), (100, 2**16, True), (10, 1, False), (1000, 2**16, False), (100, 2**26, True),
         (3, 2**40, False)]


@pytest.mark.parametrize(("summands", "entry_max", "symmetric"), CASES)
def test_derived_parameters_are_the_smallest_that_carry_the_sum(summands: int, entry_max: int,
                                                                 symmetric: bool) -> None:
    params = raw.derive(summands=summands, entry_max=entry_max, symmetric=symmetric)
    n, t = params.poly_modulus_degree, params.plain_modulus
    assert t > summands * entry_max and t % (2 * n) == 1 and raw.is_prime(t)
    assert params.min_budget(summands, symmetric=symmetric) >= 1
    assert sum(params.coeff_mod_bit_sizes) <= seal.MAX_COEFF_BITS_128[n]
    if n > min(seal.RINGS):
        with pytest.raises(CapacityError):
            raw.derive(summands=summands, entry_max=entry_max, symmetric=symmetric, ring=n // 2)
    if params.data_bits > seal.MIN_PRIME_BITS:
        smaller = raw.BfvParameters(n, (*seal.split_bits(params.data_bits - 1), params.special_bits), t)
        with pytest.raises(CapacityError):
            raw.check_capacity(smaller, summands, entry_max, symmetric=symmetric)


def test_what_no_parameters_carry_is_refused_clearly() -> None:
    with pytest.raises(CapacityError, match="128-bit security"):
        raw.derive(summands=2**20, entry_max=2**42, symmetric=False)
    spec = VectorSpec(length=3, summands=2, bound=2**61)
    with pytest.raises(CapacityError):
        make_sum("bfv", clients=[0, 1]).sum({0: np.zeros(3, dtype=np.int64)}, spec=spec)
    fixed = BfvOptions(poly_modulus_degree=4096, coeff_mod_bit_sizes=(44, 60), plain_modulus=16760833)
    assert fixed.parameters_for(VectorSpec(length=1, summands=100, bound=2**16)) == fixed.parameters
    with pytest.raises(CapacityError, match="plaintext modulus"):  # the sum could wrap modulo t
        fixed.parameters_for(VectorSpec(length=1, summands=100, bound=2**18))
    with pytest.raises(CapacityError, match="noise"):  # the noise could spoil decryption
        fixed.parameters_for(VectorSpec(length=1, summands=5000, bound=2))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(summands=st.integers(1, 400), entry_bits=st.integers(0, 40), symmetric=st.booleans(), data=st.data())
def test_honest_sums_decrypt_exactly_with_at_least_the_stated_noise_budget(
        summands: int, entry_bits: int, symmetric: bool, data: st.DataObject) -> None:
    entry_max = 2**entry_bits
    params = raw.derive(summands=summands, entry_max=entry_max, symmetric=symmetric)
    public_bytes, secret_bytes = raw.generate(params)
    public = raw.PublicContext(public_bytes, params)
    secret = raw.SecretContext(secret_bytes, public)
    contributors = data.draw(st.integers(1, min(summands, 10)), label="contributors")
    length = params.poly_modulus_degree
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32), label="seed"))
    total = np.zeros(length, dtype=np.uint64)
    accumulator = None
    for i in range(contributors):
        vector = rng.integers(0, entry_max + 1, length, dtype=np.uint64)
        vector[: i + 1] = entry_max
        total += vector
        streams = secret.encrypt(vector) if symmetric else public.encrypt(vector)
        loaded = [public.load(s, length, seeded=symmetric) for s in streams]
        if accumulator is None:
            accumulator = loaded
        else:
            public.add_into(accumulator, loaded)
    assert accumulator is not None
    values, budgets = secret.decrypt([public.dump(v) for v in accumulator], [length])
    assert np.array_equal(values, total)
    assert min(budgets) >= params.min_budget(contributors, symmetric=symmetric) >= 1


def test_targets_counts_from_100_clients_exact_in_at_most_25_bytes_per_value() -> None:
    n, d = 100, 4096
    spec = VectorSpec(length=d, summands=n, bound=2**16)
    values = counts(n, d, 2**16, seed=2)
    session = make_sum("bfv", clients=range(n))
    out = session.sum(values, spec=spec)
    assert np.array_equal(out.total, np.sum(list(values.values()), axis=0))
    agent = agent_of(session)
    per_value = {e.sender: e.bytes / d for e in session.transcript.select(run_id=out.run_id) if e.stage == "upload"}
    public_key = [b for pid, b in per_value.items() if pid != agent]
    assert max(public_key) <= 25 and per_value[agent] <= 0.55 * max(public_key)
    print(f"\nBFV counts 2**16 x 100 clients: {params_of(session, spec)}; {np.median(public_key):.2f} B/value "
          f"(public key), {per_value[agent]:.2f} B/value (seeded, the agent)")


# --- roles, dropouts, key set-up ------------------------------------------------------------------

def test_clients_silent_at_upload_are_left_out_and_get_no_result() -> None:
    n, d = 6, 20
    spec = VectorSpec(length=d, summands=n, bound=1000)
    values = counts(n, d, 1000, seed=3)
    session = keyed(n, spec)
    silent = [pid for pid in range(n) if pid != agent_of(session)][:2]
    out = session.sum(values, spec=spec, dropouts=DropoutPlan({pid: "upload" for pid in silent}))
    survivors = sorted(set(range(n)) - set(silent))
    assert out.contributors == tuple(survivors) and out.dropped == tuple(sorted(silent))
    assert np.array_equal(out.total, np.sum([values[p] for p in survivors], axis=0).astype(float))
    results_to = {e.receiver for e in session.transcript.select(run_id=out.run_id) if e.stage == "result"}
    assert results_to == {SERVER, *(p for p in survivors if p != agent_of(session))}


@pytest.mark.parametrize("stage", ["upload", "aggregate"])
def test_losing_the_key_holder_aborts(stage: str) -> None:
    spec = VectorSpec(length=5, summands=4, bound=9)
    session = keyed(4, spec)
    with pytest.raises(AbortedError):
        session.sum(counts(4, 5, 9), spec=spec, dropouts=DropoutPlan({agent_of(session): stage}))


def test_agent_mode_refuses_a_sum_hidden_from_the_server_and_all_mode_hides_it() -> None:
    spec = VectorSpec(length=4, summands=3, bound=9)
    with pytest.raises(ValueError, match="keyholder='all'"):
        make_sum("bfv", clients=[0, 1, 2]).sum(counts(3, 4, 9), spec=spec, reveal=Reveal(server=False))
    session = make_sum("bfv", clients=[0, 1, 2], keyholder="all")
    out = session.sum(counts(3, 4, 9), spec=spec, reveal=Reveal(server=False))
    assert out.learned_by == frozenset([0, 1, 2])
    assert not any(e.receiver == SERVER and e.visibility == Visibility.AGGREGATE for e in session.transcript)
    sealed = [e for e in session.transcript if e.stage == "sealed_key"]
    assert sealed and all(e.visibility == Visibility.SEALED for e in sealed)


def test_the_server_holds_a_public_context_only_and_the_descriptor_registers_bfv() -> None:
    spec = VectorSpec(length=3, summands=3, bound=5)
    session = keyed(3, spec)
    context = server_of(session).context
    assert context is not None and context.params == params_of(session, spec)
    assert not context._ctx.has_secret_key() and not context._ctx.has_galois_keys()
    keys = {pid: client_of(session, pid).keys for pid in range(3)}
    assert [pid for pid, k in keys.items() if k is not None and k.secret is not None] == [agent_of(session)]
    d = descriptor("bfv")
    assert d.family == "he" and d.exact and d.keyed and not d.server_learns_sum and d.code == 7
    assert d.stages[Stage.UPLOAD] == "upload" and d.options(keyholder="all") == BfvOptions(keyholder="all")
    _, secret = raw.generate(context.params)
    with pytest.raises(ProtocolError):
        raw.PublicContext(secret, context.params)


def test_each_parameter_set_gets_its_own_key_set() -> None:
    small = VectorSpec(length=4, summands=3, bound=3)
    large = VectorSpec(length=4, summands=3, bound=2**30)
    session = make_sum("bfv", clients=[0, 1, 2])
    for spec in (small, large, small):
        values = counts(3, 4, int(spec.bound), seed=4)
        assert np.array_equal(session.sum(values, spec=spec).total, plain_total(values, spec))
    assert set(server_of(session).keysets) == {params_of(session, small), params_of(session, large)}
    assert len([e for e in session.transcript if e.stage == "context" and e.receiver == SERVER]) == 2


# --- options and strict parsing -------------------------------------------------------------------

def test_options_are_validated() -> None:
    with pytest.raises(ValueError):
        BfvOptions(keyholder="server")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="together"):
        BfvOptions(plain_modulus=65537)
    with pytest.raises(ValueError, match="1 mod 2N"):
        BfvOptions(poly_modulus_degree=4096, coeff_mod_bit_sizes=(44, 60), plain_modulus=65539)
    with pytest.raises(ValueError, match="1 mod 2N"):
        BfvOptions(poly_modulus_degree=4096, coeff_mod_bit_sizes=(44, 60), plain_modulus=8193 * 3)
    with pytest.raises(ValueError, match="128-bit"):
        BfvOptions(poly_modulus_degree=4096, coeff_mod_bit_sizes=(60, 60), plain_modulus=16760833)
    with pytest.raises(ValueError):
        BfvOptions(poly_modulus_degree=3000)
    with pytest.raises(dataclasses.FrozenInstanceError):
        BfvOptions().keyholder = "all"  # type: ignore[misc]
    assert BfvOptions().parameters is None


def test_parameters_are_parsed_strictly() -> None:
    params = raw.derive(summands=10, entry_max=100, symmetric=False)
    data = params.to_bytes()
    assert raw.BfvParameters.from_bytes(data) == params
    for bad in (data[:-1], data + b"\x00", data[:-8] + (65539).to_bytes(8, "big"), b"", b"\x00" * 5,
                data[:5] + bytes([61]) + data[6:]):
        with pytest.raises(WireError):
            raw.BfvParameters.from_bytes(bad)


def test_a_sum_under_other_parameters_or_keys_is_refused_by_the_client() -> None:
    spec = VectorSpec(length=4, summands=2, bound=9)
    session = keyed(2, spec)
    fingerprint, agent = server_of(session).fingerprint, agent_of(session)
    assert fingerprint is not None
    chosen = params_of(session, spec).to_bytes()
    other = raw.derive(summands=2, entry_max=10**6, symmetric=False).to_bytes()
    base = SumRequest(kind="sum", statistic="sum", round=0, spec=spec, reveal=Reveal(), participants=(0, 1))
    digest = request_digest("bfv", base, (0, 1))
    client = client_of(session, 0)
    cases: list[tuple[type[ProtocolError], bytes]] = [
        (ForeignKeyError, SumParams(other, fingerprint, agent, digest).to_bytes()),
        (ForeignKeyError, SumParams(chosen, bytes(16), agent, digest).to_bytes()),
        (StageError, SumParams(chosen, fingerprint, 1 - agent, digest).to_bytes()),
        (WireError, SumParams(chosen, fingerprint, agent, request_digest("ckks", base, (0, 1))).to_bytes()),
    ]
    for error, params in cases:
        with pytest.raises(error):
            client.join(run_id=bytes(16), request=dataclasses.replace(base, params=params), values=None)
    good = dataclasses.replace(base, params=SumParams(chosen, fingerprint, agent, digest).to_bytes())
    assert isinstance(client.join(run_id=bytes(16), request=good, values=None), BfvClient)
    with pytest.raises(BoundError):  # an encoded input above entry_max never reaches encryption
        client.join(run_id=bytes(16), request=good, values=np.full(4, 10, dtype=np.uint64))
    with pytest.raises(EncodingError):
        client.join(run_id=bytes(16), request=good, values=np.full(4, 1, dtype=np.int64))


# --- tampering ------------------------------------------------------------------------------------

MUTATIONS: dict[str, Callable[[bytes], bytes]] = {
    "fingerprint bit": lambda p: bytes([p[0] ^ 1]) + p[1:],
    "count": lambda p: p[:16] + (2).to_bytes(4, "big") + p[20:],
    "inside the ciphertext": lambda p: p[: len(p) // 2] + bytes([p[len(p) // 2] ^ 0x10]) + p[len(p) // 2 + 1 :],
    "checksum": lambda p: p[:-1] + bytes([p[-1] ^ 0xFF]),
    "truncated": lambda p: p[: len(p) // 2],
    "extra byte": lambda p: p + b"\x00",
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_tampered_uploads_are_rejected_and_the_others_summed(mutation: str) -> None:
    n, d = 4, 10
    spec = VectorSpec(length=d, summands=n, bound=50)
    values = counts(n, d, 50, seed=6)
    session = keyed(n, spec)
    victim = next(pid for pid in range(n) if pid != agent_of(session))
    session.network.interceptor = rewrite(victim, Stage.UPLOAD, MUTATIONS[mutation])
    out = session.sum(values, spec=spec)
    assert len(out.rejected) == 1 and out.rejected[0].split(":")[0] in {"WireError", "ForeignKeyError"}
    others = {p: v for p, v in values.items() if p != victim}
    assert out.contributors == tuple(sorted(others))
    assert np.array_equal(out.total, plain_total(others, spec))


def test_foreign_ciphertexts_are_refused_and_relabelled_ones_abort_on_their_noise() -> None:
    n, d = 3, 8
    spec = VectorSpec(length=d, summands=n, bound=50)
    session = keyed(n, spec)
    params = params_of(session, spec)
    foreign = raw.PublicContext(raw.generate(params)[0], params)
    forged = foreign.encrypt(np.zeros(d, dtype=np.uint64))
    victim = next(pid for pid in range(n) if pid != agent_of(session))
    session.network.interceptor = rewrite(victim, Stage.UPLOAD, lambda _: _write_ciphertexts(Writer(), foreign, forged))
    out = session.sum(counts(n, d, 50), spec=spec)
    assert len(out.rejected) == 1 and out.rejected[0].startswith("ForeignKeyError")
    # Relabelled with our fingerprint they load (same parameters) but decrypt with noise near q/2:
    # the key holder's noise-budget check refuses to release a sum (a wrong one would fit below t).
    fingerprint = server_of(session).fingerprint
    assert fingerprint is not None

    def forge(_: bytes) -> bytes:
        body = Writer().raw(fingerprint).u32(len(forged))
        for stream in forged:
            body.blob(stream)
        data = body.finish()
        return data + _checksum(data)

    session.network.interceptor = rewrite(victim, Stage.UPLOAD, forge)
    with pytest.raises(AbortedError):
        session.sum(counts(n, d, 50), spec=spec)
    assert session.parties()[agent_of(session)].result is None


def test_a_corrupted_aggregate_is_never_released() -> None:
    spec = VectorSpec(length=6, summands=3, bound=7)
    session = keyed(3, spec)
    session.network.interceptor = rewrite(SERVER, Stage.AGGREGATE,
                                          lambda p: p[:-100] + bytes([p[-100] ^ 1]) + p[-99:])
    with pytest.raises(AbortedError):
        session.sum(counts(3, 6, 7), spec=spec)
    assert all(p.result is None for p in session.parties().values())


def _mutate(data: bytes, kind: str, pos: int, xor: int) -> bytes:
    header = 34
    if kind == "header":
        i = pos % min(header, len(data))
    elif kind == "payload head":
        i = header + pos % max(1, min(64, len(data) - header))
    else:
        i = pos % len(data)
    if kind == "truncate":
        return data[:i]
    if kind == "extend":
        return data + bytes([xor])
    if i >= len(data):
        return data + bytes([xor])
    return data[:i] + bytes([data[i] ^ xor]) + data[i + 1 :]


MUTATION = st.tuples(st.integers(0, 63), st.sampled_from(["header", "payload head", "anywhere", "truncate", "extend"]),
                     st.integers(0, 2**32), st.integers(1, 255))
FUZZ_SPEC = VectorSpec(length=5, summands=3, bound=100)
FUZZ_VALUES = counts(3, 5, 100, seed=10)
SETUP_MESSAGES = {"agent": 3 + 1 + 2 + 2, "all": 3 + 2 + 1 + 2 + 1 + 1 + 2 + 2}
_FUZZ: dict[str, tuple[SecureSum, int]] = {}


def _mutating(target: int, kind: str, pos: int, xor: int) -> Interceptor:
    seen: list[int] = []

    def intercept(data: bytes, message: Message) -> bytes:
        seen.append(0)
        return _mutate(data, kind, pos, xor) if len(seen) - 1 == target else data
    return intercept


def _check(session: SecureSum, rejected: list[str]) -> None:
    """Only protocol errors anywhere, and whatever a party learned is the exact sum of its contributors."""
    for reason in rejected:
        assert reason.split(" refused: ", 1)[-1].split(":")[0] in PROTOCOL_ERRORS, reason
    for endpoint in session.endpoints.values():
        assert all(e.split(":")[0] in PROTOCOL_ERRORS for e in endpoint.errors), endpoint.errors
    for party in session.parties().values():
        if party.result is not None:
            expected = plain_total({p: FUZZ_VALUES[p] for p in party.contributors}, FUZZ_SPEC)
            assert np.array_equal(party.result, expected)


def _fuzz_session(keyholder: str) -> tuple[SecureSum, int]:
    if keyholder not in _FUZZ:
        session = keyed(3, FUZZ_SPEC, keyholder=keyholder)
        before = len(session.transcript)
        session.sum(FUZZ_VALUES, spec=FUZZ_SPEC)
        _FUZZ[keyholder] = (session, len(session.transcript) - before)
    return _FUZZ[keyholder]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keyholder=st.sampled_from(["agent", "all"]), mutation=MUTATION)
def test_fuzzed_sum_messages_raise_protocol_errors_and_never_a_wrong_sum(
        keyholder: str, mutation: tuple[int, str, int, int]) -> None:
    session, count = _fuzz_session(keyholder)
    target, kind, pos, xor = mutation
    session.network.interceptor = _mutating(target % count, kind, pos, xor)
    try:
        out = session.sum(FUZZ_VALUES, spec=FUZZ_SPEC)
    except AbortedError:
        out = None
    finally:
        session.network.interceptor = None
    _check(session, list(out.rejected) if out is not None else [])
    if out is not None:
        assert np.array_equal(out.total, plain_total({p: FUZZ_VALUES[p] for p in out.contributors}, FUZZ_SPEC))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keyholder=st.sampled_from(["agent", "all"]), mutation=MUTATION)
def test_fuzzed_set_up_messages_raise_protocol_errors_and_never_a_wrong_sum(
        keyholder: str, mutation: tuple[int, str, int, int]) -> None:
    target, kind, pos, xor = mutation
    session = make_sum("bfv", clients=[0, 1, 2], keyholder=keyholder,
                       network=LocalNetwork(interceptor=_mutating(target % SETUP_MESSAGES[keyholder], kind, pos, xor)))
    session.server.check(spec=FUZZ_SPEC, reveal=Reveal())
    try:
        session.setup()
    except AbortedError:
        assert not session.ready
        return
    session.network.interceptor = None
    try:
        out = session.sum(FUZZ_VALUES, spec=FUZZ_SPEC)
    except AbortedError:
        out = None
    _check(session, list(out.rejected) if out is not None else [])


def test_every_set_up_message_is_counted_by_the_fuzzer() -> None:
    for keyholder, expected in SETUP_MESSAGES.items():
        assert len(keyed(3, FUZZ_SPEC, keyholder=keyholder).transcript) == expected


# --- client snapshots -----------------------------------------------------------------------------

@pytest.mark.parametrize("keyholder", ["agent", "all"])
def test_client_snapshots_round_trip_keep_working_and_are_parsed_strictly(keyholder: Any) -> None:
    n = 3
    spec = VectorSpec(length=7, summands=n, bound=20)
    session = keyed(n, spec, keyholder=keyholder)
    options = BfvOptions(keyholder=keyholder)
    for pid in range(n):
        snapshot = client_of(session, pid).to_bytes()
        restored = BfvClientSession(pid, clients=range(n), options=options)
        restored.load_bytes(snapshot)
        assert restored.to_bytes() == snapshot
        assert restored.keys is not None and restored.keys.agent == agent_of(session)
        assert (restored.keys.secret is not None) == (keyholder == "all" or pid == agent_of(session))
        for broken in (snapshot[:-1], snapshot + b"\x00", b"\x01" + snapshot[1:], b""):
            with pytest.raises(ProtocolError):
                restored.load_bytes(broken)
            assert restored.to_bytes() == snapshot  # nothing changed on error
        session.sessions[pid] = restored
        session.endpoints[pid].sessions[("bfv", "")] = restored
    values = counts(n, 7, 20, seed=9)
    assert np.array_equal(session.sum(values, spec=spec).total, plain_total(values, spec))
    if keyholder == "agent":  # the agent's snapshot carries the key: not another client's role
        other = next(p for p in range(n) if p != agent_of(session))
        with pytest.raises(PolicyError):
            BfvClientSession(other, clients=range(n)).load_bytes(client_of(session, agent_of(session)).to_bytes())


def test_released_sums_read_by_the_transcript_reader_and_serialisation_without_memfd(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit's reader (named by the descriptor) reads a BFV release; ciphertexts serialise
    through a private directory where SEAL cannot write through /proc."""
    monkeypatch.setattr(seal, "_MEMFD", False)
    spec = VectorSpec(length=6, summands=3, bound=9)
    captured: list[Message] = []

    def keep(data: bytes, message: Message) -> bytes:
        if message.envelope is not None and message.label.stage == "result":
            captured.append(message)
        return data

    values = counts(3, 6, 9, seed=11)
    session = make_sum("bfv", clients=[0, 1, 2], network=LocalNetwork(interceptor=keep))
    out = session.sum(values, spec=spec, reveal=Reveal(server=True, clients=False))
    request = SumRequest(kind="sum", statistic="sum", round=0, spec=spec, reveal=Reveal(), participants=(0, 1, 2))
    reader = descriptor("bfv").message_reader()
    readings = [reader.read("result", m.envelope, request, clients=(0, 1, 2)) for m in captured
                if m.envelope is not None]
    assert readings and all(r is not None and np.array_equal(r.values, out.total) for r in readings)
    assert np.array_equal(out.total, plain_total(values, spec))
