#!/usr/bin/env bash
# GGUF mixed precision to a size budget against llama.cpp's presets, on both
# fixtures, with the same imatrix (64 chunks of calibration.txt):
#   - the search's cost (imatrix, errors, probes) from one measured plan;
#   - at each k-quant preset's tensor bytes, the searched mix (reusing the
#     plan's measurements with --sensitivity) against the preset: file
#     sizes and mean KL divergence on evaluation.txt (100 chunks of 512) and,
#     for Q3_K_M, Q4_K_M and Q5_K_M, on WikiText-2 (40 chunks of 512) when
#     ../shared is present;
#   - predicted against measured KL over every mix and preset (Spearman's
#     rank correlation), and `quantforge report` of them all (KL vs size, the
#     mixes and the presets as two series).
#
#   scripts/bench/mixed_precision_gguf.sh        (tables on stdout; files in build/bench/mixed-gguf)
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ -z ${QF_BIN:-} ]]; then
  scripts/build.sh --target quantforge >/dev/null
  QF_BIN=build/bin/quantforge
fi
qf=$QF_BIN
out=build/bench/mixed-gguf
calib=tests/data/text/calibration.txt
text=tests/data/text/evaluation.txt
wiki=../shared/data/wikitext-2-raw/wiki.test.raw
presets="Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K"
extra_bpw="3.8 4.0 4.2 4.6 4.8 5.0 5.4 5.6 6.0 6.3 7.0 8.0"
rm -rf "$out" && mkdir -p "$out"

for fx in fixture-llama fixture-mixtral; do
  d="$out/$fx"
  mkdir -p "$d"
  m="tests/data/$fx"
  "$qf" -q imatrix "$m" --text "$calib" --chunks 64 -o "$d/imatrix.gguf"
  start=$(date +%s.%N)
  "$qf" -q convert "$m" --to gguf --target-bpw 5 --imatrix "$d/imatrix.gguf" --calib "$calib" --dry-run \
    --json "$d/plan.json" -o "$d/unused.gguf" >/dev/null
  echo "$fx: measured plan in $(echo "$(date +%s.%N) - $start" | bc) s"
  for p in $presets; do
    "$qf" -q convert "$m" --to gguf --type "$p" --imatrix "$d/imatrix.gguf" -o "$d/$p.gguf"
    bytes=$(/usr/bin/python3 -c "import json,sys; print([x['bytes'] for x in json.load(open(sys.argv[1]))['presets'] if x['name']==sys.argv[2]][0])" "$d/plan.json" "$p")
    "$qf" -q convert "$m" --to gguf --target-size "$bytes" --sensitivity "$d/plan.json" --imatrix "$d/imatrix.gguf" \
      -o "$d/mix-$p.gguf"
  done
  for b in $extra_bpw; do
    "$qf" -q convert "$m" --to gguf --target-bpw "$b" --sensitivity "$d/plan.json" --imatrix "$d/imatrix.gguf" \
      -o "$d/mix-$b.gguf"
  done
  for f in "$d"/*.gguf; do
    [[ $f == */imatrix.gguf ]] && continue
    n=$(basename "$f" .gguf)
    "$qf" -q eval "$f" --baseline "$m" --text "$text" --max-chunks 100 --json "$d/$n.eval.json" >/dev/null
    case $n in Q3_K_M|Q4_K_M|Q5_K_M|mix-Q3_K_M|mix-Q4_K_M|mix-Q5_K_M)
      [[ -f $wiki ]] && "$qf" -q eval "$f" --baseline "$m" --text "$wiki" --max-chunks 40 --json "$d/$n.wiki.json" >/dev/null ;;
    esac
  done
  "$qf" -q report "$d"/*.eval.json -o "$d/report" >/dev/null
done

/usr/bin/python3 - "$out" $presets <<'PYEOF'
import glob, json, os, sys
sys.path.insert(0, "python")
out, presets = sys.argv[1], sys.argv[2:]

def spearman(a, b):
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return r
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    num = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    den = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return num / den

for fx in ["fixture-llama", "fixture-mixtral"]:
    d = os.path.join(out, fx)
    plan = json.load(open(os.path.join(d, "plan.json")))
    print(f"\n### {fx}: search cost {plan['seconds']} (s), {plan['probe_tokens']} probe tokens")
    print("| size of | preset KL | mix KL | change | preset file | mix file | mix bpw | predicted mix KL | WikiText-2 preset | WikiText-2 mix | change |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    pred, meas = [], []
    pp = {p["name"]: p for p in plan["presets"]}
    for p in presets:
        e = json.load(open(os.path.join(d, f"{p}.eval.json")))["kld"]["mean"]
        em = json.load(open(os.path.join(d, f"mix-{p}.eval.json")))["kld"]["mean"]
        mj = json.load(open(os.path.join(d, f"mix-{p}.mix.json")))
        fs, fm = os.path.getsize(os.path.join(d, f"{p}.gguf")), os.path.getsize(os.path.join(d, f"mix-{p}.gguf"))
        w = ""
        wp, wm = os.path.join(d, f"{p}.wiki.json"), os.path.join(d, f"mix-{p}.wiki.json")
        if os.path.exists(wp):
            a, b = json.load(open(wp))["kld"]["mean"], json.load(open(wm))["kld"]["mean"]
            w = f"{a:.6f} | {b:.6f} | {100 * (b / a - 1):+.1f}%"
        else:
            w = " | | "
        print(f"| {p} | {e:.6f} | {em:.6f} | {100 * (em / e - 1):+.1f}% | {fs} | {fm} | {mj['bits_per_weight']:.3f} | {mj['predicted_kld']:.6f} | {w} |")
        assert fm <= fs, (p, fm, fs)
        pred += [pp[p]["predicted_kld"], mj["predicted_kld"]]
        meas += [e, em]
    for f in sorted(glob.glob(os.path.join(d, "mix-[0-9]*.mix.json"))):
        mj = json.load(open(f))
        pred.append(mj["predicted_kld"])
        meas.append(json.load(open(f[:-len(".mix.json")] + ".eval.json"))["kld"]["mean"])
    ratio = sorted(m / p for m, p in zip(meas, pred))
    print(f"\npredicted vs measured KL over {len(pred)} files ({len(presets)} presets, {len(pred) - len(presets)} mixes): "
          f"Spearman {spearman(pred, meas):.4f}; measured/predicted median {ratio[len(ratio) // 2]:.3f}, range {ratio[0]:.3f}-{ratio[-1]:.3f}")
    print(f"lagrangian shortcut at the measured plan's 5.0 bpw: {plan['lagrangian']['predicted_kld']:.6f} against the exact {plan['predicted_kld']:.6f}")
PYEOF
