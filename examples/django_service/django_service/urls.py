from django.urls import path

from django_service.orders import views

urlpatterns = [
    path("orders", views.create_order),  # a synchronous view
    path("async/orders", views.create_order_async),  # the same, from an async view
]
