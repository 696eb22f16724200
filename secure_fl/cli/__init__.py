"""The ``secure-fl`` command: one module per subcommand, each with ``register`` and ``run``.

Only the invoked subcommand's module is imported (the others appear in ``--help`` from
:data:`COMMANDS`), and no module imports torch or numpy to build its parser, so ``secure-fl
--help`` answers in well under half a second.

Options every subcommand takes (before or after its name): ``-v``/``--verbose`` (debug
messages), ``-q``/``--quiet`` (warnings and errors only; twice: errors only), ``--log-file
PATH`` (every message, with times, appended to PATH), ``--debug`` (tracebacks of unexpected
errors). Diagnostics go through :mod:`logging` to stderr; tables and JSON go to stdout.
Errors are one line and exit 2 for a bad command line, config or store, 1 for a failure while
running, 130 on Ctrl-C; a closed output pipe (``| head``) ends the command quietly.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from secure_fl import __version__
from secure_fl.suggest import did_you_mean

COMMANDS = {
    "run": "run the federated experiments a TOML config defines",
    "runs": "list stored runs",
    "report": "turn finished runs into a paper-shaped table and plots",
    "audit": "leakage audit of methods × secure-sum protocols",
    "sum": "run one secure-sum round on random inputs and check it",
    "partition": "split a dataset among clients and report class imbalance",
    "select": "client-selection study (random, greedy, Dubhe) without training",
    "dp-check": "empirically check the distributed-DP noisy sum (ε lower bound)",
    "deploy": "run a config on a Flower federation of separate processes (SuperLink + SuperNodes)",
}
"""Subcommands, in help order, with their one-line help (each module's ``register`` gives the same)."""

log = logging.getLogger("secure_fl")


class _Formatter(logging.Formatter):
    """``warning: ...`` / ``error: ...`` prefixes for people; plain text for progress lines."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.levelno >= logging.ERROR:
            text = f"error: {text}"
        elif record.levelno >= logging.WARNING:
            text = f"warning: {text}"
        if record.exc_info and record.levelno <= logging.DEBUG:
            text += "\n" + self.formatException(record.exc_info)
        return text


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a message comes (tests swap it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


def configure_logging(*, verbose: int = 0, quiet: int = 0, log_file: str | None = None,
                      stream: TextIO | None = None) -> None:
    """Messages of ``secure_fl`` (and ``protocols``) to stderr at the level -v/-q ask for, and all
    of them to ``log_file``."""
    level = logging.DEBUG if verbose else (logging.INFO, logging.WARNING, logging.ERROR)[min(quiet, 2)]
    handler: logging.Handler = logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    handler.setFormatter(_Formatter())
    handler.setLevel(level)
    handlers: list[logging.Handler] = [handler]
    if log_file:
        try:
            file_handler = logging.FileHandler(log_file, encoding="utf-8")
        except OSError as error:
            print(f"error: cannot write the log file {log_file}: {error.strerror or error}", file=sys.stderr)
            raise SystemExit(2) from None
        file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        file_handler.setLevel(logging.DEBUG)
        handlers.append(file_handler)
    for name in ("secure_fl", "protocols"):
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            if getattr(old, "_secure_fl_cli", False):
                logger.removeHandler(old)
                old.close()
        for h in handlers:
            h._secure_fl_cli = True  # type: ignore[attr-defined]
            logger.addHandler(h)
        logger.setLevel(logging.DEBUG if (verbose or log_file) else level)
        logger.propagate = False
    logging.captureWarnings(True)
    warnings_logger = logging.getLogger("py.warnings")
    for old in list(warnings_logger.handlers):
        if getattr(old, "_secure_fl_cli", False):
            warnings_logger.removeHandler(old)
    for h in handlers:
        warnings_logger.addHandler(h)
    warnings_logger.propagate = False


def positive_int(text: str) -> int:
    """An argparse type: a positive integer (``argument --jobs: expected a positive integer, got '0'``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def program() -> str:
    """How the user invoked the command, for hints they can paste: ``.venv/bin/secure-fl`` when run
    from there, else ``secure-fl``."""
    invoked = sys.argv[0] if sys.argv else ""
    return invoked if os.path.basename(invoked) == "secure-fl" else "secure-fl"


def ensure_logging() -> None:
    """The default configuration, when a command runs without :func:`main` (tests, ``python -m``)."""
    logger = logging.getLogger("secure_fl")
    if not any(getattr(h, "_secure_fl_cli", False) for h in logger.handlers):
        configure_logging()


def _common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The options every subcommand takes; on subcommands their defaults do not override the top's."""
    default = (lambda value: value) if top else (lambda value: argparse.SUPPRESS)
    group = parser.add_argument_group("output")
    group.add_argument("-v", "--verbose", action="count", default=default(0),
                       help="more messages (debug details)")
    group.add_argument("-q", "--quiet", action="count", default=default(0),
                       help="fewer messages: warnings and errors only (-qq: errors only)")
    group.add_argument("--log-file", metavar="PATH", default=default(None),
                       help="also append every message, with times, to PATH")
    group.add_argument("--debug", action="store_true", default=default(False),
                       help="print the traceback of an unexpected error")


def build_parser(commands: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; the subcommands in ``commands`` (default: all) fully, the others as names only."""
    parser = argparse.ArgumentParser(
        prog="secure-fl",
        description="Privacy-preserving federated learning under class imbalance: secure global "
                    "statistics, a leakage audit, and the papers' experiments.",
        epilog="Run 'secure-fl COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"secure-fl {__version__}")
    _common(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    full = set(COMMANDS if commands is None else commands)
    for name, summary in COMMANDS.items():
        if name in full:
            import importlib

            module = importlib.import_module(f"secure_fl.cli.{name.replace('-', '_')}")
            module.register(sub)
            _common(sub.choices[name], top=False)
        else:
            sub.add_parser(name, help=summary, add_help=False)
    return parser


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (the first word that is not an option or its value)."""
    skip = False
    for word in argv:
        if skip:
            skip = False
            continue
        if word == "--log-file":
            skip = True
            continue
        if word.startswith("-"):
            continue
        return word
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command(argv)
    if command is not None and command not in COMMANDS:
        print(f"secure-fl: error: unknown command {command!r}{did_you_mean(command, COMMANDS)}; "
              f"commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        parser = build_parser([command] if command else [])
        args = parser.parse_args(argv)
        configure_logging(verbose=args.verbose, quiet=args.quiet, log_file=args.log_file)
        code: int = args.func(args)
        sys.stdout.flush()
    except KeyboardInterrupt:
        log.error("interrupted")
        return 130
    except BrokenPipeError:
        # the reader went away (`| head`): stop quietly, and keep Python from complaining at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except SystemExit:
        raise
    except Exception as error:  # a bug or an unexpected failure: one line, the traceback on request
        if "args" in locals() and getattr(args, "debug", False):
            raise
        text = " ".join(str(error).split())
        print(f"error: {type(error).__name__}: {text} (run again with --debug for the traceback)", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    raise SystemExit(main())
