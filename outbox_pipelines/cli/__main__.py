"""``python -m outbox_pipelines.cli``: the same as the ``outbox-pipelines`` console script (tests and the bench
start relays this way)."""

import sys

from outbox_pipelines.cli import main

sys.exit(main())
