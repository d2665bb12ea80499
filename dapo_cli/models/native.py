"""Llama / Qwen2 decoder blocks on a module's own weights: the pieces both native forwards share.

Two forwards are built from these blocks: the fast sampler's decode loop
(``rollout/fast.py``, a key/value buffer of its own, under ``inference_mode``) and the
trainer's shared-prompt forward (``engine/shared_prompt.py``, differentiable). Both call
the same arithmetic, so the sampler's log-probs and the trainer's agree:

- q/k/v (and gate/up) projections fused into one matmul each; the fused weights are
  ``torch.cat`` of the module's parameters, built per forward (``layers``), so gradients
  flow back to the separate ``q_proj``/``k_proj``/... parameters; a projection PEFT gave LoRA
  adapters contributes ``W0 + (alpha / r) B A`` (:func:`linear_params`), so gradients reach ``A``
  and ``B`` and the adapters are never silently left out;
- RoPE on queries and keys at once, with the sign of ``rotate_half`` folded into ``sin``;
- attention as two batched matmuls with an additive 0 / -inf bias (grouped-query heads
  without repeating keys).

:meth:`NativeLlama.supports` says when these blocks reproduce the model's own forward:
``model_type`` llama or qwen2, every layer full attention (no sliding window), the standard
submodules, a RoPE whose frequencies do not depend on the sequence length (not ``dynamic``
or ``longrope``), no attention dropout in training mode, and LoRA layers only of the plain kind
without active adapter dropout (:func:`lora_fusable`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

NATIVE_MODEL_TYPES = ("llama", "qwen2")
"""``config.model_type`` values the native blocks implement."""

LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")
"""RoPE types whose frequencies depend on the longest position seen (not reproduced)."""


@dataclass
class Layer:
    """One decoder layer's modules and fused weights (``*_b``: bias or None)."""

    ln1: Any
    qkv_w: torch.Tensor
    qkv_b: torch.Tensor | None
    o_w: torch.Tensor
    o_b: torch.Tensor | None
    ln2: Any
    gate_up_w: torch.Tensor
    gate_up_b: torch.Tensor | None
    down_w: torch.Tensor
    down_b: torch.Tensor | None
    act: Any


def is_lora(module: Any) -> bool:
    """True for a linear layer PEFT gave LoRA adapters (``lora.Linear``: ``base_layer``, ``lora_A``, ``lora_B``)."""
    return hasattr(module, "base_layer") and hasattr(module, "lora_A") and hasattr(module, "lora_B")


def lora_fusable(module: Any) -> bool:
    """A PEFT LoRA layer whose forward is ``x (W0 + s B A)ᵀ + b``: plain LoRA (no DoRA or other variant, no
    bias on B, no transposed base weight) and no adapter dropout active (dropout is identity, or eval mode)."""
    names = [n for n in module.active_adapters if n in module.lora_A]
    return (
        not getattr(module, "fan_in_fan_out", False)
        and not any(getattr(module, "use_dora", {}).get(n, False) for n in names)
        and not any(getattr(module, "lora_bias", {}).get(n, False) for n in names)
        and not getattr(module, "lora_variant", {})
        and (not module.training or all(isinstance(module.lora_dropout[n], torch.nn.Identity) for n in names))
    )


def linear_params(module: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weight and bias a linear layer applies: an ``nn.Linear``'s own, or for a LoRA layer
    ``W0 + Σ_a (alpha_a / r_a) B_a A_a`` over its active adapters (none when they are disabled or already
    merged into W0), built from the parameters so gradients reach ``A`` and ``B`` (W0 is frozen)."""
    if not is_lora(module):
        return module.weight, module.bias
    base = module.base_layer
    weight = base.weight
    if not module.disable_adapters and not module.merged:
        for name in module.active_adapters:
            if name in module.lora_A:
                delta = module.lora_B[name].weight @ module.lora_A[name].weight
                weight = weight + module.scaling[name] * delta.to(weight.dtype)
    return weight, base.bias


def fuse_layer(layer: Any) -> Layer:
    """The fused weights of one Llama / Qwen2 decoder layer (``torch.cat``: differentiable), LoRA
    adapters merged in (:func:`linear_params`)."""
    q, k, v, o, gate, up, down = (linear_params(p) for p in _projections(layer))
    qkv_w = torch.cat([q[0], k[0], v[0]])
    qkv_b = None
    if any(p[1] is not None for p in (q, k, v)):
        qkv_b = torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in (q, k, v)])
    gate_up_b = None if gate[1] is None else torch.cat([gate[1], up[1]])
    return Layer(
        layer.input_layernorm, qkv_w, qkv_b, o[0], o[1], layer.post_attention_layernorm,
        torch.cat([gate[0], up[0]]), gate_up_b, down[0], down[1], layer.mlp.act_fn,
    )


class NativeLlama:
    """The blocks of one Llama / Qwen2 causal LM (see the module doc). Build it per forward (or per
    ``generate`` call): the fused weights are copies of the parameters at construction time."""

    def __init__(self, model: Any) -> None:
        inner = model.model
        self.embed = inner.embed_tokens
        self.norm = inner.norm
        self.rotary = inner.rotary_emb
        self.lm_head = model.lm_head
        first = inner.layers[0].self_attn
        self.heads = model.config.num_attention_heads
        self.kv_heads = model.config.num_key_value_heads
        self.head_dim = first.head_dim
        self.scaling = first.scaling
        self.layers = [fuse_layer(layer) for layer in inner.layers]
        self.inter = self.layers[0].gate_up_w.shape[0] // 2
        self.dtype = self.layers[0].qkv_w.dtype
        # RoPE: a cos/sin table may be built once and looked up (the frequencies do not depend on length)
        self.static_rope = not any(k in str(getattr(self.rotary, "rope_type", "default")) for k in LENGTH_DEPENDENT_ROPE)
        self.rope_table: tuple[torch.Tensor, torch.Tensor] | None = None

    @staticmethod
    def supports(model: Any) -> bool:
        """True when these blocks compute what ``model``'s own forward does (see the module doc)."""
        config = getattr(model, "config", None)
        if getattr(config, "model_type", None) not in NATIVE_MODEL_TYPES:
            return False
        layer_types = getattr(config, "layer_types", None) or []
        if any(t != "full_attention" for t in layer_types):
            return False  # sliding-window layers: leave them to the model's own forward
        if getattr(model, "training", False) and float(getattr(config, "attention_dropout", 0.0) or 0.0) > 0:
            return False  # random attention dropout is not reproduced
        inner = getattr(model, "model", None)
        needed = ("embed_tokens", "layers", "norm", "rotary_emb")
        if inner is None or not all(hasattr(inner, n) for n in needed) or not hasattr(model, "lm_head"):
            return False
        if any(k in str(getattr(inner.rotary_emb, "rope_type", "default")) for k in LENGTH_DEPENDENT_ROPE):
            return False
        return all(
            all(hasattr(layer.self_attn, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling"))
            and all(hasattr(layer.mlp, p) for p in ("gate_proj", "up_proj", "down_proj", "act_fn"))
            and all(lora_fusable(p) for p in _projections(layer) if is_lora(p))
            for layer in inner.layers
        )

    # ------------------------------------------------------------ norms and RoPE

    def rms_norm(self, module: Any, x: torch.Tensor) -> torch.Tensor:
        """RMSNorm in one fused call where the module is a plain one (its forward's arithmetic in float32;
        in float64 it stays float64, where transformers' module would round through float32 — which,
        with prompts shared by several rows, would make float64 gradients depend on the micro-batch)."""
        eps = getattr(module, "variance_epsilon", None)
        if eps is None or x.dtype not in (torch.float32, torch.float64) or not hasattr(F, "rms_norm"):
            return module(x)
        return F.rms_norm(x, (x.shape[-1],), module.weight, eps)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sign-folded sin [B, 1, q, d] at ``positions`` [B, q]: rotate_half(v) * sin equals
        roll(v, d/2) * (sin with its first half negated)."""
        if self.rope_table is not None:  # covers every position of the call (the caller built it)
            cos, sin = self.rope_table[0][positions], self.rope_table[1][positions]
        else:
            cos, sin = self.rotary(positions.new_zeros((), dtype=self.dtype), positions)
            half = self.head_dim // 2
            sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        return cos.unsqueeze(1), sin.unsqueeze(1)

    def build_rope_table(self, length: int, device: torch.device) -> None:
        """Precompute cos/sin for positions ``0 .. length-1`` (static RoPE only; else looked up per call)."""
        if not self.static_rope:
            return
        positions = torch.arange(length, device=device)[None, :]
        cos, sin = self.rotary(torch.zeros((), dtype=self.dtype, device=device), positions)
        half = self.head_dim // 2
        self.rope_table = (cos[0], torch.cat((-sin[0, :, :half], sin[0, :, half:]), dim=-1))

    # ------------------------------------------------------------ one layer, in two halves

    def qkv(
        self, layer: Layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries [B, h, q, d], RoPE'd keys and values [B, kv_heads, q, d] of ``x`` [B, q, H]
        (views of one fused projection)."""
        return self.split_heads(self.project_qkv(layer, x), cos, sin)

    def project_qkv(self, layer: Layer, x: torch.Tensor) -> torch.Tensor:
        """The fused q/k/v projection of the normed ``x`` [..., H]: [..., (h + 2 kv_heads) * d]."""
        return self.linear(self.rms_norm(layer.ln1, x), layer.qkv_w, layer.qkv_b)

    def split_heads(
        self, y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`project_qkv`'s output [B, q, (h + 2 kv_heads) * d] as queries [B, h, q, d] and keys and
        values [B, kv_heads, q, d], RoPE applied to queries and keys (``cos``/``sin`` [B, 1, q, d])."""
        b, q, _ = y.shape
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        y = y.view(b, q, h + 2 * kvh, d).transpose(1, 2)
        qk, v = y[:, : h + kvh], y[:, h + kvh :]
        qk = torch.addcmul(qk * cos, torch.roll(qk, d // 2, dims=-1), sin)  # RoPE on queries and keys at once
        return qk[:, :h], qk[:, h:], v

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """softmax(q kᵀ · scale + bias) v for q [B, h, q, d] and keys/values [B, kv_heads, c, d].
        ``bias`` is 0 where a key may be seen and -inf elsewhere: [B, 1, q, c] in general, or already
        flattened to [B * kv_heads, 1, c] for one query per row. Query heads are grouped onto their
        key/value head (grouped-query attention) without copying keys.

        One query per row (decode): plain batched matmuls, one ``baddbmm`` folding the scale and the mask
        in, several times faster on CPU than ``scaled_dot_product_attention``'s kernels there (measured
        0.17 ms vs 0.7 ms per layer, 64 rows, 60 keys). Several queries (prefill, the trainer's forwards):
        ``scaled_dot_product_attention`` (its fused CPU kernel, the mask as booleans), which keeps no
        [B, h, q, c] attention matrix for the backward and ran forward + backward 1.8x (63 queries) to 2.7x
        (255) faster than the two matmuls with a softmax between (64 rows x 9 heads, 40 prompt keys, 2 AVX2
        cores; ``benchmarks/logprob_chunk.py`` times whole updates)."""
        b, h, length, d = q.shape
        kvh, c = keys.shape[1], keys.shape[2]
        g = h // kvh
        if length == 1 and bias.dim() == 3:
            k3, v3 = keys.reshape(b * kvh, c, d), values.reshape(b * kvh, c, d)  # views: (B, kv) strides merge
            scores = torch.baddbmm(bias, q.reshape(b * kvh, g, d), k3.transpose(1, 2), alpha=self.scaling)
            return torch.bmm(_softmax(scores), v3).view(b, h, 1, d)
        if self.fused_attention:
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=bias == 0, scale=self.scaling, enable_gqa=g > 1)
        scores = torch.matmul(q.reshape(b, kvh, g * length, d), keys.transpose(-1, -2))  # [B, kvh, g*q, c]
        scores = scores.view(b, kvh, g, length, c).mul_(self.scaling).add_(bias.unsqueeze(2))
        weights = _softmax(scores).view(b, kvh, g * length, c)
        return torch.matmul(weights, values).view(b, h, length, d)

    fused_attention = True
    """Several queries through ``scaled_dot_product_attention`` (:meth:`attend`); False: two matmuls and a
    softmax (dapo before it; a class switch so ``benchmarks/logprob_chunk.py`` times both)."""

    def finish(self, layer: Layer, x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        """The rest of the layer: ``x`` + o_proj(``att`` [B, h, q, d]), then + SwiGLU MLP. [B, q, H]."""
        b, q, _ = x.shape
        return self.finish_tokens(layer, x, att.transpose(1, 2).reshape(b, q, self.heads * self.head_dim))

    def finish_tokens(self, layer: Layer, x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        """:meth:`finish` on ``x`` [..., H] and the attention output with heads merged, ``att`` [..., h * d]."""
        if self.feature_major_decode and self.decoding(x):
            return self.finish_decode(layer, x, att)
        x = x + self.linear(att, layer.o_w, layer.o_b)
        gate, up = self.linear(self.rms_norm(layer.ln2, x), layer.gate_up_w, layer.gate_up_b).split(self.inter, dim=-1)
        return x + self.linear(layer.act(gate).mul_(up), layer.down_w, layer.down_b)

    transposed_decode = True
    """Decode projections as ``W xᵀ`` (:meth:`linear`); a class switch so benchmarks can time both."""

    feature_major_decode = True
    """With :attr:`transposed_decode`, a decode step's o-projection and MLP feature-major
    (:meth:`finish_decode`); a class switch so benchmarks can time both."""

    def decoding(self, x: torch.Tensor) -> bool:
        """True for a decode step of the sampler: one position per row (``x`` [B, 1, ...]), no autograd."""
        return self.transposed_decode and x.dim() == 3 and x.shape[1] == 1 and not torch.is_grad_enabled()

    @staticmethod
    def project(xt: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """``W xᵀ + b`` for feature-major inputs ``xt`` [in, rows] (any strides): [out, rows], contiguous."""
        return torch.mm(w, xt) if b is None else torch.addmm(b[:, None], w, xt)

    def linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """``x Wᵀ + b`` for ``x`` [..., in]. A decode step (:meth:`decoding`) computes it as ``(W xᵀ)ᵀ``, the
        same dot products, because with a few dozen rows MKL runs ``W xᵀ`` [out, in] x [in, rows] faster than
        ``x Wᵀ`` (SmolLM2's projections, 64 rows, 2 AVX2 cores: ~100 against 70-90 GFLOP/s; the lm_head the
        same way in ``rollout.fast.vocab_logits``)."""
        if not self.decoding(x):
            return F.linear(x, w, b)
        out = self.project(x.reshape(x.shape[0], x.shape[2]).t(), w, b)  # [out, B]
        return out.t().contiguous().view(x.shape[0], 1, w.shape[0])

    def finish_decode(self, layer: Layer, x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        """:meth:`finish_tokens` for a decode step (``x`` [B, 1, H], ``att`` [B, 1, h * d]): the same products,
        with the MLP feature-major. ``W xᵀ`` leaves its output as [out, B]; gate/up [2I, B] splits into two
        contiguous halves, SiLU(gate) * up [I, B] is already the down projection's ``xᵀ``, and the o/down
        outputs are added to the residual through a transposed view. :meth:`linear` would instead copy every
        projection's [out, B] back to [B, out] (a strided copy per projection: 9.7% of SmolLM2's decode,
        most of it the 3,072-wide gate/up)."""
        b = x.shape[0]
        x = x + self.project(att.reshape(b, -1).t(), layer.o_w, layer.o_b).t().unsqueeze(1)  # [B, 1, H]
        normed = self.rms_norm(layer.ln2, x).view(b, -1)  # [B, H]
        gate_up = self.project(normed.t(), layer.gate_up_w, layer.gate_up_b)  # [2I, B]
        act = layer.act(gate_up[: self.inter]).mul_(gate_up[self.inter :])  # [I, B]
        return x + self.project(act, layer.down_w, layer.down_b).t().unsqueeze(1)  # [B, 1, H]

    def causal_bias(self, mask: torch.Tensor) -> torch.Tensor:
        """Additive bias [P, 1, S, S] of left-padded sequences ``mask`` [P, S]: a real query sees the real
        keys at or before it; a pad query sees itself only (keeps its values finite; nothing reads it)."""
        s = mask.shape[1]
        causal = torch.ones(s, s, dtype=torch.bool, device=mask.device).tril()
        attend = (causal & mask[:, None, None, :]) | torch.eye(s, dtype=torch.bool, device=mask.device)
        return torch.zeros(attend.shape, dtype=self.dtype, device=mask.device).masked_fill_(~attend, float("-inf"))


def _softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim in at least float32 (half-precision scores are upcast and cast back;
    float64 stays float64, as the models' own SDPA attention computes it)."""
    if scores.dtype in (torch.float32, torch.float64):
        return torch.softmax(scores, dim=-1)
    return torch.softmax(scores.float(), dim=-1).to(scores.dtype)


def _projections(layer: Any) -> tuple[Any, ...]:
    a, m = layer.self_attn, layer.mlp
    return (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj)
