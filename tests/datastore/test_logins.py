"""The daemons' logins to etcd and Redis (`faas_gpu.credentials`): where they come from, in which
order, and that a password never shows where a URL or a login is printed."""

from __future__ import annotations

import pytest

from faas_gpu.credentials import Login, read_login, resolve_login, split_login, write_login


@pytest.mark.parametrize(
    ("url", "bare", "user", "password"),
    [
        ("http://faas-gpu:s3cr%3At@127.0.0.1:2379", "http://127.0.0.1:2379", "faas-gpu", "s3cr:t"),
        ("etcd://u:pw-1@h1:2379,http://h2:2379", "etcd://h1:2379,http://h2:2379", "u", "pw-1"),
        ("http://u:pw-2@[::1]:2379", "http://[::1]:2379", "u", "pw-2"),
        ("redis://:only-a-password@127.0.0.1:6379/0", "redis://127.0.0.1:6379/0", None, "only-a-password"),
        ("redis://u:pw-3@127.0.0.1:6379/0", "redis://127.0.0.1:6379/0", "u", "pw-3"),
    ],
)
def test_a_urls_login_is_taken_out_of_it(url, bare, user, password):
    plain, login = split_login(url)
    assert plain == bare and login.user == user and login.password == password
    assert password not in repr(login) and password not in str(login)


def test_a_url_without_a_login_is_left_as_it_is():
    assert split_login("http://127.0.0.1:2379") == ("http://127.0.0.1:2379", None)
    assert split_login("127.0.0.1:2379") == ("127.0.0.1:2379", None)


def test_a_given_file_wins_then_the_url_then_the_state_folders_file(tmp_path):
    secrets = tmp_path / "secrets"
    write_login(secrets / "etcd-credentials", Login("from-secrets", "a"))
    given = tmp_path / "given"
    write_login(given, Login("from-file", "b:c"))
    assert resolve_login("http://u:p@h:2379", given, secrets, "etcd-credentials")[1].user == "from-file"
    assert resolve_login("http://u:p@h:2379", None, secrets, "etcd-credentials")[1].user == "u"
    plain, login = resolve_login("http://h:2379", None, secrets, "etcd-credentials")
    assert plain == "http://h:2379" and login.user == "from-secrets" and login.where.endswith("etcd-credentials")
    assert resolve_login("http://h:2379", None, tmp_path / "none", "etcd-credentials")[1] is None
    assert read_login(given).password == "b:c"  # the first colon splits: a password may hold more
    assert (secrets / "etcd-credentials").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(("text", "why"), [("", "is empty"), ("user:", "password"), ("\n\n", "is empty")])
def test_a_bad_login_file_is_refused_naming_the_file(tmp_path, text, why):
    path = tmp_path / "login"
    path.write_text(text)
    with pytest.raises(ValueError, match=why) as caught:
        read_login(path)
    assert str(path) in str(caught.value)
    with pytest.raises(ValueError, match="cannot|No such"):
        read_login(tmp_path / "missing")
