from django.db import models


class Order(models.Model):
    reference = models.CharField(max_length=64, help_text="the client's order reference, unique")
    customer = models.CharField(max_length=200)
    amount_cent = models.IntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "orders"
        constraints = [
            models.CheckConstraint(condition=models.Q(amount_cent__gt=0), name="orders_amount_positive"),
            # Checked at COMMIT (deferred): a repeated reference fails the transaction after the outbox message
            # was written, and the message goes with it.
            models.UniqueConstraint(
                fields=["reference"], name="orders_reference_unique", deferrable=models.Deferrable.DEFERRED
            ),
        ]
