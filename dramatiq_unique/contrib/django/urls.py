"""``path("admin/jobs/", include("dramatiq_unique.contrib.django.urls"))``, before the admin's own URLs."""

from django.urls import re_path

from dramatiq_unique.contrib.django.views import dashboard

app_name = "dramatiq_unique"
urlpatterns = [re_path(r"^(?P<path>.*)$", dashboard, name="dashboard")]
