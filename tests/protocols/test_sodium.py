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
