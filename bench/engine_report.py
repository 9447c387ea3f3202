"""Table and chart for the engine benchmark results (see ``bench.engine_bench``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TARGETS = {  # (metric, comparison, value, applies to)
    "c/a throughput @8 clients": (">=", 5.0, "bundled"),
    "prefix TTFT on/off": ("<=", 0.5, "large"),
    "session turn-2 TTFT on/off": ("<=", 0.5, "large"),
    "image TTFT on/off": ("<=", 0.6, "large"),
    "decode efficiency": (">=", 0.8, "both"),
}


def headline(r: dict[str, Any]) -> dict[str, float]:
    def ratio_at8(tp: dict[str, Any]) -> float:
        at8 = {k: next(x for x in v if x["clients"] == 8) for k, v in tp.items()}
        return float(at8["c_engine"]["req_per_s"] / at8["a_naive_generate"]["req_per_s"])

    return {
        "c/a throughput @8 clients": ratio_at8(r["throughput"]["single"]),
        "c/a @8, two-turn conversations": ratio_at8(r["throughput"]["two_turn"]),
        "prefix TTFT on/off": r["prefix_ttft"]["ratio"],
        "session turn-2 TTFT on/off": r["session_turn2"]["ttft_ratio"],
        "session turn-2 latency on/off": r["session_turn2"]["latency_ratio"],
        "image TTFT on/off": r["image_ttft"]["ratio"],
        "decode efficiency": r["efficiency"]["ratio"],
    }


def _verdict(name: str, value: float, model: str) -> str:
    if name not in TARGETS:
        return ""
    op, target, applies = TARGETS[name]
    if applies not in (model, "both"):
        return f"(target {op}{target} on {applies})"
    ok = value >= target if op == ">=" else value <= target
    return f"{'MET' if ok else 'MISSED'} ({op}{target})"


def print_table(results: dict[str, Any]) -> None:
    if results["meta"].get("mode") == "smoke":
        print("\nsmoke run: every code path once; the figures below measure nothing")
    for model, r in results.items():
        if model == "meta":
            continue
        print(f"\n== {model}: {r['params'] / 1e6:.1f}M params ==")
        print(f"{'config':<28}{'clients':>8}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}")
        for name, rows in ((f"{w}:{n}", rows) for w, tp in r["throughput"].items() for n, rows in tp.items()):
            for x in rows:
                ms = f"{x['p50_s'] * 1e3:>9.0f}{x['p99_s'] * 1e3:>9.0f}"
                print(f"{name:<28}{x['clients']:>8}{x['req_per_s']:>9.2f}{ms}")
        for k in ("prefix_ttft", "image_ttft"):
            v = r[k]
            print(f"{k:<20} on {v['on'] * 1e3:7.1f} ms  off {v['off'] * 1e3:7.1f} ms  ratio {v['ratio']:.2f}")
        on, off = r["session_turn2"]["on"], r["session_turn2"]["off"]
        print(
            f"{'session_turn2':<20} TTFT on {on['ttft'] * 1e3:6.1f} off {off['ttft'] * 1e3:6.1f} ms; "
            f"latency on {on['latency'] * 1e3:6.1f} off {off['latency'] * 1e3:6.1f} ms"
        )
        e = r["efficiency"]
        print(f"{'efficiency':<20} engine {e['engine_tok_s']:.0f} tok/s / bare {e['bare_tok_s']:.0f} tok/s")
        print(f"{'quant':<8}{'MB':>8}{'tok/s b8':>10}{'exact':>8}{'agree':>8}")
        for mode, q in r["quantization"].items():
            print(
                f"{mode:<8}{q['bytes'] / 1e6:>8.1f}{q['decode_tok_s_b8']:>10.0f}{q['exact_match']:>8.2f}"
                f"{q['token_agreement']:>8.2f}"
            )
        for name, value in headline(r).items():
            print(f"  {name:<32}{value:8.2f}  {_verdict(name, value, model)}")


def save_chart(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = [m for m in results if m != "meta"]
    fig, axes = plt.subplots(1, len(models) + 1, figsize=(5 * (len(models) + 1), 5))
    for ax, model in zip(axes, models, strict=False):
        for name, rows in results[model]["throughput"]["single"].items():
            ax.plot([x["clients"] for x in rows], [x["req_per_s"] for x in rows], marker="o", label=name)
        ax.set(
            title=f"{model}: throughput (single questions)",
            xlabel="closed-loop clients",
            ylabel="requests/s",
            xscale="log",
        )
        ax.legend(fontsize=8)
    ax = axes[-1]
    width = 0.8 / len(models)
    names = list(headline(results[models[0]]))
    for i, model in enumerate(models):
        vals = list(headline(results[model]).values())
        ax.bar([j + i * width for j in range(len(names))], vals, width, label=model)
    ax.set_xticks([j + width / 2 for j in range(len(names))], names, fontsize=7, rotation=35, ha="right")
    ax.set(title="ratios (see targets)", yscale="log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
