from django.db import models


class Order(models.Model):
    customer = models.CharField(max_length=100)
    total = models.DecimalField(max_digits=10, decimal_places=2)
    invoiced = models.BooleanField(default=False)
