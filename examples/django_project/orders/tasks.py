import dramatiq

from orders.models import Order


@dramatiq.actor(unique_args=["order_id"], unique_lock="until_executed")
def send_invoice(order_id: int) -> None:
    Order.objects.filter(id=order_id).update(invoiced=True)
