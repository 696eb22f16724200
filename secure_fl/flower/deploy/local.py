"""One SuperLink and N SuperNodes as separate processes on loopback: ``secure-fl deploy local``.

:class:`LocalFederation` is a context manager. Entering it makes a private work directory (the
Flower home ``FLWR_HOME``, certificates, node keys, logs), starts ``flower-superlink`` on a free
loopback port, with TLS registers each node's public key (``flwr supernode register``), starts
``flower-supernode`` N times (``partition-id`` = node index, its own runtime port, its private
key) and waits until all N are online. :meth:`LocalFederation.run` submits one Flower run
(``flwr run``) and waits for it, firing ``--kill`` specs from the ServerApp's events. Leaving the
block — normally, on an error, Ctrl-C, SIGTERM or SIGHUP — stops every process by PID (see
:mod:`.processes`) and removes the work directory (kept, for its logs, when the federation failed or a
run did not complete).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from secure_fl.flower.deploy.certs import (
    NodeKey,
    ServerCertificates,
    make_node_key,
    make_server_certificates,
)
from secure_fl.flower.deploy.kill import KillSpec, KillWatcher
from secure_fl.flower.deploy.processes import Child, ProcessSet
from secure_fl.flower.deploy.project import (
    CONNECTION,
    AppComponents,
    write_connection,
    write_project,
)
from secure_fl.flower.deploy.timing import node_spans, read_events, round_timings

__all__ = ["DeployError", "DeployOptions", "FlowerMissing", "FlowerRun", "LocalFederation", "PortError",
           "flower_executable"]

log = logging.getLogger("secure_fl.flower.deploy")

HOST = "127.0.0.1"


class DeployError(RuntimeError):
    """The federation could not be started or a run could not be carried out."""


class FlowerMissing(DeployError):
    """Flower's executables are not installed beside this Python (the ``flower`` extra)."""


class PortError(DeployError):
    """No free loopback port could be bound after retries."""


def flower_executable(name: str) -> Path:
    """``flower-superlink``, ``flower-supernode``, ``flwr`` of this interpreter's environment."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise FlowerMissing(f"{name} is not installed beside {sys.executable}; install the flower extra: "
                            "pip install 'secure-fl[flower]'")
    return path


def free_port() -> int:
    """A loopback port free now (another process may take it before it is bound: callers retry)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True, kw_only=True)
class DeployOptions:
    """How to start the federation. ``extra_env`` is added to every process's environment."""

    nodes: int
    tls: bool = False
    components: AppComponents = field(default_factory=AppComponents)
    startup_timeout: float = 120.0
    """Seconds for the SuperLink to listen and for all nodes to come online."""
    extra_env: Mapping[str, str] = field(default_factory=dict)
    keep: Path | None = None
    """Work in this directory and keep it (logs, certificates); default: a temporary one, removed."""
    state_root: Path | None = None
    """Node *i* keeps its state between rounds in ``state_root/client-<i>`` (its ``state-path``; it
    outlives the federation, so a stopped run can resume); default: the nodes keep none."""

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"nodes must be at least 1, got {self.nodes}")
        if self.startup_timeout <= 0:
            raise ValueError(f"startup_timeout must be positive, got {self.startup_timeout}")


@dataclass(frozen=True, kw_only=True)
class FlowerRun:
    """One finished Flower run as the federation saw it."""

    run_id: str
    status: str
    """Flower's status, e.g. ``finished:completed`` or ``finished:failed``."""
    seconds: float
    flower_bytes: dict[str, int]
    """Flower's own count of the run's traffic (``inbound``, ``outbound``, ``total``)."""
    kills: list[dict[str, Any]]
    rounds: list[dict[str, Any]]
    """Per round: wall, round trips, waiting on polling and its share, per stage (see timing)."""
    log: str
    """The tail of the ServerApp's log (Flower's log stream), for failures."""
    log_path: Path | None = None
    """That whole log (kept with the work directory when the run did not complete)."""

    @property
    def ok(self) -> bool:
        return self.status == "finished:completed"


class LocalFederation:
    """A SuperLink and ``options.nodes`` SuperNodes on loopback; see the module docstring."""

    def __init__(self, options: DeployOptions) -> None:
        self.options = options
        self.superlink = flower_executable("flower-superlink")
        self.supernode = flower_executable("flower-supernode")
        self.flwr = flower_executable("flwr")
        self.work = Path(tempfile.mkdtemp(prefix="secure-fl-deploy-")) if options.keep is None else options.keep
        self.work.mkdir(parents=True, exist_ok=True)
        os.chmod(self.work, 0o700)
        self.home = self.work / "flwr-home"
        self.logs = self.work / "logs"
        self.logs.mkdir(exist_ok=True)
        env = dict(os.environ)
        env.update({
            "FLWR_HOME": str(self.home),
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            "PYTHONUNBUFFERED": "1",
            **options.extra_env,
        })
        self.env = env
        self.processes = ProcessSet(env=env)
        self.certificates: ServerCertificates | None = None
        self.node_keys: dict[int, NodeKey] = {}
        self.node_ids: dict[int, int] = {}
        """Node index (partition) → Flower node id, from registration (TLS) or the node's log."""
        self.port = 0
        self._failed = False
        self._runs = 0
        self.left_behind: list[int] = []

    # --- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> Self:
        try:
            self._start()
        except BaseException:
            self._failed = True
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if kind is not None:
            self._failed = True
        self.close()

    def close(self) -> None:
        """Stop every process by PID; remove the work directory unless kept or something failed."""
        self.left_behind = self.processes.close()
        if self.options.keep is None:
            if self._failed:
                log.warning("deploy logs kept in %s", self.logs)
            else:
                shutil.rmtree(self.work, ignore_errors=True)

    def _start(self) -> None:
        started = time.monotonic()
        if self.options.tls:
            self.certificates = make_server_certificates(self.work / "certs")
            for node in range(self.options.nodes):
                self.node_keys[node] = make_node_key(self.work / "keys", f"node-{node}")
        self._start_superlink()
        write_connection(self.home, address=f"{HOST}:{self.port}",
                         ca_cert=self.certificates.ca_cert if self.certificates else None)
        if self.options.tls:
            self._register_nodes()
        for node in range(self.options.nodes):
            self._start_node(node)
        self._wait_online(deadline=started + self.options.startup_timeout)
        log.info("federation up in %.1f s: SuperLink %s:%d%s, %d SuperNodes", time.monotonic() - started, HOST,
                 self.port, " (TLS, node authentication)" if self.options.tls else " (insecure)",
                 self.options.nodes)

    def _start_superlink(self) -> None:
        for attempt in range(3):
            self.port = free_port()
            argv = [str(self.superlink), "--host", HOST, "--port", str(self.port),
                    "--disable-runtime-dependency-installation"]
            if self.certificates:
                argv += ["--ssl-ca-certfile", str(self.certificates.ca_cert),
                         "--ssl-certfile", str(self.certificates.server_cert),
                         "--ssl-keyfile", str(self.certificates.server_key), "--enable-supernode-auth"]
            else:
                argv += ["--insecure"]
            child = self.processes.start(f"superlink-{attempt}", argv, log_path=self.logs / f"superlink-{attempt}.log")
            if self._listening(child, deadline=time.monotonic() + self.options.startup_timeout):
                return
            text = _tail(child.log_path)
            if "address already in use" not in text.lower():
                raise DeployError(f"flower-superlink exited with {child.process.returncode}: "
                                  f"{_last_line(text)} (log: {child.log_path})")
            log.debug("port %d taken before the SuperLink bound it; trying another", self.port)
        raise PortError(f"could not bind a loopback port for the SuperLink after 3 tries (last {self.port})")

    def _listening(self, child: Child, *, deadline: float) -> bool:
        while time.monotonic() < deadline:
            if child.process.poll() is not None:
                return False
            if "Application startup complete" in _tail(child.log_path):
                try:
                    with socket.create_connection((HOST, self.port), timeout=1.0):
                        return True
                except OSError:
                    pass
            time.sleep(0.2)
        raise DeployError(f"flower-superlink did not listen on {HOST}:{self.port} within "
                          f"{self.options.startup_timeout:.0f} s (log: {child.log_path})")

    def _register_nodes(self) -> None:
        """``flwr supernode register KEY.pub`` for every node (in parallel); records the node ids."""
        started = {node: subprocess.Popen([str(self.flwr), "supernode", "register", str(key.public_key), CONNECTION,
                                           "--format", "json"], env=self.env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                   for node, key in self.node_keys.items()}
        try:
            for node, proc in started.items():
                out, _ = proc.communicate(timeout=self.options.startup_timeout)
                node_id = _json_field(out, "node-id")
                if proc.returncode != 0 or node_id is None:
                    raise DeployError(f"registering node {node}'s key failed: {_last_line(out.decode(errors='replace'))}")
                self.node_ids[node] = int(node_id)
        finally:
            for proc in started.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()

    def _start_node(self, node: int) -> Child:
        argv = [str(self.supernode), "--superlink", f"{HOST}:{self.port}", "--host", HOST, "--port", str(free_port()),
                "--node-config", self._node_config(node), "--max-wait-time", "60"]
        if self.certificates:
            argv += ["--root-certificates", str(self.certificates.ca_cert),
                     "--auth-supernode-private-key", str(self.node_keys[node].private_key)]
        else:
            argv += ["--insecure"]
        starts = sum(1 for c in self.processes.children if c.node == node)
        env_log = self.logs / (f"node-{node}.log" if not starts else f"node-{node}.{starts}.log")  # a fresh log per start
        # DEBUG puts a timestamp on the node's log lines: when it received each message and sent
        # its reply (timing.py). The log stays in the private work directory.
        child = self.processes.start(f"node-{node}", argv, log_path=env_log, node=node,
                                     env={"FLWR_LOG_LEVEL": "DEBUG"})
        return child

    def _node_config(self, node: int) -> str:
        config = f"partition-id={node} num-partitions={self.options.nodes}"
        if self.options.state_root is not None:
            state = self.options.state_root / f"client-{node}"
            state.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(state, 0o700)
            if any(c in str(state) for c in "\"'\\"):
                raise DeployError(f"a node's state path cannot contain quotes: {state}")
            config += f' state-path="{state}"'
        return config

    def _wait_online(self, *, deadline: float) -> None:
        """Until every SuperNode has logged its node id (it is activated on the SuperLink)."""
        pending = set(range(self.options.nodes))
        while pending:
            for node in sorted(pending):
                child = next(c for c in reversed(self.processes.children) if c.node == node)
                text = _tail(child.log_path, 65536)
                match = re.search(r"SuperNode ID: (\d+)", text)
                if match:
                    self.node_ids.setdefault(node, int(match[1]))
                    pending.discard(node)
                elif child.process.poll() is not None:
                    raise DeployError(f"SuperNode {node} exited with {child.process.returncode}: "
                                      f"{_last_line(text)} (log: {child.log_path})")
            if pending and time.monotonic() > deadline:
                raise DeployError(f"SuperNodes {sorted(pending)} did not come online within "
                                  f"{self.options.startup_timeout:.0f} s (logs in {self.logs})")
            if pending:
                time.sleep(0.2)

    def restart_dead_nodes(self) -> list[int]:
        """Start again the nodes whose process is gone (after a ``--kill``), with the same key and
        partition; waits until they are online."""
        dead = [node for node in range(self.options.nodes)
                if all(c.process.poll() is not None for c in self.processes.children if c.node == node)]
        for node in dead:
            self._start_node(node)
        if dead:
            self._wait_online(deadline=time.monotonic() + self.options.startup_timeout)
        return dead

    # --- runs ---------------------------------------------------------------------------------

    def run(self, run_config: Mapping[str, object], *, events: Path, kills: Sequence[KillSpec] = (),
            timeout: float, components: AppComponents | None = None) -> FlowerRun:
        """Submit one Flower run with ``run_config`` and wait (at most ``timeout`` seconds) for it;
        ``components`` other apps than the options' on the same nodes (a benchmark's peer)."""
        self._runs += 1
        project = write_project(self.work / f"app-{self._runs}", components=components or self.options.components,
                                run_config=run_config)
        stream_log = self.logs / f"run-{self._runs}.log"
        started = time.time()
        marks = {c.log_path: c.log_path.stat().st_size for c in self.processes.children
                 if c.node is not None and c.log_path.exists()}
        with KillWatcher(events, tuple(kills), self.processes.kill_node) as watcher, stream_log.open("wb") as out:
            submit = subprocess.Popen([str(self.flwr), "run", str(project), CONNECTION, "--stream"], env=self.env,
                                      stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True)
            try:
                submit.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                run_id = _run_id(stream_log)
                if run_id:
                    subprocess.run([str(self.flwr), "stop", run_id, CONNECTION], env=self.env, check=False,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
                raise DeployError(f"the Flower run did not finish within {timeout:.0f} s (log: {stream_log})") from None
            finally:
                if submit.poll() is None:
                    submit.kill()
                    submit.wait()
        run_id = _run_id(stream_log)
        if run_id is None:
            raise DeployError(f"flwr run did not start a run: {_last_line(_tail(stream_log))} (log: {stream_log})")
        info = self._run_info(run_id)
        spans = []
        for child in self.processes.children:
            if child.node is not None and child.log_path.exists():
                with child.log_path.open("rb") as handle:
                    handle.seek(marks.get(child.log_path, 0))  # this run's part of the log
                    spans += node_spans(child.node, handle.read().decode(errors="replace"))
        traffic = info.get("network-traffic", {})
        event_list = read_events(events)
        status = str(info.get("status", "unknown"))
        if status != "finished:completed":
            self._failed = True  # keep the work directory: its logs say why
        return FlowerRun(
            run_id=run_id, status=status, seconds=time.time() - started,
            flower_bytes={k.removesuffix("-bytes"): int(v) for k, v in traffic.items()},
            kills=[{"node": f.spec.node, "round": f.spec.round, "stage": f.spec.stage, "time": f.time,
                    "pids": f.pids} for f in watcher.fired]
                  + [{"node": s.node, "round": s.round, "stage": s.stage, "time": None, "pids": []}
                     for s in watcher.pending],
            rounds=round_timings(event_list, spans), log=_tail(stream_log, 4000), log_path=stream_log)

    def _run_info(self, run_id: str) -> dict[str, Any]:
        done = subprocess.run([str(self.flwr), "ls", CONNECTION, "--run-id", run_id, "--format", "json"],
                              env=self.env, capture_output=True, timeout=120, check=False)
        try:
            runs = json.loads(done.stdout)["runs"]
            return dict(runs[0])
        except (ValueError, KeyError, IndexError, TypeError):
            raise DeployError(f"flwr ls gave no status for run {run_id}: "
                              f"{_last_line(done.stdout.decode(errors='replace') + done.stderr.decode(errors='replace'))}") from None


def _tail(path: Path, size: int = 16384) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - size))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def _last_line(text: str) -> str:
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    return lines[-1] if lines else "(no output)"


def _json_field(out: bytes, key: str) -> Any:
    text = out.decode(errors="replace")
    start = text.find("{")
    try:
        return json.loads(text[start:]).get(key) if start >= 0 else None
    except ValueError:
        return None


def _run_id(stream_log: Path) -> str | None:
    match = re.search(r"Successfully started run (\d+)", _tail(stream_log, 1 << 20))
    return match[1] if match else None
