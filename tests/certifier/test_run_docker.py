"""The certifier recipe's pure parts (no engine, no Go): its summary of `go test -v` output and the
faas-cli config it hands the certifier for `-enableAuth`. The run itself is `make certify-docker`."""

from __future__ import annotations

import base64

import yaml

from tests.certifier.run_docker import GATEWAY, summarize, write_faas_cli_config

GO_TEST_OUTPUT = """\
=== RUN   Test_Invoke
--- PASS: Test_Invoke (12.26s)
    --- PASS: Test_Invoke/Invoke_test_with_different_verbs (6.38s)
=== RUN   Test_ScaleFromZeroDuringInvoke
    scaling_test.go:81: got 1 replicas, wanted 0
--- FAIL: Test_ScaleFromZeroDuringInvoke (2.33s)
--- SKIP: Test_ScaleToZero (0.00s)
FAIL
"""


def test_summary_has_one_line_per_test_and_subtest():
    assert summarize(GO_TEST_OUTPUT) == [
        ("PASS", "Test_Invoke"),
        ("PASS", "Test_Invoke/Invoke_test_with_different_verbs"),
        ("FAIL", "Test_ScaleFromZeroDuringInvoke"),
        ("SKIP", "Test_ScaleToZero"),
    ]


def test_faas_cli_config_carries_the_stacks_basic_auth_as_faas_cli_login_writes_it(tmp_path):
    secrets = tmp_path / "home" / "secrets"
    secrets.mkdir(parents=True)
    (secrets / "basic-auth-user").write_text("admin\n")
    (secrets / "basic-auth-password").write_text("pw\n")
    write_faas_cli_config(tmp_path / "cli", tmp_path / "home")
    config = yaml.safe_load((tmp_path / "cli" / "config.yml").read_text())
    [auth] = config["auths"]
    assert auth["gateway"] == GATEWAY and auth["auth"] == "basic"
    assert base64.b64decode(auth["token"]).decode() == "admin:pw"
    assert (tmp_path / "cli" / "config.yml").stat().st_mode & 0o077 == 0
