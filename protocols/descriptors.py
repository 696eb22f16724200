"""One descriptor per secure-sum protocol: the single place that knows the protocol list.

A :class:`ProtocolDescriptor` names a protocol, its wire code, whether its sums are exact,
who can read what it sends, and where its implementation lives (imported lazily, so that
e.g. TenSEAL loads only when CKKS is used). The wire format, the registry, configs, the
CLI and the audit all read these descriptors instead of keeping their own lists.

This module imports nothing heavy: :mod:`protocols.wire` takes the wire codes from it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, fields
from typing import Any, Final, Literal

Family = Literal["clear", "he", "masking"]
"""``clear``: the server reads every input (the baselines); ``he``: inputs are ciphertexts under a
key a client holds (unless the options give it to the server); ``masking``: inputs are masked and
the server unmasks only the sum."""


@dataclass(frozen=True, kw_only=True)
class ProtocolDescriptor:
    """Everything the rest of the code may know about one protocol without importing it.

    ``exact``
        a decoded sum equals the sum of the encoded inputs bit for bit (CKKS rounds its
        approximate sum to the encoding's grid and refuses specs where that could fail).
    ``keyed``
        the protocol has a long-lived key set-up, run as messages before its first sum.
    ``server_learns_sum``
        every sum is revealed to the server (masking unmasks at the server; the baselines
        add in the clear). Such a protocol cannot serve a statistic only clients may learn.
    ``module``
        where ``Stage``, the session classes (``server_class``, ``client_class``) and the
        frozen options class (``options_class_name``, when the protocol has options) live.

    The stage names below (and ``reader``) are what a party that reads the transcript — the
    leakage audit — needs to know of a run's messages without knowing the protocol by name.
    """

    name: str
    code: int
    family: Family
    exact: bool
    keyed: bool
    server_learns_sum: bool
    module: str
    summary: str
    encoded: bool = True
    """Inputs are :func:`~protocols.encoding.encode`'d integers (``clear`` takes raw floats)."""
    server_class: str
    client_class: str
    options_class_name: str | None = None
    input_stages: tuple[str, ...] = ("upload",)
    """Stages whose client → server message carries that client's own input to a sum."""
    key_stage: str | None = None
    """The set-up stage in which the party that generated the key pair sends the public key (or
    public context) to the server; a client sending it holds the secret key."""
    sealed_key_stage: str | None = None
    """The set-up stage in which the server relays the secret key, sealed, to further clients
    (each receiver holds the key too)."""
    reader: str = "MessageReader"
    """The class in :mod:`protocols.readers` that reads this protocol's messages as their
    receiver can (an upload or a released sum, given the keys the reader holds)."""
    _cache: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def _attr(self, attr: str) -> Any:
        if attr not in self._cache:
            self._cache[attr] = getattr(importlib.import_module(self.module), attr, None)
        return self._cache[attr]

    @property
    def stages(self) -> dict[int, str]:
        """Stage number → lower-case name (stage 0, ``open``, and 255, ``refuse``, are shared)."""
        cached: dict[int, str] | None = self._cache.get("stages")
        if cached is None:  # built once: every message a client handles asks for it
            from .wire import SHARED_STAGES

            stage_enum = self._attr("Stage")
            names = {int(s): s.name.lower() for s in stage_enum} if stage_enum is not None else {}
            cached = self._cache["stages"] = {**SHARED_STAGES, **names}
        return dict(cached)  # the caller's own copy

    @property
    def options_class(self) -> type[Any] | None:
        if self.options_class_name is None:
            return None
        cls: type[Any] = self._attr(self.options_class_name)
        return cls

    def options(self, **values: Any) -> Any:
        """The protocol's frozen options from keywords; a typed error names unknown ones."""
        cls = self.options_class
        if cls is None:
            if values:
                raise ValueError(f"protocol {self.name!r} takes no options, got {sorted(values)}")
            return None
        known = {f.name for f in fields(cls) if f.init}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown option(s) {', '.join(unknown)} for protocol {self.name!r}; "
                             f"known: {', '.join(sorted(known))}")
        try:
            return cls(**values)
        except TypeError as error:
            raise ValueError(f"bad options for protocol {self.name!r}: {error}") from None

    def message_reader(self) -> Any:
        """What a receiver reads of this protocol's messages (:class:`protocols.readers.MessageReader`)."""
        if "_reader" not in self._cache:
            from . import readers

            self._cache["_reader"] = getattr(readers, self.reader)()
        return self._cache["_reader"]

    def applicable(self, **values: Any) -> dict[str, Any]:
        """The subset of ``values`` that are options of this protocol (a command line's generic
        flags — key size, key holder — meet each protocol's own options here)."""
        cls = self.options_class
        known = set() if cls is None else {f.name for f in fields(cls) if f.init}
        return {k: v for k, v in values.items() if k in known}

    def server_session(self, *, clients: Any, options: Any = None) -> Any:
        """The server's long-lived state for this protocol (keys it may hold, parameters)."""
        return self._attr(self.server_class)(clients=clients, options=options)

    def client_session(self, party: int, *, clients: Any, options: Any = None) -> Any:
        """One client's long-lived state for this protocol (its own keys)."""
        return self._attr(self.client_class)(party, clients=clients, options=options)


DESCRIPTORS: Final[dict[str, ProtocolDescriptor]] = {
    d.name: d for d in (
        ProtocolDescriptor(
            name="clear", code=6, family="clear", exact=False, keyed=False, server_learns_sum=True,
            module="protocols.clear", encoded=False, server_class="ClearServerSession",
            client_class="ClearClientSession", reader="ClearReader",
            summary="raw float32 vectors added by the server: no protection, no quantisation (the baseline "
                    "for model updates)"),
        ProtocolDescriptor(
            name="plain", code=1, family="clear", exact=True, keyed=False, server_learns_sum=True,
            module="protocols.plain", server_class="PlainServerSession", client_class="PlainClientSession",
            reader="PlainReader",
            summary="encoded vectors in the clear: no protection (the baseline for cost and leakage)"),
        ProtocolDescriptor(
            name="paillier", code=2, family="he", exact=True, keyed=True, server_learns_sum=False,
            module="protocols.paillier", server_class="PaillierServerSession",
            client_class="PaillierClientSession", options_class_name="PaillierOptions",
            input_stages=("upload", "try_upload"), key_stage="public_key", sealed_key_stage="sealed_key",
            reader="PaillierReader",
            summary="packed Paillier; the server multiplies ciphertexts, a client-side key holder decrypts"),
        ProtocolDescriptor(
            name="masking", code=3, family="masking", exact=True, keyed=False, server_learns_sum=True,
            module="protocols.masking", server_class="CompleteServerSession", client_class="CompleteClientSession",
            options_class_name="MaskingOptions", reader="MaskingReader",
            summary="SecAgg (Bonawitz et al. 2017): pairwise masks on the complete graph, Shamir-shared seeds"),
        ProtocolDescriptor(
            name="secagg+", code=4, family="masking", exact=True, keyed=False, server_learns_sum=True,
            module="protocols.masking", server_class="SparseServerSession", client_class="SparseClientSession",
            options_class_name="MaskingOptions", reader="SparseMaskingReader",
            summary="SecAgg+ (Bell et al. 2020): pairwise masks on a sparse random Harary graph"),
        ProtocolDescriptor(
            name="ckks", code=5, family="he", exact=True, keyed=True, server_learns_sum=False,
            module="protocols.ckks", server_class="CkksServerSession", client_class="CkksClientSession",
            options_class_name="CkksOptions", key_stage="context", sealed_key_stage="sealed_key",
            reader="CkksReader",
            summary="CKKS on TenSEAL; the server adds ciphertexts, a client-side key holder decrypts and "
                    "rounds to the encoding's grid"),
        ProtocolDescriptor(
            name="bfv", code=7, family="he", exact=True, keyed=True, server_learns_sum=False,
            module="protocols.bfv", server_class="BfvServerSession", client_class="BfvClientSession",
            options_class_name="BfvOptions", key_stage="context", sealed_key_stage="sealed_key",
            reader="CkksReader",
            summary="BFV on TenSEAL: exact integer sums; the server adds ciphertexts, a client-side key holder "
                    "decrypts"),
    )
}
"""Every protocol by name."""

SECURE: Final = tuple(name for name, d in DESCRIPTORS.items() if d.family != "clear")
"""Protocols that keep individual inputs from the server."""

CODES: Final = {name: d.code for name, d in DESCRIPTORS.items()}
NAMES: Final = {d.code: name for name, d in DESCRIPTORS.items()}


def descriptor(name: str) -> ProtocolDescriptor:
    """The descriptor of ``name``, or a typed error listing the known protocols."""
    try:
        return DESCRIPTORS[name]
    except KeyError:
        raise ValueError(f"unknown protocol {name!r}; known: {', '.join(DESCRIPTORS)}") from None
