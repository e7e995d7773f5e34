def handle(event, context):
    """Called once per request; load models at import time, not here."""
    return {
        "statusCode": 200,
        "body": {"message": "Hello from python3-gpu", "bytes": len(event.body)},
        "headers": {"Content-Type": "application/json"},
    }
