"""The T5 FLOP formula of bench/flops.py against a hand count, and MFU."""

import pytest

from bench.flops import mfu, peak_tflops, t5_forward_macs, t5_train_flops, t5_train_flops_for

# a config small enough to count by hand: d_model 4, d_ff 8, 2 heads of 3 (inner 6), vocab 10,
# 2 encoder layers, 1 decoder layer
CFG = {"d_model": 4, "d_ff": 8, "num_layers": 2, "num_decoder_layers": 1, "num_heads": 2, "d_kv": 3, "vocab_size": 10}


def test_forward_macs_match_a_hand_count():
    s, t = 5, 3  # useful source and target tokens
    # encoder layer: q,k,v,o 4*5*4*6 = 480; scores + A.V 2*5*5*6 = 300; FFN 2*5*4*8 = 320
    enc_layer = 480 + 300 + 320  # 1100
    # decoder layer: self q,k,v,o 4*3*4*6 = 288; self scores + A.V 2*3*3*6 = 108;
    # cross q,o 2*3*4*6 = 144; cross k,v on the encoder output 2*5*4*6 = 240;
    # cross scores + A.V 2*3*5*6 = 180; FFN 2*3*4*8 = 192
    dec_layer = 288 + 108 + 144 + 240 + 180 + 192  # 1152
    head = 3 * 4 * 10  # 120
    hand = 2 * enc_layer + 1 * dec_layer + head
    assert hand == 3472
    assert t5_forward_macs(CFG, s, t) == hand
    # training: forward 2 FLOPs per multiply-add, and backward twice the forward
    assert t5_train_flops_for(CFG, [(s, t)]) == 3 * 2 * hand == 20832


def test_only_useful_tokens_count():
    # two samples padded to 5 -> 3: one full, one with 2 source and 1 target tokens
    useful = t5_train_flops_for(CFG, [(5, 3), (2, 1)])
    # the short sample by hand: enc layer 4*2*4*6 + 2*2*2*6 + 2*2*4*8 = 192 + 48 + 128 = 368;
    # dec layer 4*1*4*6 + 2*1*1*6 + 2*1*4*6 + 2*2*4*6 + 2*1*2*6 + 2*1*4*8 = 96+12+48+96+24+64 = 340;
    # head 1*4*10 = 40
    short = 2 * 368 + 340 + 40  # 1116
    assert useful == 6 * (3472 + short)
    padded = t5_train_flops(CFG, 2, 5, 3)
    assert padded == 6 * 2 * 3472 and useful < padded


def test_mfu_is_achieved_flops_per_second_over_the_peak():
    flops_per_step = t5_train_flops_for(CFG, [(5, 3)] * 1000)  # 20,832,000 FLOPs
    step_time = 0.5
    peak = 1e9  # FLOP/s
    assert mfu(flops_per_step, step_time, peak) == pytest.approx(20_832_000 / 0.5 / 1e9)
    assert mfu(flops_per_step, step_time, peak) == pytest.approx(0.041664)
    h100 = peak_tflops("NVIDIA H100 80GB HBM3")
    assert h100 == 989.4
    assert mfu(989.4e12 * 0.25, 1.0, h100 * 1e12) == pytest.approx(0.25)
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0 and peak_tflops("some CPU") is None
