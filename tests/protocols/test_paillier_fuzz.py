"""Random byte mutations of Paillier set-up and sum messages: only ProtocolErrors, never a wrong sum."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols import ProtocolError, Reveal, VectorSpec, make_sum
from protocols.network import LocalNetwork

N = 4
SPEC = VectorSpec(length=12, bound=3, summands=N, kind="float", signed=True, frac_bits=4)
INPUTS = {c: np.linspace(-3, 3, 12)[::-1] * (c % 2 * 2 - 1) / (c + 1) for c in range(N)}
MODES = ("agent", "all", "server")


def _mutate(data: bytes, kind: str, position: int, value: int) -> bytes | None:
    at = position % len(data)
    if kind == "flip":
        return data[:at] + bytes([data[at] ^ value]) + data[at + 1:]
    if kind == "truncate":
        return data[:at]
    if kind == "extend":
        return data + bytes([value])
    if kind == "drop":
        return None
    return data[:at] + bytes([value]) * min(8, len(data) - at) + data[at + 8:]


def _run(mode, server_learns, interceptor, keypair):
    """Set up and sum once; the key pair is reused (key generation is not what this tests)."""
    network = LocalNetwork(interceptor=interceptor)
    with mock.patch("protocols.primitives.paillier.generate_keypair", lambda *a, **k: keypair):
        session = make_sum("paillier", clients=range(N), network=network, keyholder=mode, key_bits=1024,
                           allow_weak_keys=True)
        session.setup()
        reveal = Reveal(server=server_learns or mode == "agent")
        return session.sum(INPUTS, spec=SPEC, reveal=reveal), session


@pytest.fixture(scope="module")
def message_counts(keypair_1024):
    counts = {}
    for mode in MODES:
        for server_learns in (False, True):
            seen: list[bytes] = []

            def keep(data, message, seen=seen):
                seen.append(data)
                return data

            _run(mode, server_learns, keep, keypair_1024)
            counts[mode, server_learns] = len(seen)
    return counts


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mode=st.sampled_from(MODES), server_learns=st.booleans(), target=st.integers(0, 1 << 16),
       kind=st.sampled_from(["flip", "truncate", "extend", "drop", "fill"]),
       position=st.integers(0, 1 << 20), value=st.integers(1, 255))
def test_mutated_messages_never_crash_a_party_or_yield_a_wrong_sum(
        keypair_1024, message_counts, mode, server_learns, target, kind, position, value):
    index = target % message_counts[mode, server_learns]
    state = {"count": 0, "hit": None}

    def interceptor(data, message):
        state["count"] += 1
        if state["count"] - 1 != index:
            return data
        state["hit"] = message.label.stage
        return _mutate(data, kind, position, value)

    try:
        outcome, session = _run(mode, server_learns, interceptor, keypair_1024)
    except ProtocolError:
        return  # refused or aborted cleanly: the only failure a mutation may cause
    assert state["hit"] is not None
    expected = np.sum([INPUTS[c] for c in outcome.contributors], axis=0)
    assert np.max(np.abs(outcome.total - expected)) <= SPEC.sum_error_bound(len(outcome.contributors))
    for party in session.parties().values():  # every client that learned a sum learned this one
        assert party.result is None or np.array_equal(party.result, outcome.total)
    assert all(not e.startswith(("Type", "Value", "Key", "Index")) for e in outcome.rejected)


COUNTS = {c: np.array([c + 1, 7 - c, (3 * c) % 5, 2]) for c in range(N)}
CANDIDATES = [[(0, 1)], [(2, 3)], [(0, 3)], [(1, 2)]]
ARGMIN_MESSAGES = 2 * N + 3  # store: N opens, N uploads; argmin: open, try aggregates, index


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(target=st.integers(0, ARGMIN_MESSAGES - 1), kind=st.sampled_from(["flip", "truncate", "extend", "drop", "fill"]),
       position=st.integers(0, 1 << 20), value=st.integers(1, 255))
def test_mutated_argmin_messages_never_crash_a_party_or_pick_a_wrong_index(keypair_1024, target, kind, position,
                                                                           value):
    from protocols.argmin import ArgminSession, argmin_index, score_groups

    state = {"armed": False, "count": 0, "hit": None}

    def interceptor(data, message):
        if not state["armed"]:
            return data
        state["count"] += 1
        if state["count"] - 1 != target:
            return data
        state["hit"] = message.label.stage
        return _mutate(data, kind, position, value)

    with mock.patch("protocols.primitives.paillier.generate_keypair", lambda *a, **k: keypair_1024):
        session = make_sum("paillier", clients=range(N), network=LocalNetwork(interceptor=interceptor),
                           keyholder="all", key_bits=1024, allow_weak_keys=True)
        session.setup()
    argmin = ArgminSession(session, length=4, bound=10, max_try_size=N)
    state["armed"] = True
    try:
        argmin.upload(COUNTS, round=0)
        outcome = argmin.argmin(CANDIDATES, round=1)
    except ProtocolError:
        return
    assert state["hit"] is not None
    stored = argmin.stored
    sums = [[np.sum([COUNTS[k] for k in members if k in stored], axis=0) for members in group]
            for group in CANDIDATES]
    assert outcome.index == argmin_index(score_groups(sums))
