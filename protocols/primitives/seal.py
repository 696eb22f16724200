"""What the CKKS and BFV sums share on SEAL (through TenSEAL): the security table, the noise
constants, prime moduli, strict ciphertext framing, key sets and their (de)serialisation.

Hazardous layer: no protocol logic here. :mod:`protocols.primitives.ckks` and
:mod:`protocols.primitives.bfv` subclass :class:`PublicKeys` (encrypt with the public key, load
and add ciphertexts — never decrypt) and :class:`SecretKeys` (encrypt with the secret key,
decrypt).

**Security.** Every parameter set keeps 128-bit classical security: the total coefficient
modulus ``log2 Q`` (the special prime included) stays within :data:`MAX_COEFF_BITS_128`, the
HomomorphicEncryption.org Security Standard's table (Albrecht, Chase, Chen, Ding, Goldwasser,
Gorbunov, Halevi, Hoffstein, Laine, Lauter, Lokam, Micciancio, Moody, Morrison, Sahai,
Vaikuntanathan: *Homomorphic Encryption Security Standard*, HomomorphicEncryption.org, Toronto,
November 2018, https://homomorphicencryption.org/standard/ — the maximum ``log2 q`` per ring
degree ``N`` at 128-bit classical security for the ternary secrets SEAL samples, error
standard deviation 3.2). SEAL enforces the same table (``CoeffModulus::MaxBitCount(N,
sec_level_type::tc128)``; a test checks the two agree).

**What travels.** Per ciphertext, SEAL's own serialisation (zstd-compressed by SEAL), never
TenSEAL's vector protobuf: the receiver rebuilds that wrapper itself with the chunk length
(and CKKS scale) it expects, so a sender never controls the ``sizes``/``scale`` fields TenSEAL
trusts (a ``sizes`` entry above the slot count makes TenSEAL's decrypt read past its buffer).
A *fresh symmetric-key* ciphertext travels *seeded*: SEAL replaces its uniformly random second
polynomial by the 64-byte seed it was drawn from (SEAL re-expands it on load), halving the
ciphertext — which needs the secret key, so only a client that holds it encrypts that way.
Public-key ciphertexts and sums cannot be seeded.

Before TenSEAL/SEAL see a ciphertext, :func:`check_stream` validates SEAL's header and walks
the zstd frame's block headers, so the decompressed size is bounded by the size of an honest
ciphertext of the expected form (full or seeded; no decompression bombs), and the frame
announces exactly that size. SEAL's ``load`` then checks the metadata and that every
coefficient is reduced modulo its prime; anything TenSEAL or SEAL raise on bad input becomes
one :class:`~protocols.errors.CiphertextError`. Ciphertexts are malleable: a well-formed
ciphertext altered in transit is not detected here — integrity is the transport's job.

The Python bindings write a ciphertext only to a path: :func:`saved` hands SEAL an in-memory
file (``memfd``, or a private directory in ``/dev/shm`` / the temporary directory) and reads
the bytes back; ciphertexts only, never a key.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import hmac
import itertools
import os
import shutil
import struct
import tempfile
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar, Final

import numpy as np
import numpy.typing as npt
import tenseal as ts
from tenseal import sealapi

from ..errors import (
    CapacityError,
    CiphertextError,
    EncodingError,
    ForeignKeyError,
    ProtocolError,
    WireError,
)

TenSealVector = Any
"""A TenSEAL ``CKKSVector``/``BFVVector`` holding exactly one ciphertext (TenSEAL ships no type hints)."""

MAX_COEFF_BITS_128: Final = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}
"""Largest total coefficient modulus (bits, special prime included) keeping 128-bit classical
security, per ring degree N: the HomomorphicEncryption.org Security Standard (2018), ternary
secrets, sigma = 3.2 (see the module docstring). SEAL's ``CoeffModulus.MaxBitCount(N, tc128)``."""
RINGS: Final = tuple(sorted(MAX_COEFF_BITS_128))
MIN_PRIME_BITS: Final = 20
MAX_PRIME_BITS: Final = 60
"""SEAL's primes are at most 60 bits; below 20 bits too few are 1 mod 2N for the larger rings."""
NOISE_SIGMA: Final = 3.2
"""Standard deviation of SEAL's error distribution."""
NOISE_MAX: Final = 21
"""Largest absolute coefficient SEAL's error sampler draws: its centred binomial distribution
sums 21 coin differences (SEAL 4; the clipped normal of older SEAL stops at 6 sigma = 19.2)."""

FINGERPRINT_BYTES: Final = 16

_SEAL_MAGIC: Final = 0xA15E
_SEAL_HEADER = struct.Struct("<HBBBBHQ")  # magic, header size, major, minor, compr_mode, reserved, total size
_COMPR_NONE: Final = 0
_COMPR_ZSTD: Final = 2
_ZSTD_MAGIC: Final = b"\x28\xb5\x2f\xfd"
_ZSTD_BLOCK_MAX: Final = 1 << 17
_STREAM_SLACK: Final = 1024
"""Bytes a serialised ciphertext may exceed its uncompressed size by (zstd's framing)."""


# --- parameters -------------------------------------------------------------------------------------

def check_ring(poly_modulus_degree: object, coeff_mod_bit_sizes: tuple[int, ...]) -> None:
    """Refuse (``ValueError``) a ring or modulus chain outside what SEAL takes at 128-bit security."""
    n = poly_modulus_degree
    if not isinstance(n, int) or isinstance(n, bool) or n not in MAX_COEFF_BITS_128:
        raise ValueError(f"poly_modulus_degree must be one of {list(RINGS)}, got {n!r}")
    bits = coeff_mod_bit_sizes
    if len(bits) < 2:
        raise ValueError("coeff_mod_bit_sizes needs at least two primes (data primes plus the special prime)")
    if any(not isinstance(b, int) or isinstance(b, bool) or not MIN_PRIME_BITS <= b <= MAX_PRIME_BITS
           for b in bits):
        raise ValueError(f"each coefficient prime must have {MIN_PRIME_BITS} to {MAX_PRIME_BITS} bits, "
                         f"got {list(bits)}")
    if sum(bits) > MAX_COEFF_BITS_128[n]:
        raise ValueError(
            f"coefficient modulus of {sum(bits)} bits exceeds {MAX_COEFF_BITS_128[n]} bits, "
            f"the 128-bit-security limit for N = {n} (HomomorphicEncryption.org standard)"
        )


def split_bits(total: int) -> tuple[int, ...]:
    """``total`` bits of data modulus as the fewest primes of at most 60 bits, sizes as even as possible."""
    count = max(1, -(-total // MAX_PRIME_BITS))
    base, extra = divmod(total, count)
    return tuple(base + 1 if i < extra else base for i in range(count))


@lru_cache(maxsize=256)
def coeff_primes(poly_modulus_degree: int, bit_sizes: tuple[int, ...]) -> tuple[int, ...]:
    """The primes SEAL picks for ``bit_sizes`` (``CoeffModulus.Create``: deterministic, each 1 mod 2N)."""
    try:
        return tuple(int(m.value()) for m in sealapi.CoeffModulus.Create(poly_modulus_degree, list(bit_sizes)))
    except Exception as error:  # noqa: BLE001  (SEAL: not enough primes of that size)
        raise CapacityError(f"SEAL has no primes of {list(bit_sizes)} bits for N = {poly_modulus_degree}: "
                            f"{error}") from None


@lru_cache(maxsize=256)
def batching_prime(poly_modulus_degree: int, bits: int) -> int:
    """A prime of ``bits`` bits that is 1 mod 2N (``PlainModulus.Batching``: the largest one below 2**bits)."""
    try:
        return int(sealapi.PlainModulus.Batching(poly_modulus_degree, bits).value())
    except Exception as error:  # noqa: BLE001
        raise CapacityError(f"no {bits}-bit plaintext prime for N = {poly_modulus_degree}: {error}") from None


class SealParameters(ABC):
    """What :class:`PublicKeys` and :class:`SecretKeys` need of a parameter set (CKKS or BFV)."""

    poly_modulus_degree: int
    coeff_mod_bit_sizes: tuple[int, ...]
    scheme: ClassVar[str]

    @property
    @abstractmethod
    def values_per_ciphertext(self) -> int:
        """Entries of a vector one ciphertext carries."""

    def chunk_sizes(self, length: int) -> list[int]:
        per = self.values_per_ciphertext
        return [min(per, length - start) for start in range(0, length, per)]

    def chunks(self, length: int) -> int:
        return -(-length // self.values_per_ciphertext)

    @property
    def data_bits(self) -> int:
        """Bits of the modulus fresh ciphertexts live under (every prime but the special one)."""
        return sum(self.coeff_mod_bit_sizes[:-1])

    @property
    def special_bits(self) -> int:
        return self.coeff_mod_bit_sizes[-1]

    @abstractmethod
    def context(self) -> Any:
        """A fresh TenSEAL context (keys included) with exactly these parameters."""

    @abstractmethod
    def codec(self, seal: Any) -> Codec:
        """The scheme's batching of vector chunks into plaintexts, on a loaded SEAL context."""

    @abstractmethod
    def matches(self, parms: Any) -> bool:
        """Whether SEAL's ``EncryptionParameters`` of a loaded context are these (besides N and the moduli)."""

    @abstractmethod
    def to_bytes(self) -> bytes:
        """Canonical bytes (one parameter set, one encoding); also names its key set."""

    def probe_error(self) -> float:
        """How far the decryption of one fresh public-key encryption of small integers may be from them."""
        return 0.0


def fingerprint_of(public_context: bytes) -> bytes:
    return hashlib.sha256(b"secure-fl/seal-context\x00" + public_context).digest()[:FINGERPRINT_BYTES]


def check_fingerprint(expected: bytes, got: bytes) -> None:
    if not hmac.compare_digest(expected, got):
        raise ForeignKeyError("ciphertexts were made under another key set")


def generate(params: SealParameters) -> tuple[bytes, bytes]:
    """A fresh key pair as ``(public context, secret key)`` bytes.

    TenSEAL also makes relinearisation keys; they are never serialised, and no Galois keys
    are generated at all. The generating context is dropped on return.
    """
    ctx = params.context()
    public = ctx.serialize(save_public_key=True, save_secret_key=False, save_galois_keys=False,
                           save_relin_keys=False)
    secret = ctx.serialize(save_public_key=False, save_secret_key=True, save_galois_keys=False,
                           save_relin_keys=False)
    return bytes(public), bytes(secret)


def load_context(data: bytes, params: SealParameters) -> Any:
    """Deserialise a TenSEAL context and check it has exactly ``params``."""
    try:
        ctx = ts.context_from(bytes(data), n_threads=1)
        seal = ctx.seal_context().data
        parms = seal.first_context_data().parms()
        ok = (
            bool(seal.parameters_set())
            and int(parms.poly_modulus_degree()) == params.poly_modulus_degree
            and tuple(int(m.bit_count()) for m in parms.coeff_modulus()) == params.coeff_mod_bit_sizes[:-1]
            and tuple(int(m.bit_count()) for m in seal.key_context_data().parms().coeff_modulus())
            == params.coeff_mod_bit_sizes
            and params.matches(parms)
        )
    except Exception as error:  # noqa: BLE001  (TenSEAL, SEAL, protobuf raise assorted C++-mapped types)
        raise WireError(f"{params.scheme.upper()} context could not be loaded: {type(error).__name__}") from None
    if not ok:
        raise ForeignKeyError(f"the {params.scheme.upper()} context does not have the agreed parameters")
    return ctx


# --- SEAL streams and their framing -----------------------------------------------------------------

@dataclass(frozen=True)
class StreamLayout:
    """What an honest serialised ciphertext of one form (full or seeded) looks like."""

    version: tuple[int, int]
    compression: int
    inflated_size: int
    """Bytes of SEAL's uncompressed ciphertext record (the same for every ciphertext of the form)."""

    @property
    def max_stream(self) -> int:
        return _SEAL_HEADER.size + self.inflated_size + _STREAM_SLACK

    @property
    def uncompressed_size(self) -> int:
        """Bytes the same ciphertext takes with SEAL's ``compr_mode_type::none``."""
        return _SEAL_HEADER.size + self.inflated_size

    @classmethod
    def of(cls, stream: bytes) -> StreamLayout:
        magic, hsize, major, minor, compr, _, total = _SEAL_HEADER.unpack_from(stream)
        if magic != _SEAL_MAGIC or hsize != _SEAL_HEADER.size or total != len(stream):
            raise ProtocolError("TenSEAL produced an unexpected SEAL stream")
        body = memoryview(stream)[_SEAL_HEADER.size:]
        if compr == _COMPR_NONE:
            inflated = len(body)
        elif compr == _COMPR_ZSTD:
            inflated = _zstd_frame_size(body, expected=None)
        else:  # zlib: its decompressed size cannot be bounded before inflating
            raise ProtocolError(f"SEAL compression mode {compr} is not supported (build SEAL with zstd)")
        return cls((major, minor), compr, inflated)


def check_stream(layout: StreamLayout, stream: bytes) -> None:
    """Refuse a serialised ciphertext whose framing differs from an honest one, cheaply and
    before any decompression: SEAL header fields, and for zstd the frame header and every
    block header (which bound the decompressed size)."""
    if len(stream) < _SEAL_HEADER.size:
        raise WireError("ciphertext truncated: no SEAL header")
    if len(stream) > layout.max_stream:
        raise WireError(f"ciphertext of {len(stream)} bytes exceeds the {layout.max_stream} an honest one takes")
    magic, hsize, major, minor, compr, reserved, total = _SEAL_HEADER.unpack_from(stream)
    if magic != _SEAL_MAGIC or hsize != _SEAL_HEADER.size or reserved != 0:
        raise WireError("not a SEAL ciphertext (bad header)")
    if (major, minor) != layout.version or compr != layout.compression:
        raise WireError(f"SEAL stream version {major}.{minor}, compression {compr} is not this build's")
    if total != len(stream):
        raise WireError(f"SEAL header says {total} bytes, the ciphertext carries {len(stream)}")
    body = memoryview(stream)[_SEAL_HEADER.size:]
    if compr == _COMPR_NONE:
        if len(body) != layout.inflated_size:
            raise WireError("uncompressed ciphertext has the wrong size")
        return
    _zstd_frame_size(body, expected=layout.inflated_size)


def _zstd_frame_size(body: memoryview, *, expected: int | None) -> int:
    """Walk one zstd frame (RFC 8878) without decoding it; return its declared content size.

    Requires: one frame filling ``body`` exactly, no dictionary, a declared content size
    (equal to ``expected`` when given), and block headers whose decompressed sizes add up
    to at most twice that plus one block.
    """
    def need(pos: int, count: int) -> None:
        if pos + count > len(body):
            raise WireError("ciphertext truncated inside its zstd frame")

    need(0, 5)
    if bytes(body[:4]) != _ZSTD_MAGIC:
        raise WireError("ciphertext body is not a zstd frame")
    descriptor = body[4]
    fcs_flag, single, reserved, checksum, dict_flag = (
        descriptor >> 6, (descriptor >> 5) & 1, (descriptor >> 3) & 1, (descriptor >> 2) & 1, descriptor & 3,
    )
    if reserved or dict_flag:
        raise WireError("zstd frame uses reserved bits or a dictionary")
    pos = 5 + (0 if single else 1)
    fcs_bytes = {0: 1 if single else 0, 1: 2, 2: 4, 3: 8}[fcs_flag]
    if fcs_bytes == 0:
        raise WireError("zstd frame does not declare its content size")
    need(pos, fcs_bytes)
    content = int.from_bytes(body[pos : pos + fcs_bytes], "little") + (256 if fcs_bytes == 2 else 0)
    pos += fcs_bytes
    if expected is not None and content != expected:
        raise WireError(f"ciphertext inflates to {content} bytes, an honest one to {expected}")
    limit = 2 * content + _ZSTD_BLOCK_MAX
    produced = 0
    while True:
        need(pos, 3)
        header = int.from_bytes(body[pos : pos + 3], "little")
        pos += 3
        last, kind, size = header & 1, (header >> 1) & 3, header >> 3
        if kind == 0:  # raw
            need(pos, size)
            pos += size
            produced += size
        elif kind == 1:  # run-length: one byte repeated size times
            need(pos, 1)
            pos += 1
            produced += size
        elif kind == 2:  # compressed: at most one maximal block of output
            if size > _ZSTD_BLOCK_MAX:
                raise WireError("zstd block larger than the format allows")
            need(pos, size)
            pos += size
            produced += _ZSTD_BLOCK_MAX
        else:
            raise WireError("zstd block of the reserved type")
        if produced > limit:
            raise WireError("ciphertext would inflate beyond the size of an honest one")
        if last:
            break
    pos += 4 * checksum
    need(pos, 0)
    if pos != len(body):
        raise WireError(f"{len(body) - pos} bytes after the ciphertext's zstd frame")
    return content


# --- TenSEAL's vector protobufs, written and read by hand ---------------------------------------------

def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ProtocolError("malformed varint in a TenSEAL vector")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def wrap(stream: bytes, size: int, scale: float | None = None) -> bytes:
    """``CKKSVectorProto{sizes: [size], ciphertexts: [stream], scale}`` (``BFVVectorProto`` without scale)."""
    packed = _varint(size)
    parts = [b"\x0a", _varint(len(packed)), packed, b"\x12", _varint(len(stream)), stream]
    if scale is not None:
        parts += [b"\x19", struct.pack("<d", scale)]
    return b"".join(parts)


def unwrap(proto: bytes) -> bytes:
    """The single ciphertext stream of a TenSEAL vector protobuf we serialised ourselves."""
    data = memoryview(proto)
    pos, found = 0, []
    while pos < len(data):
        tag, pos = _read_varint(data, pos)
        wire = tag & 7
        if wire == 2:
            length, pos = _read_varint(data, pos)
            if tag >> 3 == 2:
                found.append(bytes(data[pos : pos + length]))
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 0:
            _, pos = _read_varint(data, pos)
        else:
            raise ProtocolError(f"unexpected protobuf wire type {wire} in a TenSEAL vector")
    if pos != len(data) or len(found) != 1:
        raise ProtocolError("a TenSEAL vector did not hold exactly one ciphertext")
    return found[0]


# --- serialising what the bindings only write to a path ---------------------------------------------

_COUNTER = itertools.count()
_SCRATCH: dict[int, str] = {}
_MEMFD = True
"""Whether SEAL can write through ``/proc/self/fd`` here (cleared after the first failure)."""


def _scratch_path() -> str:
    pid = os.getpid()
    directory = _SCRATCH.get(pid)
    if directory is None or not os.path.isdir(directory):
        shm = "/dev/shm"
        base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
        directory = _SCRATCH[pid] = tempfile.mkdtemp(prefix="secure-fl-seal-", dir=base)
        atexit.register(shutil.rmtree, directory, True)
    return os.path.join(directory, f"{threading.get_ident()}-{next(_COUNTER)}")


def saved(obj: Any) -> bytes:
    """SEAL's serialisation of a ciphertext or of a seeded ``Serializable`` one (ciphertexts only:
    the bytes pass through an in-memory file, see the module docstring)."""
    global _MEMFD
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None and _MEMFD and os.path.isdir("/proc/self/fd"):
        fd = memfd("secure-fl-seal", 0)
        try:
            obj.save(f"/proc/self/fd/{fd}")
            return os.pread(fd, os.fstat(fd).st_size, 0)
        except Exception:  # noqa: BLE001  (a /proc that cannot reopen the file: use a private directory)
            _MEMFD = False
        finally:
            os.close(fd)
    path = _scratch_path()
    try:
        obj.save(path)
        with open(path, "rb") as handle:
            return handle.read()
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


# --- key sets ---------------------------------------------------------------------------------------

@lru_cache(maxsize=64)
def layouts(params: SealParameters) -> tuple[StreamLayout, StreamLayout]:
    """(full, seeded) layouts of honest ciphertexts under ``params``, from a throwaway key pair
    (the server, which holds no secret key, still knows what a seeded upload looks like)."""
    ctx = params.context()
    seal = ctx.seal_context().data
    plain = params.codec(seal).encode_zeros()
    full = sealapi.Ciphertext()
    sealapi.Encryptor(seal, ctx.public_key().data).encrypt(plain, full)
    seeded = sealapi.Encryptor(seal, ctx.secret_key().data).encrypt_symmetric(plain)
    return StreamLayout.of(saved(full)), StreamLayout.of(saved(seeded))


class Codec(ABC):
    """Encodes one chunk of a vector into a SEAL plaintext and back (the scheme's batching)."""

    @abstractmethod
    def encode(self, chunk: npt.NDArray[Any]) -> Any:
        """A plaintext at the first data level holding ``chunk`` (at most ``values_per_ciphertext``)."""

    def encode_zeros(self) -> Any:
        return self.encode(np.zeros(1))

    @abstractmethod
    def decode(self, plain: Any, size: int) -> npt.NDArray[Any]:
        """The first ``size`` entries a plaintext holds."""

    @abstractmethod
    def vector(self, ctx: Any, stream: bytes, size: int) -> TenSealVector:
        """TenSEAL's vector of one checked stream (a wrapper we build ourselves)."""

    @abstractmethod
    def fresh(self, ct: Any, vector: TenSealVector, size: int) -> bool:
        """Whether a loaded ciphertext is what a fresh (or summed) one of these parameters is."""


class PublicKeys:
    """Parameters and public key: enough to encrypt, load and add, never to decrypt."""

    def __init__(self, data: bytes, params: SealParameters) -> None:
        ctx = load_context(data, params)
        if ctx.has_secret_key() or ctx.has_galois_keys() or ctx.has_relin_keys() or not ctx.has_public_key():
            raise ForeignKeyError(f"a public {params.scheme.upper()} context must hold the public key and nothing else")
        self.params = params
        self.data = bytes(data)
        self.fingerprint = fingerprint_of(self.data)
        self._ctx = ctx
        seal = ctx.seal_context().data
        self._parms_id = tuple(seal.first_parms_id())
        self._data_primes = len(params.coeff_mod_bit_sizes) - 1
        self._codec = params.codec(seal)
        self._encryptor = sealapi.Encryptor(seal, ctx.public_key().data)
        self.layout, self.seeded_layout = layouts(params)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(N={self.params.poly_modulus_degree}, fingerprint={self.fingerprint.hex()})"

    def _chunks(self, values: npt.NDArray[Any]) -> list[npt.NDArray[Any]]:
        if values.ndim != 1 or values.size == 0:
            raise EncodingError("a vector to encrypt must be one-dimensional and non-empty")
        per = self.params.values_per_ciphertext
        return [values[i : i + per] for i in range(0, values.size, per)]

    def encrypt(self, values: npt.NDArray[Any]) -> list[bytes]:
        """``ceil(d / values_per_ciphertext)`` serialised public-key ciphertexts."""
        out = []
        for chunk in self._chunks(values):
            ct = sealapi.Ciphertext()
            self._encryptor.encrypt(self._codec.encode(chunk), ct)
            out.append(saved(ct))
        return out

    def dump(self, vector: TenSealVector) -> bytes:
        """SEAL's serialisation of the one ciphertext in ``vector``."""
        return unwrap(bytes(vector.serialize()))

    def load(self, stream: bytes, size: int, *, seeded: bool = False, context: Any = None) -> TenSealVector:
        """A ciphertext of ``size`` entries from the wire, validated (``seeded``: the form a
        fresh symmetric-key ciphertext travels in); CiphertextError/WireError otherwise."""
        per = self.params.values_per_ciphertext
        if not 1 <= size <= per:
            raise WireError(f"a ciphertext holds 1 to {per} values, not {size}")
        check_stream(self.seeded_layout if seeded else self.layout, stream)
        try:
            vector = self._codec.vector(self._ctx if context is None else context, stream, size)
            (ct,) = vector.ciphertext()
            ok = (
                int(ct.size()) == 2
                and tuple(ct.parms_id()) == self._parms_id
                and int(ct.coeff_modulus_size()) == self._data_primes
                and self._codec.fresh(ct, vector, size)
            )
        except Exception as error:  # noqa: BLE001  (SEAL raises logic_error, invalid_argument)
            raise CiphertextError(f"ciphertext rejected by SEAL: {type(error).__name__}") from None
        if not ok:
            raise CiphertextError("ciphertext is not a fresh-level ciphertext of the agreed parameters")
        return vector

    def add_into(self, accumulator: list[TenSealVector], vectors: list[TenSealVector]) -> None:
        if len(accumulator) != len(vectors):
            raise CiphertextError("ciphertext counts differ")
        try:
            for acc, vec in zip(accumulator, vectors):
                acc.add_(vec)
        except Exception as error:  # noqa: BLE001  (TenSEAL add on foreign data)
            raise CiphertextError(f"ciphertexts could not be added: {type(error).__name__}") from None


class SecretKeys:
    """The secret key, bound to a public key set: encrypts symmetrically (seeded) and decrypts."""

    def __init__(self, data: bytes, public: PublicKeys) -> None:
        ctx = load_context(data, public.params)
        if not ctx.has_secret_key() or ctx.has_galois_keys() or ctx.has_relin_keys():
            raise ForeignKeyError(f"a {public.params.scheme.upper()} secret key must come alone")
        self.public = public
        self._ctx = ctx
        seal = ctx.seal_context().data
        key = ctx.secret_key().data
        self._codec = public.params.codec(seal)
        self._encryptor = sealapi.Encryptor(seal, key)
        self._decryptor = sealapi.Decryptor(seal, key)
        self._check_known_answer()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(<secret>, public={self.public!r})"

    def _check_known_answer(self) -> None:
        """The key must open what the public key seals."""
        probe = np.array([1, 0, 1, 1], dtype=np.uint64)  # within what any parameter set carries
        got, _ = self.open(self.public.encrypt(probe), [probe.size])
        tolerance = self.public.params.probe_error()
        if not np.all(np.abs(got.astype(np.float64) - probe.astype(np.float64)) <= tolerance):
            raise ForeignKeyError(f"the {self.public.params.scheme.upper()} secret key does not belong to the "
                                  "public context")

    def encrypt(self, values: npt.NDArray[Any]) -> list[bytes]:
        """Seeded symmetric-key ciphertexts: half the bytes of :meth:`PublicKeys.encrypt`, less noise."""
        return [saved(self._encryptor.encrypt_symmetric(self._codec.encode(chunk)))
                for chunk in self.public._chunks(values)]

    def open(self, streams: list[bytes], sizes: list[int]) -> tuple[npt.NDArray[Any], list[int]]:
        """The entries of full serialised ciphertexts, concatenated, and SEAL's invariant noise
        budget of each (BFV; 0 for CKKS, which has none)."""
        if len(streams) != len(sizes):
            raise CiphertextError("ciphertext count does not match the layout")
        parts, budgets = [], []
        for stream, size in zip(streams, sizes):
            vector = self.public.load(stream, size, context=self._ctx)
            try:
                (ct,) = vector.ciphertext()
                plain = sealapi.Plaintext()
                self._decryptor.decrypt(ct, plain)
                parts.append(self._codec.decode(plain, size))
                budgets.append(int(self._decryptor.invariant_noise_budget(ct))
                               if self.public.params.scheme == "bfv" else 0)
            except Exception as error:  # noqa: BLE001  (SEAL decrypt/decode)
                raise CiphertextError(f"ciphertext could not be decrypted: {type(error).__name__}") from None
        return np.concatenate(parts), budgets
