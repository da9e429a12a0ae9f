"""The slots page's limits: a group no job has had, listed with its words, whose three buttons work;
one known only by its hash; the limits kept, listed and removed from the page."""

from __future__ import annotations

import re

import dramatiq

from dramatiq_unique import concurrency_status, set_concurrency_limit
from dramatiq_unique.slots import overrides
from dramatiq_unique.slots.limits import key_group


def _rows(html: str, table: str) -> dict[str, str]:
    """{data-group: the row's html} of a table of the page."""
    part = html.split(f'id="{table}"')[1].split("</table>")[0]
    return dict(re.findall(r'<tr data-group="([^"]*)">(.*?)</tr>', part, re.S))


def test_a_group_no_job_has_is_shown_in_words_and_its_buttons_work(suite, broker, dash):
    @dramatiq.actor(concurrency_limit=2, concurrency_key=["customer"])
    def deliver(customer):
        pass

    set_concurrency_limit("deliver", 3, key="typo")
    group = key_group(suite.actor_config("deliver"), "typo")
    html = dash.page("/slots")
    dash.token("/slots")
    row = _rows(html, "slots")[group]
    assert "customer=typo" in row and "#" + group.rsplit(":", 1)[1][:12] not in row
    assert "customer=typo" in _rows(html, "limits")[group]
    form = {"actor": "deliver", "key": "customer=typo", "group": group}
    assert dash.post("/slots/limit", {**form, "limit": "5"}).status_code == 303
    assert concurrency_status("deliver", key="typo").override == 5
    assert dash.post("/slots/halt", form).status_code == 303
    assert concurrency_status("deliver", key="typo").limit == 0
    assert dash.post("/slots/limit", {**form, "limit": "default"}).status_code == 303
    assert overrides.listing(suite) == []
    assert group not in _rows(dash.page("/slots"), "limits")


def test_a_limit_known_by_its_hash_and_the_actors_own_are_removed_from_the_page(suite, broker, dash, redis_client):
    @dramatiq.actor(concurrency_limit=2, concurrency_key=["customer"])
    def deliver(customer):
        pass

    set_concurrency_limit("deliver", 4)  # the actor's own: every customer
    group = key_group(suite.actor_config("deliver"), 9)
    redis_client.set(suite.keys.limit(group), 0)  # written by a release that kept no row
    redis_client.delete(suite.keys.limits_loaded())
    html = dash.page("/slots")
    dash.token("/slots")
    short = "#" + group.rsplit(":", 1)[1][:12]
    limits = _rows(html, "limits")
    assert short in limits[group] and "(all)" in limits[""]
    form = {"actor": "deliver", "key": short, "group": group}
    assert dash.post("/slots/limit", {**form, "limit": "1"}).status_code == 303
    assert concurrency_status("deliver", key=9).override == 1
    assert dash.post("/slots/limit", {"actor": "deliver", "key": short, "group": group,
                                      "limit": "default"}).status_code == 303
    assert dash.post("/slots/limit", {"actor": "deliver", "key": "(all)", "group": "",
                                      "limit": "default"}).status_code == 303
    assert overrides.listing(suite) == [] and concurrency_status("deliver").override is None
    # A form whose words name another group than its own is refused, as before.
    assert dash.post("/slots/limit", {"actor": "deliver", "key": "#0000", "group": group,
                                      "limit": "1"}).status_code == 400
