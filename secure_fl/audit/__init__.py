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

See docs/audit.md and docs/threat-model.md. Only the ledger and the settings are imported
here; the rest loads torch and is imported on use.
"""

from secure_fl.audit.ledger import (
    ExposureRow,
    Ledger,
    LedgerSummary,
    build_ledger,
    recoverable_clients,
)
from secure_fl.audit.settings import DEFAULT_METHODS, DEFAULT_PROTOCOLS, AuditSettings

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
