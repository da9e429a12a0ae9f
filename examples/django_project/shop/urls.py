from django.contrib import admin
from django.urls import include, path
from orders.views import create_order

urlpatterns = [
    path("orders/", create_order),
    path("admin/jobs/", include("dramatiq_unique.contrib.django.urls")),  # the dashboard, staff only
    path("admin/", admin.site.urls),
]
