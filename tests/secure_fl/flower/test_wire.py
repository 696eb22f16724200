"""The exchange codec inside Flower messages and the node's kept state: strict, typed errors."""

from __future__ import annotations

import os

import pytest
from flwr.app import ConfigRecord, RecordDict

from protocols import Exposure, Label, Message, ReplayError, StageError, WireError
from protocols.wire import Writer
from secure_fl.flower.wire import (
    KEY,
    HelloReply,
    read_hello,
    read_hello_reply,
    read_reply,
    read_request,
    write_hello,
    write_hello_reply,
    write_reply,
    write_request,
)

NONCE = bytes(range(16))


def _message(data: bytes, stage: str = "upload") -> Message:
    label = Label(protocol="masking", run_id="ab" * 8, stage=stage, stage_index=3, statistic="model_update",
                  round=2, exposure=Exposure.masked(7, owner=1))
    return Message(data, label)


def test_request_and_reply_round_trip() -> None:
    request = read_request(write_request(nonce=NONCE, seq=5, round=2, stage="train", inbox=[b"a", b"", b"xyz"]))
    assert (request.nonce, request.seq, request.round, request.stage, request.inbox) == \
        (NONCE, 5, 2, "train", (b"a", b"", b"xyz"))
    sent = [_message(b"\x01\x02"), _message(b"", stage="refuse")]
    got = read_reply(write_reply(nonce=NONCE, seq=5, outbox=sent), nonce=NONCE, seq=5)
    assert got == sent
    assert read_reply(write_reply(nonce=NONCE, seq=1, outbox=[]), nonce=NONCE, seq=1) == []


def test_reply_of_another_exchange_or_server_is_refused() -> None:
    reply = write_reply(nonce=NONCE, seq=4, outbox=[_message(b"x")])
    with pytest.raises(ReplayError, match="exchange 4, this is exchange 5"):
        read_reply(reply, nonce=NONCE, seq=5)
    with pytest.raises(StageError, match="another server"):
        read_reply(reply, nonce=os.urandom(16), seq=4)


def _raw_reply(outbox: bytes, **fields: object) -> RecordDict:
    record: dict[str, object] = {"nonce": NONCE, "seq": 1, "outbox": outbox, **fields}
    return RecordDict({KEY: ConfigRecord(record)})  # type: ignore[arg-type]


@pytest.mark.parametrize("outbox", [
    b"", b"\x00\x00\x00", Writer().u32(1).finish(), Writer().u32(0).finish() + b"\x00",  # short, missing, trailing
    Writer().u32(1).blob(b"x").blob(b"not json").finish(),
    Writer().u32(1).blob(b"x").blob(b'{"protocol": "masking"}').finish(),
    Writer().u32(10**6).finish(),
])
def test_malformed_replies_are_wire_errors(outbox: bytes) -> None:
    with pytest.raises(WireError):
        read_reply(_raw_reply(outbox), nonce=NONCE, seq=1)


def test_reply_fields_are_checked() -> None:
    good = Writer().u32(0).finish()
    with pytest.raises(WireError, match="seq"):
        read_reply(_raw_reply(good, seq="1"), nonce=NONCE, seq=1)
    with pytest.raises(WireError, match="nonce"):
        read_reply(_raw_reply(good, nonce=b"short"), nonce=NONCE, seq=1)
    with pytest.raises(WireError, match="config record"):
        read_reply(RecordDict({}), nonce=NONCE, seq=1)
    with pytest.raises(WireError, match="visibility"):
        label = b'{"protocol":"p","run_id":"","stage":"s","stage_index":1,"statistic":"x","round":0,' \
                b'"exposure":{"visibility":"naked","k":1,"dimension":1,"owner":null}}'
        read_reply(_raw_reply(Writer().u32(1).blob(b"x").blob(label).finish()), nonce=NONCE, seq=1)


def test_hello_reply() -> None:
    assert read_hello_reply(write_hello_reply(nonce=NONCE, party=3, parties=5), nonce=NONCE) == HelloReply(3, 5)
    refused = write_hello_reply(nonce=NONCE, party=3, parties=5, error="no stored state")
    assert read_hello_reply(refused, nonce=NONCE) == HelloReply(3, 5, "no stored state")
    with pytest.raises(WireError, match="party"):
        read_hello_reply(RecordDict({KEY: ConfigRecord({"nonce": NONCE, "party": True, "parties": 5})}),
                         nonce=NONCE)


def test_hello_names_the_run_and_the_round_to_restore() -> None:
    hello = read_hello(write_hello(nonce=NONCE, config="{}", run_id="abc", resume=4))
    assert (hello.run_id, hello.resume) == ("abc", 4)
    for bad in ({"resume": -2}, {"resume": True}, {"run-id": 3}):
        record = {"nonce": NONCE, "config": "{}", "run-id": "abc", "resume": 0, **bad}
        with pytest.raises(WireError):
            read_hello(RecordDict({KEY: ConfigRecord(record)}))
