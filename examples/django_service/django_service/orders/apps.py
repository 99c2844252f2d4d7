from django.apps import AppConfig


class OrdersConfig(AppConfig):
    name = "django_service.orders"
    label = "orders"
    default_auto_field = "django.db.models.BigAutoField"
