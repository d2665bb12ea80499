"""models/native.py: the decode step's feature-major layer against the row-major one.

The sampler's decode step (one position per row, no autograd) runs the o-projection and the MLP as
``W xᵀ`` on [features, rows] activations (``NativeLlama.finish_decode``); the trainer's forwards and the
prefill run ``x Wᵀ`` on [rows, features]. Both are the same dot products, so they agree to float32
summation order (within 1e-5 of the largest output here).
"""

from __future__ import annotations

import pytest
import torch

from dapo_cli.config.tiny import TinyModelConfig
from dapo_cli.models.native import NativeLlama
from dapo_cli.models.tiny import build_tiny_model_for
from dapo_cli.models.tokenizer import build_char_tokenizer


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])  # qwen2: q/k/v biases
def test_the_feature_major_decode_layer_is_the_row_major_layer(architecture):
    cfg = TinyModelConfig(architecture=architecture, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=160)
    torch.manual_seed(0)
    model = build_tiny_model_for(cfg, build_char_tokenizer()).eval()
    for p in model.parameters():  # random non-zero weights and biases everywhere (o/down biases too)
        torch.nn.init.normal_(p, std=0.2)
    net = NativeLlama(model)
    layer = net.layers[0]
    layer.o_b = torch.randn(layer.o_w.shape[0])
    layer.down_b = torch.randn(layer.down_w.shape[0])
    x = torch.randn(11, 1, 64)  # 11 rows, one position each: a decode step
    att = torch.randn(11, 1, 64)
    with torch.inference_mode():
        assert net.decoding(x)
        got = net.finish_tokens(layer, x, att)
        NativeLlama.feature_major_decode = False
        try:
            want = net.finish_tokens(layer, x, att)
        finally:
            NativeLlama.feature_major_decode = True
    assert got.shape == want.shape == (11, 1, 64) and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * float(want.abs().max()))
    assert torch.is_grad_enabled() and not net.decoding(x)  # the trainer's forwards (autograd on) never take it
    with torch.inference_mode():
        assert not net.decoding(torch.randn(11, 3, 64))  # several positions (prefill): the row-major forward
