"""Bounds of ``dapo eval``'s memory: how many sequences one generate call holds, and a refusal,
before anything loads, of settings whose samples cannot fit (``--avg 2000000`` once tried ~10 GB)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dapo_cli.errors import UserError

AUTO_SEQUENCES_PER_CALL = 64
"""``--batch-size 0`` (auto): whole problems per generate call up to this many sequences (``64 // K``
problems; one problem when K is more). Measured with the fast engine on SmolLM2-135M (1 thread of a
shared 2-core AVX2 machine, <= 48 new tokens, 182-token prompts, two runs): 8 tokens/s at 4 rows, 14-18
at 16, 18-19 at 32, 17-22 at 64, 18.5 at 128: per-step overhead is spent by 32-64 rows, and more rows
only add key/value cache (and coarser progress and resume batches)."""

MAX_SEQUENCES_PER_CALL = 256
"""Most sequences one generate call holds when ``--batch-size`` is 0 (K samples beyond it come in chunks)."""

# Rough bytes per token of what an evaluation holds (see check_memory).
TOKEN_ID_BYTES = 9  #: an int64 token id and its bool mask, per prompt and response position of a call
RESPONSE_TOKEN_BYTES = 8  #: float32 log-prob and ~4 characters of decoded text per response token of a call
TEXT_BYTES_PER_TOKEN = 4  #: decoded text per token (English and LaTeX average 3-4 characters)
RECORD_COPIES = 2  #: every record's text is held twice at the end: the records and the generations table
RECORD_OVERHEAD_BYTES = 400  #: one SampleRecord with its short strings (ids, pred, ground truth)
FALLBACK_MEMORY_BYTES = 16 << 30  #: memory assumed when the machine's cannot be read


def sequences_per_call(k: int, batch_size: int) -> int:
    """Most sequences in one generate call: ``--batch-size``, or when it is 0 (auto)
    :data:`AUTO_SEQUENCES_PER_CALL`, one problem's K when that is more, at most
    :data:`MAX_SEQUENCES_PER_CALL`.

    One problem's K samples beyond it are drawn in chunks of this many.
    """
    return batch_size if batch_size > 0 else max(AUTO_SEQUENCES_PER_CALL, min(k, MAX_SEQUENCES_PER_CALL))


def problems_per_call(k: int, batch_size: int) -> int:
    """Whole problems per generate call (and per resume batch): :func:`sequences_per_call` // K, at least 1."""
    return max(1, sequences_per_call(k, batch_size) // k)


def memory_limit() -> int:
    """This machine's memory in bytes: physical memory, or the cgroup limit when lower."""
    try:
        limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        limit = FALLBACK_MEMORY_BYTES
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            limit = min(limit, int(text))
    return limit


def _gib(n: float) -> str:
    return f"{n / (1 << 30):,.1f} GiB"


def memory_needed(k: int, num_problems: int, max_tokens: int, prompt_tokens: int, batch_size: int) -> tuple[int, int]:
    """(bytes the records of the whole run hold, bytes one generate call holds), both upper bounds.

    Records: every sample at ``max_tokens`` tokens of text, :data:`RECORD_COPIES` times, plus
    :data:`RECORD_OVERHEAD_BYTES`. One call: :func:`sequences_per_call` sequences (auto: up
    to 64, or one problem's K; never more than the run's samples) of ``prompt_tokens + max_tokens`` token ids and masks, and per response
    token a log-prob and its text. Rough on purpose: it catches settings that cannot fit
    (``--avg 2000000``), not a run that is merely large.
    """
    held = num_problems * k * (RECORD_COPIES * TEXT_BYTES_PER_TOKEN * max_tokens + RECORD_OVERHEAD_BYTES)
    sequences = min(sequences_per_call(k, batch_size), num_problems * k)
    per_call = sequences * ((prompt_tokens + max_tokens) * TOKEN_ID_BYTES + max_tokens * RESPONSE_TOKEN_BYTES)
    return held, per_call


def check_memory(opts: Any, num_problems: int, prompt_tokens: int = 0) -> None:
    """UserError (one line, naming the setting to lower) when :func:`memory_needed` exceeds the limit.

    ``prompt_tokens``: the longest prompt (its UTF-8 bytes bound its tokens); 0 before the
    dataset is read. Pure arithmetic: nothing is allocated, so it runs before the model loads.
    """
    if opts.max_tokens < 1:
        raise UserError(f"--max-tokens must be at least 1 (got {opts.max_tokens})")
    if opts.batch_size < 0:
        raise UserError(f"--batch-size must be 0 (auto) or more (got {opts.batch_size})")
    limit = opts.memory_limit_bytes if opts.memory_limit_bytes is not None else memory_limit()
    held, per_call = memory_needed(opts.k, num_problems, opts.max_tokens, prompt_tokens, opts.batch_size)
    if held + per_call <= limit:
        return
    if held >= per_call:
        problems = f"{num_problems} problem{'s' if num_problems != 1 else ''}"
        raise UserError(
            f"--avg {opts.k} samples × {problems} × up to --max-tokens {opts.max_tokens} tokens would hold about "
            f"{_gib(held + per_call)} of responses, more than the {_gib(limit)} of memory here; "
            "lower --avg, --max-tokens or --limit"
        )
    sequences = min(sequences_per_call(opts.k, opts.batch_size), num_problems * opts.k)
    raise UserError(
        f"one generate call of {sequences} sequences × ({prompt_tokens} prompt + {opts.max_tokens} new tokens) would "
        f"hold about {_gib(held + per_call)}, more than the {_gib(limit)} of memory here; lower --batch-size or --max-tokens"
    )
