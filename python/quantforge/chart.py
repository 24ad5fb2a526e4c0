"""Perplexity- and KL-versus-size chart of several quantized outputs of one model.

Inputs, any mix of:
  - quantize output folders: their quantization_report.json, with the
    evaluation that `quantize --eval` (or quantize(eval_text=...)) recorded;
  - eval JSON files (`quantforge eval --baseline ... --json F`, or
    evaluate()'s dict saved as JSON), e.g. of GGUF files: the size is that of
    the evaluated model's files.
Each needs a baseline comparison (perplexity and KL against the same
reference); the reference itself is drawn as one more point.

Writes OUT/chart.png (matplotlib, Debian's python3-matplotlib, Agg backend: no
display needed) and OUT/index.html (the chart and a table of the numbers), and
returns the rows. Run as `python3 -m quantforge.chart PATH... -o OUT` (the
CLI's `quantforge report` does that).
"""

import html
import json
import os
import sys


class ReportError(Exception):
    pass


def _model_bytes(path):
    """Bytes of a model: a file's size, or a folder's weight files."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    if not os.path.isdir(path):
        raise ReportError(f"{path}: no such model file or folder (needed for its size)")
    total = 0
    for name in os.listdir(path):
        if name.endswith((".safetensors", ".gguf", ".bin")):
            total += os.path.getsize(os.path.join(path, name))
    if total == 0:
        raise ReportError(f"{path}: no weight files (.safetensors, .gguf) to size")
    return total


def _row_from_eval(name, ev, size_path):
    if not ev.get("valid", False):
        raise ReportError(f"{name}: the evaluation is not valid ({'; '.join(ev.get('problems', []))})")
    if "baseline" not in ev or "kld" not in ev:
        raise ReportError(f"{name}: the evaluation has no baseline comparison (evaluate with a baseline)")
    return {"name": name, "bytes": _model_bytes(size_path), "ppl": ev["ppl"], "kld": ev["kld"]["mean"],
            "top1": ev.get("top1_agreement"), "baseline_model": ev["baseline"]["model"],
            "baseline_ppl": ev["baseline"]["ppl"], "text": ev.get("text"), "tokens": ev.get("tokens_scored")}


def load(path):
    """One row: name, bytes, ppl, kld, top1, baseline_model, baseline_ppl, text, tokens."""
    if os.path.isdir(path):
        rp = os.path.join(path, "quantization_report.json")
        if not os.path.exists(rp):
            raise ReportError(f"{path}: no quantization_report.json (not a quantize output?)")
        rep = json.load(open(rp, encoding="utf-8"))
        if not rep.get("evaluation"):
            raise ReportError(f"{path}: the report has no evaluation (quantize with --eval TEXT)")
        row = _row_from_eval(os.path.basename(os.path.normpath(path)), rep["evaluation"], path)
        row["label"] = f"{rep['method']} {rep['linears'][0]['weights'] if rep['linears'] else ''}".strip()
        return row
    if os.path.isfile(path) and path.endswith(".json"):
        ev = json.load(open(path, encoding="utf-8"))
        if "ppl" not in ev or "model" not in ev:
            raise ReportError(f"{path}: not an eval JSON (no 'ppl' and 'model')")
        row = _row_from_eval(os.path.basename(ev["model"].rstrip("/")), ev, ev["model"])
        row["label"] = os.path.basename(ev["model"].rstrip("/"))
        return row
    raise ReportError(f"{path}: expected a quantize output folder or an eval .json file")


def render(paths, out):
    """Loads every path, checks they share one baseline and one text, draws the chart."""
    if not paths:
        raise ReportError("no inputs")
    rows = [load(p) for p in paths]
    bases = {(r["baseline_model"], r["text"]) for r in rows}
    if len(bases) != 1:
        raise ReportError("the inputs were evaluated against different baselines or texts: " +
                          ", ".join(f"{b} on {t}" for b, t in sorted(bases)))
    base_model, text = bases.pop()
    base = {"name": os.path.basename(base_model.rstrip("/")) + " (reference)", "label": "reference",
            "bytes": _model_bytes(base_model), "ppl": rows[0]["baseline_ppl"], "kld": 0.0, "top1": 1.0}
    rows.sort(key=lambda r: r["bytes"])
    os.makedirs(out, exist_ok=True)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    mib = [r["bytes"] / 2**20 for r in rows]
    a1.plot(mib, [r["ppl"] for r in rows], "o-", color="tab:blue")
    a1.axhline(base["ppl"], color="gray", linestyle="--", label=f"reference {base['ppl']:.3f}")
    a1.plot([base["bytes"] / 2**20], [base["ppl"]], "s", color="gray")
    a2.plot(mib, [r["kld"] for r in rows], "o-", color="tab:red")
    for r, x in zip(rows, mib):
        a1.annotate(r["name"], (x, r["ppl"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
        a2.annotate(r["name"], (x, r["kld"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    a1.set(xlabel="size (MiB)", ylabel="perplexity", title="perplexity vs size")
    a2.set(xlabel="size (MiB)", ylabel="mean KL divergence vs reference", title="KL divergence vs size")
    a2.set_yscale("log")
    a1.legend(fontsize=8)
    for a in (a1, a2):
        a.grid(alpha=0.3)
    fig.suptitle(f"{os.path.basename(base_model.rstrip('/'))} on {os.path.basename(text or '')}", fontsize=10)
    fig.tight_layout()
    png = os.path.join(out, "chart.png")
    fig.savefig(png, dpi=110)
    plt.close(fig)

    def top1(r):
        return "" if r.get("top1") is None else f"{100 * r['top1']:.2f}%"

    cells = "".join(
        f"<tr><td>{html.escape(r['name'])}</td><td>{html.escape(r.get('label', ''))}</td>"
        f"<td>{r['bytes'] / 2**20:.2f}</td><td>{r['ppl']:.4f}</td><td>{r['kld']:.6f}</td><td>{top1(r)}</td></tr>"
        for r in [base] + rows)
    page = f"""<!doctype html>
<meta charset="utf-8"><title>quantforge report</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:.2em .8em;text-align:right}}td:first-child,th:first-child{{text-align:left}}</style>
<h1>{html.escape(os.path.basename(base_model.rstrip('/')))}: quality versus size</h1>
<p>Text: {html.escape(text or '')}; reference: {html.escape(base_model)}</p>
<img src="chart.png" alt="perplexity and KL divergence versus size">
<table><tr><th>output</th><th>method</th><th>MiB</th><th>perplexity</th><th>mean KLD</th><th>top-1</th></tr>{cells}</table>
"""
    with open(os.path.join(out, "index.html"), "w", encoding="utf-8") as f:
        f.write(page)
    with open(os.path.join(out, "report.json"), "w", encoding="utf-8") as f:
        json.dump({"reference": base, "outputs": rows}, f, indent=1)
    return [base] + rows


def main(argv=None):
    import argparse

    p = argparse.ArgumentParser(prog="quantforge report", description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+", help="quantize output folders and eval .json files")
    p.add_argument("-o", "--output", required=True, help="folder for chart.png, index.html and report.json")
    a = p.parse_args(argv)
    try:
        rows = render(a.paths, a.output)
    except ReportError as e:
        print(f"quantforge: invalid input: {e}", file=sys.stderr)
        return 3
    except OSError as e:
        print(f"quantforge: i/o error: {e}", file=sys.stderr)
        return 5
    for r in rows:
        print(f"{r['name']:<32} {r['bytes'] / 2**20:9.2f} MiB  ppl {r['ppl']:.4f}  kld {r['kld']:.6f}")
    print(f"wrote {os.path.join(a.output, 'chart.png')} and index.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
