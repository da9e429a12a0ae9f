"""Django: add ``dramatiq_unique.contrib.django`` to ``INSTALLED_APPS`` (after ``django_dramatiq``) and
run ``manage.py migrate``.  See docs/howto/django.md."""
