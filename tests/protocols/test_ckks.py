"""CKKS secure sum: exactness, parameters derived from the spec, error bounds, chunking, dropouts,
key set-up as messages (one key set per parameter set), seeded uploads, client snapshots, and
refusal of bad input."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ts = pytest.importorskip("tenseal")

from protocols import (
    SERVER,
    AbortedError,
    BoundError,
    CapacityError,
    DropoutPlan,
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
    make_sum,
)
from protocols import errors as errors_module
from protocols.ckks import (
    LEGACY,
    CkksClient,
    CkksClientSession,
    CkksOptions,
    CkksServerSession,
    Stage,
)
from protocols.primitives import ckks as raw
from protocols.primitives import seal
from protocols.seal_messages import (
    SetupParams,
    SumParams,
    _checksum,
    _write_ciphertexts,
    read_context,
    request_digest,
)
from protocols.wire import OPEN, Envelope, Writer

FLOAT: dict[str, Any] = {"bound": 1.0, "kind": "float", "signed": True}
LEGACY_OPTIONS: dict[str, Any] = {"poly_modulus_degree": 8192, "coeff_mod_bit_sizes": (60, 40, 40, 60), "scale_bits": 40}
PROTOCOL_ERRORS = {
    name for name, obj in vars(errors_module).items()
    if isinstance(obj, type) and issubclass(obj, ProtocolError)
}
Interceptor = Callable[[bytes, Message], "bytes | None"]


def inputs(n: int, d: int, seed: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i: rng.uniform(-1.0, 1.0, d) for i in range(n)}


def plain_total(values: dict[int, np.ndarray], spec: VectorSpec) -> np.ndarray:
    return make_sum("plain", clients=sorted(values)).sum(values, spec=spec).total


def keyed(n: int, *, spec: VectorSpec | None = None, interceptor: Interceptor | None = None,
          **options: Any) -> SecureSum:
    """A CKKS harness over ``n`` clients, its keys set up for sums of ``spec`` (default: ``n``
    signed floats in [-1, 1])."""
    session = make_sum("ckks", clients=list(range(n)), network=LocalNetwork(interceptor=interceptor), **options)
    needs(session, spec if spec is not None else VectorSpec(length=1, summands=n, **FLOAT))
    session.setup()
    return session


def needs(session: SecureSum, spec: VectorSpec) -> None:
    """Tell the server a sum of ``spec`` is coming (its parameter set needs keys)."""
    session.server.check(spec=spec, reveal=Reveal())


def params_of(session: SecureSum, spec: VectorSpec) -> raw.CkksParameters:
    params = server_of(session).parameters(spec)
    assert isinstance(params, raw.CkksParameters)
    return params


def server_of(session: SecureSum) -> CkksServerSession:
    assert isinstance(session.server, CkksServerSession)
    return session.server


def client_of(session: SecureSum, pid: int) -> CkksClientSession:
    client = session.client_session(pid)
    assert isinstance(client, CkksClientSession)
    return client


def agent_of(session: SecureSum) -> int:
    agent = server_of(session).agent
    assert agent is not None
    return agent


def decryption_errors(session: SecureSum) -> list[float]:
    """The CKKS error each decrypting client met in the latest sum (read from the parties)."""
    return [p.decryption_error for p in session.parties().values()
            if isinstance(p, CkksClient) and p.decryption_error is not None]


def rewrite(target: int, stage: Stage, change: Callable[[bytes], bytes]) -> Interceptor:
    """An interceptor that rewrites the payload of one party's message of one stage."""
    def intercept(data: bytes, message: Message) -> bytes:
        env = message.envelope
        if env is not None and env.sender == target and env.stage == stage:
            return dataclasses.replace(env, payload=change(env.payload)).to_bytes()
        return data
    return intercept


def test_sum_of_100_equals_the_exact_fixed_point_sum() -> None:
    n, d = 100, 16
    spec = VectorSpec(length=d, summands=n, **FLOAT)
    values = inputs(n, d)
    session = make_sum("ckks", clients=list(range(n)))
    out = session.sum(values, spec=spec)
    # Rounding the decrypted sum to the encoding's grid makes CKKS exact: same bits as `plain`.
    assert np.array_equal(out.total, plain_total(values, spec))
    assert np.max(np.abs(out.total - sum(values.values()))) <= session.tolerance(spec, n)
    # The CKKS error actually met before rounding stays below the stated bound eps(n, M).
    (raw_error,) = decryption_errors(session)  # one decryptor: the agent
    bound = params_of(session, spec).error_bound(n, float(n * spec.entry_max))
    assert 0 < raw_error <= bound <= 0.25
    assert server_of(session).error_bound(spec, n) == pytest.approx(bound / spec.scale)
    print(f"\nn=100: max CKKS error {raw_error:.3g} encoded units "
          f"({raw_error / spec.scale:.3g} in value units), bound eps={bound:.3g}")
    assert out.contributors == tuple(range(n)) and out.dropped == ()
    assert out.learned_by == frozenset([SERVER, *range(n)])
    uploads = [e for e in session.transcript if e.stage == "upload"]
    assert len(uploads) == n and all(e.visibility == Visibility.CIPHERTEXT for e in uploads)
    (to_agent,) = [e for e in session.transcript if e.stage == "aggregate"]
    assert (to_agent.receiver, to_agent.visibility, to_agent.k) == (agent_of(session), Visibility.AGGREGATE, n)
    assert all(e.visibility == Visibility.PUBLIC for e in session.transcript if e.stage == "context")
    assert out.timings.client_upload_median > 0 and out.timings.aggregate > 0 and out.timings.finalize > 0


def test_long_vectors_are_chunked_over_every_slot() -> None:
    n, d = 3, 10_000  # > N entries: three ciphertexts, the last one partly filled
    spec = VectorSpec(length=d, summands=n, **FLOAT)
    values = inputs(n, d, seed=1)
    session = make_sum("ckks", clients=list(range(n)))
    out = session.sum(values, spec=spec)
    assert np.array_equal(out.total, plain_total(values, spec))
    # An upload is ceil(d / N) ciphertexts (two entries per complex slot) and a few bytes, no
    # context: full public-key ciphertexts from clients without the key, seeded ones (half the
    # bytes) from the agent, which holds it.
    params = params_of(session, spec)
    assert params.values_per_ciphertext == params.poly_modulus_degree == 2 * params.slots
    chunks = math.ceil(d / params.poly_modulus_degree)
    assert chunks == 3
    public_bytes, secret_bytes = seal.generate(params)
    public = raw.PublicContext(public_bytes, params)
    secret = raw.SecretContext(secret_bytes, public)
    full = len(public.encrypt(np.arange(float(params.poly_modulus_degree)))[0])
    seeded = len(secret.encrypt(np.arange(float(params.poly_modulus_degree)))[0])
    assert 0.45 * full <= seeded <= 0.55 * full
    agent = agent_of(session)
    for entry in (e for e in session.transcript if e.stage == "upload"):
        one = seeded if entry.sender == agent else full
        assert 0.95 * chunks * one <= entry.bytes <= 1.05 * chunks * one


def test_other_parameters_use_their_slot_count() -> None:
    options = CkksOptions(poly_modulus_degree=16384, coeff_mod_bit_sizes=[60, 50, 60], scale_bits=40)
    assert options.coeff_mod_bit_sizes == (60, 50, 60) and options.parameters is not None
    assert options.parameters.slots == 8192 and options.parameters.values_per_ciphertext == 16384
    n, d = 2, 20_000
    spec = VectorSpec(length=d, summands=n, **FLOAT)
    values = inputs(n, d, seed=2)
    session = SecureSum("ckks", clients=[0, 1], options=options)
    assert np.array_equal(session.sum(values, spec=spec).total, plain_total(values, spec))
    context = server_of(session).context
    assert context is not None and context.params == options.parameters
    assert len(context.encrypt(np.zeros(d))) == 2
    # A fixed ring alone: the modulus chain and scale are still derived for each sum.
    ring = SecureSum("ckks", clients=[0, 1], options=CkksOptions(poly_modulus_degree=8192))
    assert np.array_equal(ring.sum(values, spec=spec).total, plain_total(values, spec))
    chosen = params_of(ring, spec)
    assert chosen.poly_modulus_degree == 8192 and chosen == raw.derive(
        summands=n, entry_max=spec.entry_max, symmetric=False, ring=8192)


def test_clients_silent_at_upload_are_left_out() -> None:
    n, d = 6, 20
    spec = VectorSpec(length=d, summands=n, kind="int", bound=1000)
    rng = np.random.default_rng(3)
    values = {i: rng.integers(0, 1001, d) for i in range(n)}
    session = keyed(n, spec=spec)
    silent = [pid for pid in range(n) if pid != agent_of(session)][:2]
    out = session.sum(values, spec=spec, dropouts=DropoutPlan({pid: "upload" for pid in silent}))
    survivors = sorted(set(range(n)) - set(silent))
    assert out.contributors == tuple(survivors) and out.dropped == tuple(sorted(silent))
    assert np.array_equal(out.total, np.sum([values[p] for p in survivors], axis=0).astype(float))
    # The silent clients get no result: it goes to the contributors only.
    results_to = {e.receiver for e in session.transcript.select(run_id=out.run_id) if e.stage == "result"}
    assert results_to == {SERVER, *(p for p in survivors if p != agent_of(session))}


def test_server_context_has_no_secret_and_no_galois_keys() -> None:
    seen: list[tuple[int, bytes]] = []

    def record(data: bytes, message: Message) -> bytes:
        env = message.envelope
        if env is not None and env.stage == Stage.CONTEXT:
            seen.append((env.receiver, read_context(env.payload)))
        return data

    session = keyed(3, interceptor=record)
    agent = agent_of(session)
    assert {receiver for receiver, _ in seen} == {SERVER, *(p for p in range(3) if p != agent)}
    for _, payload in seen:
        ctx = ts.context_from(payload)
        assert not ctx.is_private() and not ctx.has_secret_key()
        assert not ctx.has_galois_keys() and not ctx.has_relin_keys()
        assert ctx.has_public_key()
    context = server_of(session).context
    assert context is not None and context.data == seen[0][1]
    assert all(payload == seen[0][1] for _, payload in seen)
    # A context carrying a secret key is refused as a public one.
    params = context.params
    assert isinstance(params, raw.CkksParameters)
    _, secret = raw.generate(params)
    with pytest.raises(ProtocolError):
        raw.PublicContext(secret, params)


def _server_inbox(store: list[bytes]) -> Interceptor:
    def record(data: bytes, message: Message) -> bytes:
        if message.envelope is not None and message.envelope.receiver == SERVER:
            store.append(data)
        return data
    return record


def test_agent_mode_set_up_is_messages_and_only_the_agent_holds_the_key() -> None:
    to_server: list[bytes] = []
    session = keyed(4, interceptor=_server_inbox(to_server))
    agent = agent_of(session)
    # The set-up request names the agent (strictly parsed by each client from its `open`).
    opens = [e for e in session.transcript if e.stage == "open"]
    assert {e.receiver for e in opens} == set(range(4))
    stages = [(e.stage, e.sender, e.receiver) for e in session.transcript if e.stage != "open"]
    others = [p for p in range(4) if p != agent]
    assert sorted(stages) == sorted([("context", agent, SERVER)]
                                    + [("context", SERVER, p) for p in others]
                                    + [("confirm", p, SERVER) for p in others])
    keys = {pid: client_of(session, pid).keys for pid in range(4)}
    assert all(k is not None and k.agent == agent for k in keys.values())
    assert [pid for pid, k in keys.items() if k is not None and k.secret is not None] == [agent]
    agent_keys = keys[agent]
    assert agent_keys is not None and agent_keys.secret_bytes is not None
    secret = agent_keys.secret_bytes
    assert all(secret not in data for data in to_server)
    # Every party loaded its own objects from its own bytes: nothing is shared.
    contexts = [server_of(session).context] + [k.public for k in keys.values() if k is not None]
    assert len({id(c) for c in contexts}) == 5 and len({id(c._ctx) for c in contexts if c is not None}) == 5
    assert len({c.fingerprint for c in contexts if c is not None}) == 1


def test_all_mode_every_client_decrypts_and_the_key_travels_sealed() -> None:
    n, d = 4, 12
    spec = VectorSpec(length=d, summands=n, **FLOAT)
    values = inputs(n, d, seed=4)
    to_server: list[bytes] = []
    session = make_sum("ckks", clients=list(range(n)), keyholder="all",
                       network=LocalNetwork(interceptor=_server_inbox(to_server)))
    out = session.sum(values, spec=spec, reveal=Reveal(server=False))
    agent = agent_of(session)
    assert out.learned_by == frozenset(range(n))
    assert np.array_equal(out.total, plain_total(values, spec))
    assert len(decryption_errors(session)) == n
    keys = [e for e in session.transcript if e.stage == "sealed_key"]
    assert all(e.visibility == Visibility.SEALED for e in keys)
    # One bundle from the agent, then one sealed key relayed to each other client.
    assert sorted((e.sender, e.receiver) for e in keys) == sorted(
        [(agent, SERVER)] + [(SERVER, p) for p in range(n) if p != agent])
    advertised = {e.sender for e in session.transcript if e.stage == "advertise"}
    assert advertised == set(range(n)) - {agent}
    secrets_held = {client_of(session, p).keys.secret_bytes for p in range(n)}  # type: ignore[union-attr]
    (secret,) = secrets_held
    assert secret is not None and all(secret not in data for data in to_server)
    aggregates = [e for e in session.transcript if e.stage == "aggregate"]
    assert {e.receiver for e in aggregates} == set(range(n))
    assert not any(e.receiver == SERVER and e.visibility == Visibility.AGGREGATE for e in session.transcript)


def test_all_mode_hides_the_sum_from_other_clients_when_only_the_server_learns() -> None:
    spec = VectorSpec(length=5, summands=3, **FLOAT)
    values = inputs(3, 5, seed=11)
    session = keyed(3, keyholder="all")
    out = session.sum(values, spec=spec, reveal=Reveal(clients=False))
    assert np.array_equal(out.total, plain_total(values, spec))
    # the two releasers (one failing costs nothing) decrypt; the third client learns nothing
    receivers = [e.receiver for e in session.transcript.select(run_id=out.run_id) if e.stage == "aggregate"]
    assert out.learned_by == frozenset([SERVER, *receivers]) and sorted(receivers) == [0, 1]


def test_results_and_aggregates_reach_participants_only() -> None:
    n, d = 5, 6
    spec = VectorSpec(length=d, summands=n, **FLOAT)
    session = keyed(n)
    agent = agent_of(session)
    bystander, *participants = [p for p in range(n) if p != agent]
    values = {p: v for p, v in inputs(n, d, seed=12).items() if p in participants}
    out = session.sum(values, spec=spec)
    assert np.array_equal(out.total, plain_total(values, spec))
    entries = session.transcript.select(run_id=out.run_id)
    assert not any(bystander in (e.sender, e.receiver) for e in entries)
    # The agent is opened at (it decrypts) but uploads nothing.
    assert {(e.stage, e.sender) for e in entries if agent in (e.sender, e.receiver)} == {
        ("open", SERVER), ("aggregate", SERVER), ("result", agent)}
    assert out.learned_by == frozenset([SERVER, agent, *participants])


def test_agent_mode_refuses_a_sum_hidden_from_the_server() -> None:
    spec = VectorSpec(length=4, summands=2, **FLOAT)
    with pytest.raises(ValueError, match="keyholder='all'"):
        make_sum("ckks", clients=[0, 1]).sum(inputs(2, 4), spec=spec, reveal=Reveal(server=False))


def test_ciphertexts_under_a_foreign_context_are_refused() -> None:
    n, d = 4, 10
    spec = VectorSpec(length=d, summands=n, **FLOAT)
    values = inputs(n, d, seed=5)
    session = keyed(n, spec=spec)
    params = params_of(session, spec)
    foreign = raw.PublicContext(raw.generate(params)[0], params)
    forged = foreign.encrypt(np.zeros(d))
    victim = next(pid for pid in range(n) if pid != agent_of(session))
    session.network.interceptor = rewrite(victim, Stage.UPLOAD, lambda _: _write_ciphertexts(Writer(), foreign, forged))
    out = session.sum(values, spec=spec)
    assert len(out.rejected) == 1 and out.rejected[0].startswith("ForeignKeyError")
    others = {p: v for p, v in values.items() if p != victim}
    assert out.contributors == tuple(sorted(others))
    assert np.array_equal(out.total, plain_total(others, spec))


def test_a_forged_fingerprint_aborts_instead_of_releasing_garbage() -> None:
    """Foreign ciphertexts relabelled with our fingerprint load (same parameters) but
    decrypt to noise; the key holder's error check refuses to release that sum."""
    spec = VectorSpec(length=8, summands=3, **FLOAT)
    session = keyed(3, spec=spec)
    params = params_of(session, spec)
    foreign = raw.PublicContext(raw.generate(params)[0], params)
    fingerprint = server_of(session).fingerprint
    assert fingerprint is not None
    victim = next(pid for pid in range(3) if pid != agent_of(session))

    def forge(_: bytes) -> bytes:
        body = Writer().raw(fingerprint).u32(1).blob(foreign.encrypt(np.zeros(8))[0]).finish()
        return body + _checksum(body)

    session.network.interceptor = rewrite(victim, Stage.UPLOAD, forge)
    with pytest.raises(AbortedError):
        session.sum(inputs(3, 8), spec=spec)
    assert session.parties()[agent_of(session)].result is None


MUTATIONS: dict[str, Callable[[bytes], bytes]] = {
    "fingerprint bit": lambda p: bytes([p[0] ^ 1]) + p[1:],
    "count": lambda p: p[:16] + (2).to_bytes(4, "big") + p[20:],
    "inside the ciphertext": lambda p: p[: len(p) // 2] + bytes([p[len(p) // 2] ^ 0x10]) + p[len(p) // 2 + 1 :],
    "checksum": lambda p: p[:-1] + bytes([p[-1] ^ 0xFF]),
    "truncated by one": lambda p: p[:-1],
    "truncated to half": lambda p: p[: len(p) // 2],
    "extra byte": lambda p: p + b"\x00",
    "empty": lambda p: b"",
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_tampered_uploads_are_rejected_and_the_others_summed(mutation: str) -> None:
    n, d = 4, 10
    spec = VectorSpec(length=d, summands=n, **FLOAT)
    values = inputs(n, d, seed=6)
    session = keyed(n)
    victim = next(pid for pid in range(n) if pid != agent_of(session))
    session.network.interceptor = rewrite(victim, Stage.UPLOAD, MUTATIONS[mutation])
    out = session.sum(values, spec=spec)
    assert len(out.rejected) == 1 and out.rejected[0].split(":")[0] in {"WireError", "ForeignKeyError"}
    others = {p: v for p, v in values.items() if p != victim}
    assert out.contributors == tuple(sorted(others))
    assert np.array_equal(out.total, plain_total(others, spec))


def test_truncated_envelope_is_rejected() -> None:
    spec = VectorSpec(length=6, summands=3, **FLOAT)
    session = keyed(3)
    victim = next(pid for pid in range(3) if pid != agent_of(session))

    def cut(data: bytes, m: Message) -> bytes:
        return data[:-7] if m.envelope is not None and m.envelope.sender == victim else data

    session.network.interceptor = cut
    out = session.sum(inputs(3, 6), spec=spec)
    assert out.contributors == tuple(p for p in range(3) if p != victim)
    assert out.rejected[0].startswith("WireError")


def test_garbage_ciphertexts_never_escape_as_anything_but_protocol_errors() -> None:
    params = LEGACY
    context = raw.PublicContext(raw.generate(params)[0], params)
    stream = context.encrypt(np.arange(4096.0))[0]
    rng = np.random.default_rng(7)
    accepted = 0
    for i in range(300):
        broken = bytearray(stream)
        for _ in range(int(rng.integers(1, 4))):
            pos = int(rng.integers(0, 64 if i % 2 else len(broken)))  # headers half the time
            broken[pos] ^= 1 << int(rng.integers(0, 8))
        try:
            context.load(bytes(broken), 4096)
            accepted += 1  # malleable: a flipped literal can still be a valid ciphertext
        except ProtocolError:
            pass
    assert accepted < 300
    for cut in (0, 1, 15, 16, 17, 40, len(stream) // 2, len(stream) - 1):
        with pytest.raises(ProtocolError):
            context.load(stream[:cut], 4096)
    for junk in (b"\x00" * 1000, bytes(rng.integers(0, 256, 5000, dtype=np.uint8)), stream + b"\x00"):
        with pytest.raises(ProtocolError):
            context.load(junk, 4096)
    with pytest.raises(ProtocolError):
        context.load(stream, 8193)  # a ciphertext holds N = 8192 entries
    with pytest.raises(ProtocolError):
        context.load(stream, 4096, seeded=True)  # a full ciphertext where a seeded one is due
    with pytest.raises(ProtocolError):
        raw.PublicContext(b"not a context", params)


def test_a_corrupted_aggregate_is_never_released() -> None:
    spec = VectorSpec(length=6, summands=3, **FLOAT)
    session = keyed(3)
    session.network.interceptor = rewrite(SERVER, Stage.AGGREGATE, lambda p: p[:-100] + bytes([p[-100] ^ 1]) + p[-99:])
    with pytest.raises(AbortedError):
        session.sum(inputs(3, 6), spec=spec)
    assert all(p.result is None for p in session.parties().values())


@pytest.mark.parametrize("stage", ["upload", "aggregate"])
def test_losing_the_key_holder_aborts(stage: str) -> None:
    spec = VectorSpec(length=5, summands=4, **FLOAT)
    session = keyed(4)
    with pytest.raises(AbortedError):
        session.sum(inputs(4, 5), spec=spec, dropouts=DropoutPlan({agent_of(session): stage}))


def test_bound_violations_and_oversized_specs() -> None:
    spec = VectorSpec(length=3, summands=2, **FLOAT)
    session = make_sum("ckks", clients=[0, 1])
    bad = {0: np.array([0.5, 1.5, 0.0]), 1: np.zeros(3)}
    with pytest.raises(BoundError):
        session.sum(bad, spec=spec)
    clipped = session.sum(bad, spec=spec, clip=True)
    assert clipped.clipped == 1 and np.allclose(clipped.total, [0.5, 1.0, 0.0], atol=1e-4)
    # Sums too large for CKKS to carry exactly are refused up front, not rounded wrongly.
    huge = VectorSpec(length=3, summands=100, bound=1.0, kind="float", signed=True, frac_bits=40)
    with pytest.raises(CapacityError):
        session.tolerance(huge, 100)
    with pytest.raises(CapacityError):
        make_sum("ckks", clients=list(range(100))).sum({0: np.zeros(3)}, spec=huge)
    with pytest.raises(CapacityError, match="128-bit security"):
        server_of(session).check(spec=huge, reveal=Reveal())
    # ...and by every client, should a server open one anyway (under any parameters it names).
    base = SumRequest(kind="sum", statistic="sum", round=0, spec=huge, reveal=Reveal(), participants=(0,))
    forced = SumParams(LEGACY.to_bytes(), bytes(16), 0, request_digest("ckks", base, (0, 1)))
    request = dataclasses.replace(base, params=forced.to_bytes())
    with pytest.raises(CapacityError):
        client_of(session, 0).join(run_id=bytes(16), request=request, values=None)


def test_options_are_validated() -> None:
    with pytest.raises(ValueError):
        CkksOptions(keyholder="server")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        CkksOptions(poly_modulus_degree=5000)
    with pytest.raises(ValueError, match="128-bit"):  # 240 bits: below 128-bit security at N=8192
        CkksOptions(poly_modulus_degree=8192, coeff_mod_bit_sizes=(60, 60, 60, 60), scale_bits=40)
    with pytest.raises(ValueError):
        CkksOptions(poly_modulus_degree=8192, coeff_mod_bit_sizes=(60,), scale_bits=40)
    with pytest.raises(ValueError):
        CkksOptions(poly_modulus_degree=8192, coeff_mod_bit_sizes=(60, 40, 40, 60), scale_bits=70)
    with pytest.raises(ValueError, match="together"):
        CkksOptions(scale_bits=30)  # a scale without its modulus chain
    with pytest.raises(ValueError, match="together"):
        CkksOptions(coeff_mod_bit_sizes=(60, 40, 60), scale_bits=30)  # ... or without its ring
    with pytest.raises(TypeError):
        CkksOptions(symmetric="yes")  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        CkksOptions().scale_bits = 30  # type: ignore[misc]
    assert CkksOptions().parameters is None and CkksOptions(**LEGACY_OPTIONS).parameters == LEGACY
    session = make_sum("ckks", clients=[0, 1], keyholder="all", **{**LEGACY_OPTIONS, "coeff_mod_bit_sizes": [60, 40, 40, 60]})
    expected = CkksOptions(keyholder="all", **LEGACY_OPTIONS)
    assert isinstance(session.server, CkksServerSession) and session.options == expected
    assert all(client_of(session, p).options == expected for p in (0, 1))
    with pytest.raises(ValueError, match="key_bits"):
        make_sum("ckks", clients=[0, 1], key_bits=2048)
    with pytest.raises(TypeError):
        CkksServerSession(clients=[0, 1], options=object())


def test_a_context_altered_in_transit_stops_set_up() -> None:
    def alter(data: bytes, message: Message) -> bytes:
        env = message.envelope
        if env is not None and env.stage == Stage.CONTEXT and env.receiver != SERVER:
            payload = env.payload[:-50] + bytes([env.payload[-50] ^ 1]) + env.payload[-49:]
            return dataclasses.replace(env, payload=payload).to_bytes()
        return data

    session = make_sum("ckks", clients=[0, 1, 2], network=LocalNetwork(interceptor=alter))
    needs(session, FUZZ_SPEC)
    with pytest.raises(ProtocolError):
        session.setup()
    assert not session.ready


# --- key set-up: losses, strict parameters, sealed keys -----------------------------------------

@pytest.mark.parametrize("keyholder", ["agent", "all"])
def test_set_up_needs_every_client(keyholder: str) -> None:
    dropping = [True]

    def drop_first_confirm(data: bytes, message: Message) -> bytes | None:
        env = message.envelope
        if dropping[0] and env is not None and env.stage == Stage.CONFIRM:
            dropping[0] = False
            return None
        return data

    session = make_sum("ckks", clients=[0, 1, 2], keyholder=keyholder,
                       network=LocalNetwork(interceptor=drop_first_confirm))
    needs(session, FUZZ_SPEC)
    with pytest.raises(AbortedError, match="did not confirm"):
        session.setup()
    assert not session.ready
    # Nothing lost now: a fresh set-up (another run, maybe another agent) succeeds.
    session.setup()
    assert session.ready


def test_a_sealed_key_moved_to_another_client_fails_to_open() -> None:
    held: dict[int, bytes] = {}

    def swap(data: bytes, message: Message) -> bytes:
        env = message.envelope
        if env is None or env.stage != Stage.SEALED_KEY or env.sender != SERVER:
            return data
        held[env.receiver] = env.payload
        other = next(iter(p for p in held if p != env.receiver), None)
        return data if other is None else dataclasses.replace(env, payload=held[other]).to_bytes()

    session = make_sum("ckks", clients=[0, 1, 2], keyholder="all", network=LocalNetwork(interceptor=swap))
    needs(session, FUZZ_SPEC)
    with pytest.raises(AbortedError, match="did not confirm"):
        session.setup()


def test_set_up_parameters_are_parsed_strictly() -> None:
    params = LEGACY
    good = SetupParams(1, "agent", params).to_bytes()

    def parse(data: bytes, *, clients: tuple[int, ...] = (0, 1, 2), keyholder: str = "agent",
              options: CkksOptions | None = None) -> SetupParams[raw.CkksParameters]:
        options = options if options is not None else CkksOptions()
        return SetupParams.from_bytes(data, clients=clients, keyholder=keyholder, parse=options.parse_parameters,
                                      accept=options.accept)

    assert parse(good) == SetupParams(1, "agent", params)
    assert parse(good, options=CkksOptions(**LEGACY_OPTIONS)) == SetupParams(1, "agent", params)
    with pytest.raises(WireError):
        parse(good + b"\x00")
    with pytest.raises(WireError):
        parse(good[:-1])
    with pytest.raises(WireError):
        parse(good, clients=(0, 2))  # the named agent is not a client
    with pytest.raises(WireError):
        parse(good[:4] + b"\x07" + good[5:])  # unknown key-holder mode
    with pytest.raises(WireError):  # parameters below 128-bit security never parse
        parse(SetupParams(1, "agent", params).to_bytes().replace(bytes([4, 60, 40, 40, 60]), bytes([4, 60, 60, 60, 60])))
    with pytest.raises(PolicyError):
        parse(good, keyholder="all")
    with pytest.raises(ForeignKeyError):  # a client with fixed parameters takes keys for those only
        parse(good, options=CkksOptions(poly_modulus_degree=8192, coeff_mod_bit_sizes=(60, 40, 40, 60), scale_bits=30))
    # A client refuses a set-up for another mode through its session too.
    client = CkksClientSession(0, clients=[0, 1, 2], options=CkksOptions(keyholder="all"))
    request = SumRequest(kind="setup", statistic="setup", round=-1, spec=None, reveal=Reveal(),
                         participants=(0, 1, 2), params=good)
    with pytest.raises(PolicyError):
        client.join(run_id=bytes(16), request=request, values=None)


def test_a_sum_under_other_keys_or_parameters_or_before_set_up_is_refused() -> None:
    spec = VectorSpec(length=4, summands=2, **FLOAT)
    session = keyed(2, spec=spec)
    fingerprint, agent = server_of(session).fingerprint, agent_of(session)
    assert fingerprint is not None
    chosen = params_of(session, spec).to_bytes()
    base = SumRequest(kind="sum", statistic="sum", round=0, spec=spec, reveal=Reveal(), participants=(0, 1))
    digest = request_digest("ckks", base, (0, 1))
    client = client_of(session, 0)
    cases: list[tuple[type[ProtocolError], bytes]] = [
        (ForeignKeyError, SumParams(chosen, bytes(16), agent, digest).to_bytes()),
        (ForeignKeyError, SumParams(LEGACY.to_bytes(), fingerprint, agent, digest).to_bytes()),  # not what it derives
        (WireError, SumParams(b"\x00" * 7, fingerprint, agent, digest).to_bytes()),  # not parameters at all
        (StageError, SumParams(chosen, fingerprint, 1 - agent, digest).to_bytes()),
        (WireError, SumParams(chosen, fingerprint, agent, bytes(16)).to_bytes()),  # request altered in transit
        (WireError, SumParams(chosen, fingerprint, agent, request_digest("bfv", base, (0, 1))).to_bytes()),
        (WireError, SumParams(chosen, fingerprint, agent, digest).to_bytes() + b"\x00"),
    ]
    for error, params in cases:
        with pytest.raises(error):
            client.join(run_id=bytes(16), request=dataclasses.replace(base, params=params), values=None)
    good = dataclasses.replace(base, params=SumParams(chosen, fingerprint, agent, digest).to_bytes())
    assert isinstance(client.join(run_id=bytes(16), request=good, values=None), CkksClient)
    with pytest.raises(StageError):
        CkksClientSession(0, clients=[0, 1]).join(run_id=bytes(16), request=good, values=None)
    with pytest.raises(WireError):
        client.join(run_id=bytes(16), request=dataclasses.replace(good, kind="store"), values=None)


# --- client snapshots ---------------------------------------------------------------------------

@pytest.mark.parametrize("keyholder", ["agent", "all"])
def test_client_snapshots_round_trip_and_keep_working(keyholder: Any) -> None:
    n, d = 3, 7
    spec = VectorSpec(length=d, summands=n, **FLOAT)
    session = keyed(n, spec=spec, keyholder=keyholder)
    options = CkksOptions(keyholder=keyholder)
    fresh = CkksClientSession(0, clients=range(n), options=options)
    empty = fresh.to_bytes()
    for pid in range(n):
        snapshot = client_of(session, pid).to_bytes()
        restored = CkksClientSession(pid, clients=range(n), options=options)
        restored.load_bytes(snapshot)
        assert restored.to_bytes() == snapshot
        assert restored.keys is not None and restored.keys.agent == agent_of(session)
        holds = keyholder == "all" or pid == agent_of(session)
        assert (restored.keys.secret is not None) == holds
        # The restored session replaces the live one: the next sum runs on it.
        session.sessions[pid] = restored
        session.endpoints[pid].sessions[("ckks", "")] = restored
    values = inputs(n, d, seed=9)
    assert np.array_equal(session.sum(values, spec=spec).total, plain_total(values, spec))
    fresh.load_bytes(empty)
    assert fresh.keys is None and fresh.to_bytes() == empty


def test_client_snapshots_are_parsed_strictly() -> None:
    session = keyed(3)
    agent = agent_of(session)
    other = next(p for p in range(3) if p != agent)
    agent_snapshot = client_of(session, agent).to_bytes()
    other_snapshot = client_of(session, other).to_bytes()
    target = CkksClientSession(other, clients=range(3))
    target.load_bytes(other_snapshot)
    keys = client_of(session, other).keys
    assert keys is not None
    params = keys.parameters.to_bytes()
    agent_at = 1 + 4 + 4 + len(params)  # version, count, the parameters' blob, then the agent

    def snapshot(*, version: int = 2, count: int = 1, parameters: bytes = params, agent_id: int = agent,
                 flag: int = 0) -> bytes:
        return (Writer().u8(version).u32(count).blob(parameters).u32(agent_id).blob(keys.public.data).u8(flag)
                .finish())

    assert snapshot() == other_snapshot
    broken = {
        "truncated": other_snapshot[:-1],
        "extended": other_snapshot + b"\x00",
        "version": snapshot(version=1),
        "count": snapshot(count=2),
        "too many": snapshot(count=1000),
        "parameters": snapshot(parameters=params[:-1]),
        "secret flag": snapshot(flag=2),
        "unknown agent": other_snapshot[:agent_at] + (7).to_bytes(4, "big") + other_snapshot[agent_at + 4 :],
        "twice": Writer().u8(2).u32(2).raw(other_snapshot[5:] * 2).finish(),
        "empty": b"",
    }
    for name, data in broken.items():
        with pytest.raises(ProtocolError):
            target.load_bytes(data)
        assert target.to_bytes() == other_snapshot, name  # nothing changed on error
    # The agent's snapshot names this client's agent and carries its key: not this client's role.
    with pytest.raises(PolicyError):
        target.load_bytes(agent_snapshot)
    # A secret key that does not belong to the public context is refused.
    _, foreign_secret = raw.generate(keys.parameters)
    public = keys.public.data
    swapped = Writer().u8(2).u32(1).blob(params).u32(agent).blob(public).u8(1).blob(foreign_secret).finish()
    restored = CkksClientSession(agent, clients=range(3))
    with pytest.raises(ForeignKeyError):
        restored.load_bytes(swapped)
    assert restored.keys is None


# --- fuzzing: any byte mutation of any message -------------------------------------------------

def _mutate(data: bytes, kind: str, pos: int, xor: int) -> bytes:
    header = 34  # the envelope header; payload fields (lengths, counts, flags) start after it
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


def _mutating(target: int, kind: str, pos: int, xor: int) -> tuple[Interceptor, list[str]]:
    """Mutate the ``target``-th message to cross the network (modulo their number, counted by a dry run)."""
    seen: list[str] = []

    def intercept(data: bytes, message: Message) -> bytes:
        seen.append(message.label.stage)
        return _mutate(data, kind, pos, xor) if len(seen) - 1 == target else data
    return intercept, seen


def _only_protocol_errors(session: SecureSum, rejected: list[str]) -> None:
    for reason in rejected:
        name = reason.split(" refused: ", 1)[-1].split(":")[0]
        assert name in PROTOCOL_ERRORS, reason
    for endpoint in session.endpoints.values():
        assert all(e.split(":")[0] in PROTOCOL_ERRORS for e in endpoint.errors), endpoint.errors


def _check_results(session: SecureSum, values: dict[int, np.ndarray], spec: VectorSpec) -> None:
    """Whatever a party learned is the exact sum of the inputs it says it holds."""
    for party in session.parties().values():
        if party.result is not None:
            expected = plain_total({p: values[p] for p in party.contributors}, spec)
            assert np.array_equal(party.result, expected)


FUZZ_SPEC = VectorSpec(length=5, summands=3, **FLOAT)
FUZZ_VALUES = inputs(3, 5, seed=10)
_FUZZ_SESSIONS: dict[str, tuple[SecureSum, int]] = {}


def _fuzz_session(keyholder: str) -> tuple[SecureSum, int]:
    """One keyed harness per mode, reused (a failed sum leaves no state behind), and its message count."""
    if keyholder not in _FUZZ_SESSIONS:
        session = keyed(3, spec=FUZZ_SPEC, keyholder=keyholder)
        before = len(session.transcript)
        session.sum(FUZZ_VALUES, spec=FUZZ_SPEC)
        _FUZZ_SESSIONS[keyholder] = (session, len(session.transcript) - before)
    return _FUZZ_SESSIONS[keyholder]


SETUP_MESSAGES = {"agent": 3 + 1 + 2 + 2, "all": 3 + 2 + 1 + 2 + 1 + 1 + 2 + 2}
"""Messages of a 3-client set-up: open, (advertise,) context, relays, (channel keys, sealed keys,) confirms."""


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keyholder=st.sampled_from(["agent", "all"]), mutation=MUTATION)
def test_fuzzed_sum_messages_raise_protocol_errors_and_never_a_wrong_sum(
        keyholder: str, mutation: tuple[int, str, int, int]) -> None:
    session, count = _fuzz_session(keyholder)
    target, kind, pos, xor = mutation
    intercept, _ = _mutating(target % count, kind, pos, xor)
    session.network.interceptor = intercept
    try:
        out = session.sum(FUZZ_VALUES, spec=FUZZ_SPEC)
    except AbortedError:
        out = None
    finally:
        session.network.interceptor = None
    _check_results(session, FUZZ_VALUES, FUZZ_SPEC)
    if out is not None:
        _only_protocol_errors(session, list(out.rejected))
        assert np.array_equal(out.total, plain_total({p: FUZZ_VALUES[p] for p in out.contributors}, FUZZ_SPEC))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keyholder=st.sampled_from(["agent", "all"]), mutation=MUTATION)
def test_fuzzed_set_up_messages_raise_protocol_errors_and_never_a_wrong_sum(
        keyholder: str, mutation: tuple[int, str, int, int]) -> None:
    count = SETUP_MESSAGES[keyholder]
    target, kind, pos, xor = mutation
    intercept, _ = _mutating(target % count, kind, pos, xor)
    session = make_sum("ckks", clients=[0, 1, 2], keyholder=keyholder, network=LocalNetwork(interceptor=intercept))
    needs(session, FUZZ_SPEC)
    try:
        session.setup()
    except AbortedError:
        assert not session.ready
    else:
        assert session.ready
    for endpoint in session.endpoints.values():
        assert all(e.split(":")[0] in PROTOCOL_ERRORS for e in endpoint.errors), endpoint.errors
    if not session.ready:
        return
    # A set-up that survived the mutation gives exact sums (or refuses to give one).
    try:
        out = session.sum(FUZZ_VALUES, spec=FUZZ_SPEC)
    except AbortedError:
        out = None
    _check_results(session, FUZZ_VALUES, FUZZ_SPEC)
    if out is not None:
        assert np.array_equal(out.total, plain_total({p: FUZZ_VALUES[p] for p in out.contributors}, FUZZ_SPEC))


def test_every_set_up_message_is_counted_by_the_fuzzer() -> None:
    """The set-up fuzzer's message counts are the real ones (so every message can be mutated)."""
    for keyholder, expected in SETUP_MESSAGES.items():
        session = keyed(3, spec=FUZZ_SPEC, keyholder=keyholder)
        assert len(session.transcript) == expected


def test_replayed_set_up_and_sum_messages_are_refused() -> None:
    """A party that already took a stage's message refuses it again (and stays consistent)."""
    session = keyed(2, spec=VectorSpec(length=4, summands=2, **FLOAT))
    agent = agent_of(session)
    captured: list[Envelope] = []

    def keep(data: bytes, message: Message) -> bytes:
        if message.envelope is not None:
            captured.append(message.envelope)
        return data

    session.network.interceptor = keep
    values = inputs(2, 4, seed=13)
    spec = VectorSpec(length=4, summands=2, **FLOAT)
    session.sum(values, spec=spec)
    (aggregate,) = [e for e in captured if e.stage == Stage.AGGREGATE]
    party = session.parties()[agent]
    result = party.result
    with pytest.raises(StageError):
        party.receive(aggregate)
    assert party.result is result


# --- parameters derived from the spec, error bounds, targets -----------------------------------

def test_security_table_is_the_standards_and_seals() -> None:
    """HomomorphicEncryption.org's 128-bit table, as SEAL enforces it."""
    sealapi = pytest.importorskip("tenseal.sealapi")
    assert seal.MAX_COEFF_BITS_128 == {
        n: sealapi.CoeffModulus.MaxBitCount(n, sealapi.SEC_LEVEL_TYPE.TC128) for n in seal.MAX_COEFF_BITS_128}
    assert seal.MAX_COEFF_BITS_128[4096] == 109 and seal.MAX_COEFF_BITS_128[8192] == 218


CASES = [(100, 2**16, False), (100, 2**16, True), (100, 2**26, False), (10, 1, False), (1000, 2**26, True),
         (3, 2**33, False)]


@pytest.mark.parametrize(("summands", "entry_max", "symmetric"), CASES)
def test_derived_parameters_are_the_smallest_that_carry_the_sum(summands: int, entry_max: int,
                                                                 symmetric: bool) -> None:
    params = raw.derive(summands=summands, entry_max=entry_max, symmetric=symmetric)
    raw.check_capacity(params, summands, entry_max, symmetric=symmetric)
    n = params.poly_modulus_degree
    assert sum(params.coeff_mod_bit_sizes) <= seal.MAX_COEFF_BITS_128[n]
    # No smaller ring keeps 128-bit security and the bound...
    if n > min(seal.RINGS):
        with pytest.raises(CapacityError):
            raw.derive(summands=summands, entry_max=entry_max, symmetric=symmetric, ring=n // 2)
    # ...and in this ring no smaller data modulus does, at any scale.
    data, special = params.data_bits, params.special_bits
    if data > seal.MIN_PRIME_BITS:
        for scale in range(1, min(data - 2, 61)):
            smaller = raw.CkksParameters(n, (*seal.split_bits(data - 1), special), scale)
            with pytest.raises(CapacityError):
                raw.check_capacity(smaller, summands, entry_max, symmetric=symmetric)


def test_what_no_parameters_carry_is_refused_clearly() -> None:
    with pytest.raises(CapacityError, match="128-bit security"):
        raw.derive(summands=100, entry_max=2**41, symmetric=False)
    spec = VectorSpec(length=3, summands=100, kind="int", bound=2**41)
    with pytest.raises(CapacityError, match="cannot sum 100 entries"):
        make_sum("ckks", clients=list(range(100))).sum({0: np.zeros(3)}, spec=spec)
    with pytest.raises(CapacityError):  # a fixed parameter set refuses what it cannot carry
        CkksOptions(**LEGACY_OPTIONS).parameters_for(VectorSpec(length=1, summands=10**4, kind="int", bound=2**30))


def test_targets_integer_counts_through_ckks_exact_in_at_most_25_bytes_per_value() -> None:
    """Counts up to 2**16 from 100 clients: exact, <= 25 bytes per value on the wire (from 81)."""
    n, d = 100, 8192
    spec = VectorSpec(length=d, summands=n, kind="int", bound=2**16)
    rng = np.random.default_rng(21)
    values = {i: rng.integers(0, 2**16 + 1, d) for i in range(n)}
    values[0][:] = 2**16  # the largest sum occurs
    session = make_sum("ckks", clients=list(range(n)))
    out = session.sum(values, spec=spec)
    assert np.array_equal(out.total, np.sum(list(values.values()), axis=0).astype(float))
    agent = agent_of(session)
    per_value = {e.sender: e.bytes / d for e in session.transcript.select(run_id=out.run_id) if e.stage == "upload"}
    public_key = [b for pid, b in per_value.items() if pid != agent]
    assert max(public_key) <= 25 and per_value[agent] <= 0.55 * max(public_key)
    print(f"\ncounts 2**16 x 100 clients: {params_of(session, spec)}; {np.median(public_key):.2f} B/value "
          f"(public key), {per_value[agent]:.2f} B/value (seeded, the agent)")


@pytest.mark.parametrize("keyholder", ["agent", "all"])
def test_targets_model_updates_at_the_runtimes_precision_in_at_most_40_bytes_per_value(keyholder: str) -> None:
    """Updates clipped to 1.0 at 2**-24 resolution (the runtime's defaults), 100 summands."""
    d = 2 * 4096
    spec = VectorSpec(length=d, summands=100, kind="float", signed=True, bound=1.0, frac_bits=24)
    values = inputs(3, d, seed=22)
    session = make_sum("ckks", clients=[0, 1, 2], keyholder=keyholder)
    out = session.sum(values, spec=spec, reveal=Reveal(server=True, clients=False))
    assert np.array_equal(out.total, plain_total(values, spec))
    assert server_of(session).error_bound(spec, 100) * spec.scale <= raw.ROUNDING_MARGIN
    uploads = [e.bytes / d for e in session.transcript.select(run_id=out.run_id) if e.stage == "upload"]
    assert max(uploads) <= 40
    print(f"\nupdates 2**-24, 100 summands, {keyholder}: {params_of(session, spec)}; "
          f"{[round(b, 2) for b in uploads]} B/value")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(summands=st.integers(1, 300), entry_bits=st.integers(0, 28), symmetric=st.booleans(), data=st.data())
def test_measured_errors_never_exceed_the_computed_bound(summands: int, entry_bits: int, symmetric: bool,
                                                         data: st.DataObject) -> None:
    """The bound holds for sums of ``summands`` fresh encryptions under the parameters derived
    for them, with entries anywhere in [0, entry_max] (the extremes included)."""
    entry_max = 2**entry_bits
    try:
        params = raw.derive(summands=summands, entry_max=entry_max, symmetric=symmetric)
    except CapacityError:
        assert summands * entry_max > 2**34  # refused only near the double-precision limit
        return
    public_bytes, secret_bytes = raw.generate(params)
    public = raw.PublicContext(public_bytes, params)
    secret = raw.SecretContext(secret_bytes, public)
    contributors = data.draw(st.integers(1, min(summands, 12)), label="contributors")
    length = params.poly_modulus_degree
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32), label="seed"))
    total = np.zeros(length)
    accumulator = None
    for i in range(contributors):
        vector = rng.integers(0, entry_max + 1, length).astype(np.float64)
        vector[: 2 * (i + 1)] = entry_max if i % 2 == 0 else 0.0
        total += vector
        streams = secret.encrypt(vector) if symmetric else public.encrypt(vector)
        loaded = [public.load(s, length, seeded=symmetric) for s in streams]
        if accumulator is None:
            accumulator = loaded
        else:
            public.add_into(accumulator, loaded)
    assert accumulator is not None
    decrypted = secret.decrypt([public.dump(v) for v in accumulator], [length])
    error = float(np.max(np.abs(decrypted - total)))
    bound = params.error_bound(contributors, float(contributors * entry_max), symmetric=symmetric)
    assert error <= bound <= raw.ROUNDING_MARGIN
    assert np.array_equal(np.rint(decrypted), total)  # so integer statistics round exactly


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 6), kind=st.sampled_from(["int", "float"]), signed=st.booleans(),
       bound=st.integers(1, 2**12), frac_bits=st.integers(0, 26), keyholder=st.sampled_from(["agent", "all"]),
       seed=st.integers(0, 2**32))
def test_sums_through_the_protocol_are_exact_and_within_the_stated_bound(
        n: int, kind: str, signed: bool, bound: int, frac_bits: int, keyholder: str, seed: int) -> None:
    spec = VectorSpec(length=37, summands=n, kind=kind, signed=signed, bound=float(bound),  # type: ignore[arg-type]
                      frac_bits=frac_bits)
    rng = np.random.default_rng(seed)
    low = -bound if signed else 0
    values = {i: (rng.integers(low, bound + 1, 37) if kind == "int" else rng.uniform(low, bound, 37))
              for i in range(n)}
    values[0][0] = bound
    session = make_sum("ckks", clients=list(range(n)), keyholder=keyholder)
    try:
        out = session.sum(values, spec=spec)
    except CapacityError:
        return  # refused up front, never rounded wrongly
    assert np.array_equal(out.total, plain_total(values, spec))
    errors = decryption_errors(session)
    assert errors and max(errors) <= server_of(session).error_bound(spec, n) * spec.scale <= raw.ROUNDING_MARGIN


def test_each_parameter_set_gets_its_own_key_set_lazily_and_snapshots_keep_them_all() -> None:
    counts = VectorSpec(length=10, summands=3, kind="int", bound=10)
    updates = VectorSpec(length=10, summands=3, **FLOAT, frac_bits=24)
    assert CkksOptions().parameters_for(counts) != CkksOptions().parameters_for(updates)
    session = make_sum("ckks", clients=[0, 1, 2])
    rng = np.random.default_rng(23)
    ints = {i: rng.integers(0, 11, 10) for i in range(3)}
    floats = inputs(3, 10, seed=23)
    assert np.array_equal(session.sum(ints, spec=counts).total, plain_total(ints, counts))
    assert np.array_equal(session.sum(floats, spec=updates).total, plain_total(floats, updates))
    assert np.array_equal(session.sum(ints, spec=counts).total, plain_total(ints, counts))
    contexts = [e for e in session.transcript if e.stage == "context" and e.receiver == SERVER]
    assert len(contexts) == 2 and len(server_of(session).keysets) == 2  # the third sum set nothing up
    assert set(server_of(session).keysets) == {params_of(session, counts), params_of(session, updates)}
    for pid in range(3):
        snapshot = client_of(session, pid).to_bytes()
        restored = CkksClientSession(pid, clients=range(3))
        restored.load_bytes(snapshot)
        assert restored.to_bytes() == snapshot and set(restored.keysets) == set(server_of(session).keysets)
        session.sessions[pid] = restored
        session.endpoints[pid].sessions[("ckks", "")] = restored
    assert np.array_equal(session.sum(floats, spec=updates).total, plain_total(floats, updates))


def test_the_open_carries_the_chosen_parameters() -> None:
    spec = VectorSpec(length=6, summands=4, kind="int", bound=2**16)
    opened: list[bytes] = []

    def record(data: bytes, message: Message) -> bytes:
        env = message.envelope
        if env is not None and env.stage == OPEN and message.label.statistic == "counts":
            opened.append(env.payload)
        return data

    session = make_sum("ckks", clients=[0, 1, 2, 3], network=LocalNetwork(interceptor=record))
    values = {i: np.full(6, 2**16) for i in range(4)}
    out = session.sum(values, spec=spec, statistic="counts")
    assert np.array_equal(out.total, np.full(6, 4 * 2**16))
    assert opened
    for payload in opened:
        request = SumRequest.from_bytes(payload, clients=(0, 1, 2, 3))
        run = SumParams.from_bytes(request.params)
        assert raw.CkksParameters.from_bytes(run.parameters) == params_of(session, spec)
    assert server_of(session).public_parameters(spec) == {
        "poly_modulus_degree": params_of(session, spec).poly_modulus_degree,
        "coeff_mod_bit_sizes": list(params_of(session, spec).coeff_mod_bit_sizes),
        "scale_bits": params_of(session, spec).scale_bits, "ciphertexts": 1, "verified": False}


@pytest.mark.parametrize("symmetric", [True, False])
def test_each_sender_uploads_the_form_its_key_allows_and_nothing_else(symmetric: bool) -> None:
    """Key holders send seeded (secret-key) ciphertexts, the others full ones; the server takes
    exactly that form from each (with ``symmetric=False`` every upload is a full one)."""
    n, d = 4, 9
    spec = VectorSpec(length=d, summands=n, **FLOAT)
    session = keyed(n, spec=spec, symmetric=symmetric)
    agent = agent_of(session)
    keys = client_of(session, agent).keys
    assert keys is not None and keys.secret is not None
    values = inputs(n, d, seed=24)
    out = session.sum(values, spec=spec)
    sizes = {e.sender: e.bytes for e in session.transcript.select(run_id=out.run_id) if e.stage == "upload"}
    other = next(p for p in range(n) if p != agent)
    assert (sizes[agent] < 0.6 * sizes[other]) == symmetric
    encoded = np.zeros(d)
    seeded = _write_ciphertexts(Writer(), keys.public, keys.secret.encrypt(encoded))
    full = _write_ciphertexts(Writer(), keys.public, keys.public.encrypt(encoded))
    swaps = [(other, seeded)] + ([(agent, full)] if symmetric else [])
    for victim, payload in swaps:
        session.network.interceptor = rewrite(victim, Stage.UPLOAD, lambda _, p=payload: p)
        out = session.sum(values, spec=spec)
        assert len(out.rejected) == 1 and out.rejected[0].startswith("WireError"), out.rejected
        assert out.contributors == tuple(p for p in range(n) if p != victim)
        assert np.array_equal(out.total, plain_total({p: values[p] for p in out.contributors}, spec))
    session.network.interceptor = None


def test_set_up_follows_the_sum_checked_last() -> None:
    """Checking several specs ahead (capacity checks) never makes the next sum's set-up pick another."""
    first = VectorSpec(length=3, summands=3, kind="int", bound=5)
    second = VectorSpec(length=3, summands=3, **FLOAT, frac_bits=24)
    session = make_sum("ckks", clients=[0, 1, 2])
    server = server_of(session)
    server.check(spec=second, reveal=Reveal())
    server.check(spec=first, reveal=Reveal())
    assert not server.ready
    values = {i: np.full(3, i) for i in range(3)}
    assert np.array_equal(session.sum(values, spec=first).total, np.full(3, 3.0))
    assert set(server.keysets) == {params_of(session, first)} and server.ready
    floats = inputs(3, 3, seed=25)
    assert np.array_equal(session.sum(floats, spec=second).total, plain_total(floats, second))
    assert set(server.keysets) == {params_of(session, first), params_of(session, second)}
    assert make_sum("ckks", clients=[0, 1]).server.setup(run_id=bytes(16)) is None  # nothing checked: nothing to set up
