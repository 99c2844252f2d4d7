"""``python -m outbox_pipelines.core.settings.registry [keys|environment]``: the reference's tables, in Markdown
(both when no argument names one)."""

import sys
from collections.abc import Callable

from outbox_pipelines.core.settings.registry.markdown import (
    render_environment_markdown,
    render_markdown,
    render_table_keys_markdown,
)

_TABLES: dict[str, Callable[[], str]] = {"keys": render_table_keys_markdown, "environment": render_environment_markdown}


def main(argv: list[str]) -> int:
    if not argv:
        print(render_markdown(), end="")
        return 0
    if len(argv) > 1 or argv[0] not in _TABLES:
        print(f"usage: python -m outbox_pipelines.core.settings.registry [{'|'.join(_TABLES)}]", file=sys.stderr)
        return 2
    print(_TABLES[argv[0]](), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
