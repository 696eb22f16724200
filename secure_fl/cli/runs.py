"""``secure-fl runs``: list the runs stored in a workspace (newest first)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys

__all__ = ["register", "run"]

log = logging.getLogger("secure_fl.cli")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "runs",
        help="list stored runs",
        description="List the runs in the workspace's store: status, method, protocols, progress, accuracy.",
    )
    parser.add_argument("--workspace", metavar="DIR",
                        help="where the run store lives (default: $SECURE_FL_WORKSPACE or ./runs)")
    parser.add_argument("--limit", type=int, metavar="N", help="show the N newest runs only")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from secure_fl.cli import ensure_logging, program

    ensure_logging()
    from secure_fl.cli.run import (
        clipped_cell,
        format_value,
        selection_cell,
        statistics_cell,
        text_table,
    )
    from secure_fl.runtime import summarize
    from secure_fl.store import DB_NAME, RunStore, StoreError, workspace_path

    if args.limit is not None and args.limit < 1:
        log.error("--limit must be >= 1, got %d", args.limit)
        return 2
    path = workspace_path(args.workspace) / DB_NAME
    if not path.exists():
        if args.json:
            print(json.dumps({"runs": []}))
        else:
            log.info("no runs yet (%s does not exist); start one with: %s run CONFIG", path, program())
        return 0
    try:
        with RunStore.open_readonly(path) as store:  # reads only: works on a read-only or older store
            rows = store.list_runs(limit=args.limit)
            summaries = [summarize(store, r.id) for r in rows]
    except StoreError as error:
        log.error("%s", error)
        return 2
    if args.json:
        out = []
        for row, summary in zip(rows, summaries):
            item = summary.as_json()
            item.update(batch=row.batch_id, created=row.created, planned_rounds=row.rounds, device=row.device)
            out.append(item)
        json.dump({"runs": out}, sys.stdout, allow_nan=False)
        sys.stdout.write("\n")
        return 0
    table = [
        [r.id, r.batch_id, dt.datetime.fromtimestamp(r.created).strftime("%Y-%m-%d %H:%M"), r.status, r.method,
         r.loss, statistics_cell(s), r.update_protocol, selection_cell(s), str(r.seed), f"{r.rounds_done}/{r.rounds}",
         format_value(s.final["accuracy"]), format_value(s.tail["accuracy"]), clipped_cell(s), r.label or r.name]
        for r, s in zip(rows, summaries)
    ]
    headers = ["run", "batch", "created", "status", "method", "loss", "statistics", "updates", "selection", "seed",
               "rounds", "final acc", "tail acc", "clipped", "name"]
    if any(s.privacy for s in summaries):  # DP runs: the privacy spent so far, before the name
        headers.insert(-1, "ε (δ)")
        for line, s in zip(table, summaries):
            p = s.privacy or {}
            eps = p.get("epsilon")
            line.insert(-1, "-" if "epsilon" not in p else f"{'inf' if eps is None else format(eps, '.3f')} "
                                                             f"({p['delta']:g})")
    print(text_table(headers, table) if table else "no runs stored")
    failed = [(r, s) for r, s in zip(rows, summaries) if r.status == "failed"]
    for r, _ in failed:
        print(f"run {r.id} failed: {r.error or 'no reason stored'}")
    return 0
