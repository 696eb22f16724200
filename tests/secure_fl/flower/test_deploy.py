"""Fast tests of ``secure-fl deploy local``'s pieces: certificates, the --kill parser and watcher,
the launcher's teardown (fake children), the round timing, the generated project, CLI errors."""

from __future__ import annotations

import datetime
import json
import os
import stat
import sys
import time
import tomllib
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from secure_fl.cli import main
from secure_fl.flower.deploy import local as local_module
from secure_fl.flower.deploy.certs import CertificateError, make_node_key, make_server_certificates
from secure_fl.flower.deploy.kill import KillSpec, KillSpecError, KillWatcher, parse_kill
from secure_fl.flower.deploy.processes import ProcessSet, _alive
from secure_fl.flower.deploy.project import AppComponents, write_connection, write_project
from secure_fl.flower.deploy.timing import NodeSpan, node_spans, round_timings

ROOT = Path(__file__).resolve().parents[3]
SMOKE = ROOT / "experiments" / "deploy" / "smoke.toml"


# --- certificates -------------------------------------------------------------------------------

def test_the_server_certificate_is_signed_by_the_ca_for_loopback(tmp_path: Path) -> None:
    certs = make_server_certificates(tmp_path / "certs")
    ca = x509.load_pem_x509_certificate(certs.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(certs.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)  # raises unless the CA's key signed it
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    now = datetime.datetime.now(datetime.UTC)
    assert server.not_valid_before_utc < now < server.not_valid_after_utc
    key = serialization.load_pem_private_key(certs.server_key.read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.public_key().public_numbers() == server.public_key().public_numbers()
    assert stat.S_IMODE(os.stat(certs.server_key).st_mode) == 0o600
    assert not list((tmp_path / "certs").glob("ca.key*"))  # the CA key is not kept


def test_certificates_name_the_hosts_asked_and_refuse_bad_ones(tmp_path: Path) -> None:
    certs = make_server_certificates(tmp_path, hosts=("10.0.0.7", "link.example.org"))
    names = x509.load_pem_x509_certificate(certs.server_cert.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]
    assert names.get_values_for_type(x509.DNSName) == ["link.example.org"]
    with pytest.raises(CertificateError):
        make_server_certificates(tmp_path, hosts=())
    with pytest.raises(CertificateError):
        make_server_certificates(tmp_path, hosts=("bad host",))


def test_node_keys_are_openssh_p384_pairs_flower_accepts(tmp_path: Path) -> None:
    from flwr.cli.supernode.register import try_load_public_key

    key = make_node_key(tmp_path, "node-0")
    private = serialization.load_ssh_private_key(key.private_key.read_bytes(), None)
    public = serialization.load_ssh_public_key(key.public_key.read_bytes())
    assert isinstance(private, ec.EllipticCurvePrivateKey) and private.curve.name == "secp384r1"
    assert isinstance(public, ec.EllipticCurvePublicKey)
    assert private.public_key().public_numbers() == public.public_numbers()
    assert stat.S_IMODE(os.stat(key.private_key).st_mode) == 0o600
    assert try_load_public_key(key.public_key)  # what `flwr supernode register` reads
    other = make_node_key(tmp_path, "node-1")
    assert other.public_key.read_bytes() != key.public_key.read_bytes()
    with pytest.raises(CertificateError):
        make_node_key(tmp_path, "../escape")


# --- --kill ---------------------------------------------------------------------------------------

def test_kill_specs_parse_and_refuse_malformed_ones() -> None:
    assert parse_kill("3@2") == KillSpec(node=3, round=2)
    assert parse_kill(" 0@1:upload ") == KillSpec(node=0, round=1, stage="upload")
    assert str(parse_kill("4@3:share_keys")) == "4@3:share_keys"
    for bad in ("", "3", "@2", "3@", "a@2", "3@b", "3@2:", "3@2:9x", "-1@2", "3@0", "3@2:up load"):
        with pytest.raises(KillSpecError):
            parse_kill(bad)
    spec = parse_kill("3@2")
    spec.check(nodes=5, rounds=3)
    with pytest.raises(KillSpecError, match="node 5"):
        parse_kill("5@1").check(nodes=5, rounds=3)
    with pytest.raises(KillSpecError, match="round 4"):
        parse_kill("1@4").check(nodes=5, rounds=3)


def test_the_watcher_fires_at_the_round_and_stage_named(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    killed: list[int] = []
    specs = (parse_kill("1@2"), parse_kill("2@2:upload"))
    with KillWatcher(events, specs, lambda node: killed.append(node) or [123], interval=0.01) as watcher:
        lines = [{"round": 0, "stage": "train", "event": "sent", "time": 1.0},
                 {"round": 0, "stage": "train", "event": "received", "time": 2.0},
                 {"round": 1, "stage": "train", "event": "received", "time": 3.0}]
        events.write_text("".join(json.dumps(e) + "\n" for e in lines) + "not json\n")
        time.sleep(0.2)
        assert killed == []
        with events.open("a") as f:
            f.write(json.dumps({"round": 1, "stage": "train", "event": "sent", "time": 4.0}) + "\n")
            f.write(json.dumps({"round": 1, "stage": "upload", "event": "sent", "time": 5.0}))  # no newline yet
        deadline = time.monotonic() + 5
        while killed != [1] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert killed == [1]
        with events.open("a") as f:
            f.write("\n")
        while killed != [1, 2] and time.monotonic() < deadline:
            time.sleep(0.01)
    assert killed == [1, 2] and not watcher.pending
    assert [f.spec for f in watcher.fired] == list(specs) and watcher.fired[0].pids == [123]


# --- processes --------------------------------------------------------------------------------------

CHILD = """
import os, subprocess, sys, time
# a grandchild in a new session, as Flower's SuperExec is started, that ignores SIGTERM
grand = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
    start_new_session=True)
print(grand.pid, flush=True)
time.sleep(600)
"""


def _grandchild(path: Path) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = path.read_text().strip() if path.exists() else ""
        if text:
            return int(text.split()[0])
        time.sleep(0.05)
    raise AssertionError("the fake child did not start its grandchild")


def test_teardown_stops_children_and_their_detached_children_by_pid(tmp_path: Path) -> None:
    processes = ProcessSet(env=dict(os.environ))
    first = processes.start("a", [sys.executable, "-c", CHILD], log_path=tmp_path / "a.log", node=0)
    second = processes.start("b", [sys.executable, "-c", CHILD], log_path=tmp_path / "b.log", node=1)
    grand = [_grandchild(tmp_path / "a.log"), _grandchild(tmp_path / "b.log")]
    assert processes.pids() == {first.pid, second.pid, *grand}
    assert processes.pids(node=1) == {second.pid, grand[1]}
    assert processes.kill_node(1) == sorted([second.pid, grand[1]])
    time.sleep(0.1)
    assert not _alive(second.pid) and not _alive(grand[1]) and _alive(grand[0])
    assert processes.close(grace=1.0) == []
    assert not any(_alive(pid) for pid in (first.pid, *grand))
    assert processes.pids() == set()
    with pytest.raises(RuntimeError):
        processes.start("c", [sys.executable, "-c", "pass"], log_path=tmp_path / "c.log")


def test_an_orphaned_grandchild_is_still_found_by_its_token(tmp_path: Path) -> None:
    processes = ProcessSet(env=dict(os.environ))
    child = processes.start("a", [sys.executable, "-c", CHILD], log_path=tmp_path / "a.log")
    grand = _grandchild(tmp_path / "a.log")
    os.kill(child.pid, 9)
    child.process.wait()
    assert grand in processes.pids()  # re-parented, found by the environment token
    assert processes.close(grace=0.5) == []
    assert not _alive(grand)


def test_a_federation_that_fails_to_start_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in ("flower-superlink", "flower-supernode", "flwr"):  # a SuperLink that dies at once
        script = fake / name
        script.write_text(f"#!{sys.executable}\nimport sys\nprint('boom: no such option', flush=True)\nsys.exit(3)\n")
        script.chmod(0o755)
    monkeypatch.setattr(local_module, "flower_executable", lambda name: fake / name)
    options = local_module.DeployOptions(nodes=2, keep=tmp_path / "work", startup_timeout=20)
    with pytest.raises(local_module.DeployError, match="exited with 3: boom"), local_module.LocalFederation(options):
        pass


# --- timing -----------------------------------------------------------------------------------------

def test_round_timing_splits_wall_time_into_node_work_and_waiting() -> None:
    events = [
        {"round": 0, "stage": "train", "event": "sent", "time": 100.0},
        {"round": 0, "stage": "train", "event": "received", "time": 106.0},
        {"round": 0, "stage": "upload", "event": "sent", "time": 106.5},
        {"round": 0, "stage": "upload", "event": "received", "time": 110.5},
        {"round": 1, "stage": "train", "event": "sent", "time": 111.0},
        {"round": 1, "stage": "train", "event": "received", "time": 115.0},
    ]
    spans = [NodeSpan(0, 101.0, 104.0), NodeSpan(1, 102.0, 103.0), NodeSpan(0, 107.0, 108.0),
             NodeSpan(0, 112.0, 113.0)]
    first, second = round_timings(events, spans)
    assert first["round"] == 1 and first["round_trips"] == 2
    assert first["wall"] == pytest.approx(11.0)  # to the next round's first send
    assert [s["node"] for s in first["stages"]] == [pytest.approx(3.0), pytest.approx(1.0)]
    assert first["waiting"] == pytest.approx(3.0 + 3.0)
    assert first["waiting_share"] == pytest.approx(6.0 / 11.0)
    assert first["server"] == pytest.approx(1.0)
    assert second["round"] == 2 and second["wall"] == pytest.approx(4.0) and second["waiting"] == pytest.approx(3.0)


def test_node_spans_read_a_supernode_debug_log() -> None:
    text = ("\x1b[92mINFO 2026-11-25 18:39:07,430\x1b[0m:      Received successfully\n"
            "\x1b[92mINFO 2026-11-25 18:39:07,500\x1b[0m:      Start `flwr-clientapp` process\n"
            "\x1b[92mINFO 2026-11-25 18:39:12,996\x1b[0m:      Sent successfully\n"
            "\x1b[92mINFO 2026-11-25 18:39:16,036\x1b[0m:      Received successfully\n")
    (span,) = node_spans(2, text)
    assert span.node == 2 and span.sent - span.received == pytest.approx(5.566)


# --- project ----------------------------------------------------------------------------------------

def test_the_generated_project_and_connection_are_what_flwr_reads(tmp_path: Path) -> None:
    from flwr.cli.config_utils import load_and_validate

    project = write_project(tmp_path / "app", components=AppComponents(), run_config={
        "config-path": '/a "quoted" path/x.toml', "run-index": 2, "stage-timeout": 12.5, "overrides": '[["a", "1"]]'})
    config, warnings = load_and_validate(project / "pyproject.toml")
    assert config is not None, warnings
    flwr = config["tool"]["flwr"]["app"]
    assert flwr["components"] == {"serverapp": "secure_fl.flower.apps:server_app",
                                  "clientapp": "secure_fl.flower.apps:client_app"}
    assert flwr["config"]["config-path"] == '/a "quoted" path/x.toml' and flwr["config"]["run-index"] == 2
    connection = tomllib.loads(write_connection(tmp_path / "home", address="127.0.0.1:9", ca_cert=tmp_path / "ca.crt")
                               .read_text())
    assert connection["superlink"]["secure-fl-local"] == {"address": "127.0.0.1:9",
                                                          "root-certificates": str(tmp_path / "ca.crt")}
    insecure = tomllib.loads(write_connection(tmp_path / "h2", address="127.0.0.1:9", ca_cert=None).read_text())
    assert insecure["superlink"]["secure-fl-local"]["insecure"] is True


# --- the CLI's errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--nodes", "3"], "--nodes 3: each node holds one client and deploy-smoke has 5 clients; use --nodes 5"),
    (["--nodes", "6"], "use --nodes 5"),
    (["--nodes", "5", "--kill", "5@2"], "node 5 does not exist"),
    (["--nodes", "5", "--kill", "1@9"], "round 9 does not exist"),
    (["--nodes", "5", "--set", "train.rounds=0"], "rounds"),
])
def test_deploy_refuses_bad_input_in_one_line(argv: list[str], message: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", "local", str(SMOKE), *argv, "--store", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0]
    assert not list(tmp_path.iterdir())  # nothing stored, nothing started


@pytest.mark.parametrize("value", ["3", "x@1", "1@0", "1@2:"])
def test_a_malformed_kill_is_a_usage_error(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["deploy", "local", str(SMOKE), "--nodes", "5", "--kill", value])
    assert exit.value.code == 2 and "--kill" in capsys.readouterr().err


def test_deploy_without_flower_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert main(["deploy", "local", str(SMOKE), "--nodes", "5", "--store", str(tmp_path / "ws")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'secure-fl[flower]'" in err and len(err.strip().splitlines()) == 1


def test_a_port_that_cannot_be_bound_is_a_runtime_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in ("flower-superlink", "flower-supernode", "flwr"):
        script = fake / name
        script.write_text(f"#!{sys.executable}\nimport sys\nprint('[Errno 98] Address already in use')\nsys.exit(1)\n")
        script.chmod(0o755)
    monkeypatch.setattr(local_module, "flower_executable", lambda name: fake / name)
    assert main(["deploy", "local", str(SMOKE), "--nodes", "5", "--store", str(tmp_path / "ws")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: could not bind a loopback port for the SuperLink after 3 tries")


def test_the_json_adds_killed_nodes_and_each_round_s_bytes_and_timing() -> None:
    from types import SimpleNamespace

    from secure_fl.cli.deploy import _deploy_table, _run_json

    history = [SimpleNamespace(round=0, metrics={"net.wire_bytes": 900.0, "net.transcript_bytes": 400.0,
                                                 "net.stage.train.wire_bytes": 600.0,
                                                 "net.stage.upload.wire_bytes": 300.0})]
    summary = SimpleNamespace(id="r1", history=history, bytes_total=400,
                              as_json=lambda: {"id": "r1", "status": "done", "bytes": {"total": 400}})
    timing = {"round": 1, "wall": 10.0, "round_trips": 2, "waiting": 4.0, "waiting_share": 0.4, "server": 0.5,
              "stages": [{"stage": "train", "wall": 6.0, "node": 4.0, "waiting": 2.0},
                         {"stage": "upload", "wall": 3.5, "node": 1.5, "waiting": 2.0}]}
    outcome = SimpleNamespace(run_id="77", status="finished:completed", seconds=12.0,
                              flower_bytes={"inbound": 500, "outbound": 700, "total": 1200}, rounds=[timing],
                              kills=[{"node": 2, "round": 1, "stage": None, "time": 5.0, "pids": [9]},
                                     {"node": 0, "round": 1, "stage": "nope", "time": None, "pids": []}])
    fields = {"engine": "flower", "dropouts": {"count": 1, "parties": [2], "by_round": {"0": [2]}}}
    out = _run_json(summary, outcome, fields)
    assert out["engine"] == "flower"
    assert out["dropouts"] == {"count": 1, "parties": [2], "by_round": {"0": [2]}, "killed": [2]}  # fired only
    flower = out["flower"]
    assert flower["round_trips"] == 2 and flower["waiting_share"] == pytest.approx(0.4)
    assert flower["bytes"]["total"] == 1200 and flower["transcript_bytes"] == 400
    [round_1] = flower["rounds"]
    assert (round_1["wire_bytes"], round_1["transcript_bytes"]) == (900.0, 400.0)
    assert round_1["stage_wire_bytes"] == {"train": 600.0, "upload": 300.0}
    table = _deploy_table([out])
    assert "r1" in table and "40%" in table and "1,200" in table and "900" in table


FAKE_SUPERLINK = """#!{python}
import socket, sys, time
port = int(sys.argv[sys.argv.index("--port") + 1])
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", port))
server.listen()
print("Application startup complete", flush=True)
time.sleep(600)
"""

FAKE_SUPERNODE = """#!{python}
import sys, time
config = sys.argv[sys.argv.index("--node-config") + 1]
pid = int(config.split()[0].split("=")[1])
print(f"SuperNode ID: {{1000 + pid}}", flush=True)
time.sleep(600)
"""


def test_the_launcher_starts_kills_restarts_and_stops_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Against fake Flower executables: the SuperLink listens, N nodes come online with their ids,
    a killed node is started again with a fresh log, and closing leaves no process."""
    fake = tmp_path / "bin"
    fake.mkdir()
    for name, text in (("flower-superlink", FAKE_SUPERLINK), ("flower-supernode", FAKE_SUPERNODE), ("flwr", "")):
        script = fake / name
        script.write_text(text.format(python=sys.executable))
        script.chmod(0o755)
    monkeypatch.setattr(local_module, "flower_executable", lambda name: fake / name)
    options = local_module.DeployOptions(nodes=3, keep=tmp_path / "work", startup_timeout=60)
    with local_module.LocalFederation(options) as federation:
        assert federation.node_ids == {0: 1000, 1: 1001, 2: 1002}
        assert federation.restart_dead_nodes() == []
        before = federation.processes.pids()
        killed = federation.processes.kill_node(1)
        assert killed and set(killed) < before
        assert federation.restart_dead_nodes() == [1]
        logs = sorted(p.name for p in (tmp_path / "work" / "logs").glob("node-1*.log"))
        assert logs == ["node-1.1.log", "node-1.log"]
        assert len([c for c in federation.processes.children if c.node == 1]) == 2
        pids = federation.processes.pids()
    assert federation.left_behind == []
    assert not any(_alive(pid) for pid in pids)


# --- resuming: each node's own state directory -------------------------------------------------------

def test_each_node_keeps_its_state_in_its_own_private_directory(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from flwr.common.config import parse_config_args

    monkeypatch.setattr(local_module, "flower_executable", lambda name: tmp_path / name)
    root = tmp_path / "ws" / "node-state"
    federation = local_module.LocalFederation(local_module.DeployOptions(nodes=2, keep=tmp_path / "work",
                                                                         state_root=root))
    assert parse_config_args([federation._node_config(1)]) == {
        "partition-id": 1, "num-partitions": 2, "state-path": str(root / "client-1")}
    assert stat.S_IMODE((root / "client-1").stat().st_mode) == 0o700
    bare = local_module.LocalFederation(local_module.DeployOptions(nodes=2, keep=tmp_path / "work"))
    assert "state-path" not in parse_config_args([bare._node_config(0)])


def test_the_resume_hint_is_a_deploy_command_and_a_bad_resume_one_line(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from secure_fl.cli.deploy import resume_hint

    args = argparse.Namespace(config="c.toml", nodes=3, tls=True, store="ws", set=[("train.rounds", "2")])
    assert resume_hint(args, "abc").endswith(
        "deploy local c.toml --nodes 3 --tls --resume abc --store ws --set train.rounds=2")
    # the same stage timeout, and quoted for the shell it is pasted into
    args = argparse.Namespace(config="my runs/c.toml", nodes=3, tls=False, store="ws", stage_timeout=240.0,
                              set=[("data.root", "/data/my set")])
    assert resume_hint(args, "abc").endswith(
        "deploy local 'my runs/c.toml' --nodes 3 --resume abc --store ws --set 'data.root=/data/my set'"
        " --stage-timeout 240")
    assert main(["deploy", "local", str(SMOKE), "--nodes", "5", "--resume", "nope", "--store", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope" in err[0]


def test_resuming_a_done_batch_starts_no_federation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """`--resume` of a batch whose runs are all done reports them and starts no SuperLink or SuperNode."""
    from secure_fl.config import load_config
    from secure_fl.runtime.runner import describe_run
    from secure_fl.store import RunStore

    experiment = load_config(SMOKE, overrides=[("runtime.engine", "flower")])
    with RunStore.open_workspace(str(tmp_path)) as store:
        _, [run_id] = store.create_batch(name=experiment.name, source=str(SMOKE),
                                         runs=[describe_run(c) for c in experiment.runs])
        store.set_status(run_id, "done")

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a federation was started for a batch with nothing to run")

    monkeypatch.setattr(local_module, "LocalFederation", refuse)
    assert main(["deploy", "local", str(SMOKE), "--nodes", "5", "--resume", run_id, "--store", str(tmp_path),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in out["runs"]] == [run_id] and out["runs"][0]["status"] == "done"


def test_a_failed_runs_reason_is_the_serverapps_error_not_flowers_exit_footer() -> None:
    from secure_fl.cli.deploy import _server_reason

    log = ("INFO :      Starting logstream for run_id `123`\n"
           "\x1b[91mERROR \x1b[0m:     ServerApp raised an exception\n"
           "Traceback (most recent call last):\n"
           '  File "x.py", line 1, in <module>\n'
           "protocols.errors.ThresholdError: clients that advertised keys: 1 < threshold 2\n"
           "\x1b[91mERROR \x1b[0m:     Exit Code: 201\n"
           "An unhandled exception occurred in the ServerApp.\n"
           "\n"
           "For more information, visit: <https://flower.ai/docs/framework/1.41/en/ref-exit-codes/201.html>\n")
    assert _server_reason(log) == "protocols.errors.ThresholdError: clients that advertised keys: 1 < threshold 2"
    assert _server_reason("just one line\n") == "just one line"
    assert _server_reason("") == "(no output)"
