"""The README and the benchmarks' README stay short front pages whose links into the checkout
resolve.  ``mkdocs build --strict`` checks the links inside docs/; these two files sit outside
it, so a page renamed or a heading reworded there would otherwise leave them pointing nowhere."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def slug(heading: str) -> str:
    """A heading's anchor, as Python-Markdown's toc extension (MkDocs' default) makes it."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+?)\s*$", text, re.M)}


def links(page: Path) -> list[str]:
    return [link for link in LINK.findall(FENCE.sub("", page.read_text())) if "://" not in link]


FRONT_PAGES = [ROOT / "README.md", ROOT / "tests" / "benchmarks" / "README.md"]


@pytest.mark.parametrize("page", FRONT_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_names_a_file_of_the_checkout_and_a_heading_of_it(page: Path) -> None:
    assert links(page), "a front page links into the docs"
    broken = []
    for link in links(page):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists() or (anchor and anchor not in anchors(target)):
            broken.append(link)
    assert broken == []


def test_the_readme_is_a_front_page_not_the_manual() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_slug_makes_mkdocs_anchors() -> None:
    assert slug("How uniqueness holds (zero slippage)") == "how-uniqueness-holds-zero-slippage"
    assert slug("Metrics: `bench_metrics.py`") == "metrics-bench_metricspy"
    assert slug("`unique_ttl` is a lease; `heartbeat()` renews it") == "unique_ttl-is-a-lease-heartbeat-renews-it"
