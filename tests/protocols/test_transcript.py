"""The transcript's per-round byte totals, kept as entries arrive, equal a scan of its entries."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given
from hypothesis import strategies as st

from protocols.transcript import Transcript, TranscriptEntry, Visibility

entries = st.builds(
    TranscriptEntry, round=st.integers(-1, 4), protocol=st.just("masking"), run_id=st.just("ab"),
    stage=st.sampled_from(["open", "upload", "unmasking"]), sender=st.integers(0, 3), receiver=st.integers(0, 3),
    statistic=st.sampled_from(["total_samples", "model_update"]), bytes=st.integers(0, 10**9),
    visibility=st.sampled_from(list(Visibility)), k=st.integers(0, 4), dimension=st.integers(0, 9),
    owner=st.none())


def scan(items: list[TranscriptEntry], round: int) -> dict[tuple[str, str], int]:
    totals: dict[tuple[str, str], int] = defaultdict(int)
    for e in items:
        if e.round == round:
            totals[(e.statistic, e.stage)] += e.bytes
    return dict(totals)


@given(st.lists(entries, max_size=40), st.lists(entries, max_size=10))
def test_round_bytes_equal_a_scan_however_the_transcript_was_built(first: list[TranscriptEntry],
                                                                   more: list[TranscriptEntry]) -> None:
    appended = Transcript()
    for e in first:
        appended.append(e)
    built = Transcript(list(first))
    extended = Transcript(list(first))
    extended.extend(Transcript(list(more)))
    for round in range(-1, 5):
        assert appended.round_bytes(round) == built.round_bytes(round) == scan(first, round)
        assert extended.round_bytes(round) == scan(first + more, round)
