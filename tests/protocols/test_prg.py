"""AES-128-CTR masks: the NIST known answer, chunk continuity, accumulation, uniformity."""

import math

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from protocols.primitives.prg import CHUNK_BYTES, GCM_MIN_BYTES, MaskExpander, keystream_into

# NIST SP 800-38A, F.5.1 CTR-AES128.Encrypt
NIST_KEY = bytes.fromhex("2b7e151628aed2a6abf7158809cf4f3c")
NIST_COUNTER = bytes.fromhex("f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff")
NIST_PLAINTEXT = bytes.fromhex(
    "6bc1bee22e409f96e93d7e117393172a" "ae2d8a571e03ac9c9eb76fac45af8e51"
    "30c81c46a35ce411e5fbc1191a0a52ef" "f69f2445df4f9b17ad2b417be66c3710"
)
NIST_CIPHERTEXT = bytes.fromhex(
    "874d6191b620e3261bef6864990db6ce" "9806f66b7970fdff8617187bb9fffdff"
    "5ae4df3edbd5d35e5b4f09020db03eab" "1e031dda2fbe03d1792170a0f3009cee"
)


def xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b))


def test_nist_sp800_38a_f51_known_answer():
    out = bytearray(64)
    keystream_into(NIST_KEY + NIST_COUNTER, out)
    assert xor(bytes(out), NIST_PLAINTEXT) == NIST_CIPHERTEXT


def test_mask_words_are_the_little_endian_keystream():
    words = MaskExpander(16, np.uint32).expand(NIST_KEY + NIST_COUNTER)
    expected = np.frombuffer(xor(NIST_PLAINTEXT, NIST_CIPHERTEXT), dtype="<u4")
    assert np.array_equal(words, expected)
    words64 = MaskExpander(8, np.uint64).expand(NIST_KEY + NIST_COUNTER)
    assert np.array_equal(words64, np.frombuffer(xor(NIST_PLAINTEXT, NIST_CIPHERTEXT), dtype="<u8"))


def test_sixteen_byte_seed_is_a_key_with_zero_counter():
    key = bytes(range(16))
    expected = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor().update(bytes(100))
    out = bytearray(100)
    keystream_into(key, out)
    assert bytes(out) == expected


def test_keystream_spans_chunks_without_seams():
    seed = bytes(range(32))
    length = CHUNK_BYTES * 2 + 40  # two full chunks and a ragged tail
    expected = Cipher(algorithms.AES(seed[:16]), modes.CTR(seed[16:])).encryptor().update(bytes(length))
    out = np.zeros(length, dtype=np.uint8)
    keystream_into(seed, out)
    assert out.tobytes() == expected


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64])
@pytest.mark.parametrize("chunk", [64, 4096, CHUNK_BYTES])
def test_accumulate_equals_sum_of_expanded_masks(dtype, chunk):
    length = 3001
    expander = MaskExpander(length, dtype, chunk_bytes=chunk)
    seeds = [bytes([i]) * 32 for i in range(5)]
    acc = np.arange(length, dtype=dtype)
    expected = acc.copy()
    for s in seeds[:3]:
        expected += expander.expand(s)
    for s in seeds[3:]:
        expected -= expander.expand(s)
    expander.accumulate(acc, add=seeds[:3], subtract=seeds[3:])
    assert np.array_equal(acc, expected)


def test_expand_reuses_the_callers_buffer_and_is_deterministic():
    expander = MaskExpander(1000, np.uint32)
    out = np.empty(1000, dtype=np.uint32)
    first = expander.expand(b"\x01" * 32, out)
    assert first is out
    again = expander.expand(b"\x01" * 32).copy()
    assert np.array_equal(again, out)
    assert not np.array_equal(expander.expand(b"\x02" * 32), again)


def test_rejects_bad_seeds_and_buffers():
    expander = MaskExpander(10, np.uint32)
    with pytest.raises(ValueError):
        expander.expand(b"short")
    with pytest.raises(TypeError):
        expander.expand("not bytes" * 4)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        expander.accumulate(np.zeros(10, dtype=np.uint64), add=[bytes(32)])
    with pytest.raises(ValueError):
        expander.accumulate(np.zeros(11, dtype=np.uint32), add=[bytes(32)])
    with pytest.raises(ValueError):
        MaskExpander(10, np.int32)
    with pytest.raises(ValueError):
        keystream_into(bytes(32), bytes(16))  # read-only output


def chi_square(counts: np.ndarray) -> float:
    expected = counts.sum() / counts.size
    return float(((counts - expected) ** 2).sum() / expected)


def chi_square_limit(buckets: int, sigmas: float = 6.0) -> float:
    """Mean + 6 standard deviations of a chi-square with buckets-1 degrees of freedom (false alarm ~1e-9)."""
    dof = buckets - 1
    return dof + sigmas * math.sqrt(2 * dof)


def test_mask_bytes_are_uniform():
    words = MaskExpander(1 << 18, np.uint32).expand(bytes(range(32)))
    counts = np.bincount(words.view(np.uint8), minlength=256)
    assert chi_square(counts) < chi_square_limit(256)


@pytest.mark.parametrize("bits", [1, 7, 10, 17])
def test_masks_reduced_mod_small_powers_of_two_are_uniform(bits):
    acc = np.zeros(1 << 18, dtype=np.uint32)
    MaskExpander(acc.size, np.uint32).accumulate(acc, add=[b"a" * 32, b"b" * 32], subtract=[b"c" * 32])
    counts = np.bincount(acc & ((1 << bits) - 1), minlength=1 << bits)
    assert chi_square(counts) < chi_square_limit(1 << bits)


# --- long masks: the same keystream through OpenSSL's GCM encryptor ------------------------------

def _ctr_keystream(seed: bytes, nbytes: int) -> bytes:
    key, counter = (seed[:16], seed[16:]) if len(seed) == 32 else (seed, bytes(16))
    return Cipher(algorithms.AES(key), modes.CTR(counter)).encryptor().update(bytes(nbytes))


def _seed(counter: int) -> bytes:
    return bytes(range(16)) + counter.to_bytes(16, "big")


def test_gcm_field_arithmetic():
    import random

    from protocols.primitives.prg import _block, _element, _inverse, _multiply

    rng = random.Random(7)
    for _ in range(200):
        a, b, c = (rng.getrandbits(128) for _ in range(3))
        assert _multiply(a, b) == _multiply(b, a)
        assert _multiply(a, b ^ c) == _multiply(a, b) ^ _multiply(a, c)
        if a:
            assert _multiply(a, _inverse(a)) == 1
        block = rng.randbytes(16)
        assert _block(_element(block)) == block
    # NIST SP 800-38D / McGrew-Viega test case 2 (K = 0, IV = 0^96, P = 0^128):
    # GHASH_H(C, [0]_64 | [128]_64) = (C·H + L)·H
    h = _element(bytes.fromhex("66e94bd4ef8a2c3b884cfa59ca342b2e"))
    c = _element(bytes.fromhex("0388dace60b6a392f328c2b971b2fe78"))
    length = _element(bytes(8) + (128).to_bytes(8, "big"))
    assert length == 1 << 120
    assert _block(_multiply(_multiply(c, h) ^ length, h)) == bytes.fromhex("f38cbb1ad69223dcc3457ae5b6b0f885")


@pytest.mark.parametrize("counter", [
    0, 1, 0xFFFFFFFF, 2**32, 2**96 - 1, 2**128 - 1, 2**127 + 12345,
    2**32 - (GCM_MIN_BYTES // 16),      # the last 32-bit counter that fits: GCM
    2**32 - (GCM_MIN_BYTES // 16) + 1,  # the first that would wrap: CTR
    5 * 2**32 - 100,                    # wraps within the mask, carry into bit 32: CTR
])
def test_long_masks_are_the_ctr_keystream_byte_for_byte(counter):
    out = bytearray(GCM_MIN_BYTES)
    keystream_into(_seed(counter % 2**128), out)
    assert bytes(out) == _ctr_keystream(_seed(counter % 2**128), GCM_MIN_BYTES)


def test_long_masks_pick_gcm_exactly_where_the_counter_does_not_wrap(monkeypatch):
    from protocols.primitives import prg

    blocks = GCM_MIN_BYTES // 16
    assert prg._gcm_counts(_seed(2**32 - blocks)[16:], blocks)
    assert not prg._gcm_counts(_seed(2**32 - blocks + 1)[16:], blocks)
    assert prg._gcm_counts(_seed(2**128 - 2**32)[16:], blocks)  # high bits do not matter
    used = []
    real = prg.modes.GCM
    monkeypatch.setattr(prg.modes, "GCM", lambda iv: used.append(iv) or real(iv))
    prg._ciphers([_seed(2**32 - blocks), _seed(2**32 - blocks + 1), bytes(16)], GCM_MIN_BYTES)
    assert len(used) == 2  # the first and the 16-byte seed (zero counter); the second wraps: CTR
    used.clear()
    prg._ciphers([_seed(5)], GCM_MIN_BYTES - 1)
    assert not used  # short masks: CTR


def test_long_masks_accumulate_as_the_sum_of_ctr_masks():
    import os

    length = GCM_MIN_BYTES // 4 + 3  # crosses a chunk boundary off a block boundary
    seeds = [os.urandom(32) for _ in range(4)] + [_seed(2**32 - 10), os.urandom(16)]
    acc = np.arange(length, dtype=np.uint32)
    MaskExpander(length, np.uint32).accumulate(acc, add=seeds[:3], subtract=seeds[3:])
    expected = np.arange(length, dtype=np.uint32)
    for i, seed in enumerate(seeds):
        mask = np.frombuffer(_ctr_keystream(seed, 4 * length), dtype="<u4")
        expected = expected + mask if i < 3 else expected - mask
    assert np.array_equal(acc, expected)


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64])
@pytest.mark.parametrize("length", [1, 3, 1000])
def test_short_masks_accumulate_stacked_as_the_sum_of_masks(dtype, length):
    import os

    from protocols.primitives.prg import STACK_BYTES

    seeds = [os.urandom(32) for _ in range(23)] + [os.urandom(16)]
    expander = MaskExpander(length, dtype)
    assert len(seeds) * expander.nbytes <= STACK_BYTES or length == 1000
    start = np.full(length, np.iinfo(dtype).max - 5, dtype=dtype)  # wraps at once
    acc = start.copy()
    expander.accumulate(acc, add=seeds[:15], subtract=seeds[15:])
    expected = start.copy()
    for i, seed in enumerate(seeds):
        mask = expander.expand(seed)
        expected = expected + mask if i < 15 else expected - mask
    assert np.array_equal(acc, expected)
    only_minus = start.copy()
    expander.accumulate(only_minus, subtract=seeds[:2])
    assert np.array_equal(only_minus, start - expander.expand(seeds[0]) - expander.expand(seeds[1]))
