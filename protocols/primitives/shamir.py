"""Shamir secret sharing of 32-byte secrets over the prime field GF(2**256 + 297).

Hazardous: shares are bare field elements; authenticity comes from the channel that
carries them (the masking protocol seals each share with an AEAD). A share revealed over an
unauthenticated path (or by a lying holder) is caught by :func:`recover`, which checks every
share it is given: all of them must lie on one polynomial of degree ``threshold - 1`` (the
shares form a Reed-Solomon codeword), and the secret they give must pass the caller's check
against a commitment. Shares off the polynomial are located (Gao's decoder, up to
``(r - threshold) // 2`` of ``r`` shares) and named; the secret is then exact or the call
raises :class:`~protocols.errors.ShareError`, never a wrong secret.

* ``PRIME = 2**256 + 297`` is the smallest prime above ``2**256``, so every 32-byte
  secret (an integer below ``2**256``) is a field element and a share fits 33 bytes.
* A secret is the constant term of a random polynomial of degree ``threshold - 1``
  whose other coefficients come from :mod:`secrets`; party ``i`` holds the value at
  ``x = i + 1`` (x = 0 would be the secret itself).
* Any ``threshold`` shares recover the secret by Lagrange interpolation at 0; fewer
  reveal nothing about it (information-theoretically).

Arithmetic is Python's arbitrary-precision integers and not constant-time; the
secrets shared here are per-round keys and the timing of a modular reduction is not
observable by the parties that see shares.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

from ..errors import ShareError, ThresholdError, WireError

PRIME: Final = (1 << 256) + 297
SECRET_BYTES: Final = 32
SHARE_BYTES: Final = 33
"""A share value is below PRIME, which needs 257 bits."""

Point = tuple[int, int]
"""A share: (x, y) with 1 <= x < PRIME and 0 <= y < PRIME."""


def _check_xs(xs: Sequence[int], error: type[Exception]) -> None:
    for x in xs:
        if not isinstance(x, int) or isinstance(x, bool) or not 1 <= x < PRIME:
            raise error(f"a share's x-coordinate must be an integer in [1, p), got {x!r}")
    if len(set(xs)) != len(xs):
        raise error("duplicate x-coordinates among shares")


def split(secret: bytes, xs: Sequence[int], threshold: int) -> list[int]:
    """Share ``secret`` so that any ``threshold`` of the points ``(x, y)`` recover it.

    Returns the y-values in the order of ``xs``.
    """
    return split_many([secret], xs, threshold)[0]


def split_many(secrets_: Sequence[bytes], xs: Sequence[int], threshold: int) -> list[list[int]]:
    """Share each secret of ``secrets_`` among the same points ``xs`` (each with its own random
    polynomial, drawn in order): ``[split(s, xs, threshold) for s in secrets_]``, faster.

    The party ids' x-coordinates are small, so the polynomials are evaluated exactly over the
    integers (no reduction until the end: ``f(x) < p * x**t``) and side by side, one lane of
    a packed integer each (every coefficient and value is non-negative, so lanes never carry
    into each other). The shares are the same field elements as Horner's rule modulo ``p``.
    """
    for secret in secrets_:
        if not isinstance(secret, (bytes, bytearray)) or len(secret) != SECRET_BYTES:
            raise ValueError(f"a secret is exactly {SECRET_BYTES} bytes")
    _check_xs(xs, ValueError)
    if not isinstance(threshold, int) or not 1 <= threshold <= len(xs):
        raise ValueError(f"threshold must be in [1, {len(xs)}] for {len(xs)} shares, got {threshold!r}")
    # Highest-degree coefficient first, the secret last: Horner's rule.
    randoms = random_elements((threshold - 1) * len(secrets_))
    polynomials = []
    for i, secret in enumerate(secrets_):
        coefficients = randoms[i * (threshold - 1) : (i + 1) * (threshold - 1)]
        coefficients.append(int.from_bytes(secret, "big"))
        polynomials.append(coefficients)
    p = PRIME
    if not polynomials:
        return []
    largest = max(xs)
    if largest.bit_length() > 32:  # pragma: no cover - party ids are 32-bit
        return [[_horner_mod(coefficients, x) for x in xs] for coefficients in polynomials]
    # f(x) < p * max(x**t, t): the bits of one lane.
    width = p.bit_length() + threshold * largest.bit_length() + threshold.bit_length() + 1
    packed = [sum(c << (k * width) for k, c in enumerate(column)) for column in zip(*polynomials)]
    mask = (1 << width) - 1
    ys: list[list[int]] = [[] for _ in polynomials]
    for x in xs:
        acc = 0
        for a in packed:
            acc = acc * x + a
        for k, out in enumerate(ys):
            out.append((acc >> (k * width) & mask) % p)
    return ys


_DRAW_BYTES: Final = 33
_DRAW_MASK: Final = (1 << PRIME.bit_length()) - 1


def random_elements(count: int) -> list[int]:
    """``count`` independent uniform field elements from the OS's CSPRNG (:func:`secrets.token_bytes`):
    257-bit draws, rejecting those >= ``p`` (about half), as :func:`secrets.randbelow` does, but
    drawn in bulk rather than one system call per draw."""
    out: list[int] = []
    while len(out) < count:
        pool = secrets.token_bytes(_DRAW_BYTES * (2 * (count - len(out)) + 4))
        for i in range(0, len(pool), _DRAW_BYTES):
            value = int.from_bytes(pool[i : i + _DRAW_BYTES], "big") & _DRAW_MASK
            if value < PRIME:
                out.append(value)
                if len(out) == count:
                    break
    return out


def _horner_mod(coefficients: Sequence[int], x: int) -> int:
    acc = 0
    for a in coefficients:
        acc = (acc * x + a) % PRIME
    return acc


@lru_cache(maxsize=256)
def lagrange_at_zero(xs: tuple[int, ...]) -> tuple[int, ...]:
    """Coefficients c_i with f(0) = sum(c_i * f(x_i)) for any f of degree < len(xs).

    Cached: the masking server reconstructs many secrets from the same set of holders.
    """
    _check_xs(xs, WireError)
    p = PRIME
    count = len(xs)
    exact = _exact(xs)
    numerator = _product(xs, exact)
    # c_i = prod_{j != i} x_j / (x_j - x_i) = (numerator / x_i) / prod_{j != i} (x_j - x_i)
    denominators = [_product([xi, *[xj - xi for xj in xs if xj != xi]], exact) for xi in xs]
    # One inversion for all denominators (Montgomery's trick).
    prefix = [1] * (count + 1)
    for i, d in enumerate(denominators):
        prefix[i + 1] = prefix[i] * d % p
    inverse = pow(prefix[count], -1, p)
    inverses = [0] * count
    for i in range(count - 1, -1, -1):
        inverses[i] = inverse * prefix[i] % p
        inverse = inverse * denominators[i] % p
    return tuple(numerator * inv % p for inv in inverses)


def _checked_points(points: Iterable[Point], threshold: int) -> list[Point]:
    if not isinstance(threshold, int) or threshold < 1:
        raise ValueError(f"threshold must be a positive integer, got {threshold!r}")
    pts = sorted(points)
    _check_xs([x for x, _ in pts], WireError)
    for _, y in pts:
        if not isinstance(y, int) or isinstance(y, bool) or not 0 <= y < PRIME:
            raise WireError("a share value lies outside the field")
    if len(pts) < threshold:
        raise ThresholdError(f"{len(pts)} shares cannot recover a secret shared with threshold {threshold}")
    return pts


def combine(points: Iterable[Point], threshold: int) -> bytes:
    """Recover the 32-byte secret from at least ``threshold`` shares.

    Uses the ``threshold`` points with the smallest x. Raises
    :class:`~protocols.errors.ThresholdError` when too few shares are given and
    :class:`~protocols.errors.WireError` for duplicate or out-of-field values.
    """
    pts = _checked_points(points, threshold)
    chosen = pts[:threshold]
    coefficients = lagrange_at_zero(tuple(x for x, _ in chosen))
    p = PRIME
    value = 0
    for (_, y), c in zip(chosen, coefficients):
        value += y * c
    value %= p
    if value >> (8 * SECRET_BYTES):
        raise WireError("the shares do not combine to a 32-byte secret")
    return value.to_bytes(SECRET_BYTES, "big")


# --- verified recovery ------------------------------------------------------------------------

@dataclass(frozen=True)
class Recovery:
    """A secret recovered from shares that all agreed with it, except those at ``bad``."""

    secret: bytes
    bad: tuple[int, ...]
    """x-coordinates of the shares that do not lie on the secret's polynomial (left out)."""


_EXACT_BITS: Final = 4096
"""Products of factors this small in total are formed exactly and reduced once."""


def _exact(xs: Sequence[int]) -> bool:
    """Whether products of up to ``len(xs)`` of the x-coordinates (or their differences) stay
    below :data:`_EXACT_BITS` bits: party ids make a few hundred."""
    return max(xs).bit_length() * len(xs) <= _EXACT_BITS


def _product(factors: Sequence[int], exact: bool) -> int:
    """``prod(factors) mod p``: over the integers and reduced once when ``exact`` (small
    factors: far cheaper than a reduction per factor), else reduced as it goes."""
    if exact:
        return math.prod(factors) % PRIME
    product = 1
    for f in factors:
        product = product * f % PRIME
    return product


def _batch_inverse(values: Sequence[int]) -> list[int]:
    p = PRIME
    prefix = [1] * (len(values) + 1)
    for i, v in enumerate(values):
        prefix[i + 1] = prefix[i] * v % p
    inverse = pow(prefix[-1], -1, p)
    out = [0] * len(values)
    for i in range(len(values) - 1, -1, -1):
        out[i] = inverse * prefix[i] % p
        inverse = inverse * values[i] % p
    return out


@lru_cache(maxsize=256)
def _barycentric(xs: tuple[int, ...]) -> tuple[int, ...]:
    """``u_i = 1 / prod_{j != i} (x_i - x_j)``."""
    exact = _exact(xs)
    return tuple(_batch_inverse([_product([xi - xj for xj in xs if xj != xi], exact) for xi in xs]))


class ShareChecker:
    """Tests whether shares lie on one polynomial of degree below ``threshold``.

    ``r`` points do exactly when their values satisfy the ``r - threshold`` parity checks of
    the dual (generalised Reed-Solomon) code, ``sum_i u_i x_i^j y_i = 0`` for
    ``0 <= j < r - threshold``. One random combination of those checks (coefficients drawn
    from :mod:`secrets` per checker, never revealed) costs ``r`` multiplications per secret
    and misses an inconsistent set with probability ``1/p``. Keep one checker per run: the
    combined coefficients are cached per set of holders.
    """

    def __init__(self, threshold: int) -> None:
        if not isinstance(threshold, int) or threshold < 1:
            raise ValueError(f"threshold must be a positive integer, got {threshold!r}")
        self.threshold = threshold
        self._lambdas: list[int] = []
        self._weights: dict[tuple[int, ...], tuple[int, ...]] = {}

    def _combined(self, xs: tuple[int, ...]) -> tuple[int, ...]:
        weights = self._weights.get(xs)
        if weights is None:
            checks = len(xs) - self.threshold
            while len(self._lambdas) < checks:
                self._lambdas.append(secrets.randbelow(PRIME))
            lambdas = self._lambdas[:checks]
            p = PRIME
            out = []
            exact = _exact(xs)  # small x: Horner over the integers, reduced once at the end
            for x, u in zip(xs, _barycentric(xs)):
                acc = 0
                for lam in reversed(lambdas):  # sum_j lambda_j x^j by Horner
                    acc = acc * x + lam if exact else (acc * x + lam) % p
                out.append(u * acc % p)
            weights = tuple(out)
            if len(self._weights) < 1024:
                self._weights[xs] = weights
        return weights

    def consistent(self, points: Sequence[Point]) -> bool:
        """Whether the (sorted, distinct) points lie on one polynomial of degree < threshold."""
        if len(points) <= self.threshold:
            return True
        weights = self._combined(tuple(x for x, _ in points))
        return sum(w * y for w, (_, y) in zip(weights, points)) % PRIME == 0


Poly = list[int]
"""Coefficients mod PRIME, lowest degree first, without trailing zeros (``[]`` is zero)."""


def _trim(a: Poly) -> Poly:
    while a and a[-1] == 0:
        a.pop()
    return a


def _sub(a: Poly, b: Poly) -> Poly:
    p = PRIME
    out = [(a[i] if i < len(a) else 0) - (b[i] if i < len(b) else 0) for i in range(max(len(a), len(b)))]
    return _trim([c % p for c in out])


def _mul(a: Poly, b: Poly) -> Poly:
    if not a or not b:
        return []
    p = PRIME
    out = [0] * (len(a) + len(b) - 1)
    for i, ai in enumerate(a):
        if ai:
            for j, bj in enumerate(b):
                out[i + j] += ai * bj
    return _trim([c % p for c in out])


def _divmod(a: Poly, b: Poly) -> tuple[Poly, Poly]:
    p = PRIME
    rem = list(a)
    if len(rem) < len(b):
        return [], _trim(rem)
    inverse = pow(b[-1], -1, p)
    quotient = [0] * (len(rem) - len(b) + 1)
    for i in range(len(rem) - len(b), -1, -1):
        coefficient = rem[i + len(b) - 1] * inverse % p
        quotient[i] = coefficient
        if coefficient:
            for j, bj in enumerate(b):
                rem[i + j] = (rem[i + j] - coefficient * bj) % p
    return _trim(quotient), _trim(rem[: len(b) - 1])


def _evaluate(f: Poly, x: int) -> int:
    acc = 0
    for c in reversed(f):
        acc = (acc * x + c) % PRIME
    return acc


def decode(points: Sequence[Point], threshold: int) -> Poly | None:
    """Gao's Reed-Solomon decoder: the polynomial of degree < ``threshold`` that agrees with
    all but at most ``(r - threshold) // 2`` of the ``r`` points, or ``None`` if there is none."""
    p = PRIME
    xs = [x for x, _ in points]
    # g0 = prod (X - x_i); g1 interpolates every point (degree < r).
    g0: Poly = [1]
    for x in xs:
        g0 = _mul(g0, [(-x) % p, 1])
    g1 = [0] * len(points)
    for (x, y), u in zip(points, _barycentric(tuple(xs))):
        scale = y * u % p
        if not scale:
            continue
        # g0 / (X - x) by synthetic division, scaled and added into g1.
        carry = 0
        quotient = [0] * (len(g0) - 1)
        for i in range(len(g0) - 1, 0, -1):
            carry = (g0[i] + carry * x) % p
            quotient[i - 1] = carry
        for i, q in enumerate(quotient):
            g1[i] = (g1[i] + scale * q) % p
    r0, r1 = g0, _trim(g1)
    v0: Poly = []
    v1: Poly = [1]
    limit = (len(points) + threshold) / 2
    while r1 and len(r1) - 1 >= limit:
        quotient, rem = _divmod(r0, r1)
        r0, r1 = r1, rem
        v0, v1 = v1, _sub(v0, _mul(quotient, v1))
    if not v1:
        return None
    f, rem = _divmod(r1, v1)
    if rem or len(f) > threshold:
        return None
    return f


def recover(points: Iterable[Point], threshold: int, *, verify: Callable[[bytes], bool],
            checker: ShareChecker | None = None) -> Recovery:
    """The secret behind ``points``, every one of them checked.

    ``verify`` tests a candidate secret against what its dealer committed to (a hash, a public
    key). When all points lie on one polynomial of degree ``threshold - 1`` and its secret
    passes ``verify``, that secret is returned with no bad shares. Otherwise the points are
    decoded (:func:`decode`): the shares off the decoded polynomial are returned as ``bad``
    when its secret passes ``verify``; anything else raises
    :class:`~protocols.errors.ShareError`. :class:`~protocols.errors.ThresholdError` for fewer
    than ``threshold`` points, :class:`~protocols.errors.WireError` for malformed ones.
    """
    pts = _checked_points(points, threshold)
    checker = checker if checker is not None and checker.threshold == threshold else ShareChecker(threshold)
    if checker.consistent(pts):
        coefficients = lagrange_at_zero(tuple(x for x, _ in pts[:threshold]))
        value = sum(y * c for (_, y), c in zip(pts, coefficients)) % PRIME
        if not value >> (8 * SECRET_BYTES) and verify(value.to_bytes(SECRET_BYTES, "big")):
            return Recovery(value.to_bytes(SECRET_BYTES, "big"), ())
        if len(pts) == threshold:
            raise ShareError(f"{threshold} shares (no surplus to check them with) do not give the committed secret")
        raise ShareError(f"all {len(pts)} shares agree on a secret other than the committed one")
    f = decode(pts, threshold)
    if f is None:
        raise ShareError(f"{len(pts)} shares with threshold {threshold} hold more errors than can be corrected")
    value = f[0] if f else 0
    bad = tuple(x for x, y in pts if _evaluate(f, x) != y)
    if value >> (8 * SECRET_BYTES) or len(pts) - len(bad) < threshold or not verify(
            value.to_bytes(SECRET_BYTES, "big")):
        raise ShareError(f"the {len(pts)} shares decode to no committed secret")
    return Recovery(value.to_bytes(SECRET_BYTES, "big"), bad)


def share_to_bytes(y: int) -> bytes:
    if not 0 <= y < PRIME:
        raise ValueError("a share value lies outside the field")
    return y.to_bytes(SHARE_BYTES, "big")


def share_from_bytes(data: bytes) -> int:
    if len(data) != SHARE_BYTES:
        raise WireError(f"a share is {SHARE_BYTES} bytes, got {len(data)}")
    y = int.from_bytes(data, "big")
    if y >= PRIME:
        raise WireError("a share value lies outside the field")
    return y
