"""torch.nn factories of the models in ../shared/public-throughput (``FACTORY(batch) -> (module, inputs)``),
for bench/cross_gpu.py and the tests. Architectures as their papers / NVIDIA DeepLearningExamples configs;
what is approximated is said at each factory (the cross-GPU prediction uses ratios, so a model only has
to put its work in the right op classes in the right proportions).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch
from torch import nn

_EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "own-script" / "models.py"
_spec = importlib.util.spec_from_file_location("_own_script_models", _EXAMPLES)
assert _spec is not None and _spec.loader is not None
_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_models)

resnet50 = _models.resnet50
resnet152 = _models.resnet152

Built = tuple[nn.Module, tuple[Any, ...]]


def vgg16(batch: int) -> Built:
    """VGG-16 (configuration D), 224x224, 1000 classes: 138,357,544 parameters."""
    layers: list[nn.Module] = []
    c = 3
    for v in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"):
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(c, int(v), 3, padding=1), nn.ReLU(inplace=True)]
            c = int(v)
    model = nn.Sequential(*layers, nn.Flatten(), nn.Linear(512 * 49, 4096), nn.ReLU(inplace=True), nn.Dropout(),
                          nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(), nn.Linear(4096, 1000))
    return model, (torch.randn(batch, 3, 224, 224),)


class Bert(nn.Module):
    """BERT encoder (post-norm, GELU) with the SQuAD span head; NVIDIA's fine-tuning runs 384 tokens."""

    def __init__(self, d: int, layers: int, heads: int, seq: int, vocab: int = 30528) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(512, d)
        self.typ = nn.Embedding(2, d)
        self.ln = nn.LayerNorm(d)
        self.enc = nn.ModuleList(
            nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, activation="gelu", batch_first=True)
            for _ in range(layers)
        )
        self.qa = nn.Linear(d, 2)
        self.register_buffer("positions", torch.arange(seq), persistent=False)

    def forward(self, tokens: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        x = self.ln(self.tok(tokens) + self.pos(self.positions) + self.typ(types))
        for layer in self.enc:
            x = layer(x)
        return self.qa(x)


def _bert(batch: int, d: int, layers: int, heads: int, seq: int = 384) -> Built:
    tokens = torch.randint(0, 30528, (batch, seq))
    return Bert(d, layers, heads, seq), (tokens, torch.zeros(batch, seq, dtype=torch.long))


def bert_base_squad(batch: int) -> Built:
    return _bert(batch, 768, 12, 12)


def bert_large_squad(batch: int) -> Built:
    return _bert(batch, 1024, 24, 16)


class XlBlock(nn.Module):
    def __init__(self, d: int, heads: int, inner: int) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln1 = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, inner), nn.ReLU(inplace=True), nn.Linear(inner, d))
        self.ln2 = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, mem: torch.Tensor) -> torch.Tensor:
        kv = torch.cat([mem, x], dim=1)
        x = self.ln1(x + self.attn(x, kv, kv, need_weights=False)[0])
        return self.ln2(x + self.ff(x))


class TransformerXL(nn.Module):
    """Transformer-XL (NVIDIA DLE configs): attention over the segment and a same-length memory of the
    previous one. Approximated: learned absolute positions instead of relative ones, and the adaptive
    softmax as its head cluster only (20,000 words + 3 tail logits; the tail clusters are a small share)."""

    def __init__(self, d: int, layers: int, heads: int, inner: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(20003, d)
        self.blocks = nn.ModuleList(XlBlock(d, heads, inner) for _ in range(layers))
        self.head = nn.Linear(d, 20003)
        self.layers, self.seq, self.d = layers, seq, d

    def forward(self, tokens: torch.Tensor, mems: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for i, block in enumerate(self.blocks):
            x = block(x, mems[i])
        return self.head(x)


def _txl(batch: int, d: int, layers: int, heads: int, inner: int, seq: int) -> Built:
    model = TransformerXL(d, layers, heads, inner, seq)
    return model, (torch.randint(0, 20003, (batch, seq)), torch.randn(layers, batch, seq, d))


def transformer_xl_base(batch: int) -> Built:
    return _txl(batch, 512, 16, 8, 2048, 192)


def transformer_xl_large(batch: int) -> Built:
    return _txl(batch, 1024, 18, 16, 4096, 384)


class Gnmt(nn.Module):
    """GNMT v2 (NVIDIA DLE): 4-layer LSTM encoder (the first bidirectional), 4-layer LSTM decoder with
    attention, 1024 units, 32,320-token shared vocabulary; 50 source and 50 target tokens a sentence."""

    def __init__(self, d: int = 1024, vocab: int = 32320) -> None:
        super().__init__()
        self.embed_src = nn.Embedding(vocab, d)
        self.embed_tgt = nn.Embedding(vocab, d)
        self.enc_bi = nn.LSTM(d, d // 2, batch_first=True, bidirectional=True)
        self.enc = nn.LSTM(d, d, num_layers=3, batch_first=True)
        self.dec1 = nn.LSTM(d, d, batch_first=True)
        self.attn = nn.Linear(d, d, bias=False)
        self.dec = nn.LSTM(2 * d, d, num_layers=3, batch_first=True)
        self.classifier = nn.Linear(d, vocab)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        enc, _ = self.enc(self.enc_bi(self.embed_src(src))[0])
        h, _ = self.dec1(self.embed_tgt(tgt))
        scores = torch.bmm(self.attn(h), enc.transpose(1, 2)).softmax(-1)
        ctx = torch.bmm(scores, enc)
        out, _ = self.dec(torch.cat([h, ctx], dim=-1))
        return self.classifier(out)


def gnmt(batch: int) -> Built:
    return Gnmt(), (torch.randint(0, 32320, (batch, 50)), torch.randint(0, 32320, (batch, 50)))


# public-table model name -> (factory, family)
PUBLIC_MODELS: dict[str, tuple[str, str]] = {
    "resnet50v1.5": ("resnet50", "cnn"),
    "tfcnn-resnet50": ("resnet50", "cnn"),
    "tfcnn-resnet152": ("resnet152", "cnn"),
    "tfcnn-vgg16": ("vgg16", "cnn"),
    "bert-base_finetune-squad": ("bert_base_squad", "bert"),
    "bert-large_finetune-squad": ("bert_large_squad", "bert"),
    "transformer-xl-base": ("transformer_xl_base", "transformer-xl"),
    "transformer-xl-large": ("transformer_xl_large", "transformer-xl"),
    "gnmt": ("gnmt", "rnn"),
}
