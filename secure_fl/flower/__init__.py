"""Federated runs on Flower: the apps, the network over a Flower ``Grid``, the simulation engine.

* :mod:`.apps` — ``server_app`` (plays a config's run and writes it to the run store) and
  ``client_app`` (a client node, restored from its own state for every message);
* :mod:`.network` — :class:`~.network.FlowerNetwork`, the :class:`protocols.Network` over a grid:
  reply matching, stage timeouts, dropouts, wire bytes;
* :mod:`.server` / :mod:`.client` — the server's harness for the runner and the node host;
* :mod:`.simulation` — the ``flower-simulation`` engine (Ray);
* :mod:`.deploy` — ``secure-fl deploy local``.

Only this package and :mod:`secure_fl.cli` import ``flwr`` (an import-linter contract); this
module imports nothing, so ``secure_fl.flower.client`` works without Flower installed.
See docs/flower-engine.md.
"""
