"""A bench's child process: this script again, with ``--child`` and its arguments, on another tree's code, answering
on stdin/stdout a line at a time; started once it has said it is ready."""

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path


def start_child(
    script: Path, tree: str, args: Sequence[str], *, drop_env: tuple[str, ...], env: Mapping[str, str] | None = None
) -> "subprocess.Popen[str]":
    """``script --child ARGS`` with PYTHONPATH=``tree``, the variables starting with ``drop_env`` left out and
    ``env`` added; returns once its first line says ``{"ready": true}``."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(drop_env)}
    child_env.update(env or {}, PYTHONPATH=tree)
    process = subprocess.Popen(
        [sys.executable, str(script), "--child", *args],
        env=child_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    assert process.stdout is not None and json.loads(process.stdout.readline())["ready"]
    return process
