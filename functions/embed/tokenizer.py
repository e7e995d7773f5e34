"""BERT's uncased WordPiece tokenizer, read from the model package's tokenizer.json.

The same steps as the `tokenizers` package runs for this file (BertNormalizer, BertPreTokenizer,
WordPiece, the [CLS] ... [SEP] template), in plain Python: the function then needs no tokenizer
package, and the steps are short enough to read. Checked id for id against `tokenizers` on
mixed-script text (tests/functions/test_examples_embed.py has the reference ids).
"""

from __future__ import annotations

import json
import re
import unicodedata

SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# tokenizer.json's added tokens (normalized: false) are matched in the raw text before anything else
_SPECIAL_RE = re.compile("(" + "|".join(re.escape(t) for t in SPECIAL) + ")")
_CONTROL = {"Cc", "Cf", "Co"}  # not Cn: tokenizers keeps unassigned code points
_CJK = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B920, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


def _is_control(c: str) -> bool:
    return c not in "\t\n\r" and unicodedata.category(c) in _CONTROL


def _is_cjk(c: str) -> bool:
    cp = ord(c)
    return any(lo <= cp <= hi for lo, hi in _CJK)


def _is_punctuation(c: str) -> bool:
    return (c.isascii() and not c.isalnum() and c.isprintable() and not c.isspace()) or unicodedata.category(
        c
    ).startswith("P")


def normalize(text: str) -> str:
    """BertNormalizer: drop control characters, spaces for whitespace, CJK characters set apart,
    accents stripped (NFD, no nonspacing marks), lower case — in the order tokenizers applies them."""
    text = "".join(" " if c.isspace() else c for c in text if c not in "\x00\ufffd" and not _is_control(c))
    text = "".join(f" {c} " if _is_cjk(c) else c for c in text)
    text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
    return text.lower()


def pre_tokenize(text: str) -> list[str]:
    """BertPreTokenizer: split on whitespace, and every punctuation character is a word of its own."""
    words: list[str] = []
    for chunk in text.split():
        start = 0
        for i, c in enumerate(chunk):
            if _is_punctuation(c):
                if i > start:
                    words.append(chunk[start:i])
                words.append(c)
                start = i + 1
        if start < len(chunk):
            words.append(chunk[start:])
    return words


class WordPiece:
    """Text -> token ids ([CLS] ... [SEP], at most `max_length`), as the model was trained on."""

    def __init__(self, tokenizer_json: bytes | str, max_length: int = 256):
        spec = json.loads(tokenizer_json)
        model = spec["model"]
        if model.get("type") != "WordPiece":
            raise ValueError(f"tokenizer.json: model.type must be WordPiece, got {model.get('type')!r}")
        self.vocab: dict[str, int] = model["vocab"]
        self.prefix: str = model.get("continuing_subword_prefix", "##")
        self.max_chars: int = int(model.get("max_input_chars_per_word", 100))
        self.unk = self.vocab[model.get("unk_token", "[UNK]")]
        self.cls, self.sep, self.pad = self.vocab["[CLS]"], self.vocab["[SEP]"], self.vocab["[PAD]"]
        if max_length < 2:
            raise ValueError("max_length: must leave room for [CLS] and [SEP]")
        self.max_length = max_length

    def _word(self, word: str) -> list[int]:
        """Greedy longest-match-first; a word with a piece not in the vocabulary is one [UNK]."""
        if len(word) > self.max_chars:
            return [self.unk]
        out, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else self.prefix + word[start:end]
                if piece in self.vocab:
                    out.append(self.vocab[piece])
                    break
                end -= 1
            if end == start:
                return [self.unk]
            start = end
        return out

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for part in _SPECIAL_RE.split(text):
            if part in SPECIAL:
                ids.append(self.vocab[part])
            elif part:
                for word in pre_tokenize(normalize(part)):
                    ids += self._word(word)
        return [self.cls, *ids[: self.max_length - 2], self.sep]
