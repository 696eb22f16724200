"""Integers end to end: bounds, encoding and sums at 2**53 +- 1, 2**62, 2**63 - 1 and beyond are
exact or a typed error, never rounded through float64 and never clipped silently."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols import (
    AbortedError,
    BoundError,
    CapacityError,
    EncodingError,
    VectorSpec,
    decode_sum,
    decode_sum_exact,
    encode,
    make_sum,
)

EDGES = [2**53 - 1, 2**53, 2**53 + 1, 2**62 - 1, 2**62, 2**63 - 1]
BIG = VectorSpec(length=len(EDGES) - 1, bound=2**62, summands=1)  # 63 slot bits


def test_bounds_must_be_exact():
    assert VectorSpec(length=1, bound=2**53, summands=1).magnitude == 2**53
    assert VectorSpec(length=1, bound=2**62, summands=1).entry_max == 2**62
    for bound in (2**53 + 1, 2**62 - 1, 2**63 - 1):
        with pytest.raises(EncodingError, match="not exactly representable"):
            VectorSpec(length=1, bound=bound, summands=1)
    with pytest.raises(CapacityError):
        VectorSpec(length=1, bound=2**63, summands=1)
    with pytest.raises(CapacityError):
        VectorSpec(length=1, bound=2**62, summands=2)


@pytest.mark.parametrize("dtype", [np.int64, np.uint64, object])
def test_values_at_the_edges_encode_exactly(dtype):
    values = [2**53 - 1, 2**53, 2**53 + 1, 2**62 - 1, 2**62]
    encoded = encode(BIG, np.array(values, dtype=dtype)).values
    assert [int(v) for v in encoded] == values
    assert [int(v) for v in decode_sum_exact(BIG, encoded, contributors=1)] == values


@pytest.mark.parametrize("dtype", [np.int64, np.uint64, object])
def test_one_past_the_bound_is_refused_or_clipped_and_counted(dtype):
    spec = VectorSpec(length=1, bound=2**53, summands=1)
    with pytest.raises(BoundError, match="9007199254740993"):  # 2**53 + 1, not rounded to 2**53
        encode(spec, np.array([2**53 + 1], dtype=dtype))
    clipped = encode(spec, np.array([2**53 + 1], dtype=dtype), clip=True)
    assert clipped.clipped == 1 and int(clipped.values[0]) == 2**53


def test_unsigned_and_python_integers_beyond_the_range_are_refused():
    with pytest.raises(BoundError):
        encode(BIG, np.array([2**63 + 5, 0, 0, 0, 0], dtype=np.uint64))  # would wrap negative as int64
    with pytest.raises(BoundError):
        encode(BIG, [2**64 + 1, 0, 0, 0, 0])
    with pytest.raises(BoundError):
        encode(BIG, [-(2**70), 0, 0, 0, 0])
    signed = VectorSpec(length=2, bound=2**61, summands=1, signed=True)
    encoded = encode(signed, np.array([-(2**61), 2**61 - 1], dtype=np.int64)).values
    assert [int(v) for v in decode_sum_exact(signed, encoded, contributors=1)] == [-(2**61), 2**61 - 1]
    with pytest.raises(BoundError):
        encode(signed, np.array([-(2**61) - 1, 0], dtype=np.int64))


def test_a_float_result_that_would_round_is_refused():
    spec = VectorSpec(length=2, bound=2**61, summands=2)
    encoded = encode(spec, np.array([2**53 + 1, 2**53], dtype=np.int64)).values
    with pytest.raises(CapacityError, match="9007199254740993"):
        decode_sum(spec, encoded, contributors=1)
    exact = encode(spec, np.array([2**60, 2**53], dtype=np.int64)).values  # both exact floats
    assert decode_sum(spec, exact, contributors=1).tolist() == [2.0**60, 2.0**53]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), bits=st.sampled_from([52, 53, 54, 60]))
def test_property_plain_sums_are_exact_or_refused(data, bits):
    n = 3
    bound = 2**bits
    spec = VectorSpec(length=4, bound=bound, summands=n)
    inputs = {i: data.draw(st.lists(st.integers(0, bound), min_size=4, max_size=4)) for i in range(n)}
    truth = [sum(inputs[i][j] for i in range(n)) for j in range(4)]
    encoded = [encode(spec, np.array(v, dtype=np.int64)).values for v in inputs.values()]
    total = np.sum(encoded, axis=0, dtype=np.uint64)
    assert [int(v) for v in decode_sum_exact(spec, total, contributors=n)] == truth
    try:
        floats = decode_sum(spec, total, contributors=n)
    except CapacityError:
        assert any(t > 2**53 for t in truth)
        return
    assert [int(v) for v in floats] == truth


@pytest.mark.parametrize("name,options", [("plain", {}), ("masking", {}),
                                          ("paillier", {"key_bits": 1024, "allow_weak_keys": True})])
def test_protocol_sums_at_the_edges_are_exact_or_a_typed_error(name, options):
    spec = VectorSpec(length=3, bound=2**61, summands=2)
    session = make_sum(name, clients=range(2), **options)
    exact = {0: np.array([2**53, 2**60, 0], dtype=np.int64), 1: np.array([2**53, 2**60, 1], dtype=np.int64)}
    out = session.sum(exact, spec=spec)
    assert [int(v) for v in out.total] == [2**54, 2**61, 1]
    rounding = {0: np.array([2**53 + 1, 0, 0], dtype=np.int64), 1: np.array([2**53, 0, 0], dtype=np.int64)}
    with pytest.raises((AbortedError, CapacityError)):  # 2**54 + 1 has no float64: refused, never rounded
        session.sum(rounding, spec=spec)
