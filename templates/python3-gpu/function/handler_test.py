from types import SimpleNamespace

from .handler import handle


def test_handle_answers_json():
    event = SimpleNamespace(body=b"abc", headers={}, method="POST", query={}, path="/")
    result = handle(event, SimpleNamespace(hostname="localhost"))
    assert result["statusCode"] == 200
    assert result["body"]["bytes"] == 3
