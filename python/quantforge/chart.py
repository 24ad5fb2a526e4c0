"""Perplexity- and KL-versus-size chart of several quantized outputs of one model.

Inputs, any mix of (or one `quantforge kv-sweep --json` file on its own, charted by KV bytes
per token against its f16 cache):
  - quantize output folders: their quantization_report.json, with the
    evaluation that `quantize --eval` (or quantize(eval_text=...)) recorded;
  - eval JSON files (`quantforge eval --baseline ... --json F`, or
    evaluate()'s dict saved as JSON), e.g. of GGUF files: the size is that of
    the evaluated model's files.
Each needs a valid evaluation with a baseline comparison (perplexity and KL
against the same reference, on the same text and the same number of tokens);
the reference itself is drawn as one more point. The inputs are read and
validated by the C++ library (eval/report_input.h), the same parser as the
CLI's, which also checks the output folder: never an input nor inside one, and
existing report files only replaced with force. This module only draws.

Writes OUT/chart.png (matplotlib, Debian's python3-matplotlib, Agg backend: no
display needed), OUT/index.html (the chart and a table of the numbers) and
OUT/report.json (the rows), and returns the rows. Run as
`python3 -m quantforge.chart PATH... -o OUT [--force]` (the CLI's
`quantforge report` does that).
"""

import html
import json
import os
import secrets
import sys


def _rows(paths, out, force):
    """The validated rows, from the C++ parser that `quantforge report` uses; checks `out` too."""
    from ._quantforge import _report_rows

    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]
    # bytes: the file system's own names, whatever their encoding
    got = _report_rows([os.fsencode(p) for p in paths], os.fsencode(out), force)
    return got["reference"], got["outputs"], got.get("unit", "model")


def _write_atomic(out, name, write):
    """write(path) into a temporary file beside out/name, then renamed over it: an interrupted
    run leaves the old file or the new one, never half of one."""
    tmp = os.path.join(out, f".{name}.tmp.{os.getpid()}.{secrets.token_hex(4)}")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # the umask applies, as for open()
    try:
        write(tmp)
        os.replace(tmp, os.path.join(out, name))
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def render(paths, out, force=False):
    """Reads every path (the C++ parser validates each and checks that they share one baseline, one
    text and one token count; `out` must not be or lie in an input, and its files must not exist
    unless `force`), then draws the chart. Returns the reference's row and the outputs' rows."""
    base, rows, unit = _rows(paths, out, force)
    # A kv-sweep JSON charts cache formats by their KV bytes per token; the
    # other inputs are models, charted by their size in MiB.
    kv = unit == "kv_cache"
    scale, size_name = (1, "KV bytes per token") if kv else (2**20, "size (MiB)")
    out = os.fsdecode(out)
    base_model, text = rows[0]["baseline_model"], rows[0]["text"]
    os.makedirs(out, exist_ok=True)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    mib = [r["bytes"] / scale for r in rows]
    # One line per series (size-budget mixes apart from presets and the rest).
    series = sorted({r.get("series", "") for r in rows})
    styles = [("o-", "tab:blue", "tab:red"), ("^--", "tab:green", "tab:purple")]
    for k, name in enumerate(series):
        pick = [i for i, r in enumerate(rows) if r.get("series", "") == name]
        marker, c1, c2 = styles[k % len(styles)]
        label = (name or "other outputs") if len(series) > 1 else None
        a1.plot([mib[i] for i in pick], [rows[i]["ppl"] for i in pick], marker, color=c1, label=label)
        a2.plot([mib[i] for i in pick], [rows[i]["kld"] for i in pick], marker, color=c2, label=label)
    a1.axhline(base["ppl"], color="gray", linestyle="--", label=f"reference {base['ppl']:.3f}")
    a1.plot([base["bytes"] / scale], [base["ppl"]], "s", color="gray")
    if len(series) > 1:
        a2.legend(fontsize=8)
    for r, x in zip(rows, mib):
        a1.annotate(r["name"], (x, r["ppl"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
        a2.annotate(r["name"], (x, r["kld"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    a1.set(xlabel=size_name, ylabel="perplexity", title="perplexity vs size")
    a2.set(xlabel=size_name, ylabel="mean KL divergence vs reference", title="KL divergence vs size")
    if any(r["kld"] > 0 for r in rows):  # a log scale of nothing but zeros (a copy of the reference) warns
        a2.set_yscale("log")
    a1.legend(fontsize=8)
    for a in (a1, a2):
        a.grid(alpha=0.3)
    fig.suptitle(f"{os.path.basename(base_model.rstrip('/'))} on {os.path.basename(text or '')}", fontsize=10)
    fig.tight_layout()
    _write_atomic(out, "chart.png", lambda p: fig.savefig(p, dpi=110, format="png"))
    plt.close(fig)

    def top1(r):
        return "" if r.get("top1") is None else f"{100 * r['top1']:.2f}%"

    cells = "".join(
        f"<tr><td>{html.escape(r['name'])}</td><td>{html.escape(r.get('label', ''))}</td>"
        f"<td>{r['bytes'] / scale:.2f}</td><td>{r['ppl']:.4f}</td><td>{r['kld']:.6f}</td><td>{top1(r)}</td></tr>"
        for r in [base] + rows)
    page = f"""<!doctype html>
<meta charset="utf-8"><title>quantforge report</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:.2em .8em;text-align:right}}td:first-child,th:first-child{{text-align:left}}</style>
<h1>{html.escape(os.path.basename(base_model.rstrip('/')))}: quality versus size</h1>
<p>Text: {html.escape(text or '')}; reference: {html.escape(base_model)}</p>
<img src="chart.png" alt="perplexity and KL divergence versus size">
<table><tr><th>output</th><th>method</th><th>{"B/token" if kv else "MiB"}</th><th>perplexity</th><th>mean KLD</th><th>top-1</th></tr>{cells}</table>
"""

    def write_text(contents):
        def write(path):
            with open(path, "w", encoding="utf-8") as f:
                f.write(contents)
        return write

    _write_atomic(out, "index.html", write_text(page))
    # allow_nan=False: JSON has no NaN or infinity (the parser let none through)
    _write_atomic(out, "report.json", write_text(json.dumps({"unit": unit, "reference": base, "outputs": rows},
                                                            indent=1, allow_nan=False)))
    for r in [base] + rows:
        r["unit"] = unit
    return [base] + rows


# quantforge.Error subclasses: the kind the CLI prints and its exit code (README.md).
_KINDS = {"UsageError": ("usage error", 2), "InvalidInput": ("invalid input", 3), "Unsupported": ("unsupported", 4),
          "IoError": ("i/o error", 5), "NotFound": ("not found", 6)}


def main(argv=None):
    import argparse

    from . import Error

    p = argparse.ArgumentParser(prog="quantforge report", description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+", help="quantize output folders and eval .json files")
    p.add_argument("-o", "--output", required=True, help="folder for chart.png, index.html and report.json")
    p.add_argument("--force", action="store_true", help="replace the report files of an existing output folder")
    a = p.parse_args(argv)
    try:
        rows = render(a.paths, a.output, force=a.force)
    except Error as e:
        kind, code = _KINDS.get(type(e).__name__, ("internal error", 1))
        print(f"quantforge: {kind}: {e}", file=sys.stderr)
        return code
    except OSError as e:
        print(f"quantforge: i/o error: {e}", file=sys.stderr)
        return 5
    for r in rows:
        size = f"{r['bytes']:9d} B/token" if r.get("unit") == "kv_cache" else f"{r['bytes'] / 2**20:9.2f} MiB"
        print(f"{r['name']:<32} {size}  ppl {r['ppl']:.4f}  kld {r['kld']:.6f}")
    print(f"wrote {os.path.join(a.output, 'chart.png')} and index.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
