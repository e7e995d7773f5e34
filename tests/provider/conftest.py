"""Fixtures of the provider tests."""

import pytest

from tests.provider.async_stack import receiving


@pytest.fixture
def receiver():
    """A callback receiver on loopback (`async_stack.Receiver`): `.url`, `.seen[call_id]`."""
    with receiving() as r:
        yield r
