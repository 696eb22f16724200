"""One rule for Paillier key sizes across every subcommand that makes keys.

Keys below :data:`MIN_KEY_BITS` are breakable: a subcommand refuses them (exit 2, usage) unless
``--insecure-test-keys`` says the run is a test or a demo. Config files say the same with the
protocol's own option (``[secure.paillier] allow_weak_keys = true``), checked by the protocol.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["MIN_KEY_BITS", "add_key_options", "key_bits_problem"]

MIN_KEY_BITS = 2048
"""Paillier keys below this are refused unless ``--insecure-test-keys`` says they are for a test."""


def add_key_options(parser: Any, *, default: int = MIN_KEY_BITS) -> None:
    """``--key-bits`` and ``--insecure-test-keys``, with the same help everywhere."""
    parser.add_argument("--key-bits", type=int, default=default,
                        help=f"Paillier modulus size (default {default}; below {MIN_KEY_BITS} only with "
                             "--insecure-test-keys)")
    parser.add_argument("--insecure-test-keys", action="store_true",
                        help=f"allow Paillier keys below {MIN_KEY_BITS} bits (tests and demos only: they are "
                             "breakable)")


def key_bits_problem(args: argparse.Namespace, *, uses_paillier: bool = True) -> str | None:
    """The usage error of ``args``' key size, or None when it may be used."""
    if not uses_paillier:
        return None
    if args.key_bits < 1:
        return f"--key-bits must be positive, got {args.key_bits}"
    if args.key_bits < MIN_KEY_BITS and not args.insecure_test_keys:
        return (f"--key-bits {args.key_bits} is below {MIN_KEY_BITS}: such keys are breakable; pass "
                "--insecure-test-keys if this is a test")
    return None
