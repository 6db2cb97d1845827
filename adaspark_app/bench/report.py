"""Write a bench report: report.json, report.md and two PNG plots, from reply records.

Shared by `adaspark bench` and `benchmarks/speed/run_peers.py`, so every comparison in the
project is computed and shown the same way.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

from . import stats

RATIO_PLOT = "speed_ratio_by_category.png"
WIDTH_PLOT = "width_shares.png"


def _fmt_ratio(c: Mapping[str, Any]) -> str:
    if c.get("geomean_ratio") is None:
        return "n/a"
    lo, hi = c["ci95"]
    return f"{c['geomean_ratio']:.3f}x [{lo:.3f}, {hi:.3f}]"


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "n/a" if x is None else format(x, spec)


def _fmt_shares(shares: Mapping[str, float], top: int = 6) -> str:
    if not shares:
        return "-"
    items = sorted(shares.items(), key=lambda kv: -kv[1])[:top]
    return ", ".join(f"{w}: {s:.0%}" for w, s in items)


def render_markdown(report: Mapping[str, Any]) -> str:
    meta, summ = report["meta"], report["summary"]
    base = summ["base_arm"]
    arms = meta["arms"]
    m = meta.get("machine") or {}
    lines = [f"# Decode speed: {', '.join(arms)}", ""]
    if meta.get("script"):
        lines.append(f"- script: `{meta['script']}` ({meta.get('conversations', '?')} conversations, "
                     f"{meta.get('turns', '?')} turns), repeats {meta.get('repeats', 1)}, "
                     f"max tokens {meta.get('max_tokens', '?')}")
    if meta.get("command"):
        lines.append(f"- command: `{meta['command']}`")
    if meta.get("model") is not None or "model" in meta:
        lines.append(f"- model: `{meta.get('model') or 'bundled SmolLM2-135M-Instruct'}`"
                     + (f", drafter `{meta['drafter']}`" if meta.get("drafter") else ""))
    if m:
        lines.append(f"- machine: {m.get('cpu')} ({m.get('cpu_count')} cores), {m.get('platform')}, "
                     f"Python {m.get('python')}, llama-cpp-python {m.get('llama_cpp_python')} "
                     f"(kernels: {m.get('kernels', 'stock')}; round pricing: {m.get('pricing', 'numpy')}), "
                     f"threads {m.get('n_threads') or 'default'}, load average at start "
                     f"{m.get('loadavg_1_5_15')} / at end {m.get('loadavg_at_end')}")
    if m.get("device"):
        lines.append(f"- device: {m['device']}")
    if meta.get("one_row"):
        lines.append("- one-row steps on: " + "; ".join(f"`{a}` {v}" for a, v in meta["one_row"].items()))
    if meta.get("store"):
        lines.append(f"- stores: {meta['store']}; order: {meta.get('order', '-')}")
    lines.append(f"- generated {report['generated']}, elapsed {meta.get('elapsed_s', '?')} s"
                 + (", **interrupted: partial results**" if meta.get("interrupted") else ""))
    lines += ["", f"## Speed against `{base}`", "",
              "Geometric mean over replies of the per-reply decode-speed ratio (arm / "
              f"`{base}`, same conversation and turn), 95% bootstrap interval over conversations. "
              "Replies that hit the token cap in either arm are left out and counted.", "",
              "| arm | ratio [95% interval] | replies | conversations | left out: looped | "
              "left out: no interval | identical to base |",
              "|---|---|---|---|---|---|---|"]
    for arm, comp in summ["comparisons"].items():
        c = comp["overall"]
        ident = c["identical_share"]
        lines.append(f"| `{arm}` | {_fmt_ratio(c)} | {c['replies']} | {c['conversations']} | "
                     f"{c['excluded_looped']} | {c['excluded_no_speed']} | "
                     f"{'n/a' if ident is None else f'{ident:.0%}'} ({c['identical']}/{c['paired']}) |")
    cats = summ.get("categories") or []
    if cats and summ["comparisons"]:
        lines += ["", "## By category", "",
                  "| category | " + " | ".join(f"`{a}`" for a in summ["comparisons"]) + " |",
                  "|---|" + "---|" * len(summ["comparisons"])]
        for cat in cats:
            cells = []
            for comp in summ["comparisons"].values():
                c = comp["by_category"][cat]
                cells.append(f"{_fmt_ratio(c)} (n={c['replies']})")
            lines.append(f"| {cat} | " + " | ".join(cells) + " |")
    bnds = summ.get("bands") or []
    if bnds and summ["comparisons"]:
        lines += ["", "## By context band", "",
                  "Replies grouped by the context (prompt and history, in tokens) they started at.", "",
                  "| context band | " + " | ".join(f"`{a}`" for a in summ["comparisons"]) + " |",
                  "|---|" + "---|" * len(summ["comparisons"])]
        for band in bnds:
            cells = []
            for comp in summ["comparisons"].values():
                c = (comp.get("by_band") or {}).get(band)
                cells.append("-" if c is None else f"{_fmt_ratio(c)} (n={c['replies']})")
            lines.append(f"| {band} | " + " | ".join(cells) + " |")
    lines += ["", "## Arms", "",
              "tok/s is summed generated tokens over summed decode seconds; tokens per round and "
              "tok/s leave out the arm's own looped replies; width shares count every round.", "",
              "| arm | replies | looped | tok/s | tokens/round | rounds | measure rounds | width shares |",
              "|---|---|---|---|---|---|---|---|"]
    for arm in arms:
        a = summ["arms"][arm]
        lines.append(f"| `{arm}` | {a['replies']} | {a['looped']} | {_fmt(a['tokens_per_s'])} | "
                     f"{_fmt(a['tokens_per_round'], '.2f')} | {a['rounds']} | {a['measure_rounds']} | "
                     f"{_fmt_shares(a['width_shares'])} |")
    priced_arms = [a for a in arms if summ["arms"][a].get("tree_rounds") or summ["arms"][a].get("accepted_by_source")]
    lines += [] if not priced_arms else ["", "## Acceptance and its pricing", "",
              "Accepted draft tokens per round by the source that proposed them (non-looped replies); "
              "calibration is the acceptance model's expected accepted tokens over the tokens the "
              "target accepted, summed over priced rounds of more than one row (cold-start "
              "measurements left out): 1.00 is calibrated, above 1 it over-promises.", "",
              "| arm | accepted/round by source | tree rounds | expected | accepted | calibration |",
              "|---|---|---|---|---|---|"]
    for arm in priced_arms:  # engines that report rounds (not the peers timed on a client clock)
        a = summ["arms"][arm]
        src = ", ".join(f"{k} {v:.3f}" for k, v in (a.get("accepted_per_round_by_source") or {}).items()) or "-"
        lines.append(f"| `{arm}` | {src} | {a.get('tree_rounds', 0)} | {_fmt(a.get('expected_accepted'), '.1f')} | "
                     f"{a.get('accepted', 0)} | {_fmt(a.get('calibration'), '.3f')} |")
    lines += ["", f"Replies that looped in any arm: {summ['looped_any_arm']}.", "",
              f"Plots: `{RATIO_PLOT}`, `{WIDTH_PLOT}`. Raw replies: `replies.jsonl`.", ""]
    return "\n".join(lines)


def plot_ratios(report: Mapping[str, Any], path: Path) -> None:
    """Speed ratio per category (and over all replies) with 95% intervals, one marker per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summ = report["summary"]
    comps = summ["comparisons"]
    rows = ["all"] + list(summ.get("categories") or [])
    n = max(1, len(comps))
    fig, ax = plt.subplots(figsize=(7.5, min(14.0, 0.3 * len(rows) * (1.0 + 0.2 * n) + 1.6)))
    for k, (arm, comp) in enumerate(comps.items()):
        ys, xs, lo, hi = [], [], [], []
        for j, row in enumerate(rows):
            c = comp["overall"] if row == "all" else comp["by_category"][row]
            if c["geomean_ratio"] is None:
                continue
            ys.append(j + (k - (n - 1) / 2) * 0.7 / n)
            xs.append(c["geomean_ratio"])
            lo.append(c["geomean_ratio"] - c["ci95"][0])
            hi.append(c["ci95"][1] - c["geomean_ratio"])
        ax.errorbar(xs, ys, xerr=[lo, hi], fmt="o", capsize=3, label=arm)
    ax.axvline(1.0, color="grey", lw=1, ls="--")
    counts = [max((comp["overall"] if row == "all" else comp["by_category"][row])["replies"]
                  for comp in comps.values()) if comps else 0 for row in rows]
    ax.set_yticks(range(len(rows)), [f"{row} (n={c})" for row, c in zip(rows, counts)])
    ax.invert_yaxis()
    ax.set_xlabel(f"decode speed / {summ['base_arm']} (geometric mean, 95% bootstrap interval)")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small", frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # keeps the outside legend
    plt.close(fig)


def plot_width_shares(report: Mapping[str, Any], path: Path) -> None:
    """Share of rounds at each verified width, one stacked bar per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summ = report["summary"]
    arms = report["meta"]["arms"]
    widths = sorted({int(w) for a in arms for w in summ["arms"][a]["width_shares"]})
    fig, ax = plt.subplots(figsize=(7.5, max(2.4, 0.5 * len(arms) + 1.2)))
    cmap = plt.get_cmap("viridis", max(2, len(widths)))
    left = [0.0] * len(arms)
    for i, w in enumerate(widths):
        vals = [summ["arms"][a]["width_shares"].get(str(w), 0.0) for a in arms]
        ax.barh(range(len(arms)), vals, left=left, color=cmap(i), label=f"{w} row" + ("" if w == 1 else "s"))
        for j, v in enumerate(vals):
            if v >= 0.08:
                ax.text(left[j] + v / 2, j, str(w), ha="center", va="center", fontsize=8,
                        color="white" if i < len(widths) * 0.6 else "black")
        left = [l + v for l, v in zip(left, vals)]
    for j, a in enumerate(arms):
        if not summ["arms"][a]["width_shares"]:
            ax.text(0.02, j, "no rounds reported", va="center", fontsize=8, color="grey")
    ax.set_yticks(range(len(arms)), arms)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of rounds at each verified width")
    if widths:
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), ncol=1 + (len(widths) - 1) // 12,
                  fontsize="small", frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # keeps the outside legend
    plt.close(fig)


def build_report(records: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> dict:
    """The report dict: meta, the statistics of stats.full_comparison, and a short headline."""
    recs = [stats.ReplyRecord.from_json(r) for r in records]
    arms = list(meta.get("arms") or [])
    for r in recs:
        if r.arm not in arms:
            arms.append(r.arm)
    meta = {**meta, "arms": arms}
    summary = stats.full_comparison(recs, arms) if len(arms) >= 1 and recs else {
        "base_arm": arms[0] if arms else None, "arms": {a: stats.summarize_arm([], a).to_json() for a in arms},
        "comparisons": {}, "categories": [], "looped_any_arm": 0}
    headline = {arm: {"geomean_ratio": c["overall"]["geomean_ratio"], "ci95": c["overall"]["ci95"],
                      "replies": c["overall"]["replies"]}
                for arm, c in summary["comparisons"].items()}
    return {
        "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "meta": meta,
        "headline": headline,
        "summary": summary,
    }


def write_report(records: Sequence[Mapping[str, Any]], meta: Mapping[str, Any], out_dir: Path) -> dict:
    """Write report.json, report.md, speed_ratio_by_category.png and width_shares.png."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = build_report(records, meta)
    with open(out_dir / "report.json", "w", encoding="utf-8") as fp:
        json.dump(report, fp, indent=1)
        fp.write("\n")
    # a path or an id from the command line may hold an undecodable byte (a surrogate escape)
    (out_dir / "report.md").write_text(render_markdown(report), encoding="utf-8", errors="backslashreplace")
    plot_ratios(report, out_dir / RATIO_PLOT)
    plot_width_shares(report, out_dir / WIDTH_PLOT)
    return report
