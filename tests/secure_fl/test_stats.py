"""Global statistics between parties: declarations, the coordinator's requests over the network,
the participants' checks (refusals), clipping counted inside the sum, update sums, audit records."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from protocols import SERVER, AbortedError, Reveal, VectorSpec, Visibility, decode_sum, encode
from protocols.encoding import check_encoded
from protocols.wire import Envelope
from secure_fl.algorithms import LocalTraining, RunInfo, ServerRound
from secure_fl.stats import (
    MODEL_UPDATE,
    TOTAL_SAMPLES,
    Learned,
    Release,
    StatisticDeclaration,
    UpdateSettings,
)
from secure_fl.stats.tally import digits_for, read_tally, tally

from .helpers import StatsNet, make_plan

HISTOGRAM = StatisticDeclaration(name="label_histogram", length=4, bound=1000, kind="int",
                                 learners=frozenset({"server", "clients"}), per_round=False)


LOSS_SUM = StatisticDeclaration(name="loss_sum", length=2, bound=50.0, kind="float", frac_bits=16)


@pytest.fixture(scope="module")
def paillier_net() -> StatsNet:
    return StatsNet(make_plan(6, "paillier"), [TOTAL_SAMPLES, LOSS_SUM])


# --- declarations -----------------------------------------------------------------------------

def test_declaration_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="snake_case"):
        StatisticDeclaration(name="Total Samples", length=1, bound=1)
    with pytest.raises(ValueError, match="total: length"):
        StatisticDeclaration(name="total", length=0, bound=1)
    with pytest.raises(ValueError, match="total: bound"):
        StatisticDeclaration(name="total", length=1, bound=float("inf"))
    with pytest.raises(ValueError, match="learners"):
        StatisticDeclaration(name="total", length=1, bound=1, learners=frozenset({"auditor"}))
    with pytest.raises(ValueError, match="learners"):
        StatisticDeclaration(name="total", length=1, bound=1, learners=frozenset())
    with pytest.raises(ValueError, match="clip must be true or false"):
        StatisticDeclaration(name="total", length=1, bound=1, clip=1)  # type: ignore[arg-type]


def test_declaration_maps_to_spec_and_reveal() -> None:
    d = StatisticDeclaration(name="mean_loss", length=3, bound=10.0, kind="float", signed=True,
                             learners=frozenset({"clients"}), frac_bits=20)
    spec = d.spec(5)
    assert (spec.length, spec.bound, spec.summands, spec.kind, spec.signed, spec.frac_bits) == \
        (3, 10.0, 5, "float", True, 20)
    assert d.reveal == Reveal(server=False, clients=True)
    assert TOTAL_SAMPLES.reveal == Reveal(server=True, clients=True)
    assert d.as_dict()["learners"] == ["clients"] and "clip" not in d.as_dict()
    assert dataclasses.replace(d, clip=True).as_dict()["clip"] is True


# --- requests over the network ------------------------------------------------------------------

def test_plain_request_sums_and_records_bytes_from_the_transcript() -> None:
    net = StatsNet(make_plan(4), [HISTOGRAM])
    inputs = {0: [1, 2, 3, 4], 2: [10, 0, 0, 1], 3: [0, 0, 5, 0]}
    release = net.request(HISTOGRAM, inputs, round=3)
    assert release.value is not None
    np.testing.assert_array_equal(release.value, [11, 2, 8, 5])
    assert net.coordinator.records[-1] is release
    assert release.name == "label_histogram" and release.round == 3 and release.protocol == "plain"
    assert release.contributors == (0, 2, 3) and release.dropouts == () and release.clipped == 0
    assert "server" in release.learned_by and "client-2" in release.learned_by and "client-1" not in release.learned_by
    entries = net.transcript.select(statistic="label_histogram", round=3)
    assert entries and release.bytes == sum(e.bytes for e in entries)
    assert net.coordinator.bytes_by_statistic(3) == {"label_histogram": release.bytes}
    assert net.coordinator.declarations["label_histogram"] is HISTOGRAM
    # the contributors learned the sum from messages addressed to them; client 1 was not asked
    for c in (0, 2, 3):
        (learned,) = net.learned[c]
        np.testing.assert_array_equal(learned.value, [11, 2, 8, 5])
        assert learned.contributors == (0, 2, 3) and learned.round == 3
    assert net.learned[1] == [] and not [e for e in entries if 1 in (e.sender, e.receiver)]
    # every run starts with the server's public ``open`` to each member of the cohort
    opens = [e for e in entries if e.stage == "open"]
    assert sorted(e.receiver for e in opens) == [0, 2, 3]
    assert all(e.sender == SERVER and e.visibility is Visibility.PUBLIC for e in opens)


def test_learners_decide_who_receives_the_sum() -> None:
    server_only = StatisticDeclaration(name="server_only", length=1, bound=5)
    net = StatsNet(make_plan(3), [server_only])
    release = net.request(server_only, {0: [1], 1: [2]})
    assert release.learned_by == ("server",) and release.scalar() == 3
    to_clients = [e for e in net.transcript.select(statistic="server_only") if e.receiver != SERVER]
    assert to_clients and all(e.stage == "open" and e.visibility is Visibility.PUBLIC for e in to_clients)
    assert all(not learned for learned in net.learned.values())


def test_clients_only_statistic_gives_the_server_no_value() -> None:
    private = StatisticDeclaration(name="private_sum", length=2, bound=9, learners=frozenset({"clients"}))
    net = StatsNet(make_plan(3, "paillier", options={"paillier": {"keyholder": "all"}}), [private])
    release = net.request(private, {0: [1, 2], 1: [3, 4], 2: [0, 9]})
    assert release.value is None and release.learned_by == ("client-0", "client-1", "client-2")
    with pytest.raises(ValueError, match="not learned by the server"):
        release.scalar()
    for c in range(3):
        np.testing.assert_array_equal(net.learned[c][-1].value, [4, 15])
    # masking unmasks every sum at the server: it cannot serve a statistic only clients may learn
    with pytest.raises(ValueError):
        StatsNet(make_plan(3, "masking"), [private]).request(private, {0: [1, 2], 1: [3, 4]})


def test_out_of_bound_inputs_are_refused_or_clipped_and_counted() -> None:
    small = StatisticDeclaration(name="small", length=2, bound=3)
    clipping = StatisticDeclaration(name="small_clipped", length=2, bound=3, clip=True)
    net = StatsNet(make_plan(3), [small, clipping])
    refused = net.request(small, {0: [1, 9], 1: [2, 1], 2: [0, 1]})
    assert refused.contributors == (1, 2) and refused.dropouts == (0,)
    (reason,) = refused.refusals
    assert "client 0 refused" in reason and "BoundError" in reason and "outside" in reason
    np.testing.assert_array_equal(refused.value, [2, 2])
    total = net.request(clipping, {0: [1, 9], 1: [4, 1]})
    np.testing.assert_array_equal(total.value, [4, 4])
    assert total.clipped == 2 and total.contributors == (0, 1)
    assert net.participants[0].clipped == 1 and net.participants[1].clipped == 1  # each client's own count
    with pytest.raises(AbortedError, match="no client uploaded"):  # every client refused
        net.request(small, {0: [4, 0]})


def test_conflicting_redeclaration_and_bad_requests_are_refused() -> None:
    net = StatsNet(make_plan(2), [TOTAL_SAMPLES, HISTOGRAM])
    stats = net.coordinator
    stats.declare(HISTOGRAM)
    stats.declare(HISTOGRAM)  # the same declaration again is fine
    with pytest.raises(ValueError, match="already declared differently"):
        stats.declare(StatisticDeclaration(name="label_histogram", length=5, bound=1000))
    with pytest.raises(ValueError, match="at least one client"):
        net.request(TOTAL_SAMPLES, {})
    with pytest.raises(ValueError, match="model updates only"):
        make_plan(2, overrides={"total_samples": "clear"})
    with pytest.raises(ValueError, match="model updates only"):
        make_plan(2, "clear")
    with pytest.raises(ValueError, match="not in this run"):
        net.request(TOTAL_SAMPLES, {7: [1]})
    with pytest.raises(ValueError, match="unknown protocol"):
        make_plan(2, "rot13")
    # a server that asks through another protocol than the plan's gets no input: these clients keep no
    # session of it, so nobody answers
    with pytest.raises(AbortedError):
        net.request(TOTAL_SAMPLES, {0: [1], 1: [2]}, protocol="clear")


def test_paillier_keys_are_set_up_once_per_run(paillier_net: StatsNet) -> None:
    first = paillier_net.request(TOTAL_SAMPLES, {0: [120], 1: [80], 5: [7]}, round=0)
    second = paillier_net.request(TOTAL_SAMPLES, {2: [3], 3: [4]}, round=1)
    assert first.scalar() == 207.0 and second.scalar() == 7.0
    transcript = paillier_net.transcript
    setups = {e.round for e in transcript if e.statistic == "setup"}
    assert setups == {0}
    # key set-up is messages between the parties: the key holder's key reaches the others sealed
    assert {e.sender for e in transcript if e.statistic == "setup"} - {SERVER}
    stats = paillier_net.coordinator
    assert stats.session("paillier") is stats.session("paillier")
    agent = stats.session("paillier").agent  # picked with secrets: its upload is the decrypted aggregate
    uploads = [e for e in transcript.select(statistic="total_samples", round=1)
               if e.receiver == SERVER and e.sender in (2, 3) and e.sender != agent and e.stage != "refuse"
               and e.dimension > 0]
    assert uploads and all(e.visibility is Visibility.CIPHERTEXT for e in uploads)
    assert not [e for e in transcript if e.receiver == SERVER and e.visibility is Visibility.CLEAR]


def test_paillier_float_statistic_within_the_encoding_tolerance(paillier_net: StatsNet) -> None:
    values = {0: [0.123456, 3.5], 4: [2.25, 0.000123]}
    release = paillier_net.request(LOSS_SUM, values, round=2)
    assert release.value is not None and release.protocol == "paillier"
    np.testing.assert_allclose(release.value, np.sum(list(values.values()), axis=0), atol=2 * 2.0**-17)


def test_overrides_route_one_statistic_elsewhere() -> None:
    plan = make_plan(3, "paillier", overrides={"total_samples": "plain"})
    other = StatisticDeclaration(name="other", length=1, bound=1)
    assert plan.protocol_for(TOTAL_SAMPLES) == "plain" and plan.protocol_for(other) == "paillier"
    net = StatsNet(plan, [TOTAL_SAMPLES])
    assert net.request(TOTAL_SAMPLES, {0: [5], 1: [6]}).protocol == "plain"
    assert "setup" not in net.coordinator.bytes_by_statistic()  # no Paillier session was ever needed


# --- what a participant refuses -------------------------------------------------------------------

DECLARED = StatisticDeclaration(name="declared", length=3, bound=100, learners=frozenset({"server", "clients"}))
INPUTS = {0: [1, 2, 3], 1: [4, 5, 6], 2: [7, 8, 9]}


def _refused_by_1_and_2(release, reason: str) -> None:  # type: ignore[no-untyped-def]
    """Client 0 contributed; 1 and 2 refused with ``reason`` and are listed as dropouts."""
    assert release.contributors == (0,) and release.dropouts == (1, 2)
    np.testing.assert_array_equal(release.value, INPUTS[0])
    assert len(release.refusals) == 2
    for client, text in zip((1, 2), release.refusals):
        assert f"client {client} refused" in text and "PolicyError" in text and reason in text, text


def test_participant_refuses_a_statistic_it_did_not_declare() -> None:
    net = StatsNet(make_plan(3), [DECLARED], client_declarations={1: [], 2: [TOTAL_SAMPLES]})
    release = net.request(DECLARED, INPUTS)
    _refused_by_1_and_2(release, "contributes to no statistic 'declared'")
    (run_id,) = {e.run_id for e in net.transcript.select(statistic="declared")}
    refusals = [e for e in net.transcript.select(run_id=run_id) if e.stage == "refuse"]
    assert sorted(e.sender for e in refusals) == [1, 2] and all(e.receiver == SERVER for e in refusals)
    assert release.bytes == sum(e.bytes for e in net.transcript.select(run_id=run_id))


def test_a_refusal_is_labelled_with_the_runs_round_and_statistic() -> None:
    net = StatsNet(make_plan(3), [DECLARED], client_declarations={1: []})
    net.request(DECLARED, INPUTS, round=5)
    refusals = [e for e in net.transcript if e.stage == "refuse"]
    assert refusals and all((e.round, e.statistic) == (5, "declared") for e in refusals)


def test_participant_refuses_another_protocol_than_the_plans() -> None:
    run_plan = make_plan(3, overrides={"declared": "masking"})
    net = StatsNet(run_plan, [DECLARED], client_plans={0: make_plan(3)})
    release = net.request(DECLARED, INPUTS, protocol="plain")  # the server deviates from the plan
    _refused_by_1_and_2(release, "goes through 'masking' in this run, not 'plain'")


def test_participant_refuses_another_encoding_than_the_declarations() -> None:
    wider = dataclasses.replace(DECLARED, bound=1000)
    net = StatsNet(make_plan(3), [DECLARED], client_declarations={1: [wider], 2: [wider]})
    _refused_by_1_and_2(net.request(DECLARED, INPUTS), "is not the declared one")
    floats = dataclasses.replace(DECLARED, kind="float")
    net = StatsNet(make_plan(3), [DECLARED], client_declarations={1: [floats], 2: [floats]})
    _refused_by_1_and_2(net.request(DECLARED, INPUTS), "is not the declared one")


def test_participant_refuses_to_reveal_to_others_than_the_declared_learners() -> None:
    server_only = dataclasses.replace(DECLARED, learners=frozenset({"server"}))
    net = StatsNet(make_plan(3), [DECLARED], client_declarations={1: [server_only], 2: [server_only]})
    _refused_by_1_and_2(net.request(DECLARED, INPUTS), "the request reveals it to others")
    clients_only = dataclasses.replace(DECLARED, learners=frozenset({"clients"}))
    net = StatsNet(make_plan(3), [DECLARED], client_declarations={1: [clients_only], 2: [clients_only]})
    _refused_by_1_and_2(net.request(DECLARED, INPUTS), "the request reveals it to others")


def test_participant_refuses_a_once_per_run_statistic_in_another_round() -> None:
    once = dataclasses.replace(DECLARED, per_round=False)
    net = StatsNet(make_plan(3), [once])
    first = net.request(once, {1: INPUTS[1], 2: INPUTS[2]}, round=0)
    assert first.contributors == (1, 2)
    assert net.participants[1].once == {"declared": 0}
    # asked again for the same round (a resumed run's set-up): answered from the release, no messages
    before = len(net.transcript)
    assert net.request(once, {1: INPUTS[1], 2: INPUTS[2]}, round=0) is first
    assert len(net.transcript) == before
    # asked again in another round: the clients that contributed refuse
    release = net.request(once, INPUTS, round=1)
    _refused_by_1_and_2(release, "released once per run; it was released at round 0")


def test_participant_refuses_an_out_of_bound_value_without_clip() -> None:
    net = StatsNet(make_plan(3), [DECLARED])
    release = net.request(DECLARED, {0: INPUTS[0], 1: [4, 101, 6], 2: [-1, 0, 0]})
    assert release.contributors == (0,) and release.dropouts == (1, 2)
    assert "client 1 refused: BoundError" in release.refusals[0] and "entry 1 = " in release.refusals[0]
    assert "101" in release.refusals[0] and "outside [0.0, 100.0]" in release.refusals[0]
    assert "client 2 refused: BoundError" in release.refusals[1] and "entry 0 = " in release.refusals[1]
    assert all("does not allow clipping" in r for r in release.refusals)
    assert net.participants[1].clipped == 0


def test_participant_refuses_a_malformed_vector() -> None:
    net = StatsNet(make_plan(3), [DECLARED])
    release = net.request(DECLARED, {0: INPUTS[0], 1: [1, 2], 2: [1, np.nan, 2]})
    assert release.contributors == (0,) and release.dropouts == (1, 2)
    assert "2 entries, declared 3" in release.refusals[0] and "NaN" in release.refusals[1]


# --- clipping, counted inside the sum -----------------------------------------------------------------

CLIPPED_INT = StatisticDeclaration(name="clipped_counts", length=4, bound=10, clip=True,
                                   learners=frozenset({"server", "clients"}))
CLIPPED_FLOAT = StatisticDeclaration(name="clipped_signed", length=3, bound=0.5, kind="float", signed=True,
                                     clip=True, frac_bits=12)


@pytest.mark.parametrize("protocol", ["plain", "paillier", "masking"])
def test_release_counts_what_the_contributors_clipped(protocol: str) -> None:
    net = StatsNet(make_plan(3, protocol), [CLIPPED_INT, CLIPPED_FLOAT])
    ints = {0: [12, 3, -1, 4], 1: [1, 11, 20, 0], 2: [0, 0, 0, 0]}
    release = net.request(CLIPPED_INT, ints)
    assert release.protocol == protocol and release.contributors == (0, 1, 2)
    np.testing.assert_array_equal(release.value, [11, 13, 10, 4])
    assert release.clipped == 4
    assert [net.participants[c].clipped for c in range(3)] == [2, 2, 0]
    for c in range(3):  # the clients learn the total count too, never each other's
        assert net.learned[c][-1].clipped == 4
    floats = {0: [0.75, -0.25, 0.0], 1: [-2.0, 0.5, 0.125], 2: [0.25, 0.25, -0.5]}
    release = net.request(CLIPPED_FLOAT, floats, round=1)
    np.testing.assert_allclose(release.value, [0.25, 0.5, -0.375], atol=3 * 2.0**-13)
    assert release.clipped == 2
    # the count travels inside the sum: the wire carries the statistic's entries plus the count's digits
    digits = digits_for(CLIPPED_INT.spec(3), CLIPPED_INT.length)
    uploads = [e for e in net.transcript.select(statistic="clipped_counts") if e.sender != SERVER and e.dimension]
    assert uploads and {e.dimension for e in uploads} == {CLIPPED_INT.length + digits}
    if protocol != "plain":
        assert not [e for e in uploads if e.visibility is Visibility.CLEAR]


def test_clip_count_is_none_for_a_noised_statistic() -> None:
    from secure_fl.stats import StatisticPrivacy, StatisticsPrivacy

    privacy = StatisticsPrivacy({"clipped_counts": StatisticPrivacy(epsilon=2.0, secure_mode=False)}, rounds=1)
    noised = dataclasses.replace(CLIPPED_INT, record_sensitivity=1)
    net = StatsNet(make_plan(3, privacy=privacy), [noised])
    release = net.request(noised, {0: [12, 3, 0, 4], 1: [1, 1, 1, 0], 2: [0, 0, 0, 0]})
    assert release.clipped is None and release.epsilon is not None and release.noise is not None
    assert net.participants[0].clipped >= 1  # the client still knows what it clipped


@st.composite
def tallied_sums(draw: st.DrawFn) -> tuple[VectorSpec, list[np.ndarray], list[int]]:
    kind = draw(st.sampled_from(["int", "float"]))
    signed = draw(st.booleans())
    frac_bits = draw(st.integers(0, 20)) if kind == "float" else 16
    scale = 1 if kind == "int" else 1 << frac_bits
    magnitude = draw(st.integers(1, 5000))
    length = draw(st.integers(1, 40))
    clients = draw(st.integers(1, 8))
    spec = VectorSpec(length=length, bound=magnitude / scale, summands=clients, kind=kind, signed=signed,
                      frac_bits=frac_bits)  # a bound on the encoding's grid
    low = -magnitude if signed else 0
    vectors = [np.asarray(draw(st.lists(st.integers(low, magnitude), min_size=length, max_size=length)),
                          dtype=np.float64) / scale for _ in range(clients)]
    counts = draw(st.lists(st.integers(0, length), min_size=clients, max_size=clients))
    return spec, vectors, counts


@given(tallied_sums())
def test_tally_digits_round_trip_through_an_encoded_sum(case: tuple[VectorSpec, list[np.ndarray], list[int]]) -> None:
    spec, vectors, counts = case
    digits = digits_for(spec, spec.length)
    assert (spec.entry_max + 1) ** digits > spec.length  # room for every entry clipped
    wide = VectorSpec(length=spec.length + digits, bound=spec.bound, summands=spec.summands, kind=spec.kind,
                      signed=spec.signed, frac_bits=spec.frac_bits)
    total = np.zeros(wide.length, dtype=np.uint64)
    for vector, count in zip(vectors, counts):
        tallied = np.concatenate([encode(spec, vector).values, tally(spec, count, digits)])
        assert tallied.shape == (wide.length,)
        check_encoded(wide, tallied)  # every digit is an admissible encoded entry
        total += tallied
    values, clipped = read_tally(spec, decode_sum(wide, total, contributors=len(vectors)), digits, len(vectors))
    assert clipped == sum(counts)
    np.testing.assert_array_equal(values, np.sum(vectors, axis=0))
    with pytest.raises(ValueError, match="do not fit"):
        tally(spec, (spec.entry_max + 1) ** digits, digits)


def test_tally_digits_fit_a_bound_off_the_fixed_point_grid() -> None:
    spec = VectorSpec(length=3, bound=0.1, summands=2, kind="float", signed=True, frac_bits=16)
    digits = digits_for(spec, spec.length)
    wide = VectorSpec(length=3 + digits, bound=0.1, summands=2, kind="float", signed=True, frac_bits=16)
    both = np.concatenate([encode(spec, np.full(3, 0.1)).values, tally(spec, 3, digits)])
    check_encoded(wide, both)
    values, clipped = read_tally(spec, decode_sum(wide, both + both, contributors=2), digits, 2)
    assert clipped == 6 and np.allclose(values, 0.2, atol=spec.sum_error_bound(2))


# --- model-sized sums -------------------------------------------------------------------------

def vectors(k: int, d: int, scale: float = 0.01) -> dict[int, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {c: scale * torch.randn(d, generator=g) for c in range(k)}


def test_clear_update_sum_is_a_float32_sum_and_counts_raw_bytes() -> None:
    net = StatsNet(make_plan(5, updates=UpdateSettings(dimension=50)))
    vecs = vectors(3, 50)
    total, release = net.update_sum(MODEL_UPDATE, vecs, round=4)
    torch.testing.assert_close(total, vecs[0] + vecs[1] + vecs[2])
    assert total.dtype == torch.float32
    entries = net.transcript.select(statistic="model_update", round=4)
    uploads = [e for e in entries if e.receiver == SERVER]
    overhead = len(Envelope("clear", 1, bytes(16), 0, SERVER, b"").to_bytes()) + 4  # header and length
    assert [e.bytes for e in uploads] == [4 * 50 + overhead] * 3
    assert all(e.visibility is Visibility.CLEAR and e.protocol == "clear" for e in uploads)
    assert release.protocol == "clear" and release.contributors == (0, 1, 2) and release.clipped == 0
    # a client whose vector has the wrong size refuses; nobody else contributes, so the sum aborts
    with pytest.raises(AbortedError):
        net.update_sum(MODEL_UPDATE, {0: torch.zeros(49)}, round=5)


@pytest.mark.parametrize("protocol", ["plain", "paillier"])
def test_secure_update_sum_matches_the_clear_sum_up_to_quantisation(protocol: str) -> None:
    net = StatsNet(make_plan(4, updates=UpdateSettings(dimension=40, protocol=protocol, clip=1.0, frac_bits=20)))
    vecs = vectors(4, 40)
    total, release = net.update_sum(MODEL_UPDATE, vecs)
    exact = sum(v.double() for v in vecs.values())
    assert float((total.double() - exact).abs().max()) <= 4 * 2.0**-21 + 1e-7
    assert total.dtype == torch.float32 and net.updates is not None and net.updates.clipped_total == 0
    assert release.protocol == protocol and release.bytes > 0 and release.clipped == 0
    declared = net.coordinator.declarations["model_update"]
    assert declared.kind == "float" and declared.signed and declared.clip


def test_secure_update_sum_clips_and_counts() -> None:
    net = StatsNet(make_plan(2, updates=UpdateSettings(dimension=3, protocol="plain", clip=0.5, frac_bits=16)))
    total, release = net.update_sum(MODEL_UPDATE, {0: torch.tensor([0.75, -2.0, 0.25]),
                                                   1: torch.tensor([0.0, 0.0, 0.25])})
    torch.testing.assert_close(total, torch.tensor([0.5, -0.5, 0.5]))
    assert net.updates is not None and net.updates.clipped_total == 2 and release.clipped == 2


def test_weighted_mean_goes_through_total_samples_and_the_update_sum() -> None:
    settings = UpdateSettings(dimension=4, protocol="plain", clip=1.0, frac_bits=24)
    net = StatsNet(make_plan(3, updates=settings), [TOTAL_SAMPLES])
    assert net.updates is not None
    info = RunInfo(num_clients=3, num_classes=2, dimension=4, rounds=1, training=LocalTraining(), updates=settings)
    ctx = ServerRound(round=0, global_vector=torch.zeros(4), cohort=(0, 2), info=info, stats=net.coordinator,
                      updates=net.updates)
    vecs = {0: torch.tensor([0.1, 0.2, -0.3, 0.0]), 2: torch.tensor([0.3, 0.0, 0.1, -0.2])}
    sizes = {0: 30, 1: 5, 2: 10}
    net.inputs["total_samples"] = {c: [n] for c, n in sizes.items()}
    # each client scales its own vector by n_i / Σ n_j, with the total it learned this round
    net.inputs["model_update"] = {
        c: (lambda learned, c=c: vecs[c].double().numpy() * sizes[c] / learned["total_samples"].value[0])
        for c in vecs
    }
    mean = ctx.weighted_mean()
    torch.testing.assert_close(mean, (30 * vecs[0] + 10 * vecs[2]) / 40, rtol=0, atol=1e-6)
    assert [r.name for r in net.coordinator.records] == ["total_samples", "model_update"]
    assert [r.name for r in ctx.releases] == ["total_samples", "model_update"]
    assert net.coordinator.records[0].scalar() == 40 and net.learned[1] == []
    private = StatisticDeclaration(name="server_total", length=1, bound=100)
    with pytest.raises(ValueError, match="learned by the clients"):
        ctx.weighted_mean(weight=private)


def test_release_and_learned_means_divide_every_entry_by_the_contributors() -> None:
    release = Release(name="pair", round=1, protocol="plain", value=np.array([6.0, 1.5]), contributors=(0, 2, 5),
                      dropouts=(), learned_by=("server",), clipped=0, bytes=0)
    np.testing.assert_allclose(release.means(), [2.0, 0.5])
    hidden = dataclasses.replace(release, value=None)
    assert hidden.means() is None
    learned = Learned(name="pair", round=1, value=np.array([6.0, 1.5]), contributors=(0, 2, 5), clipped=0)
    np.testing.assert_allclose(learned.means(), [2.0, 0.5])
    assert learned.mean() == pytest.approx(2.0)
