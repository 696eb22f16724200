"""``secure-fl report``: finished runs → a paper-shaped Markdown table, plots and JSON.

``RUNS_OR_CONFIG`` is a config file (its runs are matched to stored runs by resolved
config), run ids (comma- or space-separated), a batch id, or a run name. ``--table`` picks a
formatter from :data:`secure_fl.report.TABLES` (``--list`` shows them); ``--out DIR``
writes ``<table>.md`` and the figures there.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("secure_fl.cli")

def register(sub: Any) -> None:
    p = sub.add_parser("report", help="turn finished runs into a paper-shaped table and plots",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sources", nargs="*", metavar="RUNS_OR_CONFIG",
                   help="config file(s), run id(s), batch id or run name")
    p.add_argument("--table", default="runs", help="table formatter (default: runs; see --list)")
    p.add_argument("--out", metavar="DIR", help="write <table>.md and PNG figures into DIR")
    p.add_argument("--html", metavar="FILE",
                   help="write one self-contained HTML page: the runs' table, accuracy curves, per-class accuracy, "
                        "bytes per statistic and stage (and the audit with --audit)")
    p.add_argument("--audit", metavar="DIR",
                   help="with --html: add the leakage audit that `secure-fl audit --out DIR` wrote")
    # secure_fl.report.SUMMARIES, spelled out so that building the parser imports no numpy
    p.add_argument("--metric", choices=["tail", "final", "best"], default="tail",
                   help="accuracy summary per run: mean of the last tail_rounds rounds (default), the "
                        "last round, or the best round (the FedShift paper's; chosen on the test set)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="formatter option (repeatable)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", type=_assignment,
                   help="the --set overrides the runs of a config file were run with (repeatable)")
    p.add_argument("--allow-missing", action="store_true",
                   help="report the runs of a config that exist even if some are missing")
    p.add_argument("--workspace", help="run store directory (default: $SECURE_FL_WORKSPACE or ./runs)")
    p.add_argument("--list", action="store_true", help="list the registered tables and exit")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _assignment(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected SECTION.KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def _options(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--option wants KEY=VALUE, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def run(args: argparse.Namespace) -> int:
    from secure_fl.cli import ensure_logging

    ensure_logging()
    from secure_fl.report import TABLES, ReportError, build_report, load_plugins

    if args.list:
        errors = load_plugins()
        tables = [{"name": s.name, "title": s.title, "description": s.description} for s in
                  sorted(TABLES.values(), key=lambda s: s.name)]
        if args.json:
            print(json.dumps({"tables": tables, "plugin_errors": errors}))
        else:
            for t in tables:
                print(f"{t['name']:24s} {t['title'] or t['description']}")
            for module, error in errors.items():
                log.warning("report module %s failed to import: %s", module, error)
        return 0
    if not args.sources:
        log.error("name the runs to report: a config file, run ids, a batch id or a run name "
                  "(secure-fl runs lists them)")
        return 2
    try:
        options = _options(args.option)
        log.info("report: reading %s, table %s%s", ", ".join(args.sources), args.table,
                 f", figures into {args.out}" if args.out else "")
        report, runs = build_report(args.sources, args.table, out_dir=args.out, metric=args.metric,
                                    options=options, workspace=args.workspace, allow_missing=args.allow_missing,
                                    assignments=args.set)
    except (ReportError, ValueError) as error:
        if args.json:
            print(json.dumps({"error": str(error)}))
        log.error("%s", error)
        return 1
    log.info("report: %d runs%s", len(runs), f", {len(report.figures)} figures" if report.figures else "")
    html_path = None
    if args.html:
        from secure_fl.report.html import write_html

        if args.audit and not (Path(args.audit) / "audit.json").is_file():
            log.warning("no audit in %s (secure-fl audit --out %s writes one); the page has none", args.audit,
                        args.audit)
        html_path = write_html(args.html, runs, audit=args.audit, source=", ".join(args.sources),
                               title=f"secure-fl report — {', '.join(args.sources)}")
        log.info("report: wrote %s", html_path)
    if args.json:
        out = report.as_json()
        out["runs"] = [r.as_json() for r in runs]
        out["metric"] = args.metric
        if html_path is not None:
            out["html"] = str(html_path)
        print(json.dumps(out))
    elif html_path is not None:
        print(f"report: {html_path.resolve()}")
    else:
        print(report.markdown, end="")
        for path in report.figures:
            print(f"figure: {path}")
        if args.out:
            print(f"wrote {args.out}/{args.table}.md")
    return 0


if __name__ == "__main__":  # python -m secure_fl.cli.report ... (same as `secure-fl report`)
    _parser = argparse.ArgumentParser(prog="secure-fl")
    register(_parser.add_subparsers(dest="command", required=True))
    _args = _parser.parse_args(["report", *sys.argv[1:]])
    raise SystemExit(_args.func(_args))
