__version__ = "0.1.0"


def remote(module):
    """The module, run on GPU units through the scheduler when one is configured (else as it is)."""
    from faas_gpu.client import remote as _remote

    return _remote(module)
