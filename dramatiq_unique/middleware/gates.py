"""The base of the two gate middlewares (ExecutionLocks, ConcurrencySlots): a job holds a gate
while it runs, parks when it cannot enter, and hands the gate on when it leaves."""

from __future__ import annotations

import logging
from typing import Any, ClassVar, NoReturn, Optional

from dramatiq import Middleware

from dramatiq_unique import context, leases
from dramatiq_unique import options as opt
from dramatiq_unique.context import MARKER, Held, JobContext
from dramatiq_unique.guard import hook
from dramatiq_unique.observe import events
from dramatiq_unique.parking import lot
from dramatiq_unique.parking.gates import WAKE, Gate
from dramatiq_unique.suite import ActorConfig, Suite

logger = logging.getLogger(__name__)


class GateMiddleware(Middleware):
    """Takes a gate in ``before_process_message`` (:meth:`enter`), hands it on when the job is done.

    Both share the suite's parking (:mod:`dramatiq_unique.parking.lot`) and its watchdog.
    """

    #: Names the middleware where the suite checks which of its middlewares a broker has.
    capability: ClassVar[str]
    #: The options the middleware reads (Dramatiq refuses an option no middleware declares).
    options: ClassVar[frozenset]
    gate: Gate

    def __init__(self, *, suite: Suite, local_handoff: Optional[bool] = None) -> None:
        self.suite = suite
        self.parking = lot.of(suite)
        if local_handoff is not None:  # None leaves it as the other gate middleware set it
            self.parking.local_handoff = local_handoff

    @property
    def actor_options(self) -> set[str]:
        return set(self.options)

    @hook
    def before_declare_actor(self, broker, actor) -> None:
        opt.check_actor(broker, actor)
        if opt.is_tracked(actor.options):
            leases.carry_context(actor)

    def after_worker_boot(self, broker, worker) -> None:
        self.parking.attach(worker)  # idempotent: both gate middlewares share the parking

    def before_worker_shutdown(self, broker, worker) -> None:
        self.parking.detach(worker)

    @hook
    def before_process_message(self, broker, message) -> None:
        config = self.suite.actor_config(message.actor_name)
        if config is None or message.failed:
            return
        ctx = context.attach(message, self.suite, config)  # JobTracking's too
        if self.applies(ctx.config):
            self.enter(ctx, message)

    def applies(self, config: ActorConfig) -> bool:
        """Whether the actor's jobs (with the message's own options) take this gate."""
        raise NotImplementedError

    def enter(self, ctx: JobContext, message: Any) -> None:
        """Take the gate for the attempt (:meth:`hold`), or park the job (:meth:`park`)."""
        raise NotImplementedError

    def take_up(self, ctx: JobContext, message: Any, group: str) -> Optional[dict]:
        """The reservation of ``group``'s gate that woke this message, taken off its marker (another
        gate's stays for that gate); None if it was not woken for this gate."""
        marker = message.options.get(MARKER)
        wake = marker.get(WAKE) if isinstance(marker, dict) else None
        if not isinstance(wake, dict) or wake.get("g") != group:
            return None
        del marker[WAKE]
        events.taken_up(self.gate.kind, message, marker, wake)
        ctx.woken = True
        return wake

    def hold(self, ctx: JobContext, held: Held) -> None:
        ctx.held[self.gate.kind] = held
        ctx.renewers.append(held.renew)

    def park(self, config: ActorConfig, message: Any, group: str, retry_in: float, **kwargs: Any) -> NoReturn:
        """The gate is taken: park the job until a holder hands it over.  Always raises SkipMessage.
        A job woken for another gate hands that one on while it waits (parking does)."""
        self.parking.park_message(self.gate, group, config, message, retry_in, **kwargs)

    def leaving(self, held: Held) -> None:
        """Called as the attempt lets go of ``held``, before it is handed on."""

    def after_process_message(self, broker, message, *, result=None, exception=None) -> None:
        self.leave(message)

    def after_skip_message(self, broker, message) -> None:
        self.leave(message)  # a later middleware parked or skipped the job after it took the gate

    def leave(self, message: Any) -> None:
        """Hand the attempt's gate to the next waiter, or release it."""
        ctx = context.of(message)
        held = ctx.held.pop(self.gate.kind, None) if ctx is not None else None
        if held is None:
            return
        self.leaving(held)
        try:
            self.parking.leave(self.gate, held.group, held.token)
        except Exception:
            logger.exception("Could not hand on %s; it frees itself when its lease runs out.", held.group)
