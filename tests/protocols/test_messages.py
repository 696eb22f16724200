import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocols.encoding import VectorSpec
from protocols.errors import WireError
from protocols.messages import ReleasedSum, read_contributors, write_contributors
from protocols.wire import Reader, Writer


def encode(contributors, parties):
    return write_contributors(Writer(), tuple(contributors), parties).finish()


def decode(data, parties, limit=None):
    reader = Reader(data)
    out = read_contributors(reader, parties, len(parties) if limit is None else limit)
    reader.end()
    return out


@st.composite
def populations(draw):
    parties = draw(st.lists(st.integers(0, 5000), min_size=1, max_size=300, unique=True))
    contributors = draw(st.lists(st.sampled_from(parties), min_size=1, unique=True))
    return draw(st.permutations(parties)), contributors


@given(populations())
def test_contributor_sets_round_trip_in_their_shorter_form(population):
    parties, contributors = population
    data = encode(contributors, parties)
    assert decode(data, parties) == tuple(sorted(contributors))
    as_list, as_bitmap = 1 + 4 + 4 * len(contributors), 1 + (len(parties) + 7) // 8
    assert (data[0], len(data)) == ((0, as_list) if as_list < as_bitmap else (1, as_bitmap))


def test_known_answers():
    # 3 of 5 parties: the list would take 16 bytes, the bitmap 1 (bits over the sorted ids).
    assert encode([9, 2, 7], [7, 2, 5, 9, 3]) == bytes([1, 0b10011000])
    # 2 of 100 parties: the list (8 + 4 bytes) beats the bitmap (13 bytes).
    assert encode([40, 3], range(100)) == bytes([0]) + (2).to_bytes(4, "big") + (3).to_bytes(4, "big") \
        + (40).to_bytes(4, "big")


def test_a_relay_to_every_party_costs_bits_not_ids():
    parties = range(1000)
    assert len(encode(parties, parties)) == 1 + 125  # was 4 + 4000 as a list


@pytest.mark.parametrize(("data", "message"), [
    (bytes([1, 0b01011001]), "padding"),                   # a bit beyond the 5 parties
    (bytes([1, 0]), "contributors is not possible"),        # nobody
    (bytes([2, 0b10011000]), "unknown contributor encoding"),
    (bytes([0, 0, 0, 0, 1, 0, 0, 0, 2]), "bitmap is the shorter"),  # 1 of 5 as a list
    (bytes([1]), "truncated"),
])
def test_malformed_or_non_canonical_sets_are_refused(data, message):
    with pytest.raises(WireError, match=message):
        decode(data, [2, 3, 5, 7, 9])


def list_form(ids):
    return bytes([0]) + len(ids).to_bytes(4, "big") + b"".join(i.to_bytes(4, "big") for i in ids)


@pytest.mark.parametrize(("ids", "message"), [
    ([40, 3], "ascending"),
    ([3, 3], "ascending"),
    ([3, 400], "unknown parties"),
])
def test_lists_must_be_ascending_known_ids(ids, message):
    with pytest.raises(WireError, match=message):
        decode(list_form(ids), range(100))


def test_list_where_the_bitmap_is_shorter_is_refused():
    with pytest.raises(WireError, match="bitmap is the shorter"):
        decode(list_form(list(range(10))), range(100))


def test_bitmap_where_the_list_is_shorter_is_refused():
    one_of_a_hundred = bytes([1, 0b10000000]) + bytes(12)  # party 0 alone: 9 bytes as a list
    with pytest.raises(WireError, match="list is the shorter"):
        decode(one_of_a_hundred, range(100))


def test_counts_above_the_summand_limit_are_refused_in_both_forms():
    parties = range(100)
    with pytest.raises(WireError, match="not possible"):
        decode(encode([1, 2], parties), parties, limit=1)
    with pytest.raises(WireError, match="not possible"):
        decode(encode(range(50), parties), parties, limit=49)


def test_released_sum_round_trips():
    spec = VectorSpec(length=3, bound=10, summands=4)
    released = ReleasedSum((1, 4), np.array([3, 0, 20], dtype=np.uint64))
    parsed = ReleasedSum.from_bytes(released.to_bytes(parties=range(6)), spec, parties=range(6))
    assert parsed.contributors == (1, 4) and parsed.encoded_sum.tolist() == [3, 0, 20]
