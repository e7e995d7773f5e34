"""A second example model for profiling, unlike ResNetMini: token ids in, parallel branches.

TextCNN (Kim, 2014), the shape of INFless's textcnn-69: an embedding, three 1-D convolutions of
kernel sizes 3, 4 and 5 side by side over the same embedded sequence, each max-pooled over time,
concatenated and classified. Its operator graph forks after the embedding and joins at the
concatenation, which is what the combination rule of §3.3 has to handle.
"""

from __future__ import annotations

import torch
from torch import nn

SEQ_LEN = 64  # input shape: (SEQ_LEN,) token ids, dtype int64


class TextCNN(nn.Module):
    def __init__(self, vocab: int = 5000, dim: int = 64, channels: int = 64, kernels=(3, 4, 5), classes: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.convs = nn.ModuleList(nn.Conv1d(dim, channels, k) for k in kernels)
        self.head = nn.Linear(channels * len(kernels), classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens).transpose(1, 2)  # (batch, dim, time)
        pooled = [torch.amax(torch.relu(conv(x)), dim=2) for conv in self.convs]
        return self.head(torch.cat(pooled, dim=1))


def textcnn() -> nn.Module:
    """For `faas-gpu profile --model faas_gpu.profiling.examples:textcnn --input-shape 64 --input-dtype int64`."""
    torch.manual_seed(0)
    return TextCNN().eval()
