"""Fixtures of the Redis tests: a certificate authority and certificates of the test run's own."""

from __future__ import annotations

import pytest

from tests.servers import Certificates


@pytest.fixture(scope="session")
def certs(tmp_path_factory) -> Certificates:
    return Certificates(tmp_path_factory.mktemp("certs"))
