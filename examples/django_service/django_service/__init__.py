"""A Django project whose orders app writes each order and its outbox message in one transaction."""
