"""Linear tags of SEAL ciphertexts: random linear functionals of their coefficients, so that a
key holder can check an aggregate is the sum of the uploads without ever seeing one upload.

Hazardous layer: no protocol logic here (:mod:`protocols.seal_sum` runs the verification).

**Why.** Adding ciphertexts is coefficient-wise addition modulo each prime ``q_j`` of the
modulus chain (in NTT form for CKKS, coefficient form for BFV; the same form on both sides). So
for any vector ``r``, ``<r, A> = sum_i <r, c_i> (mod q_j)`` when ``A = sum_i c_i``. If the
server hands the key holder some ``A' != A``, the difference ``D = A' - A`` is non-zero modulo
some ``q_j``, and for ``r`` with entries uniform in ``[0, 2**16)`` drawn *after* ``A'`` is
fixed, ``<r, D> = 0 (mod q_j)`` with probability at most ``2**-16`` (fix one non-zero entry of
``D``: at most one of its ``2**16`` coefficients in ``r`` cancels the rest). :data:`FUNCTIONALS`
independent functionals make that ``2**-128``. ``r`` is derived from a digest of ``A'`` itself
(Fiat–Shamir), so the server cannot fit ``A'`` to ``r``: each ``A'`` it tries draws a fresh
``r``.

**What a tag reveals.** ``<r, c> = <r_0, c_0> + <r_1, c_1>``; with ``c_0 = m + e - c_1 s``
(decryption) that is ``<r_0, m + e> + <r_1 - S^T r_0, c_1>``: a functional of the uniform (or
RLWE-pseudorandom) ``c_1`` masks the plaintext unless ``r_1 = S^T r_0``, which nobody can
arrange — ``r`` is a hash output and ``S`` the secret key. A key holder that sees the tags of
every contributor (and the aggregate) learns nothing about one contributor's input beyond the
sum; the server, which holds the ciphertexts themselves, learns nothing new at all.

**Coefficients.** The Python bindings expose no coefficient array, so :func:`coefficients`
inflates SEAL's own (zstd) serialisation with the zstd that SEAL's bindings are linked with
(``ZSTD_decompress`` of the loaded extension module) and reads the record SEAL writes: the
ciphertext's header fields, then its ``size * L * N`` 64-bit words. The stream must already
have passed :func:`~protocols.primitives.seal.check_stream` (the inflated size is bounded and
announced), i.e. come from SEAL or from the wire through a check.

**Exactness.** Entries of ``r`` below ``2**16`` and 20-bit limbs of the coefficients make every
partial sum of one row (at most ``2 * 32768`` products of ``2**36``) below ``2**53``, so the
products run as float64 matrix products (BLAS) and are exact; rows are combined modulo ``q_j``
in Python integers.
"""

from __future__ import annotations

import ctypes
import hashlib
import struct
import sys
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from ..errors import CiphertextError, ProtocolError
from .seal import _COMPR_NONE, _SEAL_HEADER, StreamLayout

__all__ = ["DIGEST_BYTES", "FUNCTIONALS", "TAG_BYTES", "Tags", "coefficients", "tag", "tag_bytes"]

FUNCTIONALS: Final = 8
"""Independent functionals: a wrong aggregate passes with probability at most ``2**-16`` each."""
DIGEST_BYTES: Final = 32
TAG_BYTES: Final = 8
"""Bytes of one tag value (one functional, one prime)."""
_ENTRY_BITS: Final = 16
_LIMB_BITS: Final = 20
_LIMBS: Final = 3
_RECORD_WORDS_OFFSET: Final = 32 + 1  # parms_id, is_ntt_form
_RECORD = struct.Struct("<QQQ")  # size, poly_modulus_degree, coeff_modulus_size

Tags = npt.NDArray[np.uint64]
"""``(FUNCTIONALS, L)``: per functional, per data prime, a value modulo that prime."""


@lru_cache(maxsize=1)
def _zstd() -> Any:
    """``ZSTD_decompress`` and ``ZSTD_isError`` from the library SEAL's bindings carry."""
    import tenseal.sealapi  # noqa: F401  (loads the extension module)

    module = sys.modules.get("_sealapi_cpp")
    path = getattr(module, "__file__", None)
    try:
        lib = ctypes.CDLL(path)
        decompress, is_error = lib.ZSTD_decompress, lib.ZSTD_isError
    except (OSError, AttributeError, TypeError):
        raise ProtocolError("SEAL's bindings carry no zstd: aggregates cannot be verified here") from None
    decompress.restype = ctypes.c_size_t
    decompress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    is_error.restype = ctypes.c_uint
    is_error.argtypes = [ctypes.c_size_t]
    return decompress, is_error


def coefficients(stream: bytes, layout: StreamLayout, *, degree: int, primes: int) -> npt.NDArray[np.uint64]:
    """The ``(2, primes, degree)`` coefficient words of a checked full (not seeded) ciphertext stream."""
    body = memoryview(stream)[_SEAL_HEADER.size:]
    if layout.compression == _COMPR_NONE:
        record = np.frombuffer(body, dtype=np.uint8)
    else:
        decompress, is_error = _zstd()
        record = np.empty(layout.inflated_size, dtype=np.uint8)
        got = decompress(record.ctypes.data, record.size, bytes(body), len(body))
        if is_error(got) or got != record.size:
            raise CiphertextError("ciphertext does not inflate to an honest record")
    count = 2 * primes * degree
    words = 8 * count
    if record.size < _RECORD_WORDS_OFFSET + _RECORD.size + words + 8:
        raise CiphertextError("ciphertext record too short")
    view = record.data
    size, n, levels = _RECORD.unpack_from(view, _RECORD_WORDS_OFFSET)
    (announced,) = struct.unpack_from("<Q", view, record.size - words - 8)
    if (size, n, levels, announced) != (2, degree, primes, count):
        raise CiphertextError("ciphertext record is not of the agreed shape")
    return np.frombuffer(record[record.size - words:].tobytes(), dtype="<u8").astype(np.uint64).reshape(2, primes,
                                                                                                        degree)


def _functionals(digest: bytes, index: int, shape: tuple[int, int, int]) -> npt.NDArray[np.float64]:
    """``(FUNCTIONALS, 2, L, N)`` entries in ``[0, 2**16)`` for ciphertext ``index``: AES-256-CTR
    keyed by the digest, the ciphertext's index as the counter's high half."""
    count = FUNCTIONALS * shape[0] * shape[1] * shape[2]
    key = hashlib.sha256(b"secure-fl/seal-tag-key\x00" + digest).digest()
    stream = Cipher(algorithms.AES(key), modes.CTR(index.to_bytes(8, "big") + bytes(8))).encryptor()
    entries = np.frombuffer(stream.update(bytes(2 * count)), dtype="<u2")
    return entries.astype(np.float64).reshape(FUNCTIONALS, *shape)


def tag(ciphertexts: Sequence[npt.NDArray[np.uint64]], primes: Sequence[int], digest: bytes) -> Tags:
    """``<r, c>`` modulo each data prime for every functional ``r`` drawn from ``digest``, over
    every ciphertext of a vector (each ``(2, L, N)`` words from :func:`coefficients`)."""
    if len(digest) != DIGEST_BYTES:
        raise ValueError(f"a tag digest is {DIGEST_BYTES} bytes")
    totals = [[0] * len(primes) for _ in range(FUNCTIONALS)]
    mask = (1 << _LIMB_BITS) - 1
    for index, words in enumerate(ciphertexts):
        if words.shape[1] != len(primes):
            raise CiphertextError("ciphertext has another number of primes than its parameters")
        r = _functionals(digest, index, words.shape)
        for j, q in enumerate(primes):
            row = words[:, j, :].reshape(-1)
            limbs = np.stack([(row >> np.uint64(_LIMB_BITS * b)) & np.uint64(mask) for b in range(_LIMBS)],
                             axis=1).astype(np.float64)
            sums = r[:, :, j, :].reshape(FUNCTIONALS, -1) @ limbs  # exact: every partial sum < 2**53
            for f in range(FUNCTIONALS):
                value = sum(int(sums[f, b]) << (_LIMB_BITS * b) for b in range(_LIMBS))
                totals[f][j] = (totals[f][j] + value) % q
    return np.array(totals, dtype=np.uint64).reshape(FUNCTIONALS, len(primes))


def tag_bytes(primes: int) -> int:
    """Bytes of one contributor's tags."""
    return FUNCTIONALS * primes * TAG_BYTES
