"""What one Order API app holds and its routes share, and what it frees when it stops.

The settings, the bearer tokens and the callers' gate (see callers), the tracer, the request pool
behind its guard (see dbguard), the /healthz probe on a connection of its own, and the app's own
table gauges for /metrics.
"""

from opentelemetry import trace
from prometheus_client import CollectorRegistry

from outbox_pipelines.core.oncall import table_metrics
from outbox_pipelines.orders.api import tracing
from outbox_pipelines.orders.api.auth import Tokens
from outbox_pipelines.orders.api.callers import Callers
from outbox_pipelines.orders.api.config import ApiSettings
from outbox_pipelines.orders.api.dbguard import DatabaseTrouble, GuardedEngine, HealthProbe, with_session_timeouts
from outbox_pipelines.orders.api.responses import Rejection, database_rejection


class OrderApi:
    def __init__(self, settings: ApiSettings, tracer_provider: "trace.TracerProvider | None" = None) -> None:
        self.settings = settings
        self.tokens = Tokens(settings.tokens, settings.scope_secret)
        self.tracer = tracing.tracer(tracer_provider)
        self.db = GuardedEngine(
            settings.database_url,
            pool_size=settings.pool_size,
            max_overflow=settings.pool_max_overflow,
            pool_timeout_s=settings.pool_timeout_s,
            timeout_s=settings.db_timeout_s,
        )
        self.engine = self.db.engine
        self.health_probe = HealthProbe(settings.database_url)
        self.callers = Callers(settings, self.tokens)
        # This app's own table gauges: metrics.watch_tables registers one collector per process
        # (the first database wins), which would report another app's database here.
        self.state_metrics = CollectorRegistry(auto_describe=False)
        # A scrape while a table is locked gives up after the API's timeout (the gauges are left out)
        # instead of hanging on the lock.
        scrape_url = with_session_timeouts(settings.database_url, int(settings.db_timeout_s * 1000))
        self.state_metrics.register(table_metrics.OutboxStateCollector(scrape_url, settings.watch_tables))

    def database_rejection(self, trouble: DatabaseTrouble, what: str) -> Rejection:
        """503 for a busy or unreachable database: Retry-After, and a retry with the same key is safe."""
        return database_rejection(trouble, what, self.settings.retry_after_s)

    def dispose(self) -> None:
        """The request pool and the health probe's connection, when the app stops."""
        self.db.dispose()
        self.health_probe.dispose()
