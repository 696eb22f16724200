import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from protocols.encoding import PackingLayout, VectorSpec, decode_sum, encode
from protocols.errors import BoundError, CapacityError, EncodingError


def test_derived_widths_include_log2_n_headroom():
    spec = VectorSpec(length=56, bound=1, summands=1000)
    assert spec.value_bits == 1
    assert spec.headroom_bits == math.ceil(math.log2(1000)) == 10
    assert spec.slot_bits == 11
    assert spec.summands * spec.entry_max < spec.modulus


def test_signed_float_spec_offsets_and_scale():
    spec = VectorSpec(length=3, bound=2.0, summands=4, kind="float", signed=True, frac_bits=8)
    assert spec.magnitude == 512 and spec.entry_max == 1024
    enc = encode(spec, [-2.0, 0.0, 2.0]).values
    assert enc.tolist() == [0, 512, 1024]
    assert decode_sum(spec, enc, contributors=1).tolist() == [-2.0, 0.0, 2.0]


@pytest.mark.parametrize("bad", [
    {"length": 0, "bound": 1, "summands": 1},
    {"length": 3, "bound": 0, "summands": 1},
    {"length": 3, "bound": float("nan"), "summands": 1},
    {"length": 3, "bound": 1.5, "summands": 2},  # integer spec with fractional bound
    {"length": 3, "bound": 1, "summands": 0},
    {"length": 3, "bound": 1e-9, "summands": 2, "kind": "float", "frac_bits": 8},
])
def test_invalid_specs_are_refused(bad):
    with pytest.raises(EncodingError):
        VectorSpec(**bad)


def test_spec_that_cannot_fit_64_bit_sums_is_refused():
    with pytest.raises(CapacityError):
        VectorSpec(length=1, bound=2**60, summands=1000)


def test_out_of_bound_raises_unless_clipping_is_asked_and_counted():
    spec = VectorSpec(length=4, bound=10, summands=2)
    with pytest.raises(BoundError, match="entry 2"):
        encode(spec, [0, 5, 11, 3])
    with pytest.raises(BoundError):
        encode(spec, [0, -1, 1, 3])
    clipped = encode(spec, [0, -1, 11, 3], clip=True)
    assert clipped.clipped == 2
    assert clipped.values.tolist() == [0, 0, 10, 3]


@pytest.mark.parametrize("bad", [[1, 2, 3], [1, 2, 3, 4, 5], [[1, 2], [3, 4]], [1, 2, float("inf"), 0],
                                 [1, 2, float("nan"), 0], [0.5, 1, 1, 1], ["a", "b", "c", "d"]])
def test_malformed_vectors_raise(bad):
    spec = VectorSpec(length=4, bound=10, summands=2)
    with pytest.raises(EncodingError):
        encode(spec, np.asarray(bad) if not isinstance(bad[0], str) else bad)


def test_decode_refuses_sums_that_cannot_come_from_the_declared_contributors():
    spec = VectorSpec(length=2, bound=3, summands=4)
    with pytest.raises(BoundError):
        decode_sum(spec, np.array([7, 0], dtype=np.uint64), contributors=2)
    with pytest.raises(EncodingError):
        decode_sum(spec, np.array([1, 0], dtype=np.uint64), contributors=5)


specs = st.builds(
    VectorSpec,
    length=st.integers(1, 40),
    bound=st.integers(1, 2**20),
    summands=st.integers(1, 2000),
)


@given(spec=specs, data=st.data())
def test_integer_sums_round_trip_exactly(spec, data):
    n = data.draw(st.integers(1, min(spec.summands, 12)))
    vectors = [np.array(data.draw(st.lists(st.integers(0, int(spec.bound)), min_size=spec.length,
                                           max_size=spec.length))) for _ in range(n)]
    total = sum(encode(spec, v).values for v in vectors)
    assert np.array_equal(decode_sum(spec, total, contributors=n), np.sum(vectors, axis=0))


@given(
    length=st.integers(1, 30), bound=st.floats(0.01, 1e3), frac_bits=st.integers(4, 24),
    summands=st.integers(1, 500), signed=st.booleans(), data=st.data(),
)
def test_float_sums_within_stated_error(length, bound, frac_bits, summands, signed, data):
    assume(round(bound * 2**frac_bits) >= 1)
    spec = VectorSpec(length=length, bound=bound, summands=summands, kind="float", signed=signed,
                      frac_bits=frac_bits)
    low = -bound if signed else 0.0
    n = data.draw(st.integers(1, min(summands, 8)))
    vectors = [np.array(data.draw(st.lists(st.floats(low, bound), min_size=length, max_size=length)))
               for _ in range(n)]
    total = sum(encode(spec, v).values for v in vectors)
    decoded = decode_sum(spec, total, contributors=n)
    assert np.all(np.abs(decoded - np.sum(vectors, axis=0)) <= spec.sum_error_bound(n) + 1e-9)


@given(spec=specs, capacity=st.sampled_from([256, 1023, 2047, 4095]), data=st.data())
def test_pack_sum_unpack_matches_slotwise_sum(spec, capacity, data):
    try:
        layout = PackingLayout.for_spec(spec, capacity_bits=capacity)
    except CapacityError:
        return
    n = data.draw(st.integers(1, min(spec.summands, 6)))
    vectors = [np.array(data.draw(st.lists(st.integers(0, int(spec.bound)), min_size=spec.length,
                                           max_size=spec.length))) for _ in range(n)]
    packed_total = [0] * layout.num_plaintexts
    for v in vectors:
        for i, p in enumerate(layout.pack(encode(spec, v).values)):
            assert p.bit_length() <= capacity
            packed_total[i] += p
    unpacked = layout.unpack(packed_total)
    assert np.array_equal(decode_sum(spec, unpacked, contributors=n), np.sum(vectors, axis=0))


def test_registry_layout_fits_56_slots_in_one_2048_bit_plaintext():
    spec = VectorSpec(length=56, bound=1, summands=1000)
    layout = PackingLayout.for_spec(spec, capacity_bits=2047)
    assert layout.slot_bytes == 2 and layout.num_plaintexts == 1


def test_slot_overflow_is_refused_not_wrapped():
    spec = VectorSpec(length=4, bound=255, summands=1)  # 8-bit slots, no headroom
    layout = PackingLayout.for_spec(spec, capacity_bits=32)
    one = layout.pack(encode(spec, [255, 255, 255, 255]).values)[0]
    with pytest.raises(CapacityError):
        layout.pack(np.array([256, 0, 0, 0], dtype=np.uint64))
    # Two summands where the spec allowed one: the top slot carries out of the plaintext.
    with pytest.raises(CapacityError):
        layout.unpack([one + one])
    # A carry into an unused padding slot is caught too.
    short = PackingLayout.for_spec(VectorSpec(length=3, bound=255, summands=1), capacity_bits=32)
    three = short.pack(np.array([0, 0, 255], dtype=np.uint64))[0]
    with pytest.raises(CapacityError):
        short.unpack([three + three])
    # And decode refuses a slot that exceeds what one contributor can produce.
    with pytest.raises(BoundError):
        decode_sum(spec, np.array([300, 0, 0, 0], dtype=np.uint64), contributors=1)


def test_slot_too_wide_for_plaintext():
    with pytest.raises(CapacityError):
        PackingLayout.for_spec(VectorSpec(length=1, bound=2**40, summands=2**10), capacity_bits=32)
