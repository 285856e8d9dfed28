"""The native T5's settings and layers (``t5_model.py`` assembles them): relative position
buckets, the FlexAttention mask object, RMSNorm, the gated feed-forward, self- and
cross-attention, and the encoder and decoder blocks (the stacks and their masks: ``t5_model.py``).

Shipped as a flat file next to the programs (imported by name).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention

ATTENTION_KINDS = ("sdpa", "flex")
_HALF = (torch.float16, torch.bfloat16)
# feed_forward_proj -> (gated, activation). transformers T5Config: "gated-<act>" or "<act>", and the
# legacy "gated-gelu" means the tanh approximation ("gelu_new"); a plain "gelu" is the exact erf GELU.
_FEED_FORWARD = {
    "relu": (False, "relu"),
    "gelu": (False, "gelu"),
    "silu": (False, "silu"),
    "gated-relu": (True, "relu"),
    "gated-gelu": (True, "gelu_new"),
    "gated-silu": (True, "silu"),
}


def _activation(name: str, x: torch.Tensor) -> torch.Tensor:
    """The feed-forward non-linearity; ``gelu_new`` is GELU's tanh approximation (transformers activations)."""
    if name == "relu":
        return F.relu(x)
    if name == "gelu":
        return F.gelu(x)
    if name == "gelu_new":
        return F.gelu(x, approximate="tanh")
    return F.silu(x)


@dataclass
class T5Settings:
    """T5's hyper-parameters (the fields of a Hugging Face ``config.json`` this model uses)."""

    vocab_size: int
    d_model: int
    d_kv: int
    d_ff: int
    num_layers: int
    num_decoder_layers: int
    num_heads: int
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    dropout_rate: float = 0.1
    feed_forward_proj: str = "relu"
    tie_word_embeddings: bool = True
    pad_token_id: int = 0
    decoder_start_token_id: int = 0
    eos_token_id: int = 1
    # Scale the decoder output by d_model**-0.5 before the LM head. None: as tie_word_embeddings (T5 v1.0
    # ties and scales, v1.1 / flan-t5 neither). transformers 5 saves configs with tie_word_embeddings true
    # and scale_decoder_outputs false for v1.1 models (transformers T5Config.__post_init__), hence its own field.
    scale_decoder_output: bool | None = None

    def __post_init__(self) -> None:
        if self.feed_forward_proj not in _FEED_FORWARD:
            raise ValueError(f"feed_forward_proj {self.feed_forward_proj!r} is not supported; use one of {', '.join(_FEED_FORWARD)}")
        for name in ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers", "num_heads", "relative_attention_max_distance"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.relative_attention_num_buckets < 4:  # bidirectional: half per direction, half of that exact
            raise ValueError(f"relative_attention_num_buckets must be >= 4, got {self.relative_attention_num_buckets}")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"dropout_rate must be in [0, 1), got {self.dropout_rate}")
        if self.scale_decoder_output is None:
            self.scale_decoder_output = self.tie_word_embeddings

    @property
    def gated(self) -> bool:
        return _FEED_FORWARD[self.feed_forward_proj][0]

    @property
    def activation(self) -> str:
        return _FEED_FORWARD[self.feed_forward_proj][1]

    @classmethod
    def from_hf_config(cls, config: dict) -> T5Settings:
        """Settings from a Hugging Face T5 ``config.json`` dict (missing optional keys take T5's defaults)."""
        if config.get("model_type", "t5") != "t5":
            raise ValueError(f"config.json describes a {config.get('model_type')!r} model, not t5")
        missing = [k for k in ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads") if k not in config]
        if missing:
            raise ValueError(f"config.json lacks {', '.join(missing)}")
        tie = bool(config.get("tie_word_embeddings", True))
        eos = config.get("eos_token_id", 1)
        return cls(
            vocab_size=config["vocab_size"],
            d_model=config["d_model"],
            d_kv=config["d_kv"],
            d_ff=config["d_ff"],
            num_layers=config["num_layers"],
            num_decoder_layers=config.get("num_decoder_layers") or config["num_layers"],
            num_heads=config["num_heads"],
            relative_attention_num_buckets=config.get("relative_attention_num_buckets", 32),
            relative_attention_max_distance=config.get("relative_attention_max_distance", 128),
            layer_norm_epsilon=config.get("layer_norm_epsilon", 1e-6),
            dropout_rate=config.get("dropout_rate", 0.1),
            feed_forward_proj=config.get("feed_forward_proj", "relu"),
            tie_word_embeddings=tie,
            pad_token_id=_int_or_none(config.get("pad_token_id"), 0),
            decoder_start_token_id=_int_or_none(config.get("decoder_start_token_id"), 0),
            eos_token_id=_int_or_none(eos[0] if isinstance(eos, list) and eos else eos, 1),
            scale_decoder_output=bool(config.get("scale_decoder_outputs", tie)),
        )


def _int_or_none(value: object, default: int) -> int:
    return default if value is None else int(value)  # type: ignore[arg-type]


# ------------------------------------------------------------------------- position buckets and masks


def relative_position_bucket(relative_position: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> torch.Tensor:
    """T5's bucket of each relative position (key position minus query position).

    As transformers ``T5Attention._relative_position_bucket`` (from Mesh TensorFlow): bidirectional
    attention gives half the buckets to each direction (positive offsets in the upper half);
    unidirectional attention keeps only offsets to the past. Of a direction's buckets, half hold the
    exact distances 0..max_exact-1, the rest log-spaced distances up to ``max_distance``, beyond which
    everything shares the last bucket. The float expression is evaluated in T5's order so the
    buckets match bit for bit.
    """
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = (relative_position > 0).to(relative_position.dtype) * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    log_ratio = torch.log(distance.float() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).to(relative_position.dtype)
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, large)


@dataclass
class FlexMask:
    """What a block needs for FlexAttention: the block mask and, for self-attention, T5's bias.

    ``bucket`` is the (Sq, Sk) int32 bucket of each query/key pair and ``table`` the stack's
    (buckets, heads) bias table (a parameter: its gradient flows through the ``score_mod``);
    cross-attention has no position bias, so both are None there.
    """

    block_mask: BlockMask
    bucket: torch.Tensor | None = None
    table: torch.Tensor | None = None


_compiled_flex: dict[bool, object] = {}


def _flex(dynamic: bool) -> object:
    """``torch.compile(flex_attention)``, made once per process and mode.

    Eager ``flex_attention`` materialises the full score matrix (torch flex_attention docs); compiled
    it is a fused Triton kernel on CUDA, or inductor's C++ template on CPU (forward only there).
    On CUDA it is compiled for dynamic lengths from the start: every call of the model shares one
    compiled function, whose cache (``torch._dynamo.config.recompile_limit``, 8) the three
    mask / score_mod variants would nearly fill compiling each length first static, then dynamic,
    with length-bucketed batches; past the limit it would silently run eager. On CPU the default
    (static first): torch 2.13's CPU template fails to compile the dynamic variant of a captured
    buffer (``cur_kvSplitSize2`` undeclared), so a CPU run keeps to one length per process.
    """
    if dynamic not in _compiled_flex:
        _compiled_flex[dynamic] = torch.compile(flex_attention, dynamic=True if dynamic else None)
    return _compiled_flex[dynamic]


def _bias_score_mod(bucket: torch.Tensor, table: torch.Tensor):
    """T5's relative position bias as a FlexAttention ``score_mod``: add the table's entry for the
    pair's bucket and the head (torch flex_attention docs: captured tensors are gathered in-kernel)."""

    def score_mod(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return score + table[bucket[q_idx, kv_idx], h]

    return score_mod


def _flex_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: FlexMask) -> torch.Tensor:
    """FlexAttention with T5's bias as a gather from the bias table.

    torch 2.13 (torch/_higher_order_ops/flex_attention.py, ``FlexAttentionAutogradOp.backward``)
    returns gradients for tensors a ``score_mod`` captures that require grad, so the table learns;
    on CPU it is inference only (torch/nn/attention/flex_attention.py ``_validate_device`` raises
    for inputs that require grad). Sequence lengths need not be multiples of the 128 block size:
    ``create_block_mask`` pads the mask to whole blocks and the kernels bound the indices.
    """
    if q.device.type == "cpu" and torch.is_grad_enabled() and (q.requires_grad or (mask.table is not None and mask.table.requires_grad)):
        raise NotImplementedError("FlexAttention has no backward on CPU in torch 2.13: train with attention='sdpa' there, or run under torch.no_grad()")
    score_mod = _bias_score_mod(mask.bucket, mask.table) if mask.bucket is not None and mask.table is not None else None
    out = _flex(q.is_cuda)(q, k, v, score_mod=score_mod, block_mask=mask.block_mask, scale=1.0)  # type: ignore[operator]
    assert isinstance(out, torch.Tensor)
    return out


AttnMask = torch.Tensor | FlexMask | None


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttnMask, dropout_p: float) -> torch.Tensor:
    """Attention of (B, H, S, d_kv) tensors; T5 does not scale scores (transformers T5Attention: scaling 1.0).

    FlexAttention has no dropout on the attention probabilities, so with ``attention="flex"`` only
    the other dropouts apply (equal to T5 whenever dropout_rate is 0 or in eval mode).
    """
    if isinstance(mask, FlexMask):
        return _flex_attention(q, k, v, mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=1.0)


def _dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout that dispatches nothing when it is the identity (eval, or rate 0)."""
    return F.dropout(x, p, True) if training and p > 0 else x


def _clamp_fp16(x: torch.Tensor) -> torch.Tensor:
    """transformers T5Block: in fp16, clamp infinities to the largest finite value after each layer."""
    if x.dtype != torch.float16:
        return x
    limit = torch.where(torch.isinf(x).any(), torch.finfo(x.dtype).max - 1000, torch.finfo(x.dtype).max)
    return torch.clamp(x, min=-limit, max=limit)


# ------------------------------------------------------------------------- layers


class RMSNorm(nn.Module):
    """T5's layer norm: scale only, no mean subtraction and no bias.

    transformers T5LayerNorm: the variance is taken in fp32 and the normalised value is cast to the
    weight's dtype when that is fp16/bf16 before the weight multiplies it. ``F.rms_norm`` upcasts
    half inputs to fp32 internally, so for equal input and weight dtypes it gives that value in one
    op (one fused kernel on CUDA) without a separate fp32 copy of the input.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        half_weight = self.weight.dtype in _HALF
        if x.dtype != self.weight.dtype and not half_weight:
            x = x.float()  # half activations, fp32 weight: T5 keeps the fp32 product
        normed = F.rms_norm(x, (x.size(-1),), eps=self.eps)
        if half_weight:
            normed = normed.to(self.weight.dtype)
        return self.weight * normed


class FeedForward(nn.Module):
    """T5's feed-forward: ``wo(act(wi x))`` or, gated (T5 v1.1, flan-t5), ``wo(act(wi_0 x) * wi_1 x)``.

    The gated variant keeps ``wi_0`` and ``wi_1`` stacked in one ``wi`` (one GEMM).
    """

    def __init__(self, s: T5Settings) -> None:
        super().__init__()
        self.gated = s.gated
        self.act = s.activation
        self.dropout_rate = s.dropout_rate
        self.wi = nn.Linear(s.d_model, (2 if s.gated else 1) * s.d_ff, bias=False)
        self.wo = nn.Linear(s.d_ff, s.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.wi(x)
        if self.gated:
            gate, linear = h.chunk(2, dim=-1)
            h = _activation(self.act, gate) * linear
        else:
            h = _activation(self.act, h)
        h = _dropout(h, self.dropout_rate, self.training)
        # transformers keeps wo in fp32 for some checkpoints (T5PreTrainedModel._keep_in_fp32_modules)
        return self.wo(h.to(self.wo.weight.dtype))


class SelfAttention(nn.Module):
    """Multi-head self-attention with one fused query/key/value projection."""

    def __init__(self, s: T5Settings) -> None:
        super().__init__()
        self.num_heads, self.d_kv = s.num_heads, s.d_kv
        self.dropout_rate = s.dropout_rate
        inner = s.num_heads * s.d_kv
        self.qkv = nn.Linear(s.d_model, 3 * inner, bias=False)  # rows: q, then k, then v
        self.o = nn.Linear(inner, s.d_model, bias=False)

    def forward(self, x: torch.Tensor, mask: AttnMask) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.num_heads, self.d_kv).permute(2, 0, 3, 1, 4).unbind(0)
        out = _attend(q, k, v, mask, self.dropout_rate if self.training else 0.0)
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


class CrossAttention(nn.Module):
    """Decoder-to-encoder attention: a query projection and one fused key/value projection."""

    def __init__(self, s: T5Settings) -> None:
        super().__init__()
        self.num_heads, self.d_kv = s.num_heads, s.d_kv
        self.dropout_rate = s.dropout_rate
        inner = s.num_heads * s.d_kv
        self.q = nn.Linear(s.d_model, inner, bias=False)
        self.kv = nn.Linear(s.d_model, 2 * inner, bias=False)  # rows: k, then v
        self.o = nn.Linear(inner, s.d_model, bias=False)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, mask: AttnMask) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.num_heads, self.d_kv).transpose(1, 2)
        k, v = self.kv(memory).view(b, memory.size(1), 2, self.num_heads, self.d_kv).permute(2, 0, 3, 1, 4).unbind(0)
        out = _attend(q, k, v, mask, self.dropout_rate if self.training else 0.0)
        return self.o(out.transpose(1, 2).reshape(b, t, -1))


class EncoderBlock(nn.Module):
    """Pre-norm self-attention and feed-forward, each a residual branch with dropout (transformers T5Block)."""

    def __init__(self, s: T5Settings) -> None:
        super().__init__()
        self.dropout_rate = s.dropout_rate
        self.attn_norm = RMSNorm(s.d_model, s.layer_norm_epsilon)
        self.attn = SelfAttention(s)
        self.ff_norm = RMSNorm(s.d_model, s.layer_norm_epsilon)
        self.ff = FeedForward(s)

    def forward(self, hidden: torch.Tensor, mask: AttnMask) -> torch.Tensor:
        p, train = self.dropout_rate, self.training
        hidden = _clamp_fp16(hidden + _dropout(self.attn(self.attn_norm(hidden), mask), p, train))
        return _clamp_fp16(hidden + _dropout(self.ff(self.ff_norm(hidden)), p, train))


class DecoderBlock(nn.Module):
    """Causal self-attention, cross-attention to the encoder output, feed-forward (transformers T5Block)."""

    def __init__(self, s: T5Settings) -> None:
        super().__init__()
        self.dropout_rate = s.dropout_rate
        self.attn_norm = RMSNorm(s.d_model, s.layer_norm_epsilon)
        self.attn = SelfAttention(s)
        self.cross_norm = RMSNorm(s.d_model, s.layer_norm_epsilon)
        self.cross = CrossAttention(s)
        self.ff_norm = RMSNorm(s.d_model, s.layer_norm_epsilon)
        self.ff = FeedForward(s)

    def forward(self, hidden: torch.Tensor, mask: AttnMask, memory: torch.Tensor, cross_mask: AttnMask) -> torch.Tensor:
        p, train = self.dropout_rate, self.training
        hidden = _clamp_fp16(hidden + _dropout(self.attn(self.attn_norm(hidden), mask), p, train))
        hidden = _clamp_fp16(hidden + _dropout(self.cross(self.cross_norm(hidden), memory, cross_mask), p, train))
        return _clamp_fp16(hidden + _dropout(self.ff(self.ff_norm(hidden)), p, train))
