"""Character-level text data sets for a language model (``task: language_model``).

Every rank calls ``char_windows(split=..., seq_len=...)``: the corpus shipped beside this file,
cut into windows of ``seq_len`` characters; each item is ``(tokens, targets)``, the window's
character ids and the ids of the characters one position later.

``char_sentences(split=..., seq_len=...)`` makes one item per sentence instead, padded on the
right to ``seq_len``: its tokens with id 0 (any id would do) and its targets with -100, which the
run leaves out of the loss and of ``eval/perplexity``.
"""

import re
from pathlib import Path

import torch
from torch.utils.data import Dataset

CORPUS = Path(__file__).with_name("corpus.txt")


class CharWindows(Dataset):
    def __init__(self, text: str, vocabulary: str, seq_len: int):
        ids = torch.tensor([vocabulary.index(c) for c in text])
        self.windows = (len(ids) - 1) // seq_len
        self.inputs = ids[: self.windows * seq_len].view(self.windows, seq_len)
        self.targets = ids[1 : self.windows * seq_len + 1].view(self.windows, seq_len)
        self.num_classes = len(vocabulary)  # the vocabulary size: Tessera reads it when the spec does not say

    def __len__(self):
        return self.windows

    def __getitem__(self, i):
        return self.inputs[i], self.targets[i]


def _split_text(split: str, holdout: float) -> tuple[str, str]:
    """The corpus's ``split`` ("train": all but its last ``holdout``; else that), and the vocabulary."""
    text = CORPUS.read_text()
    vocabulary = "".join(sorted(set(text)))  # from the whole corpus: train and eval share the ids
    cut = int(len(text) * (1 - holdout))
    return (text[:cut] if split == "train" else text[cut:]), vocabulary


def char_windows(split: str = "train", seq_len: int = 64, holdout: float = 0.1) -> CharWindows:
    return CharWindows(*_split_text(split, holdout), seq_len)


class PaddedSentences(Dataset):
    def __init__(self, text: str, vocabulary: str, seq_len: int):
        self.items = []
        for sentence in re.split(r"(?<=[.;?!])\s+", text):
            ids = [vocabulary.index(c) for c in sentence.strip()]
            for start in range(0, len(ids) - 1, seq_len):  # a long sentence: several items
                piece = ids[start:start + seq_len + 1]
                pad = seq_len - (len(piece) - 1)
                self.items.append((torch.tensor(piece[:-1] + [0] * pad), torch.tensor(piece[1:] + [-100] * pad)))
        self.num_classes = len(vocabulary)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def char_sentences(split: str = "train", seq_len: int = 64, holdout: float = 0.1) -> PaddedSentences:
    return PaddedSentences(*_split_text(split, holdout), seq_len)
