"""Errors: a Redis refusal by the user's ACL is named as one; a docstring message is one line."""

from __future__ import annotations

from dramatiq_unique import RedisPermissionDenied, RedisUnavailable
from dramatiq_unique.storage.database import refused_options


def test_a_noperm_reply_raises_redis_permission_denied_naming_the_keys():
    error = RedisUnavailable("taking lock 'app:redrive': NOPERM this user has no permissions to access one of the keys")
    assert type(error) is RedisPermissionDenied and isinstance(error, RedisUnavailable)
    assert "redlock:<key_prefix>:*" in str(error) and "NOPERM this user" in str(error) and "\n" not in str(error)
    assert type(RedisUnavailable("taking lock 'x': Connection refused")) is RedisUnavailable


def test_a_poolers_refusal_of_the_options_parameter_is_recognised():
    assert refused_options(Exception('FATAL:  unsupported startup parameter: options'))
    assert not refused_options(Exception('FATAL:  unsupported startup parameter: extra_float_digits'))
