from django.db import transaction
from django.http import HttpRequest, JsonResponse

from orders.models import Order
from orders.tasks import send_invoice


def create_order(request: HttpRequest) -> JsonResponse:
    with transaction.atomic():
        order = Order.objects.create(customer=request.POST["customer"], total=request.POST["total"])
        message = send_invoice.send(order.id)  # its job row is written in this transaction
        if request.POST.get("fail"):
            raise ValueError("payment refused")  # rolled back: no order, no job, nothing published
    return JsonResponse({"order": order.id, "job": message.message_id})  # published once committed
