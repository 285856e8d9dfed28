"""The native T5 (workloads/programs/t5_model.py) against Hugging Face's T5ForConditionalGeneration.

Tiny random models saved with ``save_pretrained`` and loaded into both: the same logits and
gradients in fp32, strict weight loading, FlexAttention against SDPA, and fewer dispatched aten
ops per training step than Hugging Face's eager T5.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib

import pytest
import t5_layers  # noqa: E402  (the programs directory is on sys.path: tests/conftest.py)
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch.nn.attention.flex_attention import flex_attention
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import T5Config, T5ForConditionalGeneration

from workloads.programs import t5_model as tm

TINY = {"d_model": 64, "d_ff": 128, "num_layers": 2, "num_decoder_layers": 2, "num_heads": 4, "d_kv": 16, "vocab_size": 512}
VOCAB = TINY["vocab_size"]

# name -> (config overrides, source length, target length)
VARIANTS = {
    "t5-v1.0": ({}, 20, 9),
    # flan-t5 / T5 v1.1 as on the hub: gated GELU, tie_word_embeddings false and its own lm_head.weight
    "flan-untied": ({"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}, 20, 9),
    # T5 v1.1 as transformers 5 saves it: head tied to shared, decoder output not scaled
    "v1.1-transformers5": ({"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False, "_keep_transformers_save": True}, 20, 9),
    # sequences longer than max_distance reach the log-spaced and the last buckets
    "long-log-buckets": ({"relative_attention_num_buckets": 16, "relative_attention_max_distance": 20}, 48, 40),
}


def tiny_settings(dropout_rate: float = 0.0, num_decoder_layers: int = 2) -> tm.T5Settings:
    """The tiny architecture of ``TINY`` as our settings."""
    return tm.T5Settings(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=num_decoder_layers, num_heads=4, dropout_rate=dropout_rate)


def save_hf(tmp_path: pathlib.Path, overrides: dict, seed: int = 0) -> pathlib.Path:
    """A random tiny Hugging Face T5 saved to a directory, as a model initializer would leave it.

    With ``tie_word_embeddings`` false the checkpoint gets its own ``lm_head.weight`` and the config
    keeps the flag, as flan-t5's files on the hub have them (transformers 5 itself saves such a
    model tied, which ``_keep_transformers_save`` keeps).
    """
    overrides = dict(overrides)
    keep = overrides.pop("_keep_transformers_save", False)
    torch.manual_seed(seed)
    config = T5Config(**{**TINY, "dropout_rate": 0.0, **overrides}, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)  # pyright: ignore[reportCallIssue]
    model_dir = tmp_path / "model"
    T5ForConditionalGeneration(config).save_pretrained(model_dir)
    if overrides.get("tie_word_embeddings") is False and not keep:
        weights = load_file(model_dir / "model.safetensors")
        weights["lm_head.weight"] = torch.randn(VOCAB, TINY["d_model"])
        save_file(weights, model_dir / "model.safetensors", metadata={"format": "pt"})
        cfg = json.loads((model_dir / "config.json").read_text())
        cfg["tie_word_embeddings"] = False
        cfg.pop("scale_decoder_outputs", None)
        (model_dir / "config.json").write_text(json.dumps(cfg))
    return model_dir


def load_both(model_dir: pathlib.Path, attention: str = "sdpa") -> tuple[T5ForConditionalGeneration, tm.T5Model]:
    hf = T5ForConditionalGeneration.from_pretrained(model_dir)
    assert isinstance(hf, T5ForConditionalGeneration)
    return hf, tm.from_pretrained(str(model_dir), attention=attention)


def batch(src_len: int, tgt_len: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three sources padded to different lengths (one full), labels with -100 padding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (3, src_len), generator=g)
    mask = torch.ones(3, src_len, dtype=torch.long)
    mask[1, src_len * 2 // 3 :] = 0
    mask[2, src_len // 4 :] = 0
    ids = ids.masked_fill(mask == 0, 0)
    labels = torch.randint(2, VOCAB, (3, tgt_len), generator=g)
    labels[1, tgt_len * 2 // 3 :] = -100
    labels[2, tgt_len // 3 :] = -100
    return ids, mask, labels


def hf_logits(hf: T5ForConditionalGeneration, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return hf(input_ids=ids, attention_mask=mask, labels=labels).logits


def masked_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100)


# ------------------------------------------------------------------------- equivalence


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_match_hugging_face(tmp_path, variant):
    overrides, src_len, tgt_len = VARIANTS[variant]
    hf, native = load_both(save_hf(tmp_path, overrides))
    assert not native.training  # eval mode, as transformers' from_pretrained leaves its models
    ids, mask, labels = batch(src_len, tgt_len)
    with torch.no_grad():
        want, got = hf_logits(hf, ids, mask, labels), native(ids, mask, labels)
    assert got.shape == want.shape == (3, tgt_len, VOCAB)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_variants_load_the_head_transformers_uses(tmp_path):
    """flan-style files untie the head (no scaling); a transformers-5 save ties it without scaling."""
    flan = tm.from_pretrained(str(save_hf(tmp_path / "a", VARIANTS["flan-untied"][0])))
    assert flan.lm_head is not None and flan.settings.scale_decoder_output is False
    v11 = tm.from_pretrained(str(save_hf(tmp_path / "b", VARIANTS["v1.1-transformers5"][0])))
    assert v11.lm_head is None and v11.settings.scale_decoder_output is False
    v10 = tm.from_pretrained(str(save_hf(tmp_path / "c", {})))
    assert v10.lm_head is None and v10.settings.scale_decoder_output is True


def test_batches_of_changing_lengths_match(tmp_path):
    """Length-bucketed batches: the cached bucket / causal matrices grow and are sliced correctly."""
    hf, native = load_both(save_hf(tmp_path, {"relative_attention_max_distance": 64}))
    for src_len, tgt_len in ((10, 5), (150, 140), (10, 5), (40, 70)):
        ids, mask, labels = batch(src_len, tgt_len)
        with torch.no_grad():
            torch.testing.assert_close(native(ids, mask, labels), hf_logits(hf, ids, mask, labels), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("feed_forward_proj", ["gelu", "silu", "gated-relu", "gated-silu"])
def test_other_feed_forward_activations_match(tmp_path, feed_forward_proj):
    hf, native = load_both(save_hf(tmp_path, {"feed_forward_proj": feed_forward_proj}))
    ids, mask, labels = batch(12, 7)
    with torch.no_grad():
        torch.testing.assert_close(native(ids, mask, labels), hf_logits(hf, ids, mask, labels), rtol=1e-5, atol=1e-5)


def grads_by_name(native: tm.T5Model, hf: T5ForConditionalGeneration) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(our parameter, its gradient, Hugging Face's gradients of the same weights stacked)."""
    ours = dict(native.named_parameters())
    out = []
    for name, keys in tm.hf_key_map(native.settings).items():
        hf_grads = [hf.get_parameter(k).grad for k in keys]
        assert ours[name].grad is not None and all(g is not None for g in hf_grads), name
        out.append((name, ours[name].grad, torch.cat(hf_grads, dim=0)))  # type: ignore[arg-type]
    return out


@pytest.mark.parametrize("variant", ["t5-v1.0", "flan-untied", "long-log-buckets"])
def test_gradients_match_hugging_face(tmp_path, variant):
    overrides, src_len, tgt_len = VARIANTS[variant]
    hf, native = load_both(save_hf(tmp_path, overrides))
    hf.train()
    native.train()
    ids, mask, labels = batch(src_len, tgt_len)
    masked_loss(hf_logits(hf, ids, mask, labels), labels).backward()
    masked_loss(native(ids, mask, labels), labels).backward()
    compared = grads_by_name(native, hf)
    assert len(compared) == len(list(native.parameters()))  # every parameter has its counterpart
    for name, got, want in compared:
        assert want.abs().sum() > 0, name  # the weight takes part in the loss
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_activation_checkpointing_gives_the_same_gradients(tmp_path):
    """Each block runs twice (forward, then recomputed in backward) and, dropout included, the
    gradients are those of the plain step (the recompute replays the RNG state)."""
    settings = tiny_settings(dropout_rate=0.1)
    model = tm.T5Model(settings)
    tm.init_weights(model, seed=3)
    model.train()
    calls = collections.Counter()
    for i, block in enumerate(model.blocks()):
        block.register_forward_pre_hook(lambda *_, i=i: calls.update([i]))  # the recompute stops early, before any post-hook
    ids, mask, labels = batch(16, 8)

    def grads(checkpointing: bool) -> dict[str, torch.Tensor]:
        model.activation_checkpointing = checkpointing
        model.zero_grad(set_to_none=True)
        calls.clear()
        torch.manual_seed(7)
        masked_loss(model(ids, mask, labels), labels).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain = grads(False)
    assert set(calls.values()) == {1}
    checkpointed = grads(True)
    assert set(calls.values()) == {2} and len(calls) == 4
    assert plain.keys() == checkpointed.keys() == {n for n, _ in model.named_parameters()}
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------------- weights and settings


def test_sharded_checkpoint_loads(tmp_path):
    torch.manual_seed(0)
    config = T5Config(**TINY, dropout_rate=0.0, decoder_start_token_id=0)  # pyright: ignore[reportCallIssue]
    hf = T5ForConditionalGeneration(config).eval()
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    native = tm.from_pretrained(str(tmp_path))
    ids, mask, labels = batch(10, 6)
    with torch.no_grad():
        torch.testing.assert_close(native(ids, mask, labels), hf_logits(hf, ids, mask, labels), rtol=1e-5, atol=1e-5)


def rewrite_weights(model_dir: pathlib.Path, edit) -> None:
    weights = load_file(model_dir / "model.safetensors")
    edit(weights)
    save_file(weights, model_dir / "model.safetensors", metadata={"format": "pt"})


def test_missing_weight_is_named(tmp_path):
    model_dir = save_hf(tmp_path, {})
    key = "decoder.block.1.layer.1.EncDecAttention.v.weight"
    rewrite_weights(model_dir, lambda w: w.pop(key))
    with pytest.raises(ValueError, match=rf"{key}.*model\.safetensors"):
        tm.from_pretrained(str(model_dir))


def test_unexpected_weight_is_named(tmp_path):
    model_dir = save_hf(tmp_path, {})
    key = "encoder.block.0.layer.0.SelfAttention.extra.weight"
    rewrite_weights(model_dir, lambda w: w.update({key: torch.zeros(2)}))
    with pytest.raises(ValueError, match=rf"unexpected weight {key} in .*model\.safetensors"):
        tm.from_pretrained(str(model_dir))


def test_duplicate_embedding_keys_are_accepted(tmp_path):
    model_dir = save_hf(tmp_path, {})
    rewrite_weights(model_dir, lambda w: w.update({"encoder.embed_tokens.weight": w["shared.weight"].clone(), "decoder.embed_tokens.weight": w["shared.weight"].clone()}))
    hf, native = load_both(model_dir)
    ids, mask, labels = batch(10, 6)
    with torch.no_grad():
        torch.testing.assert_close(native(ids, mask, labels), hf_logits(hf, ids, mask, labels), rtol=1e-5, atol=1e-5)


def test_tied_model_refuses_a_distinct_head(tmp_path):
    model_dir = save_hf(tmp_path, VARIANTS["flan-untied"][0])
    settings = tm.T5Settings.from_hf_config(json.loads((model_dir / "config.json").read_text()))
    tied = tm.T5Model(dataclasses.replace(settings, tie_word_embeddings=True))
    with pytest.raises(ValueError, match="lm_head.weight .* differs from shared.weight"):
        tm.load_hf_weights(tied, str(model_dir))


def test_wrong_shape_is_named(tmp_path):
    model_dir = save_hf(tmp_path, {})
    settings = tm.T5Settings.from_hf_config(json.loads((model_dir / "config.json").read_text()))
    other = tm.T5Model(dataclasses.replace(settings, d_ff=96))
    with pytest.raises(ValueError, match=r"encoder\.block\.0\.layer\.1\.DenseReluDense\.wi\.weight .* shape \(128, 64\)"):
        tm.load_hf_weights(other, str(model_dir))


def test_settings_from_hf_config():
    cfg = {**TINY, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False, "dropout_rate": 0.0, "num_decoder_layers": None}
    s = tm.T5Settings.from_hf_config(cfg)
    assert (s.gated, s.activation, s.num_decoder_layers, s.tie_word_embeddings, s.scale_decoder_output) == (True, "gelu_new", 2, False, False)
    with pytest.raises(ValueError, match="'gated-swish'"):
        tm.T5Settings.from_hf_config({**cfg, "feed_forward_proj": "gated-swish"})
    with pytest.raises(ValueError, match="umt5"):
        tm.T5Settings.from_hf_config({**cfg, "model_type": "umt5"})
    with pytest.raises(ValueError, match="d_kv"):
        tm.T5Settings.from_hf_config({k: v for k, v in cfg.items() if k != "d_kv"})


def test_init_weights_follows_t5_scheme():
    s = tm.T5Settings(vocab_size=3000, d_model=256, d_kv=32, d_ff=1024, num_layers=1, num_decoder_layers=1, num_heads=8, tie_word_embeddings=False)
    model = tm.T5Model(s)
    tm.init_weights(model, seed=0)
    inner = s.num_heads * s.d_kv
    enc, dec = model.encoder.blocks[0], model.decoder.blocks[0]
    assert isinstance(enc, tm.EncoderBlock) and isinstance(dec, tm.DecoderBlock)
    q, k, v = enc.attn.qkv.weight.split(inner)
    expected = {
        "shared": (model.shared.weight, 1.0),
        "lm_head": (model.lm_head.weight, 1.0),  # pyright: ignore[reportOptionalMemberAccess]
        "q": (q, (s.d_model * s.d_kv) ** -0.5),
        "k": (k, s.d_model**-0.5),
        "v": (v, s.d_model**-0.5),
        "o": (enc.attn.o.weight, inner**-0.5),
        "cross q": (dec.cross.q.weight, (s.d_model * s.d_kv) ** -0.5),
        "cross kv": (dec.cross.kv.weight, s.d_model**-0.5),
        "wi": (enc.ff.wi.weight, s.d_model**-0.5),
        "wo": (dec.ff.wo.weight, s.d_ff**-0.5),
        "relative bias": (model.decoder.relative_attention_bias.weight, s.d_model**-0.5),
    }
    for name, (weight, std) in expected.items():
        assert abs(weight.std().item() / std - 1) < 0.2, name
    assert all(torch.equal(m.weight, torch.ones_like(m.weight)) for m in model.modules() if isinstance(m, tm.RMSNorm))
    again = tm.T5Model(s)
    tm.init_weights(again, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True))


def test_relative_position_buckets_match_hugging_face():
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = torch.arange(300)[None, :] - torch.arange(300)[:, None]
    for bidirectional in (True, False):
        for buckets, distance in ((32, 128), (16, 20), (8, 300)):
            want = T5Attention._relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=buckets, max_distance=distance)
            assert torch.equal(tm.relative_position_bucket(rel, bidirectional, buckets, distance), want)


def test_shift_right_and_blocks():
    labels = torch.tensor([[5, 6, -100], [7, -100, -100]])
    assert tm.shift_right(labels, 0, 0).tolist() == [[0, 5, 6], [0, 7, 0]]
    model = tm.T5Model(tiny_settings(num_decoder_layers=3))
    blocks = model.blocks()
    assert [type(b) for b in blocks] == [tm.EncoderBlock] * 2 + [tm.DecoderBlock] * 3
    assert model.settings.vocab_size == VOCAB
    with pytest.raises(ValueError, match="'eager'"):
        model.attention = "eager"


def test_sdpa_masks_are_laid_out_for_fused_kernels():
    """Keys contiguous and every other stride a multiple of 8 elements, so CUDA's memory-efficient
    kernel takes the masks as they are instead of padding a copy in every layer."""
    model = tm.T5Model(tiny_settings())
    _, mask, _ = batch(20, 9)
    valid = mask.bool()
    masks = {
        "encoder": model.encoder.self_mask(valid, 20, torch.float32, torch.device("cpu"), "sdpa"),
        "encoder unpadded": model.encoder.self_mask(None, 20, torch.float32, torch.device("cpu"), "sdpa"),
        "decoder": model.decoder.self_mask(None, 9, torch.float32, torch.device("cpu"), "sdpa"),
        "cross": model._cross_mask(valid, 9, 20, torch.float32, torch.device("cpu")),
    }
    shapes = {"encoder": (3, 4, 20, 20), "encoder unpadded": (1, 4, 20, 20), "decoder": (1, 4, 9, 9), "cross": (3, 1, 1, 20)}
    for name, m in masks.items():
        assert isinstance(m, torch.Tensor) and m.shape == shapes[name], name
        assert m.stride(-1) == 1 and all(st % 8 == 0 for st in m.stride()[:-1]), (name, m.stride())
    minimum = torch.finfo(torch.float32).min
    assert (masks["cross"][:, 0, 0, :] == minimum).eq(~valid).all()
    assert (masks["decoder"][0, 0] == minimum).eq(torch.ones(9, 9, dtype=torch.bool).triu(1)).all()


# ------------------------------------------------------------------------- FlexAttention


@pytest.fixture
def eager_flex(monkeypatch):
    """Uncompiled flex_attention: checks our score_mod and block masks in seconds (compiling the CPU
    kernel takes about half a minute; ``test_compiled_flex_forward_on_cpu`` does that)."""
    monkeypatch.setattr(t5_layers, "_compiled_flex", {True: flex_attention, False: flex_attention})


@pytest.mark.parametrize(("src_len", "tgt_len"), [(20, 9), (150, 130)])  # the latter spans two 128-blocks, neither full
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_forward_matches_sdpa_on_cpu(tmp_path, eager_flex, src_len, tgt_len):
    model = tm.from_pretrained(str(save_hf(tmp_path, {"relative_attention_max_distance": 64})))
    ids, mask, labels = batch(src_len, tgt_len)
    with torch.no_grad():
        want = model(ids, mask, labels)
        model.attention = "flex"
        got = model(ids, mask, labels)
        got_no_padding = model(ids, None, labels)
        model.attention = "sdpa"
        want_no_padding = model(ids, None, labels)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_no_padding, want_no_padding, rtol=1e-5, atol=1e-5)


# Run in a fresh interpreter: inductor's CPU build reads process-wide state (sys.path joined into its
# workers' PYTHONPATH, the environment, its caches), which other tests in this process may have left.
COMPILED_FLEX = """
import pathlib, sys
root, programs, tmp = sys.argv[1:4]
sys.path[:0] = [programs, root]
import torch
from tests.test_t5_model import batch, save_hf
from workloads.programs import t5_model as tm
model = tm.from_pretrained(str(save_hf(pathlib.Path(tmp), {})))
ids, mask, labels = batch(20, 9)
with torch.no_grad():
    want = model(ids, mask, labels)
    model.attention = "flex"
    got = model(ids, mask, labels)
torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
print("compiled flex matches sdpa")
"""


@pytest.mark.slow
def test_compiled_flex_forward_on_cpu(tmp_path):
    """The module's torch.compile'd flex_attention (inductor's CPU kernel) in inference, compiled
    afresh in a process of its own (an inductor cache of its own), whatever ran before it."""
    import os
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR", "CC", "CXX")}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")
    proc = subprocess.run([sys.executable, "-c", COMPILED_FLEX, str(root), str(root / "workloads" / "programs"), str(tmp_path)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and "compiled flex matches sdpa" in proc.stdout, proc.stderr[-6000:]


def test_flex_training_on_cpu_is_refused(tmp_path):
    model = tm.T5Model(tiny_settings(), attention="flex")
    ids, mask, labels = batch(12, 6)
    with pytest.raises(NotImplementedError, match="no backward on CPU"):
        model(ids, mask, labels)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention's backward needs CUDA")
def test_flex_gradients_match_sdpa_on_cuda(tmp_path):
    model = tm.from_pretrained(str(save_hf(tmp_path, {"relative_attention_max_distance": 64}))).cuda().train()
    ids, mask, labels = (t.cuda() for t in batch(150, 70))

    def grads(attention: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.attention = attention
        model.zero_grad(set_to_none=True)
        logits = model(ids, mask, labels)
        masked_loss(logits, labels).backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    logits_sdpa, sdpa = grads("sdpa")
    logits_flex, flex = grads("flex")
    torch.testing.assert_close(logits_flex, logits_sdpa, rtol=1e-4, atol=1e-4)
    assert flex.keys() == sdpa.keys() and "encoder.relative_attention_bias.weight" in flex and "decoder.relative_attention_bias.weight" in flex
    for name in sdpa:
        torch.testing.assert_close(flex[name], sdpa[name], rtol=1e-3, atol=1e-4, msg=lambda m, name=name: f"{name}: {m}")


# ------------------------------------------------------------------------- dispatched ops


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched below autograd (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def ops_per_training_step(model: torch.nn.Module, is_hf: bool, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> int:
    def step() -> None:
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        masked_loss(out.logits if is_hf else out, labels).backward()

    step()  # warm-up: one-off work (our cached position buckets) is not part of a step
    with OpCounter() as counter:
        step()
    return counter.count


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_fewer_ops_per_training_step_than_hugging_face(dropout):
    torch.manual_seed(0)
    hf = T5ForConditionalGeneration(T5Config(**TINY, dropout_rate=dropout, decoder_start_token_id=0)).train()  # pyright: ignore[reportCallIssue]
    native = tm.T5Model(tiny_settings(dropout_rate=dropout)).train()
    ids, mask, labels = batch(20, 9)
    hf_ops = ops_per_training_step(hf, True, ids, mask, labels)
    native_ops = ops_per_training_step(native, False, ids, mask, labels)
    print(f"aten ops per training step (dropout {dropout}): native {native_ops}, transformers {hf_ops}")
    assert native_ops < 0.8 * hf_ops
