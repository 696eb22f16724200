import gmpy2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from phe import paillier as phe_paillier

from protocols.errors import CiphertextError, ForeignKeyError, ProtocolError
from protocols.paillier import ClientKeys
from protocols.primitives import paillier as raw


def test_textbook_known_answer():
    """n = 7 * 11, g = n + 1, m = 42, r = 23: c = (1 + n m) r^n mod n^2 = 3840."""
    pk = raw.PublicKey(77)
    c = raw.encrypt_with(pk, 42, raw.obfuscator(pk, 23))
    assert int(c) == 3840
    assert raw.PrivateKey(pk, 7, 11).decrypt(c) == 42


def test_known_answer_64_bit_primes():
    p, q = 1000000007, 998244353
    pk = raw.PublicKey(p * q)
    assert int(pk.n) == 998244359987710471
    c = raw.encrypt_with(pk, 123456789012, raw.obfuscator(pk, 987654321))
    assert int(c) == 508015191971451749999017089329803933
    assert raw.PrivateKey(pk, p, q).decrypt(c) == 123456789012


def test_agrees_with_phe_for_fixed_r(keypair_1024):
    pk, sk = keypair_1024
    phe_pk = phe_paillier.PaillierPublicKey(int(pk.n))
    r = 1234567891011121314151617181920
    m = 2**500 + 17
    assert int(raw.encrypt_with(pk, m, raw.obfuscator(pk, r))) == phe_pk.raw_encrypt(m, r_value=r)
    assert sk.decrypt(raw.encrypt_with(pk, m, raw.obfuscator(pk))) == m


def test_homomorphic_addition_and_pool(keypair_1024):
    pk, sk = keypair_1024
    pool = raw.ObfuscatorPool(pk)
    pool.fill(2)
    a = raw.encrypt_with(pk, 5, pool.take())
    b = raw.encrypt_with(pk, 7, pool.take())
    c = raw.encrypt_with(pk, 11, pool.take())  # pool empty: computed on demand
    assert (pool.hits, pool.misses) == (2, 1)
    assert sk.decrypt(raw.add(pk, raw.add(pk, a, b), c)) == 23
    assert a != raw.encrypt_with(pk, 5, raw.obfuscator(pk))  # randomised


def test_factored_obfuscator_known_answers():
    """The key holder's r^n through p^2 and q^2 is the same integer as r^n mod n^2."""
    assert int(raw.PrivateKey(raw.PublicKey(77), 7, 11).obfuscator(23)) == int(raw.obfuscator(raw.PublicKey(77), 23))
    p, q = 1000000007, 998244353
    pk = raw.PublicKey(p * q)
    assert int(raw.obfuscator(pk, 987654321, private_key=raw.PrivateKey(pk, p, q))) \
        == int(raw.obfuscator(pk, 987654321))
    c = raw.encrypt_with(pk, 123456789012, raw.PrivateKey(pk, q, p).obfuscator(987654321))
    assert int(c) == 508015191971451749999017089329803933  # test_known_answer_64_bit_primes's vector


@settings(max_examples=50, deadline=None)
@given(r=st.integers(min_value=1, max_value=2**1024))
def test_factored_obfuscator_equals_the_public_one(keypair_1024, r):
    pk, sk = keypair_1024
    r = r % int(pk.n) or 1
    if gmpy2.gcd(r, pk.n) == 1:
        assert sk.obfuscator(r) == raw.obfuscator(pk, r)


def test_factored_obfuscator_refuses_a_non_unit(keypair_1024):
    _, sk = keypair_1024
    p, _ = sk.export_secret()
    with pytest.raises(ProtocolError, match="unit"):
        sk.obfuscator(p)


def test_pool_with_the_key_makes_valid_fresh_obfuscators(keypair_1024):
    pk, sk = keypair_1024
    pool = raw.ObfuscatorPool(pk)
    pool.private_key = sk
    pool.fill(2)
    values = [pool.take(), pool.take(), pool.take()]  # the third computed on demand
    assert len(set(map(int, values))) == 3
    assert sk.decrypt(raw.product(pk, [raw.encrypt_with(pk, m, v) for m, v in zip((1, 2, 3), values)])) == 6
    _, other_sk = raw.generate_keypair(512, allow_weak=True)
    with pytest.raises(ForeignKeyError):
        raw.obfuscator(pk, private_key=other_sk)


def test_a_key_holding_client_fills_its_pool_with_its_key(keypair_1024):
    pk, sk = keypair_1024
    keys = ClientKeys(pk)
    keys.private_key = sk
    assert keys.pool.private_key is sk
    with pytest.raises(ForeignKeyError):
        keys.private_key = raw.generate_keypair(512, allow_weak=True)[1]
    assert keys.private_key is sk


def test_ciphertext_checks(keypair_1024):
    pk, _ = keypair_1024
    for bad in (0, pk.n_square, pk.n_square + 5, -3):
        with pytest.raises(CiphertextError):
            raw.check_ciphertext(pk, bad)
    with pytest.raises(CiphertextError):
        raw.check_ciphertext(pk, pk.n)  # shares a factor with n: not a unit
    with pytest.raises(ForeignKeyError):
        raw.check_key(pk, b"\x00" * raw.FINGERPRINT_BYTES)


def test_weak_keys_refused_outside_tests():
    with pytest.raises(ProtocolError):
        raw.generate_keypair(1024)
    with pytest.raises(ProtocolError):
        raw.generate_keypair(256, allow_weak=True)


def test_private_key_repr_hides_secret(keypair_1024):
    pk, sk = keypair_1024
    p, q = sk.export_secret()
    assert str(p) not in repr(sk) and str(q) not in repr(sk)
    assert gmpy2.mpz(p) * q == pk.n
