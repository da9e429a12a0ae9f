"""The dashboard when a store or Redis does not answer: a page says so, never hangs, never 500s."""

from __future__ import annotations

import time

import dramatiq

import dramatiq_unique
from dramatiq_unique.web import make_app
from tests.conftest import REDIS_URL
from tests.durable import free_port
from tests.integration.web.conftest import Dash


def test_a_second_store_down_is_named_and_redis_down_is_a_503(broker, sqlite_url, key_prefix):
    down_pg = f"postgresql://postgres@127.0.0.1:{free_port()}/test"
    suite = dramatiq_unique.setup(broker, database=[sqlite_url, down_pg], redis=REDIS_URL, key_prefix=key_prefix,
                                  redriver=False)
    try:
        @dramatiq.actor(track=True)
        def noted(n):
            pass

        noted.send(1)
        dash = Dash(make_app(suite).test_client())
        for path in ("/", "/jobs"):
            html = dash.page(path)
            assert "Not answering" in html, path
        assert dash.page("/jobs").count("data-job=") == 1
    finally:
        suite.close()

    no_redis = dramatiq_unique.Suite(database=sqlite_url, redis=f"redis://127.0.0.1:{free_port()}/0",
                                     key_prefix=key_prefix, check_redis=False)
    try:
        dash = Dash(make_app(no_redis).test_client())
        began = time.monotonic()
        for path in ("/locks", "/slots"):
            response = dash.get(path)
            assert response.status_code == 503 and b"Redis" in response.data, path
        assert time.monotonic() - began < 5
        assert dash.get("/").status_code == 200  # the counts come from the job table alone
    finally:
        no_redis.close()
