import os
import pathlib
import subprocess

import pytest

SOURCE = pathlib.Path(os.environ.get("QF_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
FIXTURE = SOURCE / "tests/data/fixture-llama"
EVAL_TEXT = SOURCE / "tests/data/text/evaluation.txt"
CALIB_TEXT = SOURCE / "tests/data/text/calibration.txt"
RECIPES = SOURCE / "tests/data/recipes"


def cli_path():
    p = os.environ.get("QF_CLI", str(SOURCE / "build/bin/quantforge"))
    if not os.path.exists(p):
        pytest.skip(f"the quantforge CLI is not built at {p}")
    return p


@pytest.fixture
def cli():
    """Runs the CLI: cli(args...) -> CompletedProcess (check=True)."""
    path = cli_path()

    def run(*args, check=True):
        return subprocess.run([path, "-q", *map(str, args)], capture_output=True, text=True, check=check)

    return run
