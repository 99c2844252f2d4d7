"""Which code a benchmark or soak measured: HEAD, and whether the folders it measures had
uncommitted changes (the code is often edited while a long run goes on)."""

import subprocess
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def measured_code(folders: Sequence[str]) -> tuple[str | None, bool]:
    """HEAD's short hash (None outside a git checkout) and whether ``folders`` differ from it."""
    return _git("rev-parse", "--short", "HEAD") or None, bool(_git("status", "--porcelain", "--", *folders))
