"""Operations: what an operator or a schedule does to the outbox beside relaying.

The cleaner's maintenance passes (``maintenance``), replay of dead messages (``replay``) and backfill of
sent ones (``backfill``). Each is one function the CLI and the Dagster layer both call, so a rule (a
filter, a retention, a dry run) is written once.
"""
