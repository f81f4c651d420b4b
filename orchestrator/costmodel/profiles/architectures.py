"""The supported models, built layer by layer: CIFAR ResNets, Shake-Shake, VGG-16, Transformer base."""

from __future__ import annotations

import math

from orchestrator.costmodel.profiles.layers import (
    SOFTMAX_FLOPS_PER_ELEMENT,
    add,
    batch_norm,
    conv2d,
    dense,
    global_avg_pool,
    layer_norm,
    max_pool,
    nbytes,
    relu,
    softmax_xent,
)
from orchestrator.costmodel.profiles.model import Layer, ModelProfile, Shape, Variable

# ---------------------------------------------------------------- ResNet (CIFAR), as jobs/tfjob/models.py

RESNET_SETS: dict[str, tuple[tuple[int, int, int], tuple[int, int, int]]] = {
    "resnet_tiny": ((1, 1, 1), (8, 16, 32)),
    "resnet_cifar_15": ((2, 2, 2), (16, 32, 64)),
    "resnet_cifar_32": ((5, 5, 5), (16, 32, 64)),
    "resnet_cifar_56": ((9, 9, 9), (16, 32, 64)),
}
# Depths measured on real GPUs (data/measurements) that the TF job does not offer.
MEASURED_RESNETS: dict[str, tuple[tuple[int, int, int], tuple[int, int, int]]] = {
    "resnet_cifar_20": ((3, 3, 3), (16, 32, 64)),
    "resnet_cifar_110": ((18, 18, 18), (16, 32, 64)),
}


def resnet_cifar(
    name: str,
    blocks: tuple[int, int, int],
    filters: tuple[int, int, int],
    input_shape: Shape = (32, 32, 3),
    num_classes: int = 10,
) -> ModelProfile:
    layers: list[Layer] = []

    def push(layer: Layer) -> Shape:
        layers.append(layer)
        return layer.output_shape

    x = push(conv2d("stem_conv", input_shape, filters[0], 3, 1, bias=False))
    x = push(batch_norm("stem_bn", x))
    x = push(relu("stem_relu", x))
    for stage, (n_blocks, f) in enumerate(zip(blocks, filters, strict=True)):
        for b in range(n_blocks):
            stride = 2 if (stage > 0 and b == 0) else 1
            n = f"s{stage}b{b}"
            block_in = x
            y = push(conv2d(f"{n}_conv1", block_in, f, 3, stride, bias=False))
            y = push(batch_norm(f"{n}_bn1", y))
            y = push(relu(f"{n}_relu1", y))
            y = push(conv2d(f"{n}_conv2", y, f, 3, 1, bias=False))
            y = push(batch_norm(f"{n}_bn2", y))
            if stride != 1 or block_in[-1] != f:
                s = push(conv2d(f"{n}_proj", block_in, f, 1, stride, bias=False))
                push(batch_norm(f"{n}_proj_bn", s))
            y = push(add(f"{n}_add", y))
            x = push(relu(f"{n}_out", y))
    x = push(global_avg_pool("gap", x))
    x = push(dense("logits", x, num_classes))
    push(softmax_xent("softmax_xent", x))
    depth = 6 * blocks[0] + 2 if blocks[0] == blocks[1] == blocks[2] else 0
    desc = (
        f"CIFAR ResNet blocks {list(blocks)} filters {list(filters)}"
        + (f" (ResNet-{depth})" if depth else "")
        + ", 1x1 projection shortcuts, as jobs/tfjob/models.py"
    )
    return ModelProfile(name, desc, "one 32x32x3 image", input_shape, 128, tuple(layers))


# ---------------------------------------------------------------- Shake-Shake (CIFAR)

# Gastaldi 2017 ("Shake-Shake regularization", Table 1): Shake-Shake-26 2x32d has 2.9M parameters and
# 2x96d 26.2M; the ICAC'19 study trained both ("small" and "big") beside the ResNets.
SHAKE_SETS: dict[str, int] = {"shake_shake_small": 32, "shake_shake_big": 96}


def _shake_branch(n: str, x: Shape, f: int, stride: int) -> list[Layer]:
    out = [relu(f"{n}_relu1", x), conv2d(f"{n}_conv1", x, f, 3, stride, bias=False)]
    y = out[-1].output_shape
    out += [batch_norm(f"{n}_bn1", y), relu(f"{n}_relu2", y), conv2d(f"{n}_conv2", y, f, 3, 1, bias=False)]
    return [*out, batch_norm(f"{n}_bn2", y)]


def shake_shake(name: str, width: int, blocks: int = 4) -> ModelProfile:
    """Shake-Shake-26 2x<width>d: 16-filter stem, three stages of ``blocks`` residual blocks with two
    branches each (ReLU-conv3x3-BN-ReLU-conv3x3-BN), widths w/2w/4w; a widening shortcut is two
    1x1 convs of half the width each, concatenated, then BN (Gastaldi 2017, sec. 2.2)."""
    layers: list[Layer] = [conv2d("stem_conv", (32, 32, 3), 16, 3, 1, bias=False)]
    x = layers[-1].output_shape
    layers.append(batch_norm("stem_bn", x))
    for stage, f in enumerate((width, 2 * width, 4 * width)):
        for b in range(blocks):
            stride = 2 if (stage > 0 and b == 0) else 1
            n = f"s{stage}b{b}"
            for branch in ("a", "b"):
                layers += _shake_branch(f"{n}{branch}", x, f, stride)
            y = layers[-1].output_shape
            if stride != 1 or x[-1] != f:
                layers += [conv2d(f"{n}_short{i}", x, f // 2, 1, stride, bias=False) for i in (1, 2)]
                layers.append(batch_norm(f"{n}_short_bn", y))
            layers.append(add(f"{n}_add", y))
            x = y
    layers += [relu("final_relu", x), global_avg_pool("gap", x)]
    layers.append(dense("logits", layers[-1].output_shape, 10))
    layers.append(softmax_xent("softmax_xent", layers[-1].output_shape))
    return ModelProfile(name, f"Shake-Shake-26 2x{width}d for CIFAR-10 (Gastaldi 2017)", "one 32x32x3 image",
                        (32, 32, 3), 128, tuple(layers))


# ---------------------------------------------------------------- VGG-16 (ImageNet)


def vgg16(input_shape: Shape = (224, 224, 3), num_classes: int = 1000) -> ModelProfile:
    layers: list[Layer] = []
    x = input_shape
    for block, (n_convs, f) in enumerate([(2, 64), (2, 128), (3, 256), (3, 512), (3, 512)], start=1):
        for i in range(1, n_convs + 1):
            layer = conv2d(f"block{block}_conv{i}", x, f, 3, 1, bias=True, relu=True)
            layers.append(layer)
            x = layer.output_shape
        layers.append(max_pool(f"block{block}_pool", x))
        x = layers[-1].output_shape
    x = (math.prod(x),)  # flatten: a view, no traffic
    for i, units in enumerate([4096, 4096], start=1):
        layers.append(dense(f"fc{i}", x, units, relu=True))
        x = layers[-1].output_shape
    layers.append(dense("predictions", x, num_classes))
    layers.append(softmax_xent("softmax_xent", layers[-1].output_shape))
    return ModelProfile(
        "vgg16",
        "VGG-16 (configuration D) for ImageNet, 224x224x3, 1000 classes, as keras.applications.VGG16",
        "one 224x224x3 image",
        input_shape,
        32,
        tuple(layers),
    )


# ---------------------------------------------------------------- Transformer base


def _attention(prefix: str, lq: int, lk: int, d: int, heads: int) -> list[Layer]:
    """Multi-head attention of ``lq`` queries over ``lk`` keys: projections, scores, softmax, context."""
    q_in, kv_in = (lq, d), (lk, d)
    scores = (heads, lq, lk)
    n_scores = math.prod(scores)
    # Q K^T: lq*lk*d MACs; softmax over the keys; probabilities times V: lq*lk*d MACs.
    return [
        dense(f"{prefix}_query", q_in, d),
        dense(f"{prefix}_key", kv_in, d),
        dense(f"{prefix}_value", kv_in, d),
        Layer(f"{prefix}_scores", "matmul", scores, lq * lk * d, 2 * lq * lk * d + n_scores,
              nbytes(q_in) + nbytes(kv_in), nbytes(scores), 0, nbytes(scores)),
        Layer(f"{prefix}_softmax", "softmax", scores, 0, SOFTMAX_FLOPS_PER_ELEMENT * n_scores,
              nbytes(scores), nbytes(scores), 0, nbytes(scores)),
        Layer(f"{prefix}_context", "matmul", q_in, lq * lk * d, 2 * lq * lk * d,
              nbytes(scores) + nbytes(kv_in), nbytes(q_in), 0, nbytes(q_in)),
        dense(f"{prefix}_output", q_in, d),
    ]


def _ffn(prefix: str, x: Shape, d_ff: int) -> list[Layer]:
    h = dense(f"{prefix}_ffn1", x, d_ff)
    return [h, relu(f"{prefix}_ffn_relu", h.output_shape), dense(f"{prefix}_ffn2", h.output_shape, x[-1])]


def _embedding(name: str, x: Shape, variables: tuple[Variable, ...] = ()) -> Layer:
    # Embedding lookup (a gather: reads the looked-up rows), scale by sqrt(d) and add the positions.
    return Layer(name, "embedding", x, 0, 2 * math.prod(x), nbytes(x), nbytes(x), 0, nbytes(x), variables)


def _encoder_layer(p: str, src: Shape, d_ff: int, heads: int) -> list[Layer]:
    length, d = src
    return [
        *_attention(f"{p}_self", length, length, d, heads),
        add(f"{p}_add1", src), layer_norm(f"{p}_ln1", src),
        *_ffn(p, src, d_ff),
        add(f"{p}_add2", src), layer_norm(f"{p}_ln2", src),
    ]


def _decoder_layer(p: str, tgt: Shape, src_len: int, d_ff: int, heads: int) -> list[Layer]:
    length, d = tgt
    return [
        *_attention(f"{p}_self", length, length, d, heads),  # causal mask: same work, masked
        add(f"{p}_add1", tgt), layer_norm(f"{p}_ln1", tgt),
        *_attention(f"{p}_cross", length, src_len, d, heads),
        add(f"{p}_add2", tgt), layer_norm(f"{p}_ln2", tgt),
        *_ffn(p, tgt, d_ff),
        add(f"{p}_add3", tgt), layer_norm(f"{p}_ln3", tgt),
    ]


def transformer(
    name: str = "transformer_base",
    layers_n: int = 6,
    d: int = 512,
    d_ff: int = 2048,
    heads: int = 8,
    vocab: int = 37000,
    src_len: int = 128,
    tgt_len: int = 128,
) -> ModelProfile:
    src, tgt = (src_len, d), (tgt_len, d)
    emb = Variable("shared_embedding/embeddings", (vocab, d))
    layers = [_embedding("src_embedding", src, (emb,))]
    for i in range(layers_n):
        layers += _encoder_layer(f"enc{i}", src, d_ff, heads)
    layers.append(_embedding("tgt_embedding", tgt))
    for i in range(layers_n):
        layers += _decoder_layer(f"dec{i}", tgt, src_len, d_ff, heads)
    layers.append(dense("logits", tgt, vocab, bias=False, tied_weight_bytes=emb.nbytes))
    layers.append(softmax_xent("softmax_xent", (tgt_len, vocab)))
    desc = (
        f"Transformer base (Vaswani et al. 2017): {layers_n}+{layers_n} layers, d_model {d}, d_ff {d_ff}, "
        f"{heads} heads, shared {vocab}-token embedding"
    )
    return ModelProfile(
        name,
        desc,
        f"a sentence pair of {src_len} source + {tgt_len} target tokens",
        (src_len + tgt_len,),
        32,
        tuple(layers),
    )


# ---------------------------------------------------------------- GPT (decoder-only)


def gpt(
    name: str = "gpt_1_5b", layers_n: int = 48, d: int = 1600, heads: int = 25, vocab: int = 50257,
    seq_len: int = 512, positions: int = 1024,
) -> ModelProfile:
    """A GPT-2-style decoder-only transformer (pre-layer-norm blocks, learned positions, tied output
    embedding). The defaults are GPT-2 XL's shape (Radford et al. 2019: 48 layers, d_model 1600, 25 heads,
    50,257 tokens, 1,024 positions: 1.56 B parameters), trained here on sequences of ``seq_len`` tokens."""
    x = (seq_len, d)
    tokens = Variable("wte/embeddings", (vocab, d))
    layers = [_embedding("embedding", x, (tokens, Variable("wpe/embeddings", (positions, d))))]
    for i in range(layers_n):
        p = f"h{i}"
        layers += [layer_norm(f"{p}_ln1", x), *_attention(f"{p}_attn", seq_len, seq_len, d, heads),
                   add(f"{p}_add1", x), layer_norm(f"{p}_ln2", x), *_ffn(p, x, 4 * d), add(f"{p}_add2", x)]
    layers += [layer_norm("ln_f", x), dense("logits", x, vocab, bias=False, tied_weight_bytes=tokens.nbytes),
               softmax_xent("softmax_xent", (seq_len, vocab))]
    desc = f"GPT-2-style decoder: {layers_n} layers, d_model {d}, {heads} heads, {vocab}-token tied embedding"
    return ModelProfile(name, desc, f"a sequence of {seq_len} tokens", (seq_len,), 8, tuple(layers))
