"""Fixtures of the CLI tests: the stub gateway both the in-repo and the any-folder tests call."""

import pytest

from tests.cli.stub_gateway import Stub


@pytest.fixture
def stub():
    """A stub gateway on a free loopback port, stopped after the test."""
    s = Stub()
    yield s
    s.stop()
