"""Long-term signing identities: Ed25519 keys registered at set-up, and the directory of them.

A deployment registers one Ed25519 public key per party before any run (a PKI: Flower's
SuperNode authentication keys, or keys distributed with the run's configuration). Nothing in a
run can add or replace a directory entry: a key that arrives through the server is worth no
more than the server's word, so keys the protocols rely on against an active server are
*signed* with the registered ones.

Two uses:

* payload signatures — the active-server masking setting signs each client's advertised keys
  and its view of the survivors (Bonawitz et al.'s consistency round); signatures that other
  clients check travel inside the payload because the server relays them;
* envelope authentication (:class:`Authenticator`) — every envelope a party sends carries an
  Ed25519 signature over its header (protocol, stage, run id, sender, receiver) and a SHA-256
  digest of its payload, checked by the receiver against the directory. A tampered, forged,
  re-addressed or cross-run message is then one :class:`~protocols.errors.AuthenticationError`
  (or, for a replay within a run, the stage gate's :class:`~protocols.errors.ReplayError`)
  naming the sender.

Every verification failure is one opaque :class:`~protocols.errors.AuthenticationError` that
names the party whose key was used; signatures are never partially trusted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .errors import AuthenticationError, WireError
from .primitives import sodium
from .wire import SERVER, Envelope, PartyId, party_name

__all__ = [
    "PUBLIC_KEY_BYTES", "SIGNATURE_BYTES", "Authenticator", "Directory", "Identity", "make_identities",
]

PUBLIC_KEY_BYTES: Final = 32
SIGNATURE_BYTES: Final = 64
_ENVELOPE_DOMAIN: Final = b"secure-fl/envelope/v1"


class Identity:
    """One party's long-term signing key (it never leaves the party)."""

    def __init__(self, party: PartyId, key: Ed25519PrivateKey | None = None) -> None:
        self.party = party
        self._key = key if key is not None else Ed25519PrivateKey.generate()
        self.public_bytes = self._key.public_key().public_bytes(serialization.Encoding.Raw,
                                                                serialization.PublicFormat.Raw)

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)

    def __repr__(self) -> str:  # never the key
        return f"Identity({party_name(self.party)})"


class Directory(Mapping[PartyId, bytes]):
    """Party id → registered Ed25519 public key (32 bytes), fixed once built."""

    def __init__(self, keys: Mapping[PartyId, bytes]) -> None:
        self._raw: dict[PartyId, bytes] = {}
        for party, raw in keys.items():
            if not isinstance(raw, (bytes, bytearray)) or len(raw) != PUBLIC_KEY_BYTES:
                raise ValueError(f"{party_name(party)}'s key must be {PUBLIC_KEY_BYTES} raw bytes")
            Ed25519PublicKey.from_public_bytes(bytes(raw))  # refuses what is not an Ed25519 key
            self._raw[party] = bytes(raw)

    def __getitem__(self, party: PartyId) -> bytes:
        return self._raw[party]

    def __iter__(self) -> Iterator[PartyId]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def verify(self, party: PartyId, message: bytes, signature: bytes, *, what: str = "message") -> None:
        """Raise :class:`~protocols.errors.AuthenticationError` naming ``party`` unless
        ``signature`` is its registered key's signature of ``message``. Checked by libsodium
        (:mod:`.primitives.sodium`: as strict as OpenSSL and stricter on malformed input, about
        twice as fast — a masking client against an active server checks deg + t - 1 per run)."""
        key = self._raw.get(party)
        if key is None:
            raise AuthenticationError(f"{party_name(party)} has no registered key: its {what} cannot be verified")
        if len(signature) != SIGNATURE_BYTES:
            raise AuthenticationError(f"{party_name(party)}'s {what} carries no valid signature")
        if not sodium.verify(key, message, signature):
            raise AuthenticationError(f"{party_name(party)}'s {what} failed to verify")


def make_identities(parties: Iterable[PartyId], *, server: bool = True) -> tuple[dict[PartyId, Identity], Directory]:
    """Fresh identities for ``parties`` (and the server), and the directory of their public keys:
    what a deployment's registration step hands out (tests and the embedded harness)."""
    ids = [*parties, *([SERVER] if server else [])]
    identities = {pid: Identity(pid) for pid in ids}
    return identities, Directory({pid: identity.public_bytes for pid, identity in identities.items()})


@dataclass(frozen=True)
class Authenticator:
    """Envelope authentication for one party: signs what it sends (with ``identity``) and checks
    what it receives (against ``directory``).

    A party given an authenticator refuses every envelope that is not signed by the key the
    directory registers for its sender. The signature covers the envelope header (protocol,
    stage, run id, sender, receiver) and the SHA-256 digest of the payload (so a large masked
    vector is hashed once, at ~2 GB/s, and the Ed25519 signature is over 90 bytes).
    """

    identity: Identity
    directory: Directory

    def __post_init__(self) -> None:
        if self.directory.get(self.identity.party) != self.identity.public_bytes:
            raise ValueError(f"{party_name(self.identity.party)}'s identity is not the one the directory registers")

    @staticmethod
    def statement(env: Envelope) -> bytes:
        return b"".join((_ENVELOPE_DOMAIN, env.header_bytes(), hashlib.sha256(env.payload).digest()))

    def seal(self, env: Envelope) -> Envelope:
        """``env`` signed by this party (which must be its sender)."""
        if env.sender != self.identity.party:
            raise WireError(f"{party_name(self.identity.party)} cannot sign a message as {party_name(env.sender)}")
        unsigned = env.unsigned()
        return unsigned.with_signature(self.identity.sign(self.statement(unsigned)))

    def check(self, env: Envelope) -> Envelope:
        """The envelope, its signature verified; :class:`AuthenticationError` naming its sender otherwise."""
        stage = f"stage {env.stage} message"
        if not env.signature:
            raise AuthenticationError(f"{party_name(env.sender)}'s {stage} is not signed")
        self.directory.verify(env.sender, self.statement(env.unsigned()), env.signature, what=stage)
        return env
