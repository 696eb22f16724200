"""The leakage audit: what each method tells each party, per secure-sum protocol.

* :mod:`secure_fl.audit.tap` — the tap on the run's network: every message's bytes, sender, receiver, label;
* :mod:`secure_fl.audit.views` — a party's view: what it received, read with the protocols' own readers;
* :mod:`secure_fl.audit.ledger` (rows in :mod:`secure_fl.audit.exposure`) — the exposure ledger;
* :mod:`secure_fl.audit.knowledge` — the method's own client half, run by the attacker on hypothesised clients;
* :mod:`secure_fl.audit.attacks` — pure inference attacks and their scores;
* :mod:`secure_fl.audit.probe` — what an attacker computes from global models and auxiliary data;
* :mod:`secure_fl.audit.context`, :mod:`secure_fl.audit.inference` — the attacks of one cell on the views;
* :mod:`secure_fl.audit.runner` — one method × protocol cell: run, tap, ledger, attacks;
* :mod:`secure_fl.audit.report` — the matrix, as Markdown, JSON and a heat map.

See docs/audit.md and docs/threat-model.md. Only the settings are imported here; the
ledger's names load on first use, the rest is imported on use (all of it loads torch).
"""

from typing import TYPE_CHECKING, Any

from secure_fl.audit.settings import DEFAULT_METHODS, DEFAULT_PROTOCOLS, AuditSettings

if TYPE_CHECKING:
    from secure_fl.audit.ledger import (
        ExposureRow,
        Ledger,
        LedgerSummary,
        build_ledger,
        recoverable_clients,
    )

_LEDGER = ("ExposureRow", "Ledger", "LedgerSummary", "build_ledger", "recoverable_clients")


def __getattr__(name: str) -> Any:
    """The ledger's names, imported on first use (it loads torch; the CLI's parser needs only the settings)."""
    if name in _LEDGER:
        from secure_fl.audit import ledger

        return getattr(ledger, name)
    raise AttributeError(f"module 'secure_fl.audit' has no attribute {name!r}")

__all__ = [
    "DEFAULT_METHODS",
    "DEFAULT_PROTOCOLS",
    "AuditSettings",
    "ExposureRow",
    "Ledger",
    "LedgerSummary",
    "build_ledger",
    "recoverable_clients",
]
