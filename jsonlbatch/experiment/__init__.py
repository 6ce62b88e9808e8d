"""The experiment stage: multi-step, multi-round runs composed from the other stages' APIs.

It sits above gen, exec, serve, post and report and adds no executor of its own:

- `judge`: score answers with a judge prompt, ask again what fails (new seed, the judge's
  feedback), keep the passing or best answer (`run_judge`, `JudgeConfig`);
- `spec`: read and check an experiment file (YAML, every error with its key and line);
- `runner`: run it into `runs/<id>/<condition>/`, skipping steps whose inputs and settings are
  unchanged and resuming an interrupted exec (`run_experiment`);
- `rules`: pass rules such as `score >= 6`, parsed without `eval`.
"""

from __future__ import annotations

from jsonlbatch.experiment.judge import JudgeConfig, JudgeSummary, run_judge
from jsonlbatch.experiment.rules import PassRule
from jsonlbatch.experiment.runner import ExperimentResult, StepOutcome, run_experiment
from jsonlbatch.experiment.spec import Experiment, load_experiment

#: The name `StepOutcome` had before exec's run and endpoint outcomes were told apart; kept so
#: that `from jsonlbatch.experiment import Outcome` goes on working.
Outcome = StepOutcome

__all__ = [
    "Experiment",
    "ExperimentResult",
    "JudgeConfig",
    "JudgeSummary",
    "Outcome",
    "PassRule",
    "StepOutcome",
    "load_experiment",
    "run_experiment",
    "run_judge",
]
