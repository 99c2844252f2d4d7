"""Alerts as JSON posted to a webhook (OUTBOX_ALERT_WEBHOOK_URL); logged only when unset."""

import logging
import os
from typing import Any

import httpx

log = logging.getLogger("outbox_pipelines.alerts")
ALERT_WEBHOOK_ENV = "OUTBOX_ALERT_WEBHOOK_URL"


def post_alert(payload: dict[str, Any], url: str | None = None, timeout_s: float = 5.0) -> bool:
    """Post one alert; True if the webhook accepted it (2xx). Never raises."""
    url = url if url is not None else os.environ.get(ALERT_WEBHOOK_ENV)
    log.warning("outbox alert: %s", payload.get("summary", payload))
    if not url:
        return False
    try:
        response = httpx.post(url, json=payload, timeout=timeout_s)
    except httpx.HTTPError as exc:
        log.error("alert webhook %s unreachable: %s", url, exc)
        return False
    if response.status_code >= 300:
        log.error("alert webhook %s answered HTTP %s", url, response.status_code)
        return False
    return True
