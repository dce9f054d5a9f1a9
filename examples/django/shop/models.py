from django.db import models


class Order(models.Model):
    sku = models.CharField(max_length=64)
    quantity = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
