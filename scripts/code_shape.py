"""The shape of the code, for refactoring reports: modules with line counts, the longest functions.

    python scripts/code_shape.py                # this checkout
    python scripts/code_shape.py --root /tmp/x  # another checkout (a worktree of an older commit)
    python scripts/code_shape.py --top 15

Standard library only, so it runs on any commit.
"""

import argparse
import ast
from pathlib import Path


def module_lines(package: Path) -> list[tuple[str, int]]:
    rows = []
    for path in sorted(package.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rows.append((str(path.relative_to(package.parent)), len(path.read_text().splitlines())))
    return rows


def function_lengths(package: Path) -> list[tuple[int, str]]:
    found = []
    for path in sorted(package.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                found.append((length, f"{path.relative_to(package.parent)}:{node.lineno} {node.name}"))
    return sorted(found, reverse=True)


def print_tree(rows: list[tuple[str, int]]) -> None:
    """Directories with their totals, each module indented under its directory."""
    by_dir: dict[str, list[tuple[str, int]]] = {}
    for name, lines in rows:
        directory, _, file = name.rpartition("/")
        by_dir.setdefault(directory, []).append((file, lines))
    for directory in sorted(by_dir):
        files = by_dir[directory]
        print(f"{directory}/  ({sum(n for _, n in files)} lines)")
        for file, lines in files:
            print(f"    {lines:5d}  {file}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parents[1],
        help="the checkout to measure (default: this one)",
    )
    parser.add_argument("--top", type=int, default=10, help="how many of the longest functions to list")
    args = parser.parse_args()
    package = args.root / "outbox_pipelines"
    rows = module_lines(package)
    print_tree(rows)
    print(f"\n{len(rows)} modules, {sum(n for _, n in rows)} lines\n\nlongest functions:")
    for length, where in function_lengths(package)[: args.top]:
        print(f"    {length:4d}  {where}")


if __name__ == "__main__":
    main()
