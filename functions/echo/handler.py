def handle(event, context):
    """Echo the request body back, with the content type it came with."""
    return {
        "statusCode": 200,
        "body": event.body.decode("utf-8", "replace"),
        "headers": {"Content-Type": event.headers.get("Content-Type", "text/plain")},
    }
