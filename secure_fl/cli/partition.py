"""``secure-fl partition``: split a dataset among clients and report the imbalance achieved.

Prints per-client class counts with γ_j, CS_j and EMD_k, then Γ/ρ, EMD_avg and the mean
cosine similarity; ``--json`` prints one machine-readable object instead and ``--plot FILE``
writes a clients × classes heat-map.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from typing import Any, TextIO

import numpy as np

from secure_fl.data import (
    DATASETS,
    PARTITIONERS,
    DataError,
    Partition,
    cosine_similarity_to_global,
    emd,
    load_dataset,
    local_imbalance,
)

__all__ = ["build_params", "register", "run"]

# Defaults when a flag is left out: the papers' representative settings.
DEFAULT_ALPHA = {"dirichlet": 0.1, "climb": 0.1}
DEFAULT_DUBHE_RHO = 10.0
DEFAULT_DUBHE_EMD = 1.5
DEFAULT_GLOBAL_RATIO = 10.0

# Which flags each scheme reads; any other flag given is an error, not silently ignored.
_SCHEME_FLAGS = {
    "dirichlet": {"alpha", "balance"},
    "climb": {"alpha", "rho", "minority"},
    "ratio": {"global_ratio", "minority"},
    "dubhe": {"rho", "emd", "profile"},
}
_FLAG_NAMES = {
    "alpha": "--alpha",
    "rho": "--rho",
    "minority": "--minority",
    "global_ratio": "--global-ratio",
    "emd": "--emd",
    "profile": "--profile",
    "balance": "--balance",
}


log = logging.getLogger("secure_fl.cli")

def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``partition`` sub-command to the ``secure-fl`` parser."""
    parser = subparsers.add_parser(
        "partition",
        help="split a dataset among clients and report class imbalance",
        description=(
            "Partition DATASET's training labels among N clients with one of the papers' "
            "schemes and print per-client class counts and the imbalance measures."
        ),
    )
    parser.add_argument("dataset", metavar="DATASET", choices=sorted(DATASETS))
    parser.add_argument("--scheme", required=True, choices=sorted(PARTITIONERS))
    parser.add_argument("--clients", type=int, required=True, metavar="N")
    parser.add_argument(
        "--alpha", type=float, metavar="A",
        help="dirichlet: concentration (default 0.1); climb: iid fraction (default 0.1)",
    )  # fmt: skip
    parser.add_argument(
        "--rho", type=float, metavar="R",
        help="climb: minority classes keep 1/R; dubhe: half-normal imbalance ratio (default 10)",
    )  # fmt: skip
    parser.add_argument(
        "--minority", type=int, metavar="K",
        help="climb/ratio: classes 0..K-1 are the minority (default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--global-ratio", type=float, metavar="G", help="ratio: global imbalance Γ (default 10)"
    )
    parser.add_argument(
        "--emd", type=float, metavar="E", help="dubhe: target EMD_avg (default 1.5)"
    )
    parser.add_argument(
        "--profile", choices=["dirichlet", "mixture"],
        help="dubhe: clients' label mixes Dir(beta*C*p_g) (default) or one dominant class each",
    )  # fmt: skip
    parser.add_argument(
        "--balance", action="store_const", const=True,
        help="dirichlet: the balance step of Wang et al.'s code (no share of later classes for "
             "clients already holding N/n samples)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="seed (default 0)")
    parser.add_argument("--root", metavar="PATH", help="directory of the dataset files")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--plot", metavar="FILE", help="write a clients × classes heat-map PNG")
    parser.add_argument(
        "--max-rows", type=int, default=20, metavar="M", help="client rows shown in the table"
    )
    parser.set_defaults(func=run)


class UsageError(ValueError):
    """A flag combination the chosen scheme does not accept."""


def build_params(args: argparse.Namespace) -> dict[str, Any]:
    """Translate the flags into keyword parameters of ``PARTITIONERS[args.scheme]``."""
    scheme = args.scheme
    given = {name for name in _FLAG_NAMES if getattr(args, name, None) is not None}
    stray = sorted(given - _SCHEME_FLAGS[scheme])
    if stray:
        flags = ", ".join(_FLAG_NAMES[s] for s in stray)
        raise UsageError(f"{flags} does not apply to --scheme {scheme}")
    minority_count = 1 if args.minority is None else args.minority
    if minority_count < 0:
        raise UsageError(f"--minority must be >= 0, got {minority_count}")
    minority = tuple(range(minority_count))
    if scheme == "dirichlet":
        return {"alpha": _or(args.alpha, DEFAULT_ALPHA["dirichlet"]), "balance": bool(args.balance)}
    if scheme == "climb":
        params: dict[str, Any] = {"alpha": _or(args.alpha, DEFAULT_ALPHA["climb"])}
        if args.minority is not None and args.rho is None:
            raise UsageError(
                "--minority with --scheme climb needs --rho (the kept fraction is 1/R)"
            )
        if args.rho is not None:
            params.update(rho=args.rho, minority_classes=minority)
        return params
    if scheme == "ratio":
        return {
            "global_ratio": _or(args.global_ratio, DEFAULT_GLOBAL_RATIO),
            "minority_classes": minority,
        }
    return {"rho": _or(args.rho, DEFAULT_DUBHE_RHO), "emd_avg": _or(args.emd, DEFAULT_DUBHE_EMD),
            "profile": args.profile or "dirichlet"}


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _finite_or_none(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def run(args: argparse.Namespace) -> int:
    """Entry point of ``secure-fl partition``; returns the process exit status."""
    from secure_fl.cli import ensure_logging

    ensure_logging()
    if args.clients < 1:
        log.error("--clients must be >= 1, got %d", args.clients)
        return 2
    out: TextIO = sys.stdout
    try:
        params = build_params(args)
        dataset = load_dataset(args.dataset, root=args.root, seed=args.seed)
        labels = dataset.y_train
        partition = PARTITIONERS[args.scheme](
            labels, num_clients=args.clients, rng=np.random.default_rng(args.seed), **params
        )
    except (DataError, UsageError, ValueError) as exc:
        log.error("%s", exc)
        return 2
    counts = partition.class_counts(labels, dataset.num_classes)
    if args.json:
        json.dump(_report(args, params, partition, counts), out)
        out.write("\n")
    else:
        _print_table(args, params, partition, counts, out)
    if args.plot:
        _plot(counts, args.plot, title=f"{args.dataset} / {args.scheme}, {args.clients} clients")
        if not args.json:
            print(f"heat-map written to {args.plot}", file=out)
    return 0


def _report(
    args: argparse.Namespace, params: dict[str, Any], partition: Partition, counts: np.ndarray
) -> dict[str, Any]:
    meta = {k: _finite_or_none(v) for k, v in partition.meta.items()}
    return {
        "dataset": args.dataset,
        "scheme": args.scheme,
        "seed": args.seed,
        "params": {k: list(v) if isinstance(v, tuple) else v for k, v in params.items()},
        "clients": counts.tolist(),
        "global_counts": counts.sum(axis=0).tolist(),
        "rho": meta["rho"],
        "emd_avg": meta["emd_avg"],
        "mean_cosine_similarity": meta["mean_cosine_similarity"],
        "meta": meta,
    }


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "inf"
    if math.isnan(value):
        return "nan"
    return str(int(value)) if float(value).is_integer() else f"{value:.3g}"


def _print_table(
    args: argparse.Namespace,
    params: dict[str, Any],
    partition: Partition,
    counts: np.ndarray,
    out: TextIO,
) -> None:
    num_clients, num_classes = counts.shape
    gamma = local_imbalance(counts, present_only=True)
    cs = cosine_similarity_to_global(counts)
    emd_k = emd(counts)
    width = max(5, len(str(int(counts.max(initial=0)))) + 1)
    header = (
        f"{'client':>6} {'n':>7} "
        + "".join(f"{'c' + str(c):>{width}}" for c in range(num_classes))
        + f" {'γ':>6} {'CS':>6} {'EMD':>6}"
    )
    shown = _rows_to_show(num_clients, max(args.max_rows, 0))
    setting = ", ".join(f"{k}={v}" for k, v in params.items())
    print(
        f"{args.dataset}: {args.scheme} ({setting}), {num_clients} clients, seed {args.seed}",
        file=out,
    )
    print(header, file=out)
    previous = -1
    for j in shown:
        if j != previous + 1:
            hidden = j - previous - 1
            print(f"{'...':>6} ({hidden} more clients; --max-rows to show them)", file=out)
        row = "".join(f"{int(v):>{width}}" for v in counts[j])
        print(
            f"{j:>6} {int(counts[j].sum()):>7} {row} {_fmt(gamma[j]):>6} "
            f"{_fmt(cs[j]):>6} {_fmt(emd_k[j]):>6}",
            file=out,
        )
        previous = j
    if shown and shown[-1] != num_clients - 1:  # only when --max-rows is 0 or 1
        hidden = num_clients - 1 - shown[-1]
        print(f"{'...':>6} ({hidden} more clients; --max-rows to show them)", file=out)
    total = counts.sum(axis=0)
    print(
        f"{'global':>6} {int(total.sum()):>7} " + "".join(f"{int(v):>{width}}" for v in total),
        file=out,
    )
    meta = partition.meta
    print(
        f"rho (Γ) = {_fmt(meta['rho'])}   EMD_avg = {meta['emd_avg']:.4f}   "
        f"mean CS = {meta['mean_cosine_similarity']:.4f}   coverage = {meta['coverage']:.3f}",
        file=out,
    )
    extra = {
        k: v
        for k, v in meta.items()
        if k not in {"rho", "emd_avg", "mean_cosine_similarity", "coverage", "num_clients"}
    }
    if extra:
        print("   ".join(f"{k} = {_fmt(v)}" for k, v in extra.items()), file=out)


def _rows_to_show(num_clients: int, max_rows: int) -> list[int]:
    """All rows when they fit, else the first and last halves of ``max_rows``."""
    if num_clients <= max_rows:
        return list(range(num_clients))
    head = (max_rows + 1) // 2
    tail = max_rows - head
    return list(range(head)) + list(range(num_clients - tail, num_clients))


def _plot(counts: np.ndarray, path: str, *, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    num_clients, num_classes = counts.shape
    fig, ax = plt.subplots(
        figsize=(min(2 + 0.5 * num_classes, 12), min(2 + 0.12 * num_clients, 12))
    )
    image = ax.imshow(counts, aspect="auto", interpolation="nearest", cmap="viridis")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_xticks(range(num_classes))
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label="samples")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
