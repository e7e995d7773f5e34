"""A python3-gpu handler: load the model once, at import, and call it in handle().

The supported ways to ship a model (no pickle of a whole model reaches the GPU path: unpickling
runs code, and a class saved from a helper script is not importable here, where this folder is
the package `function`):

1. A torch.export program (recommended). In the script that builds the model:
       faas_gpu.save_model(model, torch.randn(1, 3, 32, 32), "model.pt2")  # dynamic batch dimension
   or `faas-gpu export --model net.py:make --input-shape 3,32,32 -o model.pt2`; here:
       model = torch.export.load(Path(__file__).parent / "model.pt2").module()
2. A state dict or safetensors, with the module's code in this folder:
       torch.save(model.state_dict(), "weights.pt")                        # in the script
       from .net import Net                                                # here
       net = Net(); net.load_state_dict(torch.load(HERE / "weights.pt", weights_only=True))
       model = faas_gpu.remote(net)
3. TorchScript, for old artifacts only: torch.jit.load("model.pt") still runs on the GPU path, but
   torch deprecates TorchScript; the log says so once.

With a scheduler configured, the model runs on GPU units; without one, here on the CPU.
"""


def handle(event, context):
    """Called once per request; load models at import time, not here."""
    return {
        "statusCode": 200,
        "body": {"message": "Hello from python3-gpu", "bytes": len(event.body)},
        "headers": {"Content-Type": "application/json"},
    }
