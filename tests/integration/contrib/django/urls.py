from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/jobs/", include("dramatiq_unique.contrib.django.urls")),
    path("admin/", admin.site.urls),
]
