"""Errors a user can act on. Each message says what went wrong and what to do."""


class OutboxError(Exception):
    """Base class of every error raised by outbox_pipelines."""


class InvalidTableName(OutboxError, ValueError):
    pass


class InvalidMessage(OutboxError, ValueError):
    """A message that cannot be enqueued; nothing was written."""


class UnknownTable(OutboxError, LookupError):
    pass


class NotAnOutboxTable(UnknownTable):
    """A name that is a table, but not an outbox table (a business table's name declared or passed by mistake)."""


class ConfigError(OutboxError):
    pass


class MissingSecret(ConfigError):
    """A variable a table's destination names for its credential is not set in this process: the commands that
    deliver refuse the table; those that only read or maintain it (status, replay, requeue-stuck, clean) go on."""


class InvalidDatabaseUrl(ConfigError):
    """A database URL libpq cannot parse. The message shows it with its password masked."""


class RetentionTooShort(ConfigError):
    """A cleaner retention shorter than the dedup horizon (pass force to run anyway)."""


class ThresholdTooShort(ConfigError):
    """A requeue-stuck threshold under which a live relay's rows would look stuck (pass force to run anyway)."""


class DatabaseUnavailable(OutboxError):
    pass


class MigrationError(OutboxError):
    pass


class PermanentError(Exception):
    """Raise from a handler when retrying cannot help: the message goes to dead.

    ``code`` becomes the row's ``last_error_code`` (default ``PERMANENT``).
    """

    def __init__(self, message: str = "", code: str = "PERMANENT") -> None:
        super().__init__(message)
        self.code = code


class NoTransaction(OutboxError, RuntimeError):
    """``enqueue`` was given a connection with no transaction open, where the message would commit on its own,
    apart from the business write; nothing was written. ``outside_transaction=True`` asks for exactly that."""
