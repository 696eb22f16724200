"""AES-128-CTR pseudo-random masks, written into buffers the caller owns and reuses.

Hazardous: this is a keystream generator, not an encryption scheme. A *seed* is either

* 32 bytes: an AES-128 key (first 16 bytes) and the initial 128-bit counter block
  (last 16 bytes), incremented big-endian once per block as in NIST SP 800-38A; or
* 16 bytes: an AES-128 key with an all-zero initial counter block.

A seed must be uniformly random or the output of a KDF (the masking protocol derives
every seed with HKDF-SHA256 from a Diffie-Hellman secret or a random self-mask seed),
and one seed must never expand two different masks. Nothing here draws randomness:
NumPy's and Python's generators are never reachable from a mask.

Masks are the keystream read as little-endian unsigned words (``uint32`` or ``uint64``),
i.e. uniform integers modulo ``2**32`` or ``2**64``; reducing modulo any ``2**b`` with
``b`` up to the word size keeps them uniform.

Speed: keystream is produced with ``update_into`` from a shared read-only block of zeros
into a small scratch buffer, one cache-sized chunk at a time, and added to (or subtracted
from) the caller's accumulator while the chunk is still in cache. Neither the keystream
nor the accumulator ever makes a round trip through main memory per seed, which is
what lets a masking client run close to the raw AES-CTR rate.

Long masks (:data:`GCM_MIN_BYTES` and up) are the same keystream, produced by OpenSSL's AES-GCM
encryptor instead of its CTR one: GCM encrypts with AES in counter mode, and OpenSSL's GCM code
(VAES/AVX-512 where the CPU has it) runs about a third faster than its CTR code on such
machines. Only the counter blocks matter, so the GCM initialisation vector is chosen to make
GCM's first counter block the seed's: for a 16-byte IV, GCM starts from ``inc32(J0)`` with
``J0 = GHASH_H(IV, [0]_64 | [128]_64) = IV·H² + L·H`` in GF(2^128), ``H = AES_K(0^128)``, so
``IV = (J0 + L·H)·H^-2`` (:func:`_gcm_ivs`, one field inversion for all the seeds of a call).
GCM increments only the counter's low 32 bits; a seed whose low 32 counter bits would wrap
within the mask (probability ~2^-14 for 4 MB) keeps the CTR encryptor, as does the
impossible ``H = 0``. The GHASH that GCM computes alongside is discarded: no tag is ever made.
``test_prg.py`` checks the two paths byte for byte, wrapping counters included.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms, modes

KEY_BYTES: Final = 16
SEED_BYTES: Final = 32
BLOCK_BYTES: Final = 16
CHUNK_BYTES: Final = 256 * 1024
"""Keystream produced per call: small enough that the chunk, the zeros it is made from
and the matching slice of the accumulator stay in a core's L2 cache together. (64, 96, 128
and 192 KiB chunks ran within 1 % of each other and of 256 KiB over 101 masks of 4 MB,
interleaved: the size is not a lever here.)"""

_ZEROS: Final = bytes(CHUNK_BYTES)
_ZEROS_VIEW: Final = memoryview(_ZEROS)

STACK_BYTES: Final = 64 * 1024
"""When all of one call's masks together are at most this long, they are summed stacked
(:meth:`MaskExpander._accumulate_short`): SecAgg+'s one-word statistics make ~20 masks of 4 bytes."""
GCM_MIN_BYTES: Final = 2 * 1024 * 1024
"""Masks from this length on use the GCM encryptor (module docstring): it saves ~25 µs per MB of
keystream here and its initialisation vector costs ~20–40 µs of field arithmetic per seed."""

Words = npt.NDArray[np.unsignedinteger[Any]]
WORD_TYPES: Final = (np.dtype(np.uint32), np.dtype(np.uint64))


def _split(seed: bytes) -> tuple[bytes, bytes]:
    """``(key, initial counter block)`` of a seed."""
    if not isinstance(seed, (bytes, bytearray)):
        raise TypeError(f"a seed is bytes, got {type(seed).__name__}")
    if len(seed) == SEED_BYTES:
        return bytes(seed[:KEY_BYTES]), bytes(seed[KEY_BYTES:])
    if len(seed) == KEY_BYTES:
        return bytes(seed), bytes(BLOCK_BYTES)
    raise ValueError(f"a seed is {KEY_BYTES} or {SEED_BYTES} bytes, got {len(seed)}")


def _cipher(seed: bytes) -> CipherContext:
    key, counter = _split(seed)
    return Cipher(algorithms.AES(key), modes.CTR(counter)).encryptor()


# --- GF(2^128) as GCM uses it (NIST SP 800-38D): a block's first bit is the coefficient of x^0 ----

_REVERSED_BITS: Final = bytes(int(f"{b:08b}"[::-1], 2) for b in range(256))
_MODULUS: Final = (1 << 128) | 0x87  # x^128 + x^7 + x^2 + x + 1
_LENGTH_BLOCK_SHIFT: Final = 120
"""The length block of a 16-byte IV, [0]_64 | [128]_64, is the polynomial x^120."""


def _element(block: bytes) -> int:
    """A 16-byte block as a polynomial: bit i of the int is the coefficient of x^i."""
    return int.from_bytes(block.translate(_REVERSED_BITS), "little")


def _block(element: int) -> bytes:
    return element.to_bytes(BLOCK_BYTES, "little").translate(_REVERSED_BITS)


def _reduce(product: int) -> int:
    """``product`` (degree < 255) modulo x^128 + x^7 + x^2 + x + 1."""
    while product >> 128:
        high = product >> 128
        product = (product & ((1 << 128) - 1)) ^ high ^ (high << 1) ^ (high << 2) ^ (high << 7)
    return product


def _multiply(a: int, b: int) -> int:
    """``a·b`` in GF(2^128): carry-less product by 4-bit windows of ``b``, then reduction."""
    table = [0] * 16
    table[1] = a
    for i in range(2, 16, 2):
        table[i] = table[i >> 1] << 1
        table[i + 1] = table[i] ^ a
    product = 0
    shift = 0
    while b:
        product ^= table[b & 15] << shift
        b >>= 4
        shift += 4
    return _reduce(product)


def _inverse(a: int) -> int:
    """``a^-1`` in GF(2^128) (``a != 0``): the extended Euclidean algorithm over GF(2)[x]."""
    u, v, g1, g2 = a, _MODULUS, 1, 0
    while u != 1:
        j = u.bit_length() - v.bit_length()
        if j < 0:
            u, v, g1, g2, j = v, u, g2, g1, -j
        u ^= v << j
        g1 ^= g2 << j
    return g1


def _gcm_ivs(keys: Sequence[bytes], counters: Sequence[bytes]) -> list[bytes | None]:
    """For each (key, initial counter block), the 16-byte GCM IV whose first counter block is
    that counter (``None`` for the impossible H = 0). Montgomery's trick: one inversion for all."""
    hashes = []
    for key in keys:
        encryptor = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
        hashes.append(_element(encryptor.update(bytes(BLOCK_BYTES))))
    usable = [h for h in hashes if h]
    prefix = [1]
    for h in usable:
        prefix.append(_multiply(prefix[-1], h))
    inverse = _inverse(prefix[-1]) if usable else 0
    inverses: dict[int, int] = {}
    for index in range(len(usable) - 1, -1, -1):
        inverses[index] = _multiply(inverse, prefix[index])
        inverse = _multiply(inverse, usable[index])
    ivs: list[bytes | None] = []
    index = 0
    for h, counter in zip(hashes, counters):
        if not h:
            ivs.append(None)
            continue
        h_inverse = inverses[index]
        index += 1
        value = int.from_bytes(counter, "big")
        low = (value - 1) & 0xFFFFFFFF
        j0 = _element(((value >> 32 << 32) | low).to_bytes(BLOCK_BYTES, "big"))  # inc32(J0) = counter
        # IV = (J0 + L·H)·H^-2 = J0·H^-2 + L·H^-1, L = x^120
        iv = _multiply(j0, _multiply(h_inverse, h_inverse)) ^ _reduce(h_inverse << _LENGTH_BLOCK_SHIFT)
        ivs.append(_block(iv))
    return ivs


def _gcm_counts(counter: bytes, blocks: int) -> bool:
    """Whether GCM's 32-bit counter increment counts ``blocks`` blocks from ``counter`` as the
    128-bit increment does (its low 32 bits do not wrap)."""
    return int.from_bytes(counter[-4:], "big") + blocks <= 1 << 32


def _ciphers(seeds: Sequence[bytes], nbytes: int) -> list[CipherContext]:
    """One encryptor per seed, each producing that seed's AES-128-CTR keystream (module docstring):
    through GCM for long masks where the counter's low 32 bits do not wrap, CTR otherwise."""
    split = [_split(seed) for seed in seeds]
    blocks = -(-nbytes // BLOCK_BYTES)
    if nbytes < GCM_MIN_BYTES or not split:
        return [Cipher(algorithms.AES(key), modes.CTR(counter)).encryptor() for key, counter in split]
    fits = [_gcm_counts(counter, blocks) for _, counter in split]
    ivs = _gcm_ivs([key for (key, _), ok in zip(split, fits) if ok], [c for (_, c), ok in zip(split, fits) if ok])
    out: list[CipherContext] = []
    gcm = iter(ivs)
    for (key, counter), ok in zip(split, fits):
        iv = next(gcm) if ok else None
        if iv is None:
            out.append(Cipher(algorithms.AES(key), modes.CTR(counter)).encryptor())
        else:
            out.append(Cipher(algorithms.AES(key), modes.GCM(iv)).encryptor())  # its tag is never made
    return out


def _byte_view(out: Any) -> npt.NDArray[np.uint8]:
    array: npt.NDArray[Any] = out if isinstance(out, np.ndarray) else np.frombuffer(out, dtype=np.uint8)
    if not array.flags.c_contiguous or not array.flags.writeable:
        raise ValueError("the output buffer must be C-contiguous and writable")
    view: npt.NDArray[np.uint8] = array.reshape(-1).view(np.uint8)
    return view


def keystream_into(seed: bytes, out: Any) -> None:
    """Fill ``out`` (a writable, contiguous buffer or array) with the keystream of ``seed``."""
    target = _byte_view(out)
    total = target.shape[0]
    cipher = _ciphers([seed], total)[0]
    for offset in range(0, total, CHUNK_BYTES):
        size = min(CHUNK_BYTES, total - offset)
        cipher.update_into(_ZEROS_VIEW[:size], target[offset : offset + size].data)


class MaskExpander:
    """Expands seeds into masks of ``length`` words of ``dtype`` (``uint32`` or ``uint64``).

    Owns one chunk-sized scratch buffer and reuses it for every seed; never allocates a
    mask-sized array unless :meth:`expand` is asked to.
    """

    def __init__(self, length: int, dtype: npt.DTypeLike, *, chunk_bytes: int = CHUNK_BYTES) -> None:
        word = np.dtype(dtype)
        if word not in WORD_TYPES:
            raise ValueError(f"masks are uint32 or uint64 words, got {word}")
        if not isinstance(length, int) or length < 1:
            raise ValueError(f"length must be a positive integer, got {length!r}")
        if chunk_bytes < BLOCK_BYTES or chunk_bytes > CHUNK_BYTES or chunk_bytes % 64:
            raise ValueError(f"chunk_bytes must be a multiple of 64 in [64, {CHUNK_BYTES}]")
        self.length = length
        self.dtype = word
        self.nbytes = length * word.itemsize
        self._chunk_words = chunk_bytes // word.itemsize
        self._scratch = np.empty(min(chunk_bytes, self.nbytes), dtype=np.uint8)
        # Keystream words are defined little-endian on every platform.
        self._little = word.newbyteorder("<")
        self._native = sys.byteorder == "little"

    def expand(self, seed: bytes, out: Words | None = None) -> Words:
        """The mask of ``seed``, written into ``out`` (reused by the caller) or a new array."""
        if out is None:
            out = np.empty(self.length, dtype=self.dtype)
        self._check(out, "out")
        keystream_into(seed, out)
        if not self._native:  # pragma: no cover - big-endian hosts only
            out.byteswap(inplace=True)
        return out

    def accumulate(self, acc: Words, *, add: Sequence[bytes] = (), subtract: Sequence[bytes] = ()) -> None:
        """``acc += sum(mask(s) for s in add) - sum(mask(s) for s in subtract)``, modulo ``2**word_bits``.

        Works chunk by chunk: each seed's cipher context carries its counter from one
        chunk to the next, so every seed still yields one continuous keystream.
        """
        self._check(acc, "acc")
        ciphers = _ciphers([*add, *subtract], self.nbytes)
        plus, minus = ciphers[: len(add)], ciphers[len(add) :]
        if not plus and not minus:
            return
        if len(ciphers) * self.nbytes <= STACK_BYTES:
            self._accumulate_short(acc, plus, minus)
            return
        scratch = self._scratch
        words = scratch.view(self._little)
        step = self._chunk_words
        itemsize = self.dtype.itemsize
        add_, subtract_ = np.add, np.subtract
        for start in range(0, self.length, step):
            count = min(step, self.length - start)
            size = count * itemsize
            zeros = _ZEROS_VIEW[:size]
            buf = scratch[:size].data
            stream = words[:count]
            target = acc[start : start + count]
            for cipher in plus:
                cipher.update_into(zeros, buf)
                add_(target, stream, out=target)
            for cipher in minus:
                cipher.update_into(zeros, buf)
                subtract_(target, stream, out=target)

    def _accumulate_short(self, acc: Words, plus: Sequence[CipherContext], minus: Sequence[CipherContext]) -> None:
        """Short masks (a statistic of a few words): every seed's mask stacked in one array and
        summed in one pass per sign, instead of one NumPy call per seed (the same sums modulo
        ``2**word_bits``: NumPy's unsigned reductions wrap)."""
        zeros = _ZEROS_VIEW[: self.nbytes]
        for group, combine in ((plus, np.add), (minus, np.subtract)):
            if group:
                stacked = np.frombuffer(b"".join([cipher.update(zeros) for cipher in group]), dtype=self._little)
                combine(acc, stacked.reshape(len(group), self.length).sum(axis=0, dtype=self.dtype), out=acc)

    def _check(self, array: Words, name: str) -> None:
        if not isinstance(array, np.ndarray) or array.dtype != self.dtype or array.shape != (self.length,):
            raise ValueError(f"{name} must be a {self.dtype} array of shape ({self.length},)")
        if not array.flags.c_contiguous or not array.flags.writeable:
            raise ValueError(f"{name} must be C-contiguous and writable")
