"""What one exchange looks like inside a Flower message, both ways, with strict parsers.

One Flower message per party and exchange carries every message the server has for that
party in that exchange (runtime messages and protocol envelopes, in order), and one reply
carries everything the party answers. Both sit in a :class:`flwr.app.ConfigRecord` under
``secure-fl``::

    request  {"nonce": bytes 16, "seq": int, "round": int, "stage": str, "inbox": bytes}
    reply    {"nonce": bytes 16, "seq": int, "outbox": bytes}
    hello    {"nonce": bytes 16, "config": str (the run's public config, JSON), "run-id": str,
              "resume": int (the round whose stored state to restore; -1: a fresh start)}
    hello reply {"nonce": bytes 16, "party": int, "parties": int,
                 "error": str (why this node cannot take part, e.g. no stored state; "" when it can),
                 "key": bytes (its Ed25519 public key, 32 bytes, under ``authenticate``; else empty)}
    register {"nonce": bytes 16, "keys": bytes}   (``authenticate``: every party's public key)
    register reply {"nonce": bytes 16, "count": int}

``keys`` is ``u32 count | count × (u32 party | 32-byte key)`` (the server's party is ``SERVER``).
``inbox`` is ``u32 count | count × blob``; ``outbox`` is ``u32 count | count × (blob data |
blob label)``, the label being the sender's transcript label as JSON (what the server's
transcript records of a client's message is what the client says it is, as on the embedded
network). ``nonce`` names the server's network (a reply to another server or run is refused)
and ``seq`` the exchange (a replayed reply of an earlier exchange is refused).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from flwr.app import ConfigRecord, RecordDict

from protocols import Exposure, Label, Message, ReplayError, StageError, WireError
from protocols.transcript import Visibility
from protocols.wire import MAX_PAYLOAD, Reader, Writer

__all__ = [
    "EXCHANGE",
    "HELLO",
    "KEY",
    "REGISTER",
    "Hello",
    "HelloReply",
    "Request",
    "decode_keys",
    "encode_keys",
    "read_hello",
    "read_hello_reply",
    "read_register",
    "read_register_reply",
    "read_reply",
    "read_request",
    "write_hello",
    "write_hello_reply",
    "write_register",
    "write_register_reply",
    "write_reply",
    "write_request",
]

KEY: Final = "secure-fl"
EXCHANGE: Final = "query.exchange"
HELLO: Final = "query.hello"
REGISTER: Final = "query.register"
PUBLIC_KEY_BYTES: Final = 32
NONCE_BYTES: Final = 16
MAX_MESSAGES: Final = 4096
MAX_LABEL: Final = 1024
_LABEL_KEYS = frozenset({"protocol", "run_id", "stage", "stage_index", "statistic", "round", "exposure"})
_EXPOSURE_KEYS = frozenset({"visibility", "k", "dimension", "owner"})


def _record(content: RecordDict) -> ConfigRecord:
    try:
        record = content.config_records[KEY]
    except (KeyError, AttributeError, TypeError):
        raise WireError(f"no {KEY!r} config record in the message") from None
    return record


def _field(record: ConfigRecord, name: str, kind: type) -> Any:
    value = record.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise WireError(f"field {name!r} missing or not {kind.__name__}")
    return value


def _nonce(record: ConfigRecord, expected: bytes | None) -> bytes:
    nonce = _field(record, "nonce", bytes)
    if len(nonce) != NONCE_BYTES:
        raise WireError("a nonce is 16 bytes")
    if expected is not None and nonce != expected:
        raise StageError("a reply to another server or run")
    return bytes(nonce)


# --- requests (server → node) ------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    nonce: bytes
    seq: int
    round: int
    stage: str
    inbox: tuple[bytes, ...]


def write_request(*, nonce: bytes, seq: int, round: int, stage: str, inbox: Sequence[bytes]) -> RecordDict:
    writer = Writer().u32(len(inbox))
    for data in inbox:
        writer.blob(data)
    return RecordDict({KEY: ConfigRecord({"nonce": nonce, "seq": seq, "round": round, "stage": stage,
                                          "inbox": writer.finish()})})


def read_request(content: RecordDict) -> Request:
    record = _record(content)
    reader = Reader(_field(record, "inbox", bytes))
    count = reader.u32()
    if count > MAX_MESSAGES:
        raise WireError(f"{count} messages in one exchange")
    inbox = tuple(reader.blob(max_len=MAX_PAYLOAD) for _ in range(count))
    reader.end()
    return Request(nonce=_nonce(record, None), seq=_field(record, "seq", int), round=_field(record, "round", int),
                   stage=_field(record, "stage", str), inbox=inbox)


# --- replies (node → server) -------------------------------------------------------------------


def _label_json(label: Label) -> bytes:
    e = label.exposure
    return json.dumps({
        "protocol": label.protocol, "run_id": label.run_id, "stage": label.stage, "stage_index": label.stage_index,
        "statistic": label.statistic, "round": label.round,
        "exposure": {"visibility": e.visibility.value, "k": e.k, "dimension": e.dimension, "owner": e.owner},
    }, separators=(",", ":")).encode()


def _int(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise WireError(f"label field {name!r} is not an integer")
    return value


def _str(value: Any, name: str) -> str:
    if not isinstance(value, str) or len(value) > 128:
        raise WireError(f"label field {name!r} is not a short string")
    return value


def _read_label(data: bytes) -> Label:
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise WireError("a label that is not JSON") from None
    if not isinstance(raw, dict) or set(raw) != _LABEL_KEYS or not isinstance(raw["exposure"], dict) \
            or set(raw["exposure"]) != _EXPOSURE_KEYS:
        raise WireError("a label with the wrong fields")
    e = raw["exposure"]
    try:
        visibility = Visibility(e["visibility"])
    except ValueError:
        raise WireError(f"unknown visibility {e['visibility']!r}") from None
    owner = None if e["owner"] is None else _int(e["owner"], "owner")
    exposure = Exposure(visibility, _int(e["k"], "k"), _int(e["dimension"], "dimension"), owner)
    return Label(protocol=_str(raw["protocol"], "protocol"), run_id=_str(raw["run_id"], "run_id"),
                 stage=_str(raw["stage"], "stage"), stage_index=_int(raw["stage_index"], "stage_index"),
                 statistic=_str(raw["statistic"], "statistic"), round=_int(raw["round"], "round"), exposure=exposure)


def write_reply(*, nonce: bytes, seq: int, outbox: Sequence[Message]) -> RecordDict:
    writer = Writer().u32(len(outbox))
    for message in outbox:
        writer.blob(message.data).blob(_label_json(message.label))
    return RecordDict({KEY: ConfigRecord({"nonce": nonce, "seq": seq, "outbox": writer.finish()})})


def read_reply(content: RecordDict, *, nonce: bytes, seq: int) -> list[Message]:
    """A node's reply to exchange ``seq`` of the network named ``nonce`` (typed errors otherwise)."""
    record = _record(content)
    _nonce(record, nonce)
    got = _field(record, "seq", int)
    if got != seq:
        raise ReplayError(f"a reply to exchange {got}, this is exchange {seq}")
    reader = Reader(_field(record, "outbox", bytes))
    count = reader.u32()
    if count > MAX_MESSAGES:
        raise WireError(f"{count} messages in one reply")
    out = []
    for _ in range(count):
        data = reader.blob(max_len=MAX_PAYLOAD)
        out.append(Message(data, _read_label(reader.blob(max_len=MAX_LABEL))))
    reader.end()
    return out


# --- hello: which node is which party --------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    nonce: bytes
    config: str
    run_id: str = ""
    """The run store's id of the run: a node keys its stored state by it ("" keeps none)."""
    resume: int = -1
    """Restore the node's stored state of this round (the server's checkpoint); -1: a fresh start."""


@dataclass(frozen=True)
class HelloReply:
    party: int
    parties: int
    error: str = ""
    """Why the node cannot take part (its stored state is missing, foreign or tampered): a dropout."""
    key: bytes = b""
    """The node's Ed25519 public key (``authenticate``), else empty."""


MAX_ERROR: Final = 1024


def write_hello(*, nonce: bytes, config: str, run_id: str = "", resume: int = -1) -> RecordDict:
    return RecordDict({KEY: ConfigRecord({"nonce": nonce, "config": config, "run-id": run_id, "resume": resume})})


def read_hello(content: RecordDict) -> Hello:
    record = _record(content)
    resume = _field(record, "resume", int)
    if resume < -1:
        raise WireError(f"resume round {resume} < -1")
    return Hello(nonce=_nonce(record, None), config=_field(record, "config", str),
                 run_id=_field(record, "run-id", str), resume=resume)


def write_hello_reply(*, nonce: bytes, party: int, parties: int, error: str = "", key: bytes = b"") -> RecordDict:
    return RecordDict({KEY: ConfigRecord({"nonce": nonce, "party": party, "parties": parties,
                                          "error": error[:MAX_ERROR], "key": key})})


def read_hello_reply(content: RecordDict, *, nonce: bytes) -> HelloReply:
    record = _record(content)
    _nonce(record, nonce)
    party, parties, error = _field(record, "party", int), _field(record, "parties", int), _field(record, "error", str)
    if len(error) > MAX_ERROR:
        raise WireError("a hello reply's error is at most 1024 characters")
    key = _field(record, "key", bytes)
    if len(key) not in (0, PUBLIC_KEY_BYTES):
        raise WireError(f"a signing key is {PUBLIC_KEY_BYTES} bytes, not {len(key)}")
    return HelloReply(party=party, parties=parties, error=error, key=bytes(key))


# --- register: every party's signing key (``authenticate``) -----------------------------------------


def encode_keys(keys: Mapping[int, bytes]) -> bytes:
    writer = Writer().u32(len(keys))
    for party, key in sorted(keys.items()):
        if len(key) != PUBLIC_KEY_BYTES:
            raise WireError(f"a signing key is {PUBLIC_KEY_BYTES} bytes, not {len(key)}")
        writer.u32(party).raw(key)
    return writer.finish()


def decode_keys(data: bytes) -> dict[int, bytes]:
    """A directory of public keys (party → 32 bytes), strictly."""
    reader = Reader(data)
    count = reader.u32()
    if count > MAX_MESSAGES:
        raise WireError(f"{count} keys in one directory")
    keys: dict[int, bytes] = {}
    for _ in range(count):
        party, key = reader.u32(), reader.raw(PUBLIC_KEY_BYTES)
        if party in keys:
            raise WireError(f"party {party} twice in the directory")
        keys[party] = key
    reader.end()
    return keys


def write_register(*, nonce: bytes, keys: Mapping[int, bytes]) -> RecordDict:
    return RecordDict({KEY: ConfigRecord({"nonce": nonce, "keys": encode_keys(keys)})})


def read_register(content: RecordDict) -> tuple[bytes, dict[int, bytes]]:
    """The server's nonce and the directory of public keys (party → 32 bytes)."""
    record = _record(content)
    return _nonce(record, None), decode_keys(_field(record, "keys", bytes))


def write_register_reply(*, nonce: bytes, count: int) -> RecordDict:
    return RecordDict({KEY: ConfigRecord({"nonce": nonce, "count": count})})


def read_register_reply(content: RecordDict, *, nonce: bytes) -> int:
    record = _record(content)
    _nonce(record, nonce)
    return int(_field(record, "count", int))
