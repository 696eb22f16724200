"""Key material of a masking run: X25519 keys, the HKDF seeds of the masks, the sealing context.

Every key and seed is fresh per run and bound to it: the HKDF ``info`` names the protocol,
the run and the parties, so a seed of one run (or one pair) never expands another's mask,
and a sealed share moved to another run, owner or holder fails to open.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from ..errors import WireError
from ..primitives import shamir, sodium
from ..primitives.channel import NONCE_BYTES, PUBLIC_KEY_BYTES, hkdf
from ..primitives.prg import SEED_BYTES
from ..wire import PROTOCOL_CODES, PartyId

__all__ = [
    "COMMITMENT_BYTES",
    "SEALED_SHARE_BYTES",
    "SHARE_PLAINTEXT_BYTES",
    "SHARE_PURPOSE",
    "advert_statement",
    "agree",
    "check_public",
    "consistency_statement",
    "load_public",
    "matches_commitment",
    "pair_seed",
    "raw_private",
    "raw_public",
    "seed_commitment",
    "self_seed",
    "share_associated",
]

SHARE_PLAINTEXT_BYTES: Final = 2 * shamir.SHARE_BYTES
"""One holder's share of the self-mask seed ``b`` and of the mask key ``s``."""
SEALED_SHARE_BYTES: Final = NONCE_BYTES + SHARE_PLAINTEXT_BYTES + 16
SHARE_PURPOSE: Final = b"masking-shares"
COMMITMENT_BYTES: Final = 32


def raw_public(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def raw_private(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                             serialization.NoEncryption())


def load_public(data: bytes) -> X25519PublicKey:
    if len(data) != PUBLIC_KEY_BYTES:
        raise WireError(f"an X25519 public key is {PUBLIC_KEY_BYTES} bytes, got {len(data)}")
    return X25519PublicKey.from_public_bytes(data)


def check_public(data: bytes) -> None:
    """Refuse keys that cannot agree a secret (low-order points) before anyone relies on them:
    :func:`~protocols.primitives.sodium.low_order`, the keys an exchange with any private key
    refuses, found without one."""
    if len(data) != PUBLIC_KEY_BYTES or sodium.low_order(data):
        raise WireError("not a usable X25519 public key")


def agree(private: bytes, public: bytes) -> bytes:
    """X25519 of a raw private key with a peer's raw public key (libsodium: the bytes
    ``X25519PrivateKey.exchange`` gives, cheaper per call); a key that agrees nothing (low order)
    is the peer's fault."""
    if len(public) != PUBLIC_KEY_BYTES:
        raise WireError(f"an X25519 public key is {PUBLIC_KEY_BYTES} bytes, got {len(public)}")
    try:
        return sodium.agree(private, public)
    except ValueError:
        raise WireError("key agreement with a peer's key failed") from None


def _u32(value: int) -> bytes:
    return value.to_bytes(4, "big")


def pair_seed(shared: bytes, *, protocol: str, run_id: bytes, u: PartyId, v: PartyId) -> bytes:
    """The PRG seed of the pairwise mask of ``u`` and ``v`` (symmetric in u, v)."""
    low, high = min(u, v), max(u, v)
    info = b"secure-fl/masking/pair/" + protocol.encode() + run_id + _u32(low) + _u32(high)
    return hkdf(shared, info=info, length=SEED_BYTES)


def self_seed(seed: bytes, *, protocol: str, run_id: bytes, owner: PartyId) -> bytes:
    """The PRG seed of ``owner``'s self mask, from its shared 32-byte secret ``b``."""
    info = b"secure-fl/masking/self/" + protocol.encode() + run_id + _u32(owner)
    return hkdf(seed, info=info, length=SEED_BYTES)


def seed_commitment(seed: bytes, *, protocol: str, run_id: bytes, owner: PartyId) -> bytes:
    """SHA-256 commitment to ``owner``'s self-mask seed ``b``, sent with its advertised keys.

    The server checks a seed rebuilt from revealed shares against it, so wrong shares give an
    error, never a wrong sum. ``b`` is 32 uniformly random bytes: the hash hides it.
    """
    return hashlib.sha256(b"secure-fl/masking/commit/" + protocol.encode() + run_id + _u32(owner) + seed).digest()


def matches_commitment(seed: bytes, commitment: bytes, *, protocol: str, run_id: bytes, owner: PartyId) -> bool:
    return hmac.compare_digest(seed_commitment(seed, protocol=protocol, run_id=run_id, owner=owner), commitment)


def _ids(ids: list[PartyId] | tuple[PartyId, ...]) -> bytes:
    return b"".join(_u32(pid) for pid in ids)


def advert_statement(protocol: str, run_id: bytes, owner: PartyId, channel_key: bytes, mask_key: bytes,
                     commitment: bytes) -> bytes:
    """What a client signs with its registered key when it advertises (active-server setting):
    its two fresh public keys and its seed commitment, bound to the run and to itself."""
    return (b"secure-fl/masking/advert/" + protocol.encode() + run_id + _u32(owner)
            + channel_key + mask_key + commitment)


def consistency_statement(protocol: str, run_id: bytes, advertised: tuple[PartyId, ...],
                          survivors: tuple[PartyId, ...]) -> bytes:
    """What a survivor signs in the consistency round: the advertised set (hence the graph) and
    the survivor set it was told. Every honest client signs one statement per run."""
    digest = hashlib.sha256(b"secure-fl/masking/consistency/" + protocol.encode() + run_id)
    digest.update(_u32(len(advertised)) + _ids(advertised))
    digest.update(_u32(len(survivors)) + _ids(survivors))
    return digest.digest()


def share_associated(protocol: str, run_id: bytes, owner: PartyId, holder: PartyId) -> bytes:
    """Associated data of the sealed shares ``owner`` gives ``holder`` in one run."""
    return run_id + bytes([PROTOCOL_CODES[protocol]]) + _u32(owner) + _u32(holder)
