"""Dynamic sampling (DAPO §3.2): keep only groups whose responses disagree.

DAPO (Yu et al. 2025, arXiv:2503.14476) Eq. 11 constrains every prompt ``q`` in the
batch to

.. math::
    0 < \\big|\\{o_i \\mid \\text{is\\_equivalent}(a, o_i)\\}\\big| < G,

i.e. its ``G`` responses are neither all correct nor all wrong: such groups have
zero GRPO advantage and so no gradient. Generation is repeated until the batch
holds ``target_groups`` informative groups (Algorithm 1, lines 6-8).

The caller passes the metric that decides "constant": the raw accuracy (0/1)
of each response, **before** any length shaping; a shaped reward (accuracy plus
overlong punishment) would make almost every group look informative.
"""

from __future__ import annotations

import torch

from dapo_cli.algo.advantages import GroupIds, constant_groups, group_index


def informative_groups(metric: torch.Tensor, group_ids: GroupIds) -> torch.Tensor:
    """BoolTensor ``[N]``: True for responses whose group's ``metric`` is not constant (Eq. 11).

    metric:    ``[N]`` per-response accuracy (bool or float), before length shaping.
    group_ids: ``N`` hashables or an integer tensor ``[N]``; equal id = same prompt.
    A group of size 1 is constant, hence never informative.
    """
    if metric.dim() != 1:
        raise ValueError(f"metric must be 1-D [N], got shape {list(metric.shape)}")
    index, num_groups = group_index(group_ids, metric.numel())
    flat = constant_groups(metric.detach().cpu(), index, num_groups)
    return (~flat)[index].to(metric.device)


class GroupBatchAssembler:
    """Accumulates informative groups over generation rounds until ``target_groups`` are kept.

    Usage (the trainer skips the assembler entirely when dynamic sampling is off)::

        asm = GroupBatchAssembler(target_groups=16, max_num_gen_batches=10)
        while not asm.done:
            if asm.exhausted:
                ...  # the trainer's policy: raise, or train on what it has
            rollouts = generate(...)
            keep = asm.add(accuracy, group_ids)  # LongTensor [M] into this round

    ``max_num_gen_batches <= 0`` means unlimited rounds (never exhausted). Group ids
    are compared only within one ``add`` call: rounds never share groups.
    """

    def __init__(self, target_groups: int, max_num_gen_batches: int) -> None:
        if target_groups <= 0:
            raise ValueError(f"target_groups must be > 0, got {target_groups}")
        self.target_groups = target_groups
        self.max_num_gen_batches = max_num_gen_batches
        self._num_gen_batches = 0
        self._num_kept_groups = 0
        self._groups_generated = 0
        self._samples_generated = 0

    @property
    def num_gen_batches(self) -> int:
        """Generation rounds seen so far (calls to :meth:`add`)."""
        return self._num_gen_batches

    @property
    def num_kept_groups(self) -> int:
        """Groups kept so far (never more than ``target_groups``)."""
        return self._num_kept_groups

    @property
    def samples_generated(self) -> int:
        """Responses seen so far over all rounds."""
        return self._samples_generated

    @property
    def done(self) -> bool:
        """True once exactly ``target_groups`` groups are kept."""
        return self._num_kept_groups == self.target_groups

    @property
    def exhausted(self) -> bool:
        """Not done, and the round budget is spent (never when ``max_num_gen_batches <= 0``)."""
        limited = self.max_num_gen_batches > 0
        return not self.done and limited and self._num_gen_batches >= self.max_num_gen_batches

    def add(self, metric: torch.Tensor, group_ids: GroupIds) -> torch.Tensor:
        """Record one generation round and return the indices ``[M]`` of responses to keep.

        metric:    ``[N]`` raw accuracy per response (see the module docstring).
        group_ids: ``N`` hashables or an integer tensor ``[N]`` for this round.
        Returns a CPU LongTensor ``[M]`` of indices into this round: whole informative groups in
        order of first appearance (each group's members in ascending position),
        stopping once ``target_groups`` groups are kept in total (later groups are trimmed).
        Raises RuntimeError when called after :attr:`done`.
        """
        if self.done:
            raise RuntimeError("GroupBatchAssembler.add called after the batch is already full")
        n = metric.numel()
        index, num_groups = group_index(group_ids, n)
        informative = ~constant_groups(metric.detach().cpu(), index, num_groups)  # [K], first-appearance order
        room = self.target_groups - self._num_kept_groups
        kept_groups = informative & (torch.cumsum(informative.long(), 0) <= room)  # [K]

        self._num_gen_batches += 1
        self._samples_generated += n
        self._groups_generated += num_groups
        self._num_kept_groups += int(kept_groups.sum().item())

        positions = torch.nonzero(kept_groups[index]).squeeze(-1)  # ascending positions
        order = torch.sort(index[positions], stable=True).indices
        return positions[order]

    def metrics(self) -> dict[str, float]:
        """``train/num_gen_batches``, ``train/kept_group_frac`` (kept / generated groups),
        ``train/samples_generated``, ``train/samples_per_kept_group`` (0.0 until a group is kept)."""
        kept = self._num_kept_groups
        return {
            "train/num_gen_batches": float(self._num_gen_batches),
            "train/kept_group_frac": kept / self._groups_generated if self._groups_generated else 0.0,
            "train/samples_generated": float(self._samples_generated),
            "train/samples_per_kept_group": self._samples_generated / kept if kept else 0.0,
        }
