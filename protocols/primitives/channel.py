"""Authenticated client-to-client channels relayed by an untrusted server.

X25519 key agreement, HKDF-SHA256 key derivation bound to a context label, and
ChaCha20-Poly1305 sealing with the associated data naming sender, receiver and
purpose — so a sealed message moved to another receiver or purpose fails to open.
All decryption failures map to one opaque :class:`AuthenticationError`.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..errors import AuthenticationError, WireError
from . import sodium

PUBLIC_KEY_BYTES = 32
NONCE_BYTES = 12


def hkdf(secret: bytes, *, info: bytes, length: int = 32, salt: bytes | None = None) -> bytes:
    """HKDF-SHA256 (RFC 5869), pyca/cryptography's."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(secret)


class ChannelKey:
    """A party's long-term X25519 key for one protocol run."""

    def __init__(self) -> None:
        self._private = sodium.x25519_private()
        self._aeads: dict[tuple[bytes, bytes], ChaCha20Poly1305] = {}
        self.public_bytes = sodium.x25519_public(self._private)

    def shared_secret(self, peer_public: bytes) -> bytes:
        """X25519 with ``peer_public`` (libsodium: the same bytes as ``X25519PrivateKey.exchange``,
        cheaper per call); ``ValueError`` for a low-order peer key, as that raises."""
        if len(peer_public) != PUBLIC_KEY_BYTES:
            raise WireError(f"an X25519 public key is {PUBLIC_KEY_BYTES} bytes, got {len(peer_public)}")
        return sodium.agree(self._private, bytes(peer_public))

    def __repr__(self) -> str:
        return f"ChannelKey(public={self.public_bytes.hex()[:16]}…)"


def load_public(data: bytes) -> X25519PublicKey:
    if len(data) != PUBLIC_KEY_BYTES:
        raise WireError(f"an X25519 public key is {PUBLIC_KEY_BYTES} bytes, got {len(data)}")
    return X25519PublicKey.from_public_bytes(data)


def _aead(key: ChannelKey, peer_public: bytes, purpose: bytes) -> ChaCha20Poly1305:
    """One key agreement per (peer, purpose); later messages on the channel reuse the derived key."""
    cached = key._aeads.get((peer_public, purpose))
    if cached is None:
        cached = ChaCha20Poly1305(hkdf(key.shared_secret(peer_public), info=b"secure-fl/channel/" + purpose))
        key._aeads[(peer_public, purpose)] = cached
    return cached


def seal(key: ChannelKey, peer_public: bytes, plaintext: bytes, *, associated: bytes, purpose: bytes) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    return nonce + _aead(key, peer_public, purpose).encrypt(nonce, plaintext, associated)


def open_sealed(key: ChannelKey, peer_public: bytes, sealed: bytes, *, associated: bytes, purpose: bytes) -> bytes:
    if len(sealed) < NONCE_BYTES + 16:
        raise AuthenticationError("sealed message failed to open")
    try:
        return _aead(key, peer_public, purpose).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], associated)
    except (InvalidTag, ValueError):
        raise AuthenticationError("sealed message failed to open") from None
