"""Ed25519 verification and X25519 agreement on raw 32-byte keys, through libsodium (PyNaCl).

The same functions as pyca/cryptography's (RFC 8032 Ed25519 and RFC 7748 X25519 give one answer
for one input), only cheaper per call where a client makes hundreds of them in one run: a masking
client against an active server verifies ``deg`` advertisement signatures and ``t - 1``
consistency signatures, and agrees one pairwise mask seed per neighbour. Measured on the
project's 2-vCPU machine, one call each: Ed25519 verification ~76 µs here vs ~125–140 µs through
``Ed25519PublicKey.verify``; X25519 ~31 µs vs ~38–43 µs plus ~4 µs to load the peer's key.

* :func:`verify` is libsodium's ``crypto_sign_open``: it accepts every signature a correct
  signer makes, and it is *stricter* than OpenSSL on malformed input (it also refuses
  non-canonical and small-order public keys and ``R`` values), so a signature it accepts would
  be accepted by :meth:`~protocols.identity.Directory.verify` too.
* :func:`agree` is ``crypto_scalarmult`` (X25519): byte-identical to
  :meth:`X25519PrivateKey.exchange`, and refuses, as that does, a peer key whose product is the
  all-zero value (low-order points).
* :func:`x25519_private` and :func:`x25519_public` make a fresh key pair as
  :meth:`X25519PrivateKey.generate` does (32 bytes from the OS's CSPRNG, clamped as OpenSSL stores
  them; the public key is ``crypto_scalarmult_base``, byte-identical to OpenSSL's, ~17 µs against
  ~34 µs: libsodium uses a fixed-base table, OpenSSL a full ladder).
* :func:`low_order` says whether a public key is one of the points every X25519 agreement with it
  gives the all-zero value for (what an exchange with a throw-away key used to find out, by
  arithmetic on the encoding instead of a scalar multiplication).

Every length is checked here first: the C functions read exactly 32 (64) bytes.
"""

from __future__ import annotations

import secrets
from typing import Final

from nacl import exceptions as nacl_errors
from nacl.bindings import crypto_scalarmult, crypto_scalarmult_base, crypto_sign_open

__all__ = ["KEY_BYTES", "SIGNATURE_BYTES", "agree", "low_order", "verify", "x25519_private", "x25519_public"]

KEY_BYTES: Final = 32
SIGNATURE_BYTES: Final = 64

_FIELD: Final = 2**255 - 19
_LOW_ORDER_U: Final = frozenset({
    0, 1, _FIELD - 1,  # orders 2 and 4 (curve and twist)
    325606250916557431795983626356110631294008115727848805560023387167927233504,  # order 8
    39382357235489614581723060781553021112529911719440698176882885853963445705823,  # order 8
})
"""The u-coordinates of Curve25519's (and its twist's) points of order dividing 8: exactly the
public keys whose product with every clamped scalar (a multiple of 8 below the large prime
orders) is the point at infinity, encoded as the all-zero value. libsodium's own blacklist
(``has_small_order``) is these five and the non-canonical encodings of 0 and 1."""


def verify(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """Whether ``signature`` is the Ed25519 signature of ``message`` under ``public_key`` (raw)."""
    if len(public_key) != KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        crypto_sign_open(bytes(signature) + bytes(message), bytes(public_key))
    except (nacl_errors.BadSignatureError, nacl_errors.CryptoError, ValueError, TypeError):
        return False
    return True


def x25519_private() -> bytes:
    """A fresh X25519 private key: 32 bytes of the OS's CSPRNG, clamped (RFC 7748) as OpenSSL
    stores the keys :meth:`X25519PrivateKey.generate` makes."""
    key = bytearray(secrets.token_bytes(KEY_BYTES))
    key[0] &= 248
    key[31] = (key[31] & 127) | 64
    return bytes(key)


def x25519_public(private_key: bytes) -> bytes:
    """The public key of a raw X25519 private key (``crypto_scalarmult_base``: the bytes
    ``X25519PrivateKey.from_private_bytes(k).public_key()`` encodes, for any 32 bytes ``k``)."""
    if len(private_key) != KEY_BYTES:
        raise ValueError(f"X25519 keys are {KEY_BYTES} bytes")
    return crypto_scalarmult_base(bytes(private_key))


def low_order(public_key: bytes) -> bool:
    """Whether the raw X25519 public key agrees the all-zero value with every private key (a
    point of order dividing 8, in any encoding: the high bit is ignored and the coordinate is
    read modulo p, as RFC 7748 decodes it). Such a key is refused by :func:`agree` and by
    :meth:`X25519PrivateKey.exchange`; every other 32-byte string agrees a non-zero secret."""
    if len(public_key) != KEY_BYTES:
        raise ValueError(f"X25519 keys are {KEY_BYTES} bytes")
    u = int.from_bytes(public_key, "little") & ((1 << 255) - 1)
    return u % _FIELD in _LOW_ORDER_U


def agree(private_key: bytes, public_key: bytes) -> bytes:
    """X25519 of a raw private scalar and a raw peer public key; ``ValueError`` when the peer's
    key is unusable (wrong length, or a low-order point that agrees nothing)."""
    if len(private_key) != KEY_BYTES or len(public_key) != KEY_BYTES:
        raise ValueError(f"X25519 keys are {KEY_BYTES} bytes")
    try:
        shared = crypto_scalarmult(bytes(private_key), bytes(public_key))
    except (nacl_errors.CryptoError, ValueError, TypeError):
        raise ValueError("X25519 agreed the all-zero value (a low-order peer key)") from None
    if not any(shared):  # pragma: no cover - libsodium refuses these itself
        raise ValueError("X25519 agreed the all-zero value (a low-order peer key)")
    return shared
