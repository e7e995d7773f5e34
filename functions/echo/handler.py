"""Echo the request body back: the smallest python3-gpu function.

Text comes back as text with the request's Content-Type; a body that is not UTF-8 comes back
byte for byte as application/octet-stream. X-Echo-Method and X-Echo-Path tell what was called.
"""


def handle(event, context):
    headers = {"X-Echo-Method": event.method, "X-Echo-Path": event.path}
    try:
        text = event.body.decode("utf-8")
    except UnicodeDecodeError:
        # the python3-http index.py returns the body as-is only for this exact header key
        return {
            "statusCode": 200,
            "body": event.body,
            "headers": {**headers, "Content-type": "application/octet-stream"},
        }
    headers["Content-Type"] = event.headers.get("Content-Type") or "text/plain"
    return {"statusCode": 200, "body": text, "headers": headers}
