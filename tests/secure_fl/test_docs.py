"""Docs that cannot drift: the registries block of docs/runtime.md is generated from the
registries, and the README's commands are ones the CLI accepts, naming files that exist."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from secure_fl.cli import COMMANDS, build_parser
from secure_fl.docs import BEGIN, DOC, END, render, shipped, update

ROOT = Path(__file__).resolve().parents[2]


def test_the_registries_block_is_up_to_date() -> None:
    from secure_fl.algorithms import ALGORITHMS, register_algorithm
    from secure_fl.algorithms.fedavg import FedAvg

    @register_algorithm("docs_test_method")  # a test's (or plug-in's) registration is not shipped: not listed
    class _Extra(FedAvg):
        pass

    try:
        assert update(DOC, check=True), "docs/runtime.md's registries block is stale: run python -m secure_fl.docs"
    finally:
        del ALGORITHMS["docs_test_method"]


def test_the_block_lists_every_registry_name() -> None:
    from protocols import DESCRIPTORS
    from secure_fl.algorithms import ALGORITHMS
    from secure_fl.losses import LOSSES
    from secure_fl.selection import SELECTION_STRATEGIES

    text = DOC.read_text()
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    sections = re.split(r"\n\*\*", block)
    listed = {s.split("**", 1)[0]: re.findall(r"^\| `([^`]+)` \|", s, flags=re.MULTILINE) for s in sections if "|" in s}
    assert listed == {"Methods": list(shipped(ALGORITHMS)), "Losses": list(shipped(LOSSES)),
                      "Selection strategies": list(shipped(SELECTION_STRATEGIES)), "Protocols": list(DESCRIPTORS)}
    assert {"fedavg", "fedshift", "climb", "ratio_loss"} <= set(listed["Methods"])  # the four papers' methods
    assert {"random", "dubhe"} <= set(listed["Selection strategies"])
    assert block.strip() == render().strip()


def test_update_rewrites_a_stale_block(tmp_path: Path) -> None:
    stale = tmp_path / "doc.md"
    stale.write_text(f"intro\n{BEGIN}\n| `fedavg` | old |\n{END}\noutro\n")
    assert not update(stale, check=True) and "old" in stale.read_text()
    assert not update(stale)
    assert update(stale, check=True) and stale.read_text().startswith("intro\n") and "outro" in stale.read_text()


def readme_commands() -> list[list[str]]:
    """Every ``secure-fl`` command of the README's code blocks, as argv (after the program)."""
    text = (ROOT / "README.md").read_text()
    out = []
    for block in re.findall(r"```(?:sh|console)?\n(.*?)```", text, flags=re.DOTALL):
        for line in block.splitlines():
            line = line.split(" #")[0].strip()
            for prefix in (".venv/bin/secure-fl ", "secure-fl "):
                if line.startswith(prefix):
                    out.append(shlex.split(line[len(prefix):]))
    return out


def test_the_readme_uses_the_installed_command() -> None:
    text = (ROOT / "README.md").read_text()
    bare = [line for block in re.findall(r"```(?:sh)?\n(.*?)```", text, flags=re.DOTALL) for line in block.splitlines()
            if line.strip().startswith("secure-fl ")]
    assert not bare, f"after `make venv` the command is .venv/bin/secure-fl: {bare}"


@pytest.mark.parametrize("argv", readme_commands(), ids=lambda a: " ".join(a)[:60])
def test_readme_commands_parse_and_name_existing_files(argv: list[str]) -> None:
    assert argv and argv[0] in COMMANDS
    args = build_parser([argv[0]]).parse_args(argv)  # SystemExit on an option the CLI does not take
    for value in vars(args).values():
        if isinstance(value, str) and value.endswith(".toml"):
            assert (ROOT / value).is_file(), value


def test_a_readme_report_names_runs_the_readme_makes_first() -> None:
    runs: set[str] = set()
    for argv in readme_commands():
        if argv[0] == "run":
            runs.add(argv[1])
        if argv[0] == "report":
            configs = [a for a in argv[1:] if a.endswith(".toml")]
            assert all(c in runs for c in configs), f"report {configs} before a run of it"
