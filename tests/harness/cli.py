"""The ``nlagg`` command line run in the test's own process (its exit code, stdout and stderr)."""

from __future__ import annotations

import pytest

from nlagg_node.cli import main

__all__ = ["run_cli"]


def run_cli(
    args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str, str]:
    """Run ``nlagg ARGS`` as ``main()``; returns its exit code, stdout and stderr."""
    monkeypatch.setattr("sys.argv", ["nlagg", *args])
    with pytest.raises(SystemExit) as exc:
        main()
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err
