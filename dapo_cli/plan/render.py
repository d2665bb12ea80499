"""The plan as readable text (rich) and as JSON."""

from __future__ import annotations

import json

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dapo_cli.plan import Plan
from dapo_cli.plan.batch import KEPT_FRACTIONS
from dapo_cli.plan.memory import DTYPE_BYTES, GIB, activation_bytes_per_token_layer
from dapo_cli.plan.shape import embedding_parameters, layer_parameters

WIDTH = 140


def gib(value: float) -> str:
    """GiB with a precision that suits the size (0 prints as 0)."""
    x = value / GIB
    if x == 0:
        return "0"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 0.01:
        return f"{x:.2f}"
    return f"{x:.2g}"


def count(n: float) -> str:
    """1,058,432 → '1.06 M'; 32,763,876,352 → '32.76 B'."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:g}"


def to_json(plan: Plan) -> str:
    return json.dumps(plan.to_dict(), indent=2, default=str)


def lines(plan: Plan) -> list[str]:
    """Everything above and below the memory table, as plain lines (the table is built apart)."""
    s, b = plan.shape, plan.batch
    out = [f"dapo train plan{': ' + plan.config if plan.config else ''} — nothing loaded, no GPU needed", ""]
    tied = "tied embeddings" if s.tie_word_embeddings else "separate lm_head"
    out += [
        "Model",
        f"  {plan.model_path} ({s.source}), {plan.dtype}",
        (f"  {s.model_type}, {plan.parameters:,} parameters ({count(plan.parameters)}): hidden {s.hidden_size}, "
        f"{s.num_hidden_layers} layers,"),
        (f"  {s.num_attention_heads} heads / {s.num_key_value_heads} KV heads (head_dim {s.head_width}), "
        f"MLP {s.intermediate_size}, vocab {s.vocab_size:,}, {tied}"),
        (f"  P = V·h{'' if s.tie_word_embeddings else '·2'} + L·layer + h = {embedding_parameters(s):,} + "
        f"{s.num_hidden_layers}·{layer_parameters(s):,} + {s.hidden_size}"),
        "",
        "Batch per RL step",
        f"  prompts trained          {b.prompts} × n={b.responses // b.prompts} = {b.responses:,} responses",
    ]
    if b.dynamic_sampling:
        n = b.responses // b.prompts
        cap = (
            f"at most max_num_gen_batches = {b.max_rounds} rounds = {b.prompts_generated_worst:,} prompts "
            f"({b.prompts_generated_worst * n:,} responses)" if b.max_rounds else "no cap (max_num_gen_batches <= 0)"
        )
        at = ", ".join(f"{frac:.0%} → {b.rounds_at[frac]}" for frac in KEPT_FRACTIONS)
        out += [
            f"  generation rounds        dynamic sampling: depends on the kept fraction f of groups, ⌈{b.prompts} / ({b.gen_batch_size} × f)⌉",
            f"                           {cap}",
            f"                           rounds at f = {at}",
        ]
    else:
        out.append(f"  generation rounds        1 round of {b.gen_batch_size} prompts (dynamic sampling off)")
    out += [
        (f"  optimizer updates        {b.prompts} / {b.mini_batch_size} = {b.mini_batches} mini-batches"
        f" × {b.epochs} epoch{'s' if b.epochs > 1 else ''} = {b.updates}"),
        (f"  micro-batches            per update per rank ⌈{b.mini_rows_per_rank:g} / {b.micro_batch}⌉ = {b.micro_per_update} "
        "(on average; ranks run in lockstep at the busiest rank's count)"),
        f"                           old log-probs: {b.old_logprob_forwards} no-grad forwards per rank",
        (f"  tokens trained           expected {b.trained_tokens_expected:,} (assuming prompts and responses at {b.expected_fill:.0%} "
        f"of {b.max_prompt:,} / {b.max_response:,})"),
        f"                           worst {b.trained_tokens_worst:,} ({b.responses:,} × {b.seq_worst:,})",
    ]
    worst = f"{b.generated_tokens_worst:,}" if b.generated_tokens_worst is not None else "unbounded (no round cap)"
    out += [
        f"  tokens generated         expected {b.generated_tokens_expected:,} per round (responses at {b.expected_fill:.0%})",
        f"                           worst {worst}"
        + (f" ({b.max_rounds} round{'s' if b.max_rounds != 1 else ''} × {b.gen_batch_size} × {b.responses // b.prompts} × {b.max_response:,})" if b.generated_tokens_worst else ""),
    ]
    out += ["", "World"]
    per_node = min(plan.world_size, plan.gpus_per_node)
    node_word = f"{plan.nodes} node{'s' if plan.nodes > 1 else ''} × {per_node} GPU{'s' if per_node > 1 else ''}"
    out.append(f"  world size {plan.world_size} = {node_word} (from {plan.world_source})")
    for c in plan.checks:
        mark = "ok  " if c.ok else ("FAIL" if c.hard else "warn")
        out.append(f"  [{mark}] {c.message}")
    return out


def memory_table(plan: Plan) -> Table:
    mem = plan.memory
    phases = mem.phases + mem.alternatives
    table = Table(title=f"Memory per GPU in GiB ({mem.gpu_bytes / GIB:g} GiB GPU assumed; --gpu-memory-gib)", title_justify="left")
    table.add_column("term", no_wrap=True)
    table.add_column("formula", no_wrap=True)
    for p in phases:
        table.add_column(p.name, justify="right")
    names: list[str] = []
    formulas: dict[str, str] = {}
    for p in phases:
        for t in p.terms:
            if t.name not in formulas:
                names.append(t.name)
                formulas[t.name] = t.formula
    for name in names:
        cells = []
        for p in phases:
            term = next((t for t in p.terms if t.name == name), None)
            cells.append("—" if term is None else gib(term.gpu))
        table.add_row(escape(name), escape(formulas[name]), *cells)
    table.add_row("total", "", *[gib(p.total) for p in phases], end_section=True)
    cpu = [gib(p.cpu) if p.cpu else "0" for p in phases]
    table.add_row("CPU memory per rank", "offloaded terms", *cpu)
    return table


def memory_lines(plan: Plan) -> list[str]:
    mem, b = plan.memory, plan.batch
    out: list[str] = []
    for p in mem.phases:
        out.append(f"  {p.name}: {p.verdict}")
        if p.knob:
            out.append(f"      {p.knob}")
    for p in mem.alternatives:
        out.append(f"  ({p.name}: {p.verdict})")
    if mem.cpu_per_rank:
        out.append(f"  CPU memory: {gib(mem.cpu_per_rank)} GiB per rank, {gib(mem.cpu_per_rank * mem.ranks_per_node)} GiB per node "
                   f"({mem.ranks_per_node} rank{'s' if mem.ranks_per_node > 1 else ''})")
    v = mem.vllm
    if v is not None:
        fit = "fit at once" if v.tokens_fit >= v.tokens_needed else f"do not fit at once: at most {v.concurrent_worst} run concurrently, vLLM queues the rest"
        out += [
            f"  vLLM pool: {gib(v.pool)} GiB = weights {gib(v.weights)} GiB (P·b/TP) + KV cache {gib(v.kv_cache)} GiB",
            f"  vLLM KV cache: {v.kv_bytes_per_token:,} bytes a token per GPU (2·L·kv_heads/TP·head_dim·b), so it holds {v.tokens_fit:,} tokens",
            f"  a round's worst case per vLLM engine: {v.sequences_per_engine:,} sequences × {b.seq_worst:,} = {v.tokens_needed:,} tokens — {fit}",
        ]
    return out


def formula_lines(plan: Plan) -> list[str]:
    s = plan.shape
    b = DTYPE_BYTES[plan.dtype]
    a = activation_bytes_per_token_layer(s, b)
    return [
        (f"  b = {b} bytes ({plan.dtype}); A = b·(2q + 2kv + 4I) + 2·(4+b)·h = {a:,} bytes a token per layer "
        f"(≈ h × {a / s.hidden_size:.0f})"),
        "  S = max_prompt + max_response, R = max_response; m = responses in the largest micro-batch on a rank",
        "  not counted: CUDA context, NCCL buffers, allocator fragmentation, vLLM activations/CUDA graphs (docs/scaling.md)",
    ]


def render(plan: Plan, console: Console | None = None) -> None:
    """Print the plan (text, tables) to ``console`` (stdout)."""
    con = console or Console(width=WIDTH, highlight=False, soft_wrap=False)
    for line in lines(plan):
        con.print(escape(line), soft_wrap=True)
    con.print()
    con.print(memory_table(plan))
    for line in formula_lines(plan) + memory_lines(plan):
        con.print(escape(line), soft_wrap=True)
    for note in plan.notes:
        con.print(escape(f"note: {note}"), soft_wrap=True)
