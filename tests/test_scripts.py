"""scripts/: bad input is refused with one line and exit status 2, before any server starts."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "mlflow_screenshots.py"


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--tracking-uri", "http://127.0.0.1:5000"], "expected sqlite:///PATH"),
        (["--tracking-uri", "sqlite:////no/such/mlflow.db"], "does not exist; run a grid first"),
        (["--chromium", "/no/such/chromium"], "is not an executable"),
    ],
)
def test_screenshots_bad_input_exits_2_with_one_line(tmp_path, args, needle):
    (tmp_path / "mlflow.db").write_bytes(b"")
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert p.returncode == 2 and p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1 and needle in p.stderr
