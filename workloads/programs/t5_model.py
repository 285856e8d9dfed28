"""A native T5 encoder-decoder for the FSDP program, built for few kernel launches.

Numerically the same model as Hugging Face's ``T5ForConditionalGeneration`` (it loads the same
``model.safetensors`` weights and gives the same logits), laid out for speed:

* one GEMM for the self-attention query, key and value (``qkv``), one for the cross-attention key
  and value (``kv``), one for the two gated feed-forward inputs (``wi`` holds ``wi_0`` and ``wi_1``);
* attention through ``torch.nn.functional.scaled_dot_product_attention`` with ``scale=1.0`` (T5 does
  not scale its scores), the relative position bias and the padding / causal mask folded into one
  additive mask per stack and forward, not per layer; or, opt-in (``attention="flex"``),
  FlexAttention, where the bias is a ``score_mod`` gathering from the (buckets, heads) table and the
  masks are a ``BlockMask``;
* blocks whose ``forward`` takes plain tensors (and the mask object), so the program can
  ``fully_shard`` and ``torch.compile`` each block.

Shipped as a flat file next to the programs (imported by name) and free of ``transformers``:
``safetensors`` is imported only by the weight loader.
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F
from t5_layers import (  # noqa: F401  (the settings and layers are part of this module's interface)
    ATTENTION_KINDS,
    AttnMask,
    CrossAttention,
    DecoderBlock,
    EncoderBlock,
    FeedForward,
    FlexMask,
    RMSNorm,
    SelfAttention,
    T5Settings,
    _dropout,
    _flex,
    relative_position_bucket,
)
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask
from torch.utils.checkpoint import checkpoint


class T5Stack(nn.Module):
    """An encoder or decoder: its blocks, its relative position bias table and its final norm.

    As in T5, the bias is computed once per forward and shared by every block (transformers keeps
    the table in the first layer and passes its bias on); here the stack owns the table and folds
    bias and masks into one attention-mask object before the first block.
    """

    def __init__(self, s: T5Settings, decoder: bool) -> None:
        super().__init__()
        self.decoder = decoder
        self.settings = s
        n = s.num_decoder_layers if decoder else s.num_layers
        self.blocks = nn.ModuleList([DecoderBlock(s) if decoder else EncoderBlock(s) for _ in range(n)])
        self.relative_attention_bias = nn.Embedding(s.relative_attention_num_buckets, s.num_heads)
        self.final_layer_norm = RMSNorm(s.d_model, s.layer_norm_epsilon)
        self.activation_checkpointing = False
        self._cache: dict[tuple, object] = {}

    def _cached(self, key: tuple, make) -> object:
        """Shape-only tensors (buckets, causal masks), made once per shape and device.

        Made outside inference mode so that a tensor first built under ``torch.inference_mode`` can
        still be saved for backward in a later training step.
        """
        if key not in self._cache:
            with torch.inference_mode(False), torch.no_grad():
                self._cache[key] = make()
        return self._cache[key]

    def _square(self, name: str, n: int, device: torch.device, make) -> torch.Tensor:
        """The top-left (n, n) corner of a cached square matrix that depends only on key minus query
        position, so one matrix serves every shorter length (the program's length-bucketed batches
        would otherwise cache one per length); it grows in steps of 128."""
        held = self._cache.get((name, device))
        if not isinstance(held, torch.Tensor) or held.size(0) < n:
            size = -(-n // 128) * 128
            self._cache.pop((name, device), None)
            held = self._cached((name, device), lambda: make(size))
            assert isinstance(held, torch.Tensor)
        return held[:n, :n]

    def position_bucket(self, q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
        """(q_len, k_len) int32 buckets: bidirectional in the encoder, to the past in the decoder."""
        s = self.settings

        def make(n: int) -> torch.Tensor:
            rel = torch.arange(n, device=device)[None, :] - torch.arange(n, device=device)[:, None]
            return relative_position_bucket(rel, not self.decoder, s.relative_attention_num_buckets, s.relative_attention_max_distance).to(torch.int32)

        # contiguous (a small copy unless the length is the cached size): torch 2.13's inductor CPU flex
        # template emits C++ that does not compile for a strided captured buffer (undeclared cur_kvSplitSize2)
        return self._square("bucket", max(q_len, k_len), device, make)[:q_len, :k_len].contiguous()

    def _future(self, n: int, device: torch.device) -> torch.Tensor:
        """(n, n) bool, True where a key lies after its query (what causal attention hides)."""
        return self._square("future", n, device, lambda size: torch.ones(size, size, dtype=torch.bool, device=device).triu(1))

    def self_mask(self, key_valid: torch.Tensor | None, q_len: int, dtype: torch.dtype, device: torch.device, attention: str) -> AttnMask:
        """The self-attention mask of every block: bias plus key padding (encoder) or causality (decoder).

        sdpa: one (B or 1, H, S, S) additive mask in the activations' dtype, the bias where attention
        is allowed and the dtype's minimum elsewhere (as transformers does, so a fully padded row
        stays finite). Built S_pad keys wide and sliced to S (see ``_mask_width``). flex: a
        ``FlexMask`` with the bucket matrix, the table and a ``BlockMask``.
        """
        if attention == "flex":
            if self.decoder:
                block_mask = self._cached(("flex-causal", q_len, device), lambda: _causal_block_mask(q_len, device))
            else:
                block_mask = _padding_block_mask(key_valid, q_len, device) if key_valid is not None else None
            if block_mask is None:
                block_mask = self._cached(("flex-full", q_len, device), lambda: _full_block_mask(q_len, q_len, device))
            assert isinstance(block_mask, BlockMask)
            return FlexMask(block_mask, self.position_bucket(q_len, q_len, device), self.relative_attention_bias.weight)
        width = _mask_width(q_len)
        # (H, S, S_pad) laid out contiguously, as sdpa's fused kernels want the mask (an embedding
        # lookup and a permute would leave the heads innermost)
        bias = self.relative_attention_bias.weight.t()[:, self.position_bucket(q_len, width, device)].unsqueeze(0).to(dtype)
        if self.decoder:
            hidden_keys = self._future(width, device)[:q_len]
        elif key_valid is not None:
            hidden_keys = _hidden_keys(key_valid, width)[:, None, None, :]
        else:
            return bias[..., :q_len]
        return bias.masked_fill(hidden_keys, torch.finfo(dtype).min)[..., :q_len]

    def forward(self, hidden: torch.Tensor, mask: AttnMask, memory: torch.Tensor | None = None, cross_mask: AttnMask = None) -> torch.Tensor:
        """Run the (already embedded and dropped-out) inputs through the blocks and the final norm."""
        p = self.settings.dropout_rate
        for block in self.blocks:
            args = (hidden, mask, memory, cross_mask) if self.decoder else (hidden, mask)
            if self.activation_checkpointing and torch.is_grad_enabled():
                hidden = checkpoint(block, *args, use_reentrant=False)
            else:
                hidden = block(*args)
        return _dropout(self.final_layer_norm(hidden), p, self.training)


def _mask_width(k_len: int) -> int:
    """Keys rounded up to a multiple of 8: an additive mask allocated this wide and sliced back has
    strides that are multiples of 8 elements, which sdpa's memory-efficient CUDA kernel needs (torch
    aten/src/ATen/native/transformers/attention.cpp ``preprocess_mask``, ``mem_eff_alignment = 8``);
    otherwise it pads a copy of the mask in every layer."""
    return -(-k_len // 8) * 8


def _hidden_keys(key_valid: torch.Tensor, width: int) -> torch.Tensor:
    """(B, width) bool, True at padding keys and at the alignment columns past the last key."""
    hidden = ~key_valid
    return F.pad(hidden, (0, width - hidden.size(1)), value=True) if width > hidden.size(1) else hidden


def _padding_block_mask(key_valid: torch.Tensor, q_len: int, device: torch.device) -> BlockMask:
    """BlockMask letting every query see the keys that are not padding, per batch row."""
    valid = key_valid.bool()

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return valid[b, kv_idx]

    return create_block_mask(mask_mod, valid.size(0), None, q_len, valid.size(1), device=device)


def _causal_block_mask(n: int, device: torch.device) -> BlockMask:
    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return kv_idx <= q_idx

    return create_block_mask(mask_mod, None, None, n, n, device=device)


def _full_block_mask(q_len: int, k_len: int, device: torch.device) -> BlockMask:
    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return q_idx >= 0

    return create_block_mask(mask_mod, None, None, q_len, k_len, device=device)


def shift_right(labels: torch.Tensor, decoder_start_token_id: int, pad_token_id: int) -> torch.Tensor:
    """Decoder inputs from labels: start token first, labels shifted right, -100 as pad (transformers T5 ``_shift_right``)."""
    start = labels.new_full((*labels.shape[:-1], 1), decoder_start_token_id)
    shifted = torch.cat([start, labels[..., :-1]], dim=-1)
    return shifted.masked_fill(shifted == -100, pad_token_id)


class T5Model(nn.Module):
    """T5 for conditional generation: shared embedding, encoder, decoder, LM head.

    ``forward(input_ids, attention_mask, labels)`` returns the logits; the loss is the caller's.
    ``attention`` picks "sdpa" (default) or "flex"; ``activation_checkpointing`` recomputes each block
    in backward (non-reentrant ``torch.utils.checkpoint``).
    """

    def __init__(self, settings: T5Settings, attention: str = "sdpa", activation_checkpointing: bool = False) -> None:
        super().__init__()
        self.settings = settings
        self.shared = nn.Embedding(settings.vocab_size, settings.d_model)
        self.encoder = T5Stack(settings, decoder=False)
        self.decoder = T5Stack(settings, decoder=True)
        self.lm_head = None if settings.tie_word_embeddings else nn.Linear(settings.d_model, settings.vocab_size, bias=False)
        self.attention = attention
        self.activation_checkpointing = activation_checkpointing

    @property
    def attention(self) -> str:
        return self._attention

    @attention.setter
    def attention(self, kind: str) -> None:
        if kind not in ATTENTION_KINDS:
            raise ValueError(f"attention {kind!r} is not one of {', '.join(ATTENTION_KINDS)}")
        if kind == "flex":
            for dynamic in (True, False):  # made here, not first inside a compiled block's trace
                _flex(dynamic)
        self._attention = kind

    @property
    def activation_checkpointing(self) -> bool:
        return self.encoder.activation_checkpointing

    @activation_checkpointing.setter
    def activation_checkpointing(self, enabled: bool) -> None:
        self.encoder.activation_checkpointing = self.decoder.activation_checkpointing = bool(enabled)

    def set_dropout(self, rate: float) -> None:
        """Every dropout of the model at ``rate`` (embeddings, attention, feed-forward, residuals)."""
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"dropout rate must be in [0, 1), got {rate}")
        self.settings.dropout_rate = rate
        for module in self.modules():
            if hasattr(module, "dropout_rate"):
                setattr(module, "dropout_rate", rate)  # noqa: B010  # a plain float attribute, which nn.Module's typed __setattr__ does not declare

    def blocks(self) -> list[nn.Module]:
        """Every block, encoder first: the units the program shards (and may compile) one by one."""
        return [*self.encoder.blocks, *self.decoder.blocks]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None, decoder_input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, vocab) for the decoder inputs: ``decoder_input_ids``, or ``labels`` shifted right."""
        s = self.settings
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError("forward needs labels or decoder_input_ids")
            decoder_input_ids = shift_right(labels, s.decoder_start_token_id, s.pad_token_id)
        p, train, device = s.dropout_rate, self.training, input_ids.device
        key_valid = attention_mask.bool() if attention_mask is not None else None

        src = _dropout(self.shared(input_ids), p, train)
        enc_mask = self.encoder.self_mask(key_valid, input_ids.size(1), src.dtype, device, self.attention)
        memory = self.encoder(src, enc_mask)

        tgt = _dropout(self.shared(decoder_input_ids), p, train)
        dec_mask = self.decoder.self_mask(None, decoder_input_ids.size(1), tgt.dtype, device, self.attention)
        cross_mask = self._cross_mask(key_valid, decoder_input_ids.size(1), input_ids.size(1), tgt.dtype, device)
        hidden = self.decoder(tgt, dec_mask, memory, cross_mask)

        if self.lm_head is not None:
            return self.lm_head(hidden * s.d_model**-0.5 if s.scale_decoder_output else hidden)
        if s.scale_decoder_output:  # T5 v1.0 scales the decoder output before the tied head
            hidden = hidden * s.d_model**-0.5
        return F.linear(hidden, self.shared.weight)

    def _cross_mask(self, key_valid: torch.Tensor | None, q_len: int, k_len: int, dtype: torch.dtype, device: torch.device) -> AttnMask:
        """Cross-attention sees the non-padding encoder positions; it has no position bias."""
        if self.attention == "flex":
            if key_valid is None:
                block_mask = self.decoder._cached(("flex-full", q_len, k_len, device), lambda: _full_block_mask(q_len, k_len, device))
                assert isinstance(block_mask, BlockMask)
                return FlexMask(block_mask)
            return FlexMask(_padding_block_mask(key_valid, q_len, device))
        if key_valid is None:
            return None
        width = _mask_width(k_len)
        zeros = torch.zeros((key_valid.size(0), 1, 1, width), dtype=dtype, device=device)
        return zeros.masked_fill(_hidden_keys(key_valid, width)[:, None, None, :], torch.finfo(dtype).min)[..., :k_len]


# ------------------------------------------------------------------------- initialisation


def init_weights(model: T5Model, seed: int | None = None) -> None:
    """T5's random initialisation (transformers ``T5PreTrainedModel._init_weights``, initializer_factor 1).

    Normal with mean 0 and std: shared embedding 1.0; query d_model**-0.5 * d_kv**-0.5 (the missing
    score scaling folded into the weights); key and value d_model**-0.5; attention output
    (heads * d_kv)**-0.5; feed-forward inputs (wi, wi_0, wi_1) d_model**-0.5, output d_ff**-0.5;
    relative position bias tables d_model**-0.5; an untied LM head 1.0. Norm weights are 1.
    ``seed`` makes it reproducible without touching the global generator.
    """
    s = model.settings
    inner = s.num_heads * s.d_kv
    gens: dict[torch.device, torch.Generator] = {}

    def normal(t: torch.Tensor, std: float) -> None:
        gen = None
        if seed is not None:
            gen = gens.get(t.device) or gens.setdefault(t.device, torch.Generator(device=t.device).manual_seed(seed))
        with torch.no_grad():
            t.normal_(0.0, std, generator=gen)

    q_std, kv_std, o_std = (s.d_model * s.d_kv) ** -0.5, s.d_model**-0.5, inner**-0.5
    normal(model.shared.weight, 1.0)
    if model.lm_head is not None:
        normal(model.lm_head.weight, 1.0)
    for stack in (model.encoder, model.decoder):
        normal(stack.relative_attention_bias.weight, s.d_model**-0.5)
    for module in model.modules():
        if isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)
        elif isinstance(module, SelfAttention):
            q, k, v = module.qkv.weight.split(inner, dim=0)
            normal(q, q_std)
            normal(k, kv_std)
            normal(v, kv_std)
            normal(module.o.weight, o_std)
        elif isinstance(module, CrossAttention):
            normal(module.q.weight, q_std)
            normal(module.kv.weight, kv_std)
            normal(module.o.weight, o_std)
        elif isinstance(module, FeedForward):
            normal(module.wi.weight, s.d_model**-0.5)
            normal(module.wo.weight, s.d_ff**-0.5)


# ------------------------------------------------------------------------- Hugging Face weights

# Checkpoint keys that duplicate another (transformers ties the stacks' embed_tokens to shared) or that
# T5 never uses (T5ForConditionalGeneration._keys_to_ignore_on_load_unexpected).
_OPTIONAL_KEYS = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight")


def hf_key_map(settings: T5Settings) -> dict[str, list[str]]:
    """Our parameter name -> the Hugging Face checkpoint keys stacked (along dim 0) to make it."""
    out: dict[str, list[str]] = {"shared.weight": ["shared.weight"]}
    ff_names = ["wi_0", "wi_1"] if settings.gated else ["wi"]
    for stack, n in (("encoder", settings.num_layers), ("decoder", settings.num_decoder_layers)):
        ff_layer = 2 if stack == "decoder" else 1
        out[f"{stack}.relative_attention_bias.weight"] = [f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
        out[f"{stack}.final_layer_norm.weight"] = [f"{stack}.final_layer_norm.weight"]
        for i in range(n):
            ours, hf = f"{stack}.blocks.{i}", f"{stack}.block.{i}.layer"
            out[f"{ours}.attn_norm.weight"] = [f"{hf}.0.layer_norm.weight"]
            out[f"{ours}.attn.qkv.weight"] = [f"{hf}.0.SelfAttention.{x}.weight" for x in "qkv"]
            out[f"{ours}.attn.o.weight"] = [f"{hf}.0.SelfAttention.o.weight"]
            if stack == "decoder":
                out[f"{ours}.cross_norm.weight"] = [f"{hf}.1.layer_norm.weight"]
                out[f"{ours}.cross.q.weight"] = [f"{hf}.1.EncDecAttention.q.weight"]
                out[f"{ours}.cross.kv.weight"] = [f"{hf}.1.EncDecAttention.{x}.weight" for x in "kv"]
                out[f"{ours}.cross.o.weight"] = [f"{hf}.1.EncDecAttention.o.weight"]
            out[f"{ours}.ff_norm.weight"] = [f"{hf}.{ff_layer}.layer_norm.weight"]
            out[f"{ours}.ff.wi.weight"] = [f"{hf}.{ff_layer}.DenseReluDense.{x}.weight" for x in ff_names]
            out[f"{ours}.ff.wo.weight"] = [f"{hf}.{ff_layer}.DenseReluDense.wo.weight"]
    if not settings.tie_word_embeddings:
        out["lm_head.weight"] = ["lm_head.weight"]
    return out


def checkpoint_files(model_dir: str) -> dict[str, str]:
    """Checkpoint key -> the safetensors file holding it: ``model.safetensors`` or a sharded index."""
    single = os.path.join(model_dir, "model.safetensors")
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as fh:
            weight_map = json.load(fh).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index} has no weight_map")
        return {key: os.path.join(model_dir, name) for key, name in weight_map.items()}
    if os.path.isfile(single):
        from safetensors import safe_open

        with safe_open(single, framework="pt") as fh:
            return dict.fromkeys(fh.keys(), single)
    raise FileNotFoundError(f"{model_dir} has neither model.safetensors nor model.safetensors.index.json")


def _open(files: dict[str, str], keys: list[str]) -> dict[str, object]:
    """A safetensors handle per file holding one of ``keys`` (tensors are read one at a time from them)."""
    from safetensors import safe_open

    return {path: safe_open(path, framework="pt") for path in sorted({files[k] for k in keys})}


def _read(files: dict[str, str], keys: list[str]) -> dict[str, torch.Tensor]:
    """The tensors of ``keys``."""
    handles = _open(files, keys)
    return {key: handles[files[key]].get_tensor(key) for key in keys}  # type: ignore[attr-defined]


def load_hf_weights(model: T5Model, model_dir: str) -> None:
    """Copy a Hugging Face T5 checkpoint into ``model``'s parameters in place (before sharding).

    Strict both ways: every parameter's keys must be in the checkpoint, and every checkpoint key must
    be used or be a known duplicate / unused key; a ValueError names the key and the file.
    """
    files = checkpoint_files(model_dir)
    index = os.path.join(model_dir, "model.safetensors.index.json")
    where = index if os.path.isfile(index) else os.path.join(model_dir, "model.safetensors")
    mapping = hf_key_map(model.settings)
    needed = {key for keys in mapping.values() for key in keys}
    for key in sorted(needed):
        if key not in files:
            raise ValueError(f"weight {key} is missing from {where}")
    for key in sorted(files):
        if key not in needed and key not in _OPTIONAL_KEYS and key != "lm_head.weight":
            raise ValueError(f"unexpected weight {key} in {files[key]}")
    if "lm_head.weight" not in needed and _unties_head(files):
        raise ValueError(f"lm_head.weight in {files['lm_head.weight']} differs from shared.weight but the model ties them: build it with tie_word_embeddings=False")
    handles = _open(files, sorted(needed))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, keys in mapping.items():  # one parameter's tensors in memory at a time
            parts = [handles[files[k]].get_tensor(k) for k in keys]  # type: ignore[attr-defined]
            value = torch.cat(parts, dim=0) if len(parts) > 1 else parts[0]
            param = params[name]
            if value.shape != param.shape:
                raise ValueError(f"{', '.join(keys)} in {files[keys[0]]} has shape {tuple(value.shape)}, the model expects {tuple(param.shape)} for {name}")
            param.copy_(value)


def _unties_head(files: dict[str, str]) -> bool:
    """True when the checkpoint's lm_head.weight is its own matrix, not a copy of shared.weight
    (transformers 5 then unties the head whatever tie_word_embeddings says)."""
    if "lm_head.weight" not in files or "shared.weight" not in files:
        return False
    tensors = _read(files, ["lm_head.weight", "shared.weight"])
    return not torch.equal(tensors["lm_head.weight"], tensors["shared.weight"])


def from_pretrained(model_dir: str, attention: str = "sdpa") -> T5Model:
    """A ``T5Model`` from a Hugging Face model directory: config.json, then the safetensors weights.

    Returned in eval mode, as transformers' ``from_pretrained`` returns its models (call ``train()``
    for dropout).
    """
    with open(os.path.join(model_dir, "config.json")) as fh:
        settings = T5Settings.from_hf_config(json.load(fh))
    if settings.tie_word_embeddings and _unties_head(checkpoint_files(model_dir)):
        settings.tie_word_embeddings = False
    model = T5Model(settings, attention=attention)
    load_hf_weights(model, model_dir)
    return model.eval()
