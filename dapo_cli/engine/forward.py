"""The trainer's forward: per-token log π (and entropy) of each row's response tokens.

Two ways to compute the same numbers for rows ``[prompt ; response]`` (prompt ``[N, S]``
left-padded, response ``[N, T]`` right-padded):

- :func:`plain_log_probs`: the model's own forward over every row's whole sequence, with
  explicit position ids, logits kept for the last ``T + 1`` positions only.
- :func:`shared_prompt_log_probs` (Llama / Qwen2, ``engine.shared_prompt_forward``): in GRPO a
  group's G rows share one prompt, so the plain forward computes each prompt's hidden states,
  keys and values G times. Here each **distinct prompt** of the call (rows deduplicated by their
  prompt token ids, wherever they sit) runs once; then the response tokens of every row run
  against its prompt's keys/values, and ``lm_head`` / log-softmax / entropy run only at the
  ``T`` positions whose log-probs are needed (the last prompt position, then every response
  position but the last), never at prompt positions. The last response token is not fed at
  all: nothing reads its keys/values or its logits. The response inputs are **packed**: the
  token-wise work (projections, norms, MLP, ``lm_head``) runs on the real inputs only
  (:func:`needed_inputs`; a row's right padding and its last real token are never fed), and only
  RoPE and attention see them in the padded ``[N, T-1]`` layout (:class:`Packing`; nothing to
  gather or scatter when no row is padded). Positions not computed return 0: losses
  and metrics read log-probs and entropies through the response mask, never at padding.

Why it is the same function (float32, up to summation order):

- A causal decoder's state at prompt position ``s`` depends only on prompt tokens ``<= s``,
  so two rows with the same (real) prompt tokens have the same prompt keys/values; left
  padding is masked out of every real query, so the padding width does not matter either.
- Response position ``t`` of a row attends to its prompt's real keys plus its own response
  keys ``<= t`` that are real (``response_mask``): exactly the plain forward's mask. Positions
  (RoPE) continue the plain forward's ``cumsum(mask) - 1``: ``len(prompt) - 1 + cumsum(response_mask)``.
- Autograd: a prompt's keys/values are gathered (``index_select``) to its rows, whose backward
  sums the rows' gradients into the one shared prompt computation — the gradient the plain
  forward accumulates over its G copies.

:class:`PolicyLogProbs` wraps both as one ``nn.Module`` forward, so DDP wraps it and its
reducer hooks see an ordinary forward; it falls back to the plain forward wherever
:func:`shared_prompt_supported` is false (other architectures, sliding-window layers,
length-dependent RoPE, attention dropout in training, gradient checkpointing).
"""

from __future__ import annotations

import contextlib

import torch

from dapo_cli.algo.logits import chunked_head_log_probs, entropy_from_logits, token_log_probs
from dapo_cli.models.native import NativeLlama, is_lora, linear_params, lora_fusable


AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {"none": None, "bfloat16": torch.bfloat16}
"""``engine.autocast`` values and the dtype each runs the trainer's forward in (None: no autocast)."""


def logits_to_log_probs(
    logits: torch.Tensor, response_ids: torch.Tensor, *, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(z / T) of ``response_ids`` [N, T] and its entropy, from logits [N, T, V] (at
    least float32; divided by ``temperature`` so they are the sampling distribution's)."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    logits = logits / temperature
    logp = token_log_probs(logits, response_ids)
    return logp, entropy_from_logits(logits) if with_entropy else None


PLAIN_HEAD_TYPES = ("llama", "qwen2", "qwen3", "mistral", "gpt2")
"""``config.model_type`` values whose causal-LM forward is ``lm_head(base_model(...).last_hidden_state)`` and
nothing else (no logit scaling or soft-capping), so the plain forward may run the backbone and score the
response positions through the chunked head (:func:`head_log_probs`)."""


def chunkable_head(head: torch.nn.Module) -> bool:
    """A head :func:`head_log_probs` may chunk: a plain ``nn.Linear`` or a fusable PEFT LoRA linear
    (``models.native.linear_params`` builds its weight), with no forward hooks (tests and benchmarks
    observe outputs through them: such a head runs as its module)."""
    if head._forward_hooks or head._forward_pre_hooks:
        return False
    if is_lora(head):
        return lora_fusable(head)
    return type(head) is torch.nn.Linear


def head_log_probs(
    head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, *, temperature: float, with_entropy: bool, chunk: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(head(hidden) / T) of ``targets`` [K] and its entropy, for final hidden states [K, H].

    ``chunk`` > 0 and a :func:`chunkable_head`: ``algo.logits.chunked_head_log_probs``, ``chunk`` rows at a
    time (no [K, V] logits in the forward or the backward; under autocast the head's matmul runs in the
    autocast dtype, as the module would). ``chunk`` 0 (or another head): the head's full logits, then
    :func:`logits_to_log_probs`."""
    if chunk > 0 and chunkable_head(head):
        weight, bias = linear_params(head)
        device = hidden.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        return chunked_head_log_probs(hidden, weight, bias, targets, temperature=temperature, chunk=chunk,
                                      with_entropy=with_entropy, compute_dtype=dtype)
    logp, ent = logits_to_log_probs(head(hidden)[:, None], targets[:, None], temperature=temperature, with_entropy=with_entropy)
    return logp[:, 0], (ent[:, 0] if ent is not None else None)


def plain_backbone(model: torch.nn.Module) -> torch.nn.Module | None:
    """``model.base_model`` when the plain forward may score through the chunked head (its type is one of
    :data:`PLAIN_HEAD_TYPES` and its output head is :func:`chunkable_head`), else None."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in PLAIN_HEAD_TYPES or not hasattr(model, "get_output_embeddings"):
        return None
    head, backbone = model.get_output_embeddings(), getattr(model, "base_model", model)
    if head is None or backbone is model or not chunkable_head(head):
        return None
    return backbone


def plain_log_probs(
    model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
    response_mask: torch.Tensor, *, temperature: float, with_entropy: bool, chunk: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The model's forward on ``[prompt ; response]``: the state at position ``S - 1 + t`` predicts response
    token ``t``. With ``chunk`` > 0 and a :func:`plain_backbone`, the backbone runs and only the real
    response positions go through :func:`head_log_probs` (the others return 0); otherwise the model's
    own forward with the logits of the last ``T + 1`` positions materialised (``logits_to_keep``)."""
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attention = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (attention.long().cumsum(-1) - 1).clamp(min=0)
    n, t = response_ids.shape
    backbone = plain_backbone(model) if chunk > 0 else None
    if backbone is None:
        out = model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids, logits_to_keep=t + 1, use_cache=False)
        return logits_to_log_probs(out.logits[:, :-1, :], response_ids, temperature=temperature, with_entropy=with_entropy)
    states = backbone(input_ids=input_ids, attention_mask=attention, position_ids=position_ids, use_cache=False).last_hidden_state
    layout = Packing(response_mask.reshape(-1).nonzero().squeeze(1), n * t)
    hidden = layout.pack(states[:, -(t + 1) : -1].reshape(n * t, -1))
    logp, ent = head_log_probs(model.get_output_embeddings(), hidden, layout.pack(response_ids.reshape(-1)),
                               temperature=temperature, with_entropy=with_entropy, chunk=chunk)
    return layout.unpack(logp).view(n, t), (layout.unpack(ent).view(n, t) if ent is not None else None)


def shared_prompt_supported(model: torch.nn.Module) -> bool:
    """True when :func:`shared_prompt_log_probs` reproduces ``model``'s forward: the native Llama /
    Qwen2 blocks support it, and gradient checkpointing (a memory setting the blocks do not
    implement) is off."""
    if not NativeLlama.supports(model):
        return False
    checkpointing = getattr(model, "is_activation_checkpointing", None)  # transformers >= 5.x's name
    if checkpointing is None:
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
    return not checkpointing


def distinct_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The distinct prompts of ``N`` rows: ids [P, S'], mask [P, S'] (left-padded, the columns no
    prompt needs dropped) and ``prompt_of_row`` [N] (row ``i`` has prompt ``prompt_of_row[i]``).

    Two rows share a prompt iff their real (unmasked) tokens are equal: padding ids are replaced by
    -1 (never a token id) before comparing, so whatever fills the padding does not matter."""
    key = prompt_ids.masked_fill(~prompt_mask.bool(), -1)
    unique, prompt_of_row = torch.unique(key, dim=0, return_inverse=True)
    mask = unique >= 0
    first = int((~mask).all(0).long().cumprod(0).sum())  # leading columns that are padding in every prompt
    return unique[:, first:].clamp(min=0), mask[:, first:], prompt_of_row


def response_attention(prompt_mask: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions [N, R] and the key mask [N, R, S + R] of ``R`` response inputs after their rows' prompts.

    ``prompt_mask`` [N, S] (left-padded) and ``response_mask`` [N, R] of each row. The plain forward's
    position ids are ``cumsum(mask) - 1`` over ``[prompt ; response]``, i.e. ``len(prompt) - 1 +
    cumsum(response_mask)`` on the response; its mask lets query ``r`` see every real prompt key and
    the real response keys ``<= r`` (a padding query sees the real keys before it, not itself)."""
    r = response_mask.shape[1]
    response_mask = response_mask.bool()
    positions = prompt_mask.long().sum(-1, keepdim=True) - 1 + response_mask.long().cumsum(-1)
    causal = torch.ones(r, r, dtype=torch.bool, device=response_mask.device).tril()
    attend = torch.cat([prompt_mask.bool()[:, None, :].expand(-1, r, -1), causal & response_mask[:, None, :]], dim=-1)
    return positions, attend


def shared_prompt_log_probs(
    model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
    response_mask: torch.Tensor, *, temperature: float, with_entropy: bool, chunk: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`plain_log_probs` with each distinct prompt computed once (see the module doc).

    Stage 1, the ``P`` distinct prompts [P, S']: every layer under the causal, left-padding-aware
    mask; each layer's keys/values are kept, and the final hidden state at the last prompt column
    (always a real token: prompts are left-padded) gives the logits of response token 0.
    Stage 2, the ``N`` rows' response inputs (response tokens ``0 .. T-2``), packed to the ``M``
    needed ones [M, H]: each layer projects them in token layout, scatters the projection to
    [N, T-1] (zeros where an input is not fed: masked from every real query), applies RoPE so each
    query attends to ``[its prompt's keys ; its own response keys]`` under the additive bias
    ``[prompt mask | causal & response mask]``, and gathers the M outputs back; their final hidden
    states give the logits of response tokens ``1 .. T-1``. lm_head runs on ``N + M`` hidden states
    (:func:`head_log_probs`: ``chunk`` rows at a time when ``chunk`` > 0). Returns [N, T] log-probs (and entropies), 0 where a position was not computed.
    """
    net = NativeLlama(model)
    p_ids, p_mask, of_row = distinct_prompts(prompt_ids, prompt_mask)
    t = response_ids.shape[1]

    # stage 1: distinct prompts, causal attention over their real tokens
    cos, sin = net.rope((p_mask.long().cumsum(-1) - 1).clamp(min=0))
    bias = net.causal_bias(p_mask)
    x = net.embed(p_ids)
    prompt_kv: list[tuple[torch.Tensor, torch.Tensor]] = []
    for layer in net.layers:
        q, k, v = net.qkv(layer, x, cos, sin)
        prompt_kv.append((k, v))
        x = net.finish(layer, x, net.attend(q, k, v, bias))
    last = net.rms_norm(net.norm, x[:, -1:]).index_select(0, of_row)  # [N, 1, H]: predicts response token 0

    # stage 2: every row's response inputs against its prompt's keys/values, packed: the token-wise
    # work (projections, norms, MLP, lm_head) runs on the M needed inputs only; RoPE and attention on [N, T-1]
    if t > 1:
        r_mask = response_mask[:, :-1]
        positions, attend = response_attention(p_mask.index_select(0, of_row), r_mask)
        n, width = r_mask.shape
        flat = needed_inputs(response_mask).reshape(-1).nonzero().squeeze(1)  # [M] into N * (T-1)
        layout = Packing(flat, n * width)
        cos, sin = net.rope(positions)
        bias = torch.zeros(attend.shape, dtype=net.dtype, device=r_mask.device).masked_fill_(~attend, float("-inf"))
        bias = bias.unsqueeze(1)  # [N, 1, T-1, S'+T-1]
        x = net.embed(layout.pack(response_ids[:, :-1].reshape(-1)))  # [M, H]
        for layer, (pk, pv) in zip(net.layers, prompt_kv):
            y = layout.unpack(net.project_qkv(layer, x))  # [N * (T-1), ...]: inputs not fed are 0, seen by no real query
            q, k, v = net.split_heads(y.view(n, width, -1), cos, sin)
            keys = torch.cat([pk.index_select(0, of_row), k], dim=2)
            values = torch.cat([pv.index_select(0, of_row), v], dim=2)
            att = net.attend(q, keys, values, bias).transpose(1, 2).reshape(n * width, net.heads * net.head_dim)
            x = net.finish_tokens(layer, x, layout.pack(att))
        hidden = torch.cat([last[:, 0], net.rms_norm(net.norm, x)])  # [N + M, H]
        targets = torch.cat([response_ids[:, 0], layout.pack(response_ids[:, 1:].reshape(-1))])
        logp, ent = head_log_probs(net.lm_head, hidden, targets, temperature=temperature, with_entropy=with_entropy, chunk=chunk)
        return rows_of(logp, layout), (rows_of(ent, layout) if ent is not None else None)
    logp, ent = head_log_probs(net.lm_head, last[:, 0], response_ids[:, 0], temperature=temperature, with_entropy=with_entropy, chunk=chunk)
    return logp[:, None], (ent[:, None] if ent is not None else None)


def needed_inputs(response_mask: torch.Tensor) -> torch.Tensor:
    """Which response inputs ``0 .. T-2`` [N, T-1] the shared forward computes: input ``t`` is needed
    when its logits predict a real token (``response_mask[t + 1]``) or when it is real and a later
    real query reads its keys/values. For right-padded rows that is ``response_mask[:, 1:]``: a
    row's padding and its last real token are never fed."""
    mask = response_mask.bool()
    later = mask[:, 1:].flip(1).cumsum(1).flip(1) > 0  # a real token after input t
    return mask[:, 1:] | (mask[:, :-1] & later)


class Packing:
    """The ``M`` needed positions ``flat`` (indices into ``total`` padded positions, ascending) of a
    packed batch: :meth:`pack` gathers them from a padded tensor [total, ...], :meth:`unpack` scatters
    packed values back (0 elsewhere). Both are differentiable, and the identity when nothing is padded."""

    def __init__(self, flat: torch.Tensor, total: int) -> None:
        self.flat, self.total = flat, total
        self.full = flat.numel() == total

    def pack(self, padded: torch.Tensor) -> torch.Tensor:
        return padded if self.full else padded.index_select(0, self.flat)

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        if self.full:
            return packed
        return packed.new_zeros(self.total, *packed.shape[1:]).index_copy(0, self.flat, packed)


def rows_of(values: torch.Tensor, layout: Packing) -> torch.Tensor:
    """[N, T] from ``values`` [N + M]: response token 0 of every row (from its prompt's last position),
    then the M packed positions of tokens 1 .. T-1; the positions not computed are 0."""
    n = values.shape[0] - layout.flat.numel()
    rest = layout.unpack(values[n:]).view(n, -1)
    return torch.cat([values[:n, None], rest], dim=1)


class PolicyLogProbs(torch.nn.Module):
    """``policy``'s per-token log-probs and entropies as one module forward (DDP wraps this module).

    ``shared_prompt``: use :func:`shared_prompt_log_probs` where :func:`shared_prompt_supported`
    holds (checked at every call: gradient checkpointing or the train/eval mode may change),
    else :func:`plain_log_probs`. ``autocast``: "bfloat16" runs the forward under
    ``torch.autocast`` (matmuls in bfloat16, the residual stream, norms, softmax and the
    log-softmax of the logits in float32; the backward follows), "none" in the parameters' dtype. ``chunk``:
    the output head's rows per chunk (:func:`head_log_probs`; 0: the full logits at once)."""

    def __init__(self, policy: torch.nn.Module, *, shared_prompt: bool, chunk: int, autocast: str = "none") -> None:
        super().__init__()
        if autocast not in AUTOCAST_DTYPES:
            raise ValueError(f"autocast must be one of {', '.join(AUTOCAST_DTYPES)}, got {autocast!r}")
        self.policy = policy
        self.shared_prompt = shared_prompt
        self.chunk = chunk
        self.autocast_dtype = AUTOCAST_DTYPES[autocast]

    def uses_shared_prompt(self) -> bool:
        return self.shared_prompt and shared_prompt_supported(self.policy)

    def forward(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor, response_mask: torch.Tensor,
        *, temperature: float, with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        fn = shared_prompt_log_probs if self.uses_shared_prompt() else plain_log_probs
        mixed = contextlib.nullcontext()
        if self.autocast_dtype is not None:
            mixed = torch.autocast(device_type=prompt_ids.device.type, dtype=self.autocast_dtype)
        with mixed:
            return fn(
                self.policy, prompt_ids, prompt_mask, response_ids, response_mask, temperature=temperature,
                with_entropy=with_entropy, chunk=self.chunk,
            )
