"""Shamir sharing over GF(2**256 + 297): the field, known answers, reconstruction, refusals, speed."""

import itertools
import secrets
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.errors import ThresholdError, WireError
from protocols.primitives import shamir
from protocols.primitives.shamir import PRIME, combine, lagrange_at_zero, split

SMALL_PRIMES = [p for p in range(2, 320) if all(p % q for q in range(2, int(p**0.5) + 1))]


def miller_rabin(n: int, bases=SMALL_PRIMES) -> bool:
    """Deterministic Miller-Rabin: fixed bases (the 66 primes below 320), no randomness.

    'composite' is always a proof; passing all 66 bases leaves a chance below 4**-66
    for any number not built against these bases."""
    if n < 2:
        return False
    for p in bases:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d //= 2
        r += 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def test_field_is_the_smallest_prime_above_2_256():
    assert PRIME == 2**256 + 297
    assert miller_rabin(PRIME)
    assert not any(miller_rabin(2**256 + k) for k in range(1, 297))
    assert miller_rabin(2**127 - 1) and not miller_rabin(2**128 + 1)  # the test itself works


def test_field_primality_cross_checked_with_gmpy2():
    gmpy2 = pytest.importorskip("gmpy2")
    assert gmpy2.is_prime(PRIME, 64)


def test_known_answer_shares(monkeypatch):
    # f(x) = s + (p - 1) x + (2**255 + 12345) x**2 over GF(p), s = 0x0102...20
    monkeypatch.setattr(shamir, "random_elements", lambda count: [2**255 + 12345, PRIME - 1][:count])
    secret = bytes(range(1, 33))
    ys = split(secret, [1, 2, 3, 7, 2**32 - 1], 3)
    assert ys == [
        0x8102030405060708090A0B0C0D0E0F101112131415161718191A1B1C1D1E4F58,
        0x102030405060708090A0B0C0D0E0F101112131415161718191A1B1C1D1EDDB0,
        0x8102030405060708090A0B0C0D0E0F101112131415161718191A1B1C1D1FCC7A,
        0x8102030405060708090A0B0C0D0E0F101112131415161718191A1B1C1D273E2A,
        0x8102030405060708090A0B0C0D0E0F1011121314151646BC9919BBD21D1E4F5A,
    ]
    assert combine([(7, ys[3]), (3, ys[2]), (2**32 - 1, ys[4])], 3) == secret


def test_known_answer_lagrange_coefficients():
    # For xs = 1, 2, 3: f(0) = 3 f(1) - 3 f(2) + f(3).
    assert lagrange_at_zero((1, 2, 3)) == (3, PRIME - 3, 1)


def test_every_threshold_subset_recovers_the_secret():
    secret = secrets.token_bytes(32)
    xs = [1, 5, 6, 9, 12, 40]
    ys = split(secret, xs, 3)
    points = list(zip(xs, ys))
    for subset in itertools.combinations(points, 3):
        assert combine(subset, 3) == secret
    assert combine(points, 3) == secret  # more than enough


def test_fewer_than_threshold_shares_refused():
    xs = list(range(1, 11))
    points = list(zip(xs, split(bytes(32), xs, 5)))
    with pytest.raises(ThresholdError):
        combine(points[:4], 5)


def interpolate(points, x):
    """Value at x of the polynomial through ``points`` (textbook Lagrange, independent of shamir.py)."""
    total = 0
    for i, (xi, yi) in enumerate(points):
        num, den = 1, 1
        for j, (xj, _) in enumerate(points):
            if j != i:
                num = num * (x - xj) % PRIME
                den = den * (xi - xj) % PRIME
        total += yi * num * pow(den, -1, PRIME)
    return total % PRIME


def test_t_minus_one_shares_are_consistent_with_every_secret():
    # Information-theoretic hiding: through t-1 shares and (0, c) passes a polynomial of
    # degree t-1 for every candidate c, so the shares alone cannot tell the secrets apart.
    xs = [2, 3, 4]
    known = list(zip(xs, split(secrets.token_bytes(32), xs + [8], 4)[:3]))
    for candidate in (bytes(32), b"\xff" * 32, secrets.token_bytes(32)):
        anchor = (0, int.from_bytes(candidate, "big"))
        completion = (8, interpolate([anchor, *known], 8))
        assert combine([*known, completion], 4) == candidate


def test_a_corrupted_share_never_yields_the_secret_silently():
    secret = b"\x01" * 32
    good = split(secret, [1, 2, 3], 3)
    try:
        assert combine([(1, good[0]), (2, good[1]), (3, (good[2] + 1) % PRIME)], 3) != secret
    except WireError:
        pass  # the result left the 32-byte range


def test_duplicate_and_out_of_field_values_refused():
    xs = [1, 2, 3]
    ys = split(bytes(32), xs, 2)
    with pytest.raises(WireError):
        combine([(1, ys[0]), (1, ys[0]), (3, ys[2])], 2)
    with pytest.raises(WireError):
        combine([(1, PRIME), (2, ys[1])], 2)
    with pytest.raises(WireError):
        combine([(0, ys[0]), (2, ys[1])], 2)
    with pytest.raises(WireError):
        combine([(PRIME, ys[0]), (2, ys[1])], 2)
    with pytest.raises(WireError):
        shamir.share_from_bytes(PRIME.to_bytes(33, "big"))
    with pytest.raises(WireError):
        shamir.share_from_bytes(b"\x00" * 32)
    with pytest.raises(ValueError):
        split(bytes(32), [1, 1, 2], 2)
    with pytest.raises(ValueError):
        split(bytes(31), [1, 2], 2)
    with pytest.raises(ValueError):
        split(bytes(32), [1, 2], 3)


def test_share_bytes_round_trip():
    for y in (0, 1, PRIME - 1, 2**256):
        data = shamir.share_to_bytes(y)
        assert len(data) == shamir.SHARE_BYTES and shamir.share_from_bytes(data) == y


@settings(max_examples=30, deadline=None)
@given(secret=st.binary(min_size=32, max_size=32), n=st.integers(1, 12), data=st.data())
def test_round_trip_property(secret, n, data):
    t = data.draw(st.integers(1, n))
    xs = data.draw(st.lists(st.integers(1, 2**32), min_size=n, max_size=n, unique=True))
    ys = split(secret, xs, t)
    chosen = data.draw(st.permutations(list(zip(xs, ys))))[:t]
    assert combine(chosen, t) == secret


def test_speed_of_100_shares_at_threshold_50():
    xs = list(range(1, 101))
    start = time.perf_counter()
    ys = split(secrets.token_bytes(32), xs, 50)
    split_s = time.perf_counter() - start
    lagrange_at_zero.cache_clear()
    start = time.perf_counter()
    combine(list(zip(xs, ys))[:50], 50)
    combine_s = time.perf_counter() - start
    # ~1 ms each on an idle core; generous bounds for loaded CI machines.
    assert split_s < 0.05 and combine_s < 0.05


# --- verified recovery: every share checked, bad ones located -----------------------------------------

def _shares(secret, n, t):
    xs = list(range(1, n + 1))
    return list(zip(xs, split(secret, xs, t)))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 24), data=st.data())
def test_recover_locates_every_correctable_error(n, data):
    t = data.draw(st.integers(1, n), label="t")
    secret = secrets.token_bytes(32)
    points = _shares(secret, n, t)
    errors = data.draw(st.sets(st.integers(0, n - 1), max_size=(n - t) // 2), label="errors")
    for i in errors:
        x, y = points[i]
        points[i] = (x, (y + data.draw(st.integers(1, PRIME - 1))) % PRIME)
    out = shamir.recover(points, t, verify=lambda s: s == secret)
    assert out.secret == secret
    assert set(out.bad) == {points[i][0] for i in errors}


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 16), data=st.data())
def test_recover_never_returns_a_wrong_secret(n, data):
    t = data.draw(st.integers(1, n), label="t")
    secret = secrets.token_bytes(32)
    points = _shares(secret, n, t)
    for i in data.draw(st.sets(st.integers(0, n - 1), min_size=1), label="errors"):
        points[i] = (points[i][0], data.draw(st.integers(0, PRIME - 1)))
    try:
        out = shamir.recover(points, t, verify=lambda s: s == secret)
    except shamir.ShareError:
        return
    assert out.secret == secret
    assert len(points) - len(out.bad) >= t


def test_recover_refuses_a_secret_that_misses_its_commitment():
    secret = secrets.token_bytes(32)
    points = _shares(secret, 5, 3)
    with pytest.raises(shamir.ShareError, match="other than the committed"):
        shamir.recover(points, 3, verify=lambda s: False)
    x, y = points[0]
    with pytest.raises(shamir.ShareError, match="no surplus"):
        shamir.recover([(x, (y + 1) % PRIME), *points[1:3]], 3, verify=lambda s: s == secret)
    with pytest.raises(ThresholdError):
        shamir.recover(points[:2], 3, verify=lambda s: True)
    with pytest.raises(WireError):
        shamir.recover([(1, PRIME), *points[1:]], 3, verify=lambda s: True)


def test_share_checker_catches_any_single_wrong_share():
    secret = secrets.token_bytes(32)
    points = _shares(secret, 30, 20)
    checker = shamir.ShareChecker(20)
    assert checker.consistent(points)
    for i in range(30):
        bad = list(points)
        bad[i] = (bad[i][0], (bad[i][1] + 1) % PRIME)
        assert not checker.consistent(bad)


def test_checking_every_share_is_cheap():
    """The server checks 100 secrets' 100 shares each (t = 67) in well under a second."""
    t, n = 67, 100
    sets = [_shares(secrets.token_bytes(32), n, t) for _ in range(20)]
    checker = shamir.ShareChecker(t)
    start = time.perf_counter()
    for points in sets * 5:
        shamir.recover(points, t, verify=lambda s: True, checker=checker)
    assert time.perf_counter() - start < 1.0


def _horner(coefficients, x):
    acc = 0
    for a in coefficients:
        acc = (acc * x + a) % PRIME
    return acc


@pytest.mark.parametrize("xs", [list(range(1, 102)), [1, 2, 3, 7, 2**32 - 1], [PRIME - 1, 2**200 + 7, 5]])
def test_split_many_is_horners_rule_modulo_p_for_each_secret(monkeypatch, xs):
    threshold = min(len(xs), 67)
    draws = [PRIME - 1, 0] + shamir.random_elements(3 * (threshold - 1))  # extremes first
    monkeypatch.setattr(shamir, "random_elements", lambda count: list(draws[:count]))
    secrets_ = [bytes(32), b"\xff" * 32, secrets.token_bytes(32)]
    shares = shamir.split_many(secrets_, xs, threshold)
    for i, secret in enumerate(secrets_):
        coefficients = draws[i * (threshold - 1) : (i + 1) * (threshold - 1)] + [int.from_bytes(secret, "big")]
        assert shares[i] == [_horner(coefficients, x) for x in xs]
        assert combine(list(zip(xs, shares[i])), threshold) == secret


def test_split_many_draws_fresh_polynomials_and_checks_every_secret():
    xs = list(range(1, 12))
    a, b = shamir.split_many([bytes(32), bytes(32)], xs, 6)
    assert a != b  # same secret, independent polynomials
    assert combine(list(zip(xs, a)), 6) == combine(list(zip(xs, b)), 6) == bytes(32)
    assert shamir.split_many([], xs, 6) == []
    with pytest.raises(ValueError):
        shamir.split_many([bytes(32), bytes(31)], xs, 6)
    with pytest.raises(ValueError):
        shamir.split_many([bytes(32)], xs, 12)


def test_random_elements_are_field_elements_of_full_width():
    values = shamir.random_elements(2000)
    assert len(values) == 2000 and len(set(values)) == 2000
    assert all(0 <= v < PRIME for v in values)
    # 257-bit draws below p: the top bit (2**256) is almost never set, bit 255 half the time.
    high = sum(v >> 255 & 1 for v in values)
    assert 850 < high < 1150
    assert shamir.random_elements(0) == []


def test_interpolation_weights_match_the_per_factor_reduction():
    """Exact products for small x-coordinates (one reduction) equal a reduction per factor."""
    import random

    from protocols.primitives.shamir import PRIME, _barycentric, lagrange_at_zero

    def naive_barycentric(xs):
        out = []
        for i, xi in enumerate(xs):
            d = 1
            for j, xj in enumerate(xs):
                if j != i:
                    d = d * (xi - xj) % PRIME
            out.append(pow(d, -1, PRIME))
        return tuple(out)

    def naive_lagrange(xs):
        out = []
        for i, xi in enumerate(xs):
            c = 1
            for j, xj in enumerate(xs):
                if j != i:
                    c = c * xj % PRIME * pow((xj - xi) % PRIME, -1, PRIME) % PRIME
            out.append(c)
        return tuple(out)

    rng = random.Random(3)
    for xs in ([1, 2, 3], list(range(1, 102)), rng.sample(range(1, 10**6), 40),
               [rng.randrange(1, PRIME) for _ in range(12)], [1, PRIME - 1, 2**200, 7]):
        xs = tuple(sorted(xs))
        assert _barycentric(xs) == naive_barycentric(xs)
        assert lagrange_at_zero(xs) == naive_lagrange(xs)
