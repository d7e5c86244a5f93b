"""Routing quality on recorded outcomes: the learned conductor against every single model, random,
the static rules, a cost-aware cascade and the oracle.

    python -m bench.routing_quality TRAIN.jsonl.gz EVAL.jsonl.gz [--write]

Any files in the replay format work (another split, another benchmark). The learned policy is trained
with GRPO on the first file only and evaluated greedily on the second; every system is scored from
the recorded outcomes of real models. Prints one JSON line per system at the end.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.docs import write_section  # noqa: E402
from training.policy import (  # noqa: E402
    DEFAULT_FEATURES,
    FEATURE_SETS,
    GRPOConfig,
    Outcome,
    Policy,
    Workflow,
    default_actions,
    simulate,
    train,
)


def read(path: Path) -> list:
    import gzip
    from types import SimpleNamespace

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [SimpleNamespace(**json.loads(line)) for line in fh if line.strip()]


def score(name: str, choose, items) -> dict:
    outcomes = [simulate(choose(item), item.outcomes, item.domain) for item in items]
    return summary(name, outcomes)


def summary(name: str, outcomes: list[Outcome]) -> dict:
    n = len(outcomes)
    return {
        "system": name,
        "accuracy": round(sum(o.correct for o in outcomes) / n, 4),
        "usd_per_1000": round(sum(o.cost_usd for o in outcomes) / n * 1000, 4),
    }


STATIC = {"math-l5": Workflow("cascade", ("gpt-4o-mini-2024-07-18", "gemini-1.5-flash", "gpt-4o-2024-08-06"))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("train", type=Path)
    parser.add_argument("eval", type=Path)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--cost-penalty", type=float, default=20.0, help="reward = correct - penalty x USD")
    parser.add_argument("--learning-rate", type=float, default=3.0)
    parser.add_argument(
        "--second-penalty",
        type=float,
        default=5.0,
        help="also train an accuracy-leaning policy with this cost penalty (0: don't)",
    )
    parser.add_argument("--features", default=DEFAULT_FEATURES, choices=sorted(FEATURE_SETS))
    parser.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    parser.add_argument("--chart", type=Path, help="write the accuracy-cost chart to this PNG file")
    args = parser.parse_args()
    train_items, eval_items = read(args.train), read(args.eval)
    models = sorted(eval_items[0].outcomes)
    actions = default_actions(models)

    def trained(penalty: float) -> tuple[Policy, list[float]]:
        policy = Policy.new(actions, args.features)
        config = GRPOConfig(
            epochs=args.epochs, cost_penalty_per_usd=penalty, learning_rate=args.learning_rate
        )
        return policy, train(policy, train_items, config)

    started = time.perf_counter()
    policy, curve = trained(args.cost_penalty)
    train_s = time.perf_counter() - started
    second = trained(args.second_penalty)[0] if args.second_penalty > 0 else None

    rows = [score(m, lambda item, m=m: Workflow("single", (m,)), eval_items) for m in models]
    rng = random.Random(0)
    rows.append(score("random", lambda item: rng.choice(actions), eval_items))
    rows.append(
        score(
            "static rules",
            lambda item: (
                STATIC.get(item.domain)
                or Workflow(
                    "single",
                    ("gpt-4o-2024-08-06" if item.domain == "cruxeval-o" else "gpt-4o-mini-2024-07-18",),
                )
            ),
            eval_items,
        )
    )
    cascade = Workflow("cascade", ("gpt-4o-mini-2024-07-18", "gemini-1.5-flash", "gpt-4o-2024-08-06"))
    rows.append(score("cascade: mini + flash, gpt-4o on disagreement", lambda item: cascade, eval_items))
    rows.append(
        score("learned conductor (GRPO)", lambda item: policy.choose(item.task, item.domain)[0], eval_items)
    )
    if second is not None:
        rows.append(
            score(
                f"learned conductor (GRPO, cost penalty {args.second_penalty:g})",
                lambda item: second.choose(item.task, item.domain)[0],
                eval_items,
            )
        )
    oracle = []
    for item in eval_items:
        right = [o for o in item.outcomes.values() if o["score"] == 1.0]
        best = (
            min(right, key=lambda o: o["cost_usd"])
            if right
            else min(item.outcomes.values(), key=lambda o: o["cost_usd"])
        )
        oracle.append(Outcome(float(best["score"]), float(best["cost_usd"])))
    rows.append(summary("oracle (cheapest correct model)", oracle))

    best_single = max(rows[: len(models)], key=lambda r: r["accuracy"])
    learned = next(r for r in rows if r["system"].startswith("learned"))

    def versus(row: dict) -> dict:
        return {
            "accuracy_gain_points": round((row["accuracy"] - best_single["accuracy"]) * 100, 2),
            "cost_ratio_to_best_single": round(row["usd_per_1000"] / best_single["usd_per_1000"], 3),
        }

    goal = {
        "best_single": best_single["system"],
        **versus(learned),
        "accuracy_leaning": versus(next(r for r in rows if "cost penalty" in r["system"]))
        if second
        else None,
        "train_s": round(train_s, 1),
        "reward_curve": [round(r, 4) for r in curve[:: max(1, len(curve) // 10)]],
    }
    if args.write:
        table = "\n".join(f"| {r['system']} | {r['accuracy']:.3f} | {r['usd_per_1000']:.2f} |" for r in rows)
        write_section(
            "routing:quality",
            f"""## Routing quality on recorded outcomes

Command: `python -m bench.routing_quality <replay>/train.jsonl.gz <replay>/dev.jsonl.gz --write --chart docs/routing-quality.png` ({len(train_items)}
training items, {len(eval_items)} evaluation items; the learned policy is trained on the first file only,
{args.epochs} GRPO epochs, groups of 16, cost penalty {args.cost_penalty:g} per USD, {args.features} features,
{len(actions)} workflows (single models, cascades, votes); {train_s:.0f} s on a CPU). The second learned row is
the same training with cost penalty {args.second_penalty:g}: a more accurate, dearer operating point.

| system | accuracy | USD per 1,000 tasks |
|---|---|---|
{table}

Learned vs the best single model ({best_single["system"]}): {goal["accuracy_gain_points"]:+.2f} points of accuracy
at {goal["cost_ratio_to_best_single"]:.2f}x its cost.

![Accuracy against cost per system](routing-quality.png)""",
        )
    if args.chart:
        chart(rows, len(models), args.chart)
    for row in rows:
        print(json.dumps(row))
    print(json.dumps(goal))


def chart(rows: list[dict], singles: int, path: Path) -> None:
    """Accuracy against USD per 1,000 tasks (log scale), one point per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=120)
    for index, row in enumerate(rows):
        name = row["system"]
        if index < singles:
            style = {"color": "#8a94a6", "marker": "o"}
        elif name.startswith("learned"):
            style = {"color": "#d62728", "marker": "*", "s": 160}
        elif name.startswith("oracle"):
            style = {"color": "#2ca02c", "marker": "D"}
        else:
            style = {"color": "#1f77b4", "marker": "s"}
        ax.scatter(row["usd_per_1000"], row["accuracy"], zorder=3, **{"s": 45, **style})
        ax.annotate(
            name,
            (row["usd_per_1000"], row["accuracy"]),
            fontsize=7,
            xytext=(5, 3),
            textcoords="offset points",
        )
    ax.set_xscale("log")
    ax.set_xlabel("USD per 1,000 tasks (log scale)")
    ax.set_ylabel("accuracy")
    ax.set_title("Routing quality on the evaluation file (trained on the training file only)")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    main()
