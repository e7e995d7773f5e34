__version__ = "0.1.0"


def remote(module):
    """The module, run on GPU units through the scheduler when one is configured (else as it is)."""
    from faas_gpu.client import remote as _remote

    return _remote(module)


def save_model(module, example, path):
    """Save `module` as python3-gpu loads it: a torch.export program with a dynamic batch dimension
    (`faas_gpu.client.save_model`); the handler loads it with torch.export.load(path).module()."""
    from faas_gpu.client import save_model as _save_model

    return _save_model(module, example, path)
