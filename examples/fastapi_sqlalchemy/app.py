"""A FastAPI shop on SQLAlchemy: the suite takes the engine, and a send inside ``session.begin()``, or
inside ``dramatiq_unique.transaction(session=...)`` where the code commits with ``session.commit()``, is
written in the session's transaction and published after its commit."""

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from fastapi import Depends, FastAPI, HTTPException
from sqlalchemy import Numeric, String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import dramatiq_unique

DATABASE_URL = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
NAMESPACE = os.environ.get("EXAMPLE_NAMESPACE", "shop")

engine = create_engine(DATABASE_URL.replace("postgresql://", "postgresql+psycopg2://", 1))
broker = RedisBroker(url=REDIS_URL, namespace=NAMESPACE)
dramatiq.set_broker(broker)
dramatiq_unique.setup(broker, database=engine, redis=REDIS_URL, key_prefix=NAMESPACE)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(100))
    total: Mapped[float] = mapped_column(Numeric(10, 2))
    invoiced: Mapped[bool] = mapped_column(default=False)


@dramatiq.actor(unique_args=["order_id"], unique_lock="until_executed")
def send_invoice(order_id: int) -> None:
    with Session(engine) as session, session.begin():
        session.get(Order, order_id).invoiced = True


app = FastAPI()


def get_session():
    with Session(engine) as session:
        yield session


@app.post("/orders")
def create_order(customer: str, total: float, fail: bool = False, session: Session = Depends(get_session)) -> dict:
    try:
        with session.begin():
            order = Order(customer=customer, total=total)
            session.add(order)
            session.flush()
            message = send_invoice.send(order.id)  # its job row: in this transaction
            if fail:
                raise ValueError("payment refused")  # rolled back: no order, no job, nothing published
    except ValueError as e:
        raise HTTPException(402, str(e)) from None
    return {"order": order.id, "job": message.message_id}  # published once committed


@app.post("/orders/{order_id}/repeat")
def repeat_order(order_id: int, session: Session = Depends(get_session)) -> dict:
    """The same in the ``session.commit()`` style: the block says which sends belong to the transaction."""
    first = session.get(Order, order_id)  # the session's own transaction begins here (autobegin)
    if first is None:
        raise HTTPException(404, "no such order")
    order = Order(customer=first.customer, total=first.total)
    session.add(order)
    session.flush()
    with dramatiq_unique.transaction(session=session):
        message = send_invoice.send(order.id)  # its job row: in the session's transaction
    session.commit()  # published now
    return {"order": order.id, "job": message.message_id}
