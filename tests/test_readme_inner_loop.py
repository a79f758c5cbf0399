"""The README's inner test loop, run exactly as written, in a fresh virtual environment.

Issue 36: the README once gave the inner loop as a bare ``python3 -m pytest -m "core and not
slow"``, which fails on a fresh clone with ``No module named pytest`` (the ``test`` extra was
never installed on that path). Here a copy of the working tree gets a fresh virtual environment
made by the README's own first line, and then the README's inner-loop block runs in it, as
extracted from README.md (not retyped): the install of the ``test`` extra (from PyPI, or pip's
cache), then the tests themselves, which must all pass. Minutes: the install, then about 1,100
tests.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from .test_readme import ROOT, bash_block, working_tree

pytestmark = [pytest.mark.install, pytest.mark.timeout(900)]

INNER_LOOP = "### The inner loop"
"""The README's heading above the inner loop's commands."""
RUN_TIMEOUT = 840
"""Seconds for the install and the run together, within the test's own timeout."""


def test_the_readme_inner_loop_runs_as_written_in_a_fresh_venv(tmp_path: Path) -> None:
    readme = ROOT / "README.md"
    venv = bash_block(readme, "## Run the example app").splitlines()[0]
    assert venv == "python3 -m venv .venv && . .venv/bin/activate", venv
    commands = bash_block(readme, INNER_LOOP)
    # what the block must do, whatever else it says: install the test extra, then run the loop
    assert "python3 -m pip install -e '.[test]'" in commands, commands
    assert commands.rstrip().endswith('python3 -m pytest -m "core and not slow"'), commands
    repo = working_tree(tmp_path / "rubris")
    log = tmp_path / "inner-loop.log"
    # the environment of a new terminal: nothing of this run's own venv or paths leaks in
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VIRTUAL_ENV", "PYTHONPATH") and not k.startswith("PYTEST_")
    }
    with log.open("w") as out:
        done = subprocess.run(
            ["bash", "-c", f"set -e\n{venv}\n{commands}"],
            cwd=repo,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            timeout=RUN_TIMEOUT,
            check=False,
        )
    said = log.read_text()
    # on a failure, pytest's report if it got that far, else the end of pip's output
    report = said[said.rfind("test session starts") :] if "test session starts" in said else said
    assert done.returncode == 0, report[-20_000:]
    summary = said.rstrip().splitlines()[-1]
    assert re.search(r"\b\d+ passed\b", summary), summary
    assert not re.search(r"\b(failed|error|errors)\b", summary), summary
