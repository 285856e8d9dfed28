"""Model FLOPs of T5 training steps and accelerator peaks, for MFU.

The formula (T5 v1.0: ReLU feed-forward with two matrices; ``inner = num_heads * d_kv``). For one
sample with ``s`` useful (non-pad) source tokens and ``t`` useful target tokens, the forward pass
performs these multiply-adds (MACs):

    encoder, per layer (num_layers):
        self-attention q, k, v, o projections   4 * s * d_model * inner
        self-attention scores QK^T and A.V      2 * s * s * inner
        feed-forward wi, wo                     2 * s * d_model * d_ff
    decoder, per layer (num_decoder_layers):
        self-attention q, k, v, o projections   4 * t * d_model * inner
        self-attention scores and A.V           2 * t * t * inner
        cross-attention q, o on target tokens   2 * t * d_model * inner
        cross-attention k, v on encoder output  2 * s * d_model * inner
        cross-attention scores and A.V          2 * t * s * inner
        feed-forward wi, wo                     2 * t * d_model * d_ff
    LM head                                     t * d_model * vocab_size

    forward FLOPs  = 2 * MACs                  (a multiply-add is two floating-point operations)
    training FLOPs = 3 * forward FLOPs = 6 * MACs   (backward: gradients of inputs and of weights)

Only useful tokens count: the work a step spends on padding is not model FLOPs, so MFU is
achieved useful FLOPs per second over the device's peak. Embedding lookups, layer norms,
softmax, relative position bias, the loss and the optimizer are not counted (a few per cent at
most). ``t5_train_flops`` with full-length sequences gives the padded (hardware) count.
"""

from __future__ import annotations

from collections.abc import Iterable

# Dense bf16 tensor-core peaks (no sparsity), from NVIDIA's data sheets.
PEAK_BF16_TFLOPS = {
    "H100 SXM": 989.4,
    "H100 PCIe": 756.0,
    "H200": 989.4,
    "A100": 312.0,
    "L40S": 362.05,
    "L4": 121.0,
    "A10G": 70.0,
}


def peak_tflops(device_name: str) -> float | None:
    name = device_name.upper()
    if "H100" in name:
        return PEAK_BF16_TFLOPS["H100 PCIe"] if "PCIE" in name else PEAK_BF16_TFLOPS["H100 SXM"]
    for key, value in PEAK_BF16_TFLOPS.items():
        if key.split()[0] in name:
            return value
    return None


def t5_forward_macs(cfg: dict, s: int, t: int) -> int:
    """Forward multiply-adds of one sample with s source and t target tokens (see the module doc)."""
    d, dff, vocab = cfg["d_model"], cfg["d_ff"], cfg["vocab_size"]
    inner = cfg["num_heads"] * cfg["d_kv"]
    n_enc, n_dec = cfg["num_layers"], cfg.get("num_decoder_layers", cfg["num_layers"])
    enc_layer = 4 * s * d * inner + 2 * s * s * inner + 2 * s * d * dff
    dec_layer = 4 * t * d * inner + 2 * t * t * inner  # self-attention
    dec_layer += 2 * t * d * inner + 2 * s * d * inner + 2 * t * s * inner  # cross-attention
    dec_layer += 2 * t * d * dff  # feed-forward
    head = t * d * vocab
    return n_enc * enc_layer + n_dec * dec_layer + head


def t5_train_flops_for(cfg: dict, lengths: Iterable[tuple[int, int]]) -> float:
    """Training FLOPs (forward + backward) of the samples with these (useful source, useful target)
    token counts: 6 x forward multiply-adds."""
    return 6.0 * sum(t5_forward_macs(cfg, s, t) for s, t in lengths)


def t5_train_flops(cfg: dict, batch: int, source_len: int, target_len: int) -> float:
    """Training FLOPs of a batch whose samples all have these token counts (for a padded batch:
    the work the hardware does; for useful FLOPs pass the non-pad lengths to t5_train_flops_for)."""
    return 6.0 * batch * t5_forward_macs(cfg, source_len, target_len)


def mfu(flops_per_step: float, step_time_s: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation: achieved (useful) FLOPs per second over the device's peak."""
    return flops_per_step / step_time_s / peak_flops_per_s
