"""Ports handed to the servers we start come from outside the kernel's ephemeral range, so an
outgoing connection's local end can never take one between the draw and the child's bind."""

from __future__ import annotations

import socket

from faas_gpu import ports


def test_a_drawn_port_lies_outside_the_ephemeral_range_and_is_bindable():
    low, high = ports.ephemeral_range()
    for _ in range(50):
        port = ports.free_port()
        assert not low <= port <= high
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_is_not_handed_out_twice_in_a_row():
    drawn = [ports.free_port() for _ in range(200)]
    assert len(set(drawn)) == len(drawn)


def test_a_port_something_listens_on_is_never_drawn(monkeypatch):
    with socket.create_server(("127.0.0.1", ports.free_port())) as taken:
        port = taken.getsockname()[1]
        monkeypatch.setattr(ports, "pool", lambda low, high: range(port, port + 1))
        assert ports.free_port() != port


def test_the_pool_sits_below_the_usual_range_and_above_a_low_one():
    assert ports.pool(32768, 60999) == range(32768 - ports.POOL_SIZE, 32768)
    assert ports.pool(1024, 40000) == range(40001, 40001 + ports.POOL_SIZE)
    assert ports.pool(1024, 65000) is None


def test_an_unreadable_range_file_means_the_linux_default(tmp_path):
    assert ports.ephemeral_range(tmp_path / "missing") == ports.LINUX_DEFAULT
    (tmp_path / "bad").write_text("not numbers")
    assert ports.ephemeral_range(tmp_path / "bad") == ports.LINUX_DEFAULT
    (tmp_path / "good").write_text("10000\t20000\n")
    assert ports.ephemeral_range(tmp_path / "good") == (10000, 20000)


def test_with_no_room_outside_the_range_it_falls_back_to_port_zero(monkeypatch):
    monkeypatch.setattr(ports, "pool", lambda low, high: None)
    port = ports.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
