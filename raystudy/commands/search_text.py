"""What ``raystudy search`` prints of its budget and at its end: the best configuration per
condition, tested with fresh seeds, and for a rehearsal how near its known optimum it came."""

from __future__ import annotations

from typing import Any

from raystudy.tracking import views


def budget_line(time_budget: float | None, studies: int, num_samples: int) -> str:
    """What the search may spend: the time budget per study and over all of them."""
    if not time_budget:
        return f"time budget: none; each of the {studies} studies runs its {num_samples} trials to the end"
    total = time_budget * studies
    return (
        f"time budget: {time_budget:g} s per study, at most {total:g} s ({total / 3600:.2g} h) for the "
        f"{studies} studies, then the test re-runs of each best config"
    )


def summarize(job, summary: list[dict[str, Any]], exp_id: str, storage) -> int:
    """The search's end: the best configuration per condition (``print_summary``), where to browse
    its runs and its Optuna studies; the exit status."""
    print_summary(summary)
    optuna_db = storage / "optuna" / "optuna.db"
    browse = [*views.browse_lines(job.uri, exp_id), f"Optuna studies: optuna-dashboard sqlite:///{optuna_db}"]
    print("\n" + "\n".join(browse))
    return 0


def stopped(summary: list[dict[str, Any]]) -> int:
    """A stopped search: its line, then the best configuration of each study done so far (labelled
    partial); exit status 130. The same command resumes it."""
    print("\nsearch stopped; run the same command to resume it", flush=True)
    if summary:
        print_summary(summary, partial=True)
    return 130


def print_summary(summary: list[dict[str, Any]], partial: bool = False) -> None:
    """The best configuration per condition: validation and test accuracy, its knobs, the trial
    counts; ``partial``: of the studies done before the search stopped, and said so."""
    n = len(summary)
    head = f"PARTIAL, the {n} stud{'y' if n == 1 else 'ies'} done so far: " if partial else ""
    print(f"\n{head}best configuration per condition (chosen on validation, tested with fresh seeds):")
    for s in summary:
        if "config" not in s:
            print(f"  {s['condition']:<16} no finished trial ({s['trials']} trials, {s['stopped']} stopped early)")
            continue
        c = s["config"]
        knobs = ", ".join(
            f"{k}={c[k]:.3g}" if isinstance(c[k], float) else f"{k}={c[k]}"
            for k in ("optimizer", "lr", "weight_decay", "warmup_steps", "batch_size")
            if k in c
        )
        tested = tested_line(s["test_acc"], s["test_std"], s["test_runs"])
        print(
            f"  {s['condition']:<16} val {s['val_acc']:.4f}  {tested}"
            f"  [{knobs}]  trials: {s['finished']} finished, "
            f"{s['stopped']} stopped early by ASHA"
        )
        if "found" in s:
            print("    " + found_line(s["found"]))


def tested_line(mean: float, std: float, runs: int) -> str:
    """The test accuracy of a best config over its fresh seeds: a spread only where there are two or more."""
    if runs == 0:
        return "test: no seed finished"
    spread = f" ± {std:.4f}" if runs > 1 else ""
    return f"test {mean:.4f}{spread} ({runs} seed{'s' if runs > 1 else ''})"


def found_line(f: dict[str, Any]) -> str:
    """A rehearsal study against its known optimum: the chosen config's true plateau, the best
    any finished trial had, and how far each is below the optimum (the regret)."""
    return (
        f"rehearsal: known optimum {f['optimum']:.3f}; chosen config {f['chosen']:.3f} "
        f"(regret {f['optimum'] - f['chosen']:.3f}); closest of {f['told']} trials {f['closest']:.3f} "
        f"(regret {f['optimum'] - f['closest']:.3f})"
    )
