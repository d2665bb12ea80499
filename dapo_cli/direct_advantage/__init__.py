"""Direct Advantage-Based Policy Optimization (Liu et al., NeurIPS 2025, arXiv:2412.18279) as ``dapo train --algo direct-advantage``.

The other "DAPO": offline and step-level. One iteration is five resumable phases, each
writing a parquet table under the run directory (and into MLflow) that the next reads::

    generate    the iteration's reference policy samples solutions; a balanced few are chosen
    mc_values   every prefix (state) of a chosen solution gets M completions from a fixed completer;
                their success rate is the state's soft value target
    critic      a scalar-head transformer learns V(state) with BCE on those targets
    advantages  candidate next steps = distinct first steps of each state's completions;
                q_i = V(s + a_i), A_i = q_i - mean_j q_j; states with max - min A < min_gap dropped
    actor       1/2 (A/beta - log pi(a|s)/pi_ref(a|s))^2, whole-step log-probs, pi_ref frozen

then greedy validation. Modules: :mod:`.steps` (step splitting, solution choice),
:mod:`.store` (run directory, tables, resume record), :mod:`.phases` (generate, MC values,
advantages), :mod:`.critic`, :mod:`.actor`, :mod:`.run` (the stages and what they log),
:mod:`.launch` (open / resume / finish a run, MLflow), :mod:`.plan` (``--dry-run``),
:mod:`.checks` (which settings each phase depends on). Engines come from :mod:`dapo_cli.components`
like ``dapo train``'s; the config rules are in :mod:`dapo_cli.config.validate_direct_advantage`,
``dapo train``'s options in :mod:`dapo_cli.cli.train`. The objective's tensor maths is in :mod:`dapo_cli.algo.direct_advantage`;
the method and its knobs are in ``docs/direct-advantage.md``.
"""

PHASES: tuple[str, ...] = ("generate", "mc_values", "critic", "advantages", "actor")
"""The phases of one iteration, in order (``--from-phase NAME`` restarts at one)."""

STAGES: tuple[str, ...] = (*PHASES, "evaluate")
"""What an iteration records as done: the phases, then its validation."""
