"""Which job rows a process may act on: its own app's (``app`` = ``key_prefix``), of the actors it declares.

A pass never sends a row into a broker that cannot run it, nor fails or prunes a row it does not
understand.  Rows written before the ``app`` column (``app = ''``) are adopted.  See docs/howto/several-apps.md.
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING, Any, Optional

import peewee as pw

from dramatiq_unique.storage.models import FINISHED, JobModel, after_ms
from dramatiq_unique.storage.stores import base_of

if TYPE_CHECKING:
    import dramatiq

    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)

#: The app of rows written by a version without the ``app`` column.
NO_APP = ""


class Scope:
    """The rows one re-drive pass may act on (see the module docstring)."""

    def __init__(self, suite: "Suite", broker: Optional["dramatiq.Broker"]) -> None:
        self.suite = suite
        self.app = suite.app
        declared = None if broker is None else set(broker.get_declared_actors())
        #: Per job table: the tracked actors this process declares, on ``broker``, kept in that table.
        self.actors: dict[type[JobModel], tuple[str, ...]] = {}
        for name, config in sorted(suite.actors.items()):
            if declared is None or name in declared:
                self.actors[config.model] = (*self.actors.get(config.model, ()), name)

    def names(self, model: type[JobModel]) -> tuple[str, ...]:
        """The actors of this scope kept in ``model`` (in any store)."""
        return self.actors.get(base_of(model), ())

    def models(self) -> list[type[JobModel]]:
        """The job tables with rows this pass may act on, in the suite's order."""
        return [model for model in self.suite.models if self.actors.get(model)]

    def where(self, model: type[JobModel]) -> Any:
        """The condition that keeps a statement to this scope's rows of ``model`` (in any store)."""
        names = self.names(model)
        # One name as "=", so PostgreSQL estimates it as well as a plain equality.
        return (model.app == self.app) & (model.actor_name == names[0] if len(names) == 1 else
                                          model.actor_name.in_(names))

    def prunable(self, model: type[JobModel]) -> Any:
        """:meth:`where`, less the rows whose idempotency key an actor's own ``idempotency_window`` keeps
        past the pruning's cutoff: a repeated ``submit()`` would make a second job."""
        settings = self.suite.settings
        cutoff = max(settings.retention, settings.idempotency_window)
        longer: dict[float, list[str]] = {}
        for name in self.names(model):
            config = self.suite.actors.get(name)
            window = settings.idempotency_window if config is None else config.idempotency_window  # as submit()
            if window > cutoff:
                longer.setdefault(window, []).append(name)
        cond = self.where(model)
        for window, names in sorted(longer.items()):
            # As submit() judges a key: alive while its job was created less than the window ago.
            cond &= ~(model.actor_name.in_(names) & model.idempotency_hold.is_null(False)
                      & (model.created_at > after_ms(-window)))
        return cond

    def lock_name(self) -> str:
        """The pass lock: one per app and set of declared actors, so a process that declares
        fewer actors (a web process) cannot keep the others' passes from running."""
        names = sorted(name for names in self.actors.values() for name in names)
        digest = hashlib.sha256("\n".join(names).encode("utf-8")).hexdigest()[:16]
        return f"{self.suite.keys.redrive_lock()}:{digest}"

    def adopt(self, model: type[JobModel], page: int, max_pages: int) -> int:
        """Give rows without an app (``app = ''``) of this scope's actors this app, waiting ones first,
        at most ``max_pages`` pages of each per pass; returns how many."""
        adopted = 0
        legacy = (model.app == NO_APP) & model.actor_name.in_(self.names(model))  # never empty: models() has them
        for cond in (legacy & model.status.not_in(FINISHED), legacy & model.status.in_(FINISHED)):
            for _ in range(max_pages):
                ids = [job.id for job in model.select(model.id).where(cond).limit(page)]
                done = self._adopt(model, ids, cond) if ids else 0
                adopted += done
                if len(ids) < page or done < len(ids):
                    break  # the last page, or rows that cannot be adopted: the next pass goes on
        return adopted

    def _adopt(self, model: type[JobModel], ids: list[int], legacy: Any) -> int:
        """Adopt rows ``ids``; one whose key a job of this app holds too (sent by both versions during an
        upgrade) is left and logged."""
        db = model._meta.database
        try:
            with db.atomic():
                return model.update(app=self.app).where(model.id.in_(ids) & legacy).execute()
        except pw.IntegrityError:
            adopted = 0
            for row_id in ids:
                try:
                    with db.atomic():
                        adopted += model.update(app=self.app).where((model.id == row_id) & legacy).execute()
                except pw.IntegrityError:
                    logger.warning("Job %s has no app and holds a key that a job of app %r holds too: "
                                   "left as it is.", row_id, self.app)
            return adopted
