"""`jsonlbatch run`: one experiment file, every condition and step, one comparison report."""

from __future__ import annotations

import sys

import click

from jsonlbatch.cli.sections import Sectioned
from jsonlbatch.experiment.runner import run_experiment
from jsonlbatch.experiment.spec import load_experiment

#: As `jsonlbatch exec`: the run finished but some requests failed.
EXIT_SOME_FAILED = 3


@click.command(
    "run",
    cls=Sectioned,
    examples=(
        "jsonlbatch run experiment.yaml --check       # the file checked, nothing run",
        "jsonlbatch run experiment.yaml               # again: only what changed runs",
    ),
)
@click.argument("experiment_file", type=click.Path(dir_okay=False))
@click.option(
    "--runs",
    "runs_dir",
    default="runs",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where runs go: RUNS/<experiment id>/<condition>/.",
)
@click.option(
    "--condition",
    "only",
    multiple=True,
    metavar="NAME",
    help="Run only this condition. Repeatable.",
)
@click.option(
    "--check", is_flag=True, help="Check the file (every problem, with its line) and stop."
)
@click.option("-q", "--quiet", is_flag=True, help="No progress bars or step notes; errors only.")
def run(
    experiment_file: str, runs_dir: str, only: tuple[str, ...], check: bool, quiet: bool
) -> None:
    """Run EXPERIMENT_FILE (YAML): gen, exec, judge rounds, post (votes, files, patches) for
    each condition, then one report comparing them; plain files under RUNS/<experiment id>/.

    The file is checked before anything runs. Run it again and unchanged steps are skipped (by
    content hash), an interrupted exec resumes, and a changed setting re-runs only the steps
    that depend on it. See docs/experiments.md. Exit status: 0 done, 1 a bad file, 3 some
    requests failed (their lines say why), 130 interrupted (run it again to resume).
    """
    experiment = load_experiment(experiment_file)
    if check:
        steps = ", ".join(["gen", *(s.kind for s in experiment.steps)])
        names = ", ".join(c.name for c in experiment.conditions)
        click.echo(
            f"{experiment_file}: ok: experiment {experiment.id}; conditions {names}; steps {steps}"
        )
        return
    echo = None if quiet else (lambda message: click.echo(message, err=True))
    result = run_experiment(experiment, runs_dir=runs_dir, only=only, quiet=quiet, echo=echo)
    if not quiet:
        if result.table:
            click.echo(result.table, err=True)
        ran = [o for o in result.outcomes if o.status != "skipped"]
        click.echo(
            f"{len(ran)} steps ran, {len(result.outcomes) - len(ran)} unchanged; "
            f"results in {result.directory}",
            err=True,
        )
    if result.failed:
        counts = ", ".join(f"{name}: {n}" for name, n in result.failed.items())
        click.echo(
            f"some requests failed ({counts}); their lines in responses.jsonl say why", err=True
        )
        sys.exit(EXIT_SOME_FAILED)
