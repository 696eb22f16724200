"""libsodium's Ed25519 verification and X25519 agreement agree with pyca/cryptography's."""

import os

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from protocols.primitives import sodium
from protocols.primitives.channel import ChannelKey

LOW_ORDER = [
    bytes(32),
    (1).to_bytes(32, "little"),
    bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),
    bytes.fromhex("5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157"),
    bytes.fromhex("ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f"),
]


def test_agree_is_x25519_exchange_byte_for_byte():
    for _ in range(50):
        mine, theirs = X25519PrivateKey.generate(), X25519PrivateKey.generate()
        peer = theirs.public_key().public_bytes_raw()
        assert sodium.agree(mine.private_bytes_raw(), peer) == mine.exchange(theirs.public_key())
    key = X25519PrivateKey.generate()
    for _ in range(200):  # arbitrary 32-byte strings, high bit and non-canonical values included
        peer = os.urandom(32)
        try:
            expected = key.exchange(X25519PublicKey.from_public_bytes(peer))
        except ValueError:
            expected = None
        try:
            got = sodium.agree(key.private_bytes_raw(), peer)
        except ValueError:
            got = None
        assert got == expected


@pytest.mark.parametrize("point", LOW_ORDER)
def test_agree_refuses_low_order_points_as_cryptography_does(point):
    key = X25519PrivateKey.generate()
    with pytest.raises(ValueError):
        key.exchange(X25519PublicKey.from_public_bytes(point))
    with pytest.raises(ValueError):
        sodium.agree(key.private_bytes_raw(), point)


def test_agree_refuses_wrong_lengths():
    key = X25519PrivateKey.generate().private_bytes_raw()
    for bad in (b"", bytes(31), bytes(33)):
        with pytest.raises(ValueError):
            sodium.agree(key, bad)
        with pytest.raises(ValueError):
            sodium.agree(bad, bytes(32))


def test_channel_keys_agree_both_ways():
    a, b = ChannelKey(), ChannelKey()
    assert a.shared_secret(b.public_bytes) == b.shared_secret(a.public_bytes)


def test_verify_accepts_exactly_the_signers_signature():
    key = Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes_raw()
    message = os.urandom(90)
    signature = key.sign(message)
    assert sodium.verify(public, message, signature)
    other = Ed25519PrivateKey.generate().public_key().public_bytes_raw()
    assert not sodium.verify(other, message, signature)
    assert not sodium.verify(public, message + b"\0", signature)
    for i in (0, 31, 32, 63):
        flipped = bytearray(signature)
        flipped[i] ^= 1
        assert not sodium.verify(public, message, bytes(flipped))
    assert not sodium.verify(public, message, signature[:63])
    assert not sodium.verify(public[:31], message, signature)
    assert not sodium.verify(public, message, bytes(64))
    # S = L + s (non-canonical) is refused
    order = 2**252 + 27742317777372353535851937790883648493
    s = int.from_bytes(signature[32:], "little")
    assert not sodium.verify(public, message, signature[:32] + (s + order).to_bytes(32, "little"))


def test_key_pairs_are_cryptographys_byte_for_byte():
    for _ in range(50):
        private = sodium.x25519_private()
        assert private[0] & 7 == 0 and private[31] >> 6 == 1  # clamped, as OpenSSL stores keys
        expected = X25519PrivateKey.from_private_bytes(private).public_key().public_bytes_raw()
        assert sodium.x25519_public(private) == expected
    for _ in range(50):  # any 32 bytes: both clamp before multiplying
        raw = os.urandom(32)
        assert sodium.x25519_public(raw) == X25519PrivateKey.from_private_bytes(raw).public_key().public_bytes_raw()
    assert len({sodium.x25519_private() for _ in range(100)}) == 100
    for bad in (b"", bytes(31), bytes(33)):
        with pytest.raises(ValueError):
            sodium.x25519_public(bad)


def _encodings(point: bytes) -> list[bytes]:
    """``point`` with the ignored high bit set too, and its non-canonical encoding (u + p) where
    one fits in 255 bits."""
    u = int.from_bytes(point, "little")
    out = [point, (u | 1 << 255).to_bytes(32, "little")]
    if u + 2**255 - 19 < 2**255:
        out += [(u + 2**255 - 19).to_bytes(32, "little"), (u + 2**255 - 19 | 1 << 255).to_bytes(32, "little")]
    return out


@pytest.mark.parametrize("point", LOW_ORDER)
def test_low_order_finds_every_encoding_of_the_low_order_points(point):
    key = X25519PrivateKey.generate()
    for encoding in _encodings(point):
        assert sodium.low_order(encoding)
        with pytest.raises(ValueError):
            key.exchange(X25519PublicKey.from_public_bytes(encoding))


def test_low_order_is_exactly_what_an_exchange_refuses():
    key = X25519PrivateKey.generate()
    near = [(u + d) % 2**256 for u in (0, 1, 2**255 - 20, 2**255 - 19, 2**255 - 1) for d in (-2, -1, 0, 1, 2)]
    candidates = [os.urandom(32) for _ in range(300)] + [u.to_bytes(32, "little") for u in near]
    candidates += [ChannelKey().public_bytes for _ in range(20)]
    for public in candidates:
        try:
            key.exchange(X25519PublicKey.from_public_bytes(public))
            refused = False
        except ValueError:
            refused = True
        assert sodium.low_order(public) == refused, public.hex()
    with pytest.raises(ValueError):
        sodium.low_order(bytes(31))


def test_hkdf_is_cryptographys_byte_for_byte():
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    from protocols.primitives.channel import hkdf

    for n in range(300):
        secret, info, length = os.urandom(n % 97), os.urandom(n % 61), 1 + n % 48
        salt = os.urandom(16) if n % 5 == 0 else None
        expected = HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(secret)
        assert hkdf(secret, info=info, length=length, salt=salt) == expected
    # RFC 5869, test case 3 (no salt, no info), its first 32 bytes
    okm = bytes.fromhex("8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d")
    assert hkdf(bytes([0x0B]) * 22, info=b"", length=32) == okm
