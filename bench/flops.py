"""Model FLOPs of T5 training steps and accelerator peaks, for MFU.

FLOPs count the matrix multiplies a step really performs on the padded batch (forward x 3 for
forward + backward): per encoder layer q/k/v/o and the two feed-forward matrices on every source
token, plus self-attention scores and values (S^2); per decoder layer the same on target tokens
plus cross-attention (q/o on target tokens, k/v on the encoder output) and its scores (T x S);
the LM head on every target token. Embedding lookups, norms and softmax are not counted.
"""

from __future__ import annotations

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


def t5_train_flops(cfg: dict, batch: int, source_len: int, target_len: int) -> float:
    d, dff, heads, dkv, vocab = cfg["d_model"], cfg["d_ff"], cfg["num_heads"], cfg["d_kv"], cfg["vocab_size"]
    inner = heads * dkv
    n_enc, n_dec = cfg["num_layers"], cfg.get("num_decoder_layers", cfg["num_layers"])
    S, T = source_len, target_len
    enc_layer = 2 * S * (4 * d * inner + 2 * d * dff) + 2 * 2 * S * S * inner
    dec_layer = 2 * T * (4 * d * inner + 2 * d * dff) + 2 * 2 * T * T * inner  # self-attention + FF
    dec_layer += 2 * T * 2 * d * inner + 2 * S * 2 * d * inner + 2 * 2 * T * S * inner  # cross-attention
    head = 2 * T * d * vocab
    forward = batch * (n_enc * enc_layer + n_dec * dec_layer + head)
    return 3.0 * forward
