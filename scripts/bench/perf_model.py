#!/usr/bin/python3
"""The performance model of the device path (docs/architecture.md, "Performance
model"): Llama-3-8B GPTQ W4A16 calibration on 128 x 2048 tokens, and eval
(perplexity over 2048-token windows, decode) on an H100 SXM and an H200.

Every figure in that section is printed here from the constants below:
the model's shape, the cards' datasheet peaks, the fractions of peak assumed,
and the figures measured on one H100 (docs/benchmarks.md, "First run on a
GPU"). Standard library only.

usage: perf_model.py"""

# Llama-3-8B.
H, FF, LAYERS, HEADS, KV_HEADS, HD, VOCAB = 4096, 14336, 32, 32, 8, 128, 128256
QD, KVD = HEADS * HD, KV_HEADS * HD
SEQS, SEQ = 128, 2048
N = SEQS * SEQ            # calibration tokens
PASS = 512                # kDevicePassTokens: tokens per pass through a layer
GPTQ_BLOCK = 128
GROUP = 128               # W4 group size

# TinyLlama-1.1B shapes (the measured run: 128 x 512 calibration tokens).
T_H, T_FF, T_LAYERS, T_HEADS, T_KV_HEADS, T_HD, T_VOCAB = 2048, 5632, 22, 32, 4, 64, 32000
T_N, T_SEQ = 128 * 512, 512

# Datasheet peaks (dense), FLOP/s and bytes/s.
CARDS = {
    "H100 SXM": {"fp64_tc": 67e12, "fp64": 34e12, "fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "hbm": 3.35e12},
    "H200": {"fp64_tc": 67e12, "fp64": 34e12, "fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "hbm": 4.8e12},
}
# Fractions of peak used by the model.
GEMM_EFF = 0.60           # large GEMMs, SYRK, potrf/trsm
SMALL_GEMM_EFF = 0.30     # the attention's batched GEMMs (k = 128, 4 heads a batch)
STREAM_EFF = 0.75         # streaming element-wise kernels
KERNEL_S = 2e-6           # per kernel, once no call synchronises
PCIE_PINNED = 40e9        # PCIe Gen5 x16, pinned host memory
PCIE_PAGEABLE = 12e9      # pageable host memory (what the code uses today)
HOST_NS_PER_WEIGHT = 5e-9  # the solve's host loops per weight, one thread (estimate)
HOST_THREADS = 16
ROW_BLOCK_S = 100e-6     # one GPTQ in-block row kernel: one thread per row, latency-bound

# Measured on one H100 80GB HBM3 (docs/benchmarks.md, "First run on a GPU").
M_FORWARD_S, M_FORWARD_RATE = 50.8, 2.56e12
M_SOLVE_S = 30.6
M_PROPAGATE_S, M_PROPAGATE_RATE = 23.3, 5.6e12
M_LAYERS_S, M_TOTAL_S = 116.3, 123.0
M_GPTQ_4096_S, M_GPTQ_14336_S = 0.19, 1.16     # qf_gptq_device_bench, GPTQ part
M_PREFILL_TOKS, M_DECODE_TOKS = 1986.0, 37.4   # bench -p 512 -n 32, f16 1.1B
M_READ_BW = 2.7e12                             # the card's measured read rate


def linear_weights(h, ff, qd, kvd):
    return h * qd + 2 * h * kvd + qd * h + 3 * h * ff


def attention_flops_useful(heads, hd, seq):
    # layer_forward_flops: 2 per head dimension, query and visible key, both products.
    return 4 * hd * heads * (seq + 1) / 2


def attention_flops_passes(heads, hd, seq, pass_tokens):
    # What the GEMMs compute: every pass's full nq x nk rectangle.
    nk = [min(seq, p + pass_tokens) for p in range(0, seq, pass_tokens)]
    return 4 * hd * heads * sum(nk) / len(nk)


def hessian_flops(cols):
    return sum(c * (c + 1) for c in cols)


def fmt(x, unit=""):
    for scale, s in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {s}{unit}"
    return f"{x:.3g} {unit}"


def sec(x):
    return f"{x:.3g} s" if x >= 1e-3 else f"{x * 1e3:.3g} ms"


W_LAYER = linear_weights(H, FF, QD, KVD)
W_DECODER = W_LAYER * LAYERS
W_LMHEAD = VOCAB * H
LIN_FLOPS_TOKEN = 2 * W_LAYER
ATT_USEFUL_TOKEN = attention_flops_useful(HEADS, HD, SEQ)
ATT_PASSES_TOKEN = attention_flops_passes(HEADS, HD, SEQ, PASS)
HESS_COLS = [H, QD, H, FF]  # q/k/v input, o input, gate/up input, down input
HESS_TOKEN = hessian_flops(HESS_COLS)
LAYER_PASSES = SEQS * (SEQ // PASS)  # 512-token passes per layer per model pass
KERNELS_LAYER_PASS = 1 + 6 + 2 + 2 + 3 * KV_HEADS + 2 + 1 + 1 + 4 + 1 + 2 + 1
PACKED_BYTES = 0.5 + 8 / GROUP  # int4 codes, f32 scale and int32 zero per group

# Element-wise bytes per token per layer (f32): norms, RoPE, K/V store,
# residual adds, SwiGLU; and the bf16 casts of the four GEMM inputs (after).
ELEM_TODAY = 4 * (2 * 2 * H + 2 * (QD + KVD) + 2 * 2 * KVD + 2 * 3 * H + 3 * FF)
ELEM_CASTS = 6 * (H + QD + H + FF)
SCORES_TOKEN = HEADS * ATT_PASSES_TOKEN / (4 * HD * HEADS) * 16  # 16 B a score


def tinyllama_check():
    w = linear_weights(T_H, T_FF, T_HEADS * T_HD, T_KV_HEADS * T_HD)
    fwd = T_N * T_LAYERS * (2 * w + attention_flops_useful(T_HEADS, T_HD, T_SEQ))
    hess = T_N * T_LAYERS * hessian_flops([T_H, T_HEADS * T_HD, T_H, T_FF])
    print("## 1.1B measured run (H100)")
    print(f"forward flops {fmt(fwd, 'FLOP')}: at {M_FORWARD_S} s {fmt(fwd / M_FORWARD_S, 'FLOP/s')}, "
          f"at {M_PROPAGATE_S} s {fmt(fwd / M_PROPAGATE_S, 'FLOP/s')}")
    hess_s = M_FORWARD_S - M_PROPAGATE_S
    print(f"Hessian flops {fmt(hess, 'FLOP')} in capture - propagate = {hess_s:.1f} s: {fmt(hess / hess_s, 'FLOP/s')}")
    per_pass = M_PROPAGATE_S / (T_LAYERS * 128)
    gemm = T_SEQ * 2 * w / (GEMM_EFF * 67e12)
    print(f"propagate per 512-token layer pass {per_pass * 1e3:.2f} ms; its GEMMs at 60% FP32 {gemm * 1e3:.2f} ms")
    # Decode: f16 widened (2 read, 4 write) then read by the GEMM (4): 10 B a weight.
    wd = T_LAYERS * w + T_VOCAB * T_H
    step = 1 / M_DECODE_TOKS
    widen = 10 * wd / M_READ_BW
    calls = T_LAYERS * (1 + 6 + 2 + 2 + 3 * T_KV_HEADS + 2 + 1 + 1 + 4 + 1 + 2 + 1) + 6
    print(f"decode step {step * 1e3:.2f} ms; weights x 10 B = {fmt(10 * wd, 'B')} at 2.7 TB/s {widen * 1e3:.2f} ms; "
          f"{calls} calls -> {(step - widen) / calls * 1e6:.1f} us each")
    prefill_rate = M_PREFILL_TOKS * (2 * w * T_LAYERS + T_LAYERS * attention_flops_useful(T_HEADS, T_HD, T_SEQ))
    print(f"prefill effective rate {fmt(prefill_rate, 'FLOP/s')}")
    print(f"outside the phases: {M_TOTAL_S - (M_FORWARD_S + M_SOLVE_S + M_PROPAGATE_S):.1f} s; "
          f"scale to 8B by decoder weights x{W_DECODER / (T_LAYERS * w):.2f}")
    print()
    return (calls, (step - widen) / calls, hess / hess_s, prefill_rate, T_LAYERS * w)


def calibration(per_call, hess_rate, t_weights):
    print("## Shapes")
    print(f"decoder Linear weights per layer {fmt(W_LAYER)}, model {fmt(W_DECODER)}; lm_head {fmt(W_LMHEAD)}")
    print(f"per token per layer: Linears {fmt(LIN_FLOPS_TOKEN, 'FLOP')}, attention useful {fmt(ATT_USEFUL_TOKEN, 'FLOP')}, "
          f"as computed in 512-token passes {fmt(ATT_PASSES_TOKEN, 'FLOP')}, Hessians {fmt(HESS_TOKEN, 'FLOP')}")
    print(f"element-wise bytes per token per layer: {ELEM_TODAY / 1e3:.0f} kB today, +{ELEM_CASTS / 1e3:.0f} kB casts; "
          f"scores {SCORES_TOKEN / 1e3:.0f} kB")
    print()
    pass_useful = N * LAYERS * (LIN_FLOPS_TOKEN + ATT_USEFUL_TOKEN)
    lin = N * LAYERS * LIN_FLOPS_TOKEN
    att = N * LAYERS * ATT_PASSES_TOKEN
    hess = N * LAYERS * HESS_TOKEN
    # Solve (per layer): factors potrf n^3/3 + trsm against I n^3.
    f4096, f14336 = 4 / 3 * H ** 3, 4 / 3 * FF ** 3
    factors_today = LAYERS * (6 * f4096 + f14336)
    factors_shared = LAYERS * (3 * f4096 + f14336)
    shapes = [(QD, H), (KVD, H), (KVD, H), (H, QD), (FF, H), (FF, H), (H, FF)]
    lazy = LAYERS * sum(r * c * (c - GPTQ_BLOCK) for r, c in shapes)
    rows = LAYERS * sum(r * c * GPTQ_BLOCK for r, c in shapes)
    blocks = LAYERS * sum(c // GPTQ_BLOCK for _, c in shapes)

    print("## (a) today, scaled from the measured rates (H100)")
    t_fwd = pass_useful / M_PROPAGATE_RATE
    t_hess = hess / hess_rate
    t_gptq = LAYERS * (6 * M_GPTQ_4096_S + M_GPTQ_14336_S)
    t_host = W_DECODER * HOST_NS_PER_WEIGHT
    outside = (M_TOTAL_S - (M_FORWARD_S + M_SOLVE_S + M_PROPAGATE_S)) * W_DECODER / t_weights
    rows_today = [
        ("capture pass, forward", fmt(pass_useful, "FLOP"), "5.6 TFLOP/s", t_fwd),
        ("capture pass, Hessians", fmt(hess, "FLOP"), f"{hess_rate / 1e12:.1f} TFLOP/s", t_hess),
        ("solve, device", "6 x 0.19 s + 1.16 s a layer", "", t_gptq),
        ("solve, host loops", fmt(W_DECODER) + " weights", "5 ns a weight", t_host),
        ("propagate", fmt(pass_useful, "FLOP"), "5.6 TFLOP/s", t_fwd),
        ("outside the phases", "", "", outside),
    ]
    total = 0
    for name, work, rate, t in rows_today:
        total += t
        print(f"| {name} | {work} | {rate} | {t:.0f} s |")
    # Bottom-up for today's pass: FP32 GEMMs at 60%, every call at the per-call
    # cost the decode measurement implies, the f16 widening at the measured read
    # rate; scaled by how far the same sum falls short of the 1.1B measurement.
    lp = PASS * (LIN_FLOPS_TOKEN + ATT_PASSES_TOKEN) / (GEMM_EFF * 67e12) + KERNELS_LAYER_PASS * per_call \
        + 6 * W_LAYER / M_READ_BW
    t_w = linear_weights(T_H, T_FF, T_HEADS * T_HD, T_KV_HEADS * T_HD)
    t_calls = 1 + 6 + 2 + 2 + 3 * T_KV_HEADS + 2 + 1 + 1 + 4 + 1 + 2 + 1
    t_lp = T_SEQ * (2 * t_w + attention_flops_passes(T_HEADS, T_HD, T_SEQ, T_SEQ)) / (GEMM_EFF * 67e12) \
        + t_calls * per_call + 4.56 * t_w / M_READ_BW
    short = (M_PROPAGATE_S / (T_LAYERS * 128)) / t_lp
    low = lp * LAYERS * LAYER_PASSES
    print(f"bottom-up layer pass: 8B {lp * 1e3:.2f} ms, 1.1B {t_lp * 1e3:.2f} ms (measured "
          f"{M_PROPAGATE_S / (T_LAYERS * 128) * 1e3:.2f} ms, x{short:.2f}); 8B pass {low:.0f} s, x{short:.2f} = {low * short:.0f} s")
    low_total = total - 2 * t_fwd + 2 * low * short - t_hess + hess / 5e12
    print(f"lower estimate (passes bottom-up x{short:.2f}, Hessians at 5 TFLOP/s): {low_total:.0f} s = {low_total / 60:.0f} min")
    alt = total - t_hess + hess / 5e12
    print(f"| total | | | {total:.0f} s = {total / 60:.0f} min (Hessians at 5 TFLOP/s: {alt / 60:.0f} min) |")
    widen = LAYERS * LAYER_PASSES * W_LAYER * 6
    print(f"f16 widening per model pass {fmt(widen, 'B')}: {widen / M_READ_BW:.1f} s at 2.7 TB/s, "
          f"{widen / (0.8 * 4.8e12):.1f} s on an H200")
    print()

    print("## (a) after, bottom-up")
    kernels = LAYERS * LAYER_PASSES * KERNELS_LAYER_PASS
    elem = N * LAYERS * (ELEM_TODAY + ELEM_CASTS)
    scores = N * LAYERS * SCORES_TOKEN
    to_double = N * LAYERS * 12 * sum(HESS_COLS)  # 4 B read + 8 B written a value
    upload = N * H * 4 + LAYERS * (2 * W_LAYER + PACKED_BYTES * W_LAYER)
    host_after = t_host / HOST_THREADS
    totals = {}
    for card, c in CARDS.items():
        bw = STREAM_EFF * c["hbm"]
        gemm = GEMM_EFF * c["bf16"]
        f64 = GEMM_EFF * c["fp64_tc"]
        fwd = [
            ("Linears", "BF16 tensor cores, f32 accumulation", fmt(lin, "FLOP"), "", lin / gemm),
            ("attention products", "BF16 tensor cores (30%)", fmt(att, "FLOP"), "", att / (SMALL_GEMM_EFF * c["bf16"])),
            ("softmax", "f32", "", fmt(scores, "B"), scores / bw),
            ("norms, RoPE, SwiGLU, residuals, casts", "f32", "", fmt(elem, "B"), elem / bw),
            ("kernel launches", "", f"{kernels / 1e3:.0f}k kernels", "", kernels * KERNEL_S),
        ]
        t_pass = sum(r[-1] for r in fwd)
        phases = [("uploads (hidden states; each layer as stored, twice)", "", "", fmt(upload, "B") + " PCIe",
                   upload / PCIE_PINNED)]
        phases += [("capture: " + r[0],) + r[1:] for r in fwd]
        phases += [
            ("Hessians: inputs to double", "f32 -> f64", "", fmt(to_double, "B"), to_double / bw),
            ("Hessians: SYRK", "FP64 tensor cores", fmt(hess, "FLOP"), "", hess / f64),
            ("solve: factors (potrf + trsm, shared per Hessian)", "FP64", fmt(factors_shared, "FLOP"), "",
             factors_shared / f64),
            ("solve: lazy updates", "FP64", fmt(lazy, "FLOP"), "", lazy / f64),
            ("solve: in-block row loops", "FP64", fmt(rows, "FLOP"), f"{blocks} block kernels", blocks * ROW_BLOCK_S),
            ("solve: host loops, 16 threads", "", "", "", host_after),
            ("propagate (as the capture forward)", "BF16 / f32", fmt(lin + att, "FLOP"), fmt(scores + elem, "B"), t_pass),
        ]
        device = sum(p[-1] for p in phases)
        totals[card] = (phases, device, t_pass)
    names = list(CARDS)
    for i, p in enumerate(totals[names[0]][0]):
        print(f"| {p[0]} | {p[1]} | {p[2]} | {p[3]} | {sec(p[4])} | {sec(totals[names[1]][0][i][4])} |")
    for card in names:
        d = totals[card][1]
        print(f"{card}: device phases {d:.1f} s, with outside {d + outside:.0f} s = {(d + outside) / 60:.1f} min; "
              f"forward pass {totals[card][2]:.1f} s")
    f_tf32 = lin / (GEMM_EFF * 494.7e12) - lin / (GEMM_EFF * 989.4e12)
    print(f"TF32 instead of BF16 for the Linears: +{f_tf32:.1f} s a pass")
    print(f"FP64 SIMT (34 TF) SYRK instead: {hess / (GEMM_EFF * 34e12):.0f} s")
    for k in (PASS, SEQ):
        c_bytes = sum(c * c / 2 * 16 for c in HESS_COLS)  # lower triangle read and written per call
        calls = LAYERS * N // k
        print(f"SYRK with k = {k}: the sums' traffic {fmt(calls * c_bytes, 'B')} "
              f"({calls * c_bytes / (STREAM_EFF * 3.35e12):.1f} s at 75% of the H100's HBM)")
    print(f"TF32 SYRK instead: {hess / (GEMM_EFF * 494.7e12):.1f} s")
    print(f"factors without sharing {fmt(factors_today, 'FLOP')}")
    down = sum(c * c * 8 for c in HESS_COLS)
    up = sum(c * c * 8 for c in (H, H, H, QD, H, H, FF))  # one upload per Linear
    print(f"Hessians to the host {fmt(down, 'B')} and back {fmt(up, 'B')} a layer: "
          f"{fmt(LAYERS * (down + up), 'B')}, {LAYERS * (down + up) / PCIE_PAGEABLE:.0f} s pageable")
    for r, c in ((H, H), (H, FF)):
        work = 4 / 3 * c ** 3 + r * c * (c - GPTQ_BLOCK)
        print(f"GPTQ {r} x {c}: {fmt(work, 'FLOP')} at 60% FP64 tensor cores {sec(work / (GEMM_EFF * 67e12))}; "
              f"the bench's inputs are {fmt(N * c)} normal draws on the host")
    print()
    return t_fwd, t_hess, t_gptq, t_host, outside


def evaluation(per_call, prefill_rate):
    print("## (b) eval, one 2048-token window, W4A16 model (lm_head bf16)")
    scored = SEQ - 1
    lin = SEQ * LAYERS * LIN_FLOPS_TOKEN
    head = 2 * W_LMHEAD * scored
    att_useful = SEQ * LAYERS * ATT_USEFUL_TOKEN
    att = SEQ * LAYERS * ATT_PASSES_TOKEN
    logits = scored * VOCAB * 4
    useful = lin + head + att_useful
    today = useful / M_PROPAGATE_RATE + logits / PCIE_PAGEABLE
    print(f"FLOPs: Linears {fmt(lin)}, lm_head {fmt(head)}, attention useful {fmt(att_useful)} / computed {fmt(att)}; "
          f"logits {fmt(logits, 'B')}")
    print(f"today: {useful / M_PROPAGATE_RATE:.2f} s at 5.6 TF + logits {logits / PCIE_PAGEABLE:.3f} s = {today:.2f} s "
          f"-> {SEQ / today:.0f} tok/s; at the 1.1B prefill rate {SEQ / (useful / prefill_rate):.0f} tok/s")
    passes = SEQ // PASS
    decode_bytes = passes * W_DECODER * (PACKED_BYTES + 2)
    scores = SEQ * LAYERS * SCORES_TOKEN
    elem = SEQ * LAYERS * (ELEM_TODAY + ELEM_CASTS)
    kernels = passes * (LAYERS * KERNELS_LAYER_PASS + 6)
    res = {}
    for card, c in CARDS.items():
        bw = STREAM_EFF * c["hbm"]
        gemm = GEMM_EFF * c["bf16"]
        rows = [
            ("Linears", "BF16", fmt(lin, "FLOP"), "", lin / gemm),
            ("lm_head, 2047 rows", "BF16", fmt(head, "FLOP"), "", head / gemm),
            ("attention products", "BF16 (30%)", fmt(att, "FLOP"), "", att / (SMALL_GEMM_EFF * c["bf16"])),
            ("int4 -> bf16 decode, once per pass", "", "", fmt(decode_bytes, "B"), decode_bytes / bw),
            ("softmax", "f32", "", fmt(scores, "B"), scores / bw),
            ("norms, RoPE, SwiGLU, residuals, casts", "f32", "", fmt(elem, "B"), elem / bw),
            ("log-softmax and NLL on the device", "f32", "", fmt(2 * logits, "B"), 2 * logits / bw),
            ("kernel launches", "", f"{kernels}", "", kernels * KERNEL_S),
        ]
        t = sum(r[-1] for r in rows)
        fused = t - decode_bytes / bw - scores / bw + passes * W_DECODER * PACKED_BYTES / bw
        res[card] = (rows, t, fused)
    names = list(CARDS)
    for i, r in enumerate(res[names[0]][0]):
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {sec(r[4])} | {sec(res[names[1]][0][i][4])} |")
    for card in names:
        rows, t, fused = res[card]
        print(f"{card}: {t * 1e3:.0f} ms a window -> {SEQ / t:.0f} tok/s; fused W4 GEMM + attention without scores: "
              f"{fused * 1e3:.0f} ms -> {SEQ / fused:.0f} tok/s")
    print()

    print("## (b) decode, one token at position 1024")
    kv = 1024 * LAYERS * 2 * KVD * 4  # the cache holds f32
    w_today = W_DECODER * (PACKED_BYTES + 4 + 4) + W_LMHEAD * 10
    calls = LAYERS * KERNELS_LAYER_PASS + 6
    w_after = W_DECODER * (PACKED_BYTES + 2 + 2) + W_LMHEAD * 2
    w_fused = W_DECODER * PACKED_BYTES + W_LMHEAD * 2
    print(f"today: weights {fmt(w_today, 'B')} + KV {fmt(kv, 'B')}; {calls} calls x {per_call * 1e6:.1f} us = "
          f"{calls * per_call * 1e3:.1f} ms")
    for card, c in CARDS.items():
        bw_today = M_READ_BW if card == "H100 SXM" else 0.8 * c["hbm"]
        t_today = (w_today + kv) / bw_today + calls * per_call
        bw = STREAM_EFF * c["hbm"]
        t_after = (w_after + kv) / bw + calls * KERNEL_S
        fused_kernels = LAYERS * 12 + 6
        t_fused = (w_fused + kv) / bw + fused_kernels * KERNEL_S
        bound = (w_fused + kv) / c["hbm"]
        print(f"{card}: today {(w_today + kv) / bw_today * 1e3:.1f} + {calls * per_call * 1e3:.1f} ms = "
              f"{t_today * 1e3:.1f} ms -> {1 / t_today:.1f} tok/s; after (decode to bf16 then GEMV) "
              f"{fmt(w_after + kv, 'B')} {t_after * 1e3:.1f} ms -> {1 / t_after:.0f} tok/s; fused W4 GEMV "
              f"{fmt(w_fused + kv, 'B')} {t_fused * 1e3:.2f} ms -> {1 / t_fused:.0f} tok/s; bound {1 / bound:.0f} tok/s")


if __name__ == "__main__":
    calls, per_call, hess_rate, prefill_rate, t_weights = tinyllama_check()
    calibration(per_call, hess_rate, t_weights)
    evaluation(per_call, prefill_rate)
