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

Words = npt.NDArray[np.unsignedinteger[Any]]
WORD_TYPES: Final = (np.dtype(np.uint32), np.dtype(np.uint64))


def _cipher(seed: bytes) -> CipherContext:
    if not isinstance(seed, (bytes, bytearray)):
        raise TypeError(f"a seed is bytes, got {type(seed).__name__}")
    if len(seed) == SEED_BYTES:
        key, counter = bytes(seed[:KEY_BYTES]), bytes(seed[KEY_BYTES:])
    elif len(seed) == KEY_BYTES:
        key, counter = bytes(seed), bytes(BLOCK_BYTES)
    else:
        raise ValueError(f"a seed is {KEY_BYTES} or {SEED_BYTES} bytes, got {len(seed)}")
    return Cipher(algorithms.AES(key), modes.CTR(counter)).encryptor()


def _byte_view(out: Any) -> npt.NDArray[np.uint8]:
    array: npt.NDArray[Any] = out if isinstance(out, np.ndarray) else np.frombuffer(out, dtype=np.uint8)
    if not array.flags.c_contiguous or not array.flags.writeable:
        raise ValueError("the output buffer must be C-contiguous and writable")
    view: npt.NDArray[np.uint8] = array.reshape(-1).view(np.uint8)
    return view


def keystream_into(seed: bytes, out: Any) -> None:
    """Fill ``out`` (a writable, contiguous buffer or array) with the keystream of ``seed``."""
    target = _byte_view(out)
    cipher = _cipher(seed)
    total = target.shape[0]
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
        plus = [_cipher(s) for s in add]
        minus = [_cipher(s) for s in subtract]
        if not plus and not minus:
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

    def _check(self, array: Words, name: str) -> None:
        if not isinstance(array, np.ndarray) or array.dtype != self.dtype or array.shape != (self.length,):
            raise ValueError(f"{name} must be a {self.dtype} array of shape ({self.length},)")
        if not array.flags.c_contiguous or not array.flags.writeable:
            raise ValueError(f"{name} must be C-contiguous and writable")
