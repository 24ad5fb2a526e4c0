#!/usr/bin/python3
"""Independent check of a LoRA merge: numpy only (no torch, no peft, no safetensors package).

  lora_merge_check.py BASE_DIR MERGED_DIR ADAPTER_DIR[:SCALE] [ADAPTER_DIR[:SCALE] ...]

Reads BASE_DIR/*.safetensors, every adapter's adapter_config.json and
adapter_model.safetensors (PEFT layout), computes in float64 the weights a
merge must produce, and compares with MERGED_DIR/*.safetensors.

PEFT's rules, written from peft's sources (tuners/tuners_utils.py
check_target_module_exists, tuners/lora/model.py _create_and_replace,
tuners/lora/layer.py update_layer / merge / get_delta_weight,
tuners/lora/dora.py, utils/other.py _set_trainable, utils/save_and_load.py):

  * module names are those of the base model's named_modules()
    ("model.layers.0.self_attn.q_proj"); adapter keys are
    "base_model.model." + module + ".lora_A.weight" [r, in] / ".lora_B.weight" [out, r]
    (".lora_embedding_A" [r, num_embeddings] / ".lora_embedding_B" [dim, r] for an
    Embedding) and, with DoRA, "...lora_magnitude_vector" [out].
  * target_modules: a string is a regex that must match the whole name
    (re.fullmatch); a list matches a name equal to an entry or ending in
    "." + entry; "all-linear" (later PEFT) is every 2-D weight but lm_head and the
    embeddings. For a list, layers_to_transform (int or list) keeps only names
    whose layer index, read with re.match(r".*\\.{layers_pattern}\\.(\\d+)\\.") (or
    r".*\\.[^.]*\\.(\\d+)\\." without a pattern), is selected. exclude_modules
    (later PEFT) drops names the same way.
  * rank and alpha: r / lora_alpha unless a rank_pattern / alpha_pattern key
    matches; a key matches a name when re.match(rf"(.*\\.)?({key})$", name)
    (current PEFT's get_pattern_key, the dicts looked up separately; peft
    <= 0.13 looked the first key of either dict up in both, which differs only
    when a module matches keys of both dicts: the script warns then).
  * scaling = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora; times
    SCALE (peft's scale_layer multiplies the scaling, DoRA included).
  * delta = scaling * B @ A ((B @ A).T for an Embedding); W' = W + delta.
    fan_in_fan_out has no effect on torch.nn.Linear modules (PEFT resets it).
  * DoRA: W' = (m / ||W + delta||_row) * (W + delta), the norm of each output row
    over the input dimension (columns of the [in, out] weight with fan_in_fan_out).
  * any other adapter tensor ("base_model.model.lm_head.weight" for
    modules_to_save, "<module>.base_layer.bias" for bias "all"/"lora_only")
    replaces the base tensor of that name, whatever SCALE is.
  * several adapters are applied in the order given, each to the result of the
    previous ones (as peft merges active adapters one after another).

Exit status 0 only if every tensor of the base is in the merged folder with the
same shape and dtype, the tensors no adapter touches are bit-identical to the
base, every touched tensor is within the tolerance below, and every touched
tensor whose expected float16 value differs from the base does differ from it
(so the base itself, passed as the merged folder, fails).
"""
import glob
import json
import math
import os
import re
import struct
import sys

import numpy as np

# ----------------------------------------------------------------------------- tolerance
# The merged file stores W' once rounded to its dtype (float16 here) from a float32
# computation. Rounding to nearest costs at most 1/2 ulp(|W'|), where ulp(x) is the
# spacing of float16 numbers in the binade of x (2^(floor(log2|x|) - 10), and 2^-24 below
# 2^-14 where float16 is subnormal). The float32 arithmetic before it adds a relative
# error of a few 2^-24 of the terms (|W|, |delta| and, for DoRA, the norm ratio), about
# 2^-13 ulp of float16 for terms of the size of the result; it can also move a value that
# lies next to a rounding midpoint to the other neighbour. So 1/2 ulp + (float32 error)
# < 1 ulp: a correct merge is within 1 ulp(|expected|) of the float64 expectation, and a
# wrong scale, a missed module or a wrong DoRA norm is off by many ulps.
TOL_ULPS = 1.0

NP_DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "BF16": np.uint16,
             "I8": np.int8, "U8": np.uint8, "I16": np.int16, "I32": np.int32, "I64": np.int64, "BOOL": np.bool_}


def ulp(x, dtype):
    """Spacing of `dtype` numbers in the binade of |x| (float64 arrays)."""
    if dtype == "F16":
        mant, emin = 10, -14
    elif dtype == "BF16":
        mant, emin = 7, -126
    elif dtype == "F32":
        mant, emin = 23, -126
    else:
        mant, emin = 52, -1022
    e = np.floor(np.log2(np.maximum(np.abs(x), 2.0 ** emin)))
    return np.exp2(e - mant)


# ----------------------------------------------------------------------------- safetensors
def read_safetensors(path):
    """{name: (dtype string, numpy array)}; BF16 is returned as float32."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        dt = info["dtype"]
        if dt not in NP_DTYPES:
            raise ValueError(f"{path}: {name}: dtype {dt} not supported")
        arr = np.frombuffer(data[8 + n + a:8 + n + b], dtype=np.dtype(NP_DTYPES[dt]).newbyteorder("<"))
        arr = arr.reshape(info["shape"])
        if dt == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = (dt, arr)
    return out


def read_folder(d):
    files = sorted(glob.glob(os.path.join(d, "*.safetensors")))
    if not files:
        raise ValueError(f"{d}: no *.safetensors")
    out = {}
    for f in files:
        for k, v in read_safetensors(f).items():
            if k in out:
                raise ValueError(f"{d}: tensor {k} in two files")
            out[k] = v
    return out


# ----------------------------------------------------------------------------- PEFT rules
def layer_selected(cfg, name):
    idx = cfg.get("layers_to_transform")
    if idx is None or (isinstance(idx, list) and not idx):
        return True
    pats = cfg.get("layers_pattern")
    m = None
    if not pats:
        m = re.match(r".*\.[^.]*\.(\d+)\.", name)
    else:
        for p in [pats] if isinstance(pats, str) else pats:
            m = re.match(rf".*\.{p}\.(\d+)\.", name)
            if m:
                break
    if m is None:
        return False
    i = int(m.group(1))
    return i == idx if isinstance(idx, int) else i in idx


def name_matches(spec, name):
    if isinstance(spec, str):
        return re.fullmatch(spec, name) is not None
    return name in spec or any(name.endswith("." + t) for t in spec)


def targeted(cfg, name, all_linear_names):
    t = cfg.get("target_modules")
    if t is None:
        return False
    ex = cfg.get("exclude_modules")
    if ex and name_matches(ex, name):
        return False
    if t == "all-linear":
        return name in all_linear_names
    if isinstance(t, str):
        return re.fullmatch(t, name) is not None
    return name_matches(t, name) and layer_selected(cfg, name)


def pattern_key(keys, name):
    for k in keys:
        if re.match(rf"(.*\.)?({k})$", name):
            return k
    return None


def rank_alpha(cfg, name):
    rp, ap = cfg.get("rank_pattern") or {}, cfg.get("alpha_pattern") or {}
    rk, ak = pattern_key(rp, name), pattern_key(ap, name)
    r = rp.get(rk, cfg["r"]) if rk is not None else cfg["r"]
    alpha = ap.get(ak, cfg["lora_alpha"]) if ak is not None else cfg["lora_alpha"]
    # peft <= 0.13: one key, the first of rank_pattern then alpha_pattern matching ".*\.{key}$"
    old = next((k for k in list(rp) + list(ap) if re.match(rf".*\.{k}$", name)), None)
    if old is not None and (rp.get(old, cfg["r"]), ap.get(old, cfg["lora_alpha"])) != (r, alpha):
        print(f"warning: {name}: rank/alpha ({r}, {alpha}) by current PEFT, ({rp.get(old, cfg['r'])}, "
              f"{ap.get(old, cfg['lora_alpha'])}) by peft <= 0.13", file=sys.stderr)
    return r, alpha


# ----------------------------------------------------------------------------- merge
PREFIX = "base_model.model."


def apply_adapter(expected, touched, base, adir, scale, errors):
    with open(os.path.join(adir, "adapter_config.json")) as f:
        cfg = json.load(f)
    if cfg.get("peft_type", "LORA") != "LORA":
        errors.append(f"{adir}: peft_type {cfg.get('peft_type')} is not LORA")
        return
    ad = {k: v[1] for k, v in read_safetensors(os.path.join(adir, "adapter_model.safetensors")).items()}
    # fan_in_fan_out transposes Conv1D (GPT-2) weights only: for torch.nn.Linear
    # targets, which every architecture here has, PEFT's LoRA Linear warns and
    # resets it to False (tuners/lora/layer.py Linear.__init__ via
    # _create_new_module), so it changes nothing.
    fifo = False
    if cfg.get("lora_bias"):
        errors.append(f"{adir}: lora_bias not supported by this checker")
    for k in ad:
        if not k.startswith(PREFIX):
            errors.append(f"{adir}: key {k} lacks the {PREFIX!r} prefix")
            return
    modules = sorted({k[len(PREFIX):].split(".lora_")[0] for k in ad if ".lora_" in k})
    weights = {n[:-len(".weight")] for n in base if n.endswith(".weight")}
    all_linear = {n for n in weights if base[n + ".weight"][1].ndim == 2 and not n.endswith(("lm_head", "embed_tokens", "wte", "embed_in"))}
    want = sorted(n for n in weights if targeted(cfg, n, all_linear))
    if set(want) != set(modules):
        errors.append(f"{adir}: the config targets {len(want)} modules, the tensors hold {len(modules)}; "
                      f"config only: {sorted(set(want) - set(modules))[:4]}, tensors only: {sorted(set(modules) - set(want))[:4]}")
    for mod in modules:
        wname = mod + ".weight"
        if wname not in base:
            errors.append(f"{adir}: {mod}: no {wname} in the base")
            continue
        emb = PREFIX + mod + ".lora_embedding_A" in ad
        ka, kb = (PREFIX + mod + ".lora_embedding_A", PREFIX + mod + ".lora_embedding_B") if emb else \
                 (PREFIX + mod + ".lora_A.weight", PREFIX + mod + ".lora_B.weight")
        if ka not in ad or kb not in ad:
            errors.append(f"{adir}: {mod}: lora_A/lora_B missing")
            continue
        a, b = ad[ka].astype(np.float64), ad[kb].astype(np.float64)
        r, alpha = rank_alpha(cfg, mod)
        if a.shape[0] != r or b.shape[1] != r:
            errors.append(f"{adir}: {mod}: rank {a.shape[0]} in the tensors, {r} by the config")
            continue
        s = (alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r) * scale
        w = expected[wname]
        delta = b @ a
        if emb:
            delta = delta.T          # [num_embeddings, dim], the Embedding weight's layout
        elif fifo:
            delta = delta.T          # the weight is stored [in, out]
        if delta.shape != w.shape:
            errors.append(f"{adir}: {mod}: delta {delta.shape} vs weight {w.shape}")
            continue
        w = w + s * delta
        km = PREFIX + mod + ".lora_magnitude_vector"
        if km in ad:
            if not cfg.get("use_dora"):
                errors.append(f"{adir}: {mod}: magnitude vector without use_dora")
            wo = w.T if fifo else w                       # [out, in]
            norm = np.linalg.norm(wo, axis=1)
            m = ad[km].astype(np.float64).reshape(-1)
            if m.shape != norm.shape:
                errors.append(f"{adir}: {mod}: magnitude {m.shape} vs {norm.shape} output rows")
                continue
            wo = (m / norm)[:, None] * wo
            w = wo.T if fifo else wo
        elif cfg.get("use_dora"):
            errors.append(f"{adir}: {mod}: use_dora but no {km}")
        expected[wname] = w
        touched.add(wname)
    for k, v in ad.items():
        if ".lora_" in k:
            continue
        name = k[len(PREFIX):].replace(".base_layer.", ".").replace(".modules_to_save.", ".")
        if name not in base:
            errors.append(f"{adir}: {k} names no base tensor ({name})")
            continue
        if tuple(v.shape) != tuple(base[name][1].shape):
            errors.append(f"{adir}: {k} shape {v.shape} vs base {base[name][1].shape}")
            continue
        expected[name] = v.astype(np.float64)
        touched.add(name)


def main(argv):
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    base_dir, merged_dir = argv[1], argv[2]
    errors = []
    base, merged = read_folder(base_dir), read_folder(merged_dir)
    expected, touched = {}, set()
    for n, (dt, arr) in base.items():
        expected[n] = arr.astype(np.float64)
    for spec in argv[3:]:
        adir, scale = spec, 1.0
        m = re.match(r"^(.*):([-+0-9.eE]+)$", spec)
        if m and not os.path.isdir(spec):
            adir, scale = m.group(1), float(m.group(2))
        apply_adapter(expected, touched, base, adir, scale, errors)
    checked, worst, worst_name, n_changed = 0, 0.0, "", 0
    for n, (dt, barr) in sorted(base.items()):
        if n not in merged:
            errors.append(f"{n}: missing from the merged folder")
            continue
        mdt, marr = merged[n]
        if mdt != dt or tuple(marr.shape) != tuple(barr.shape):
            errors.append(f"{n}: merged {mdt}{list(marr.shape)}, base {dt}{list(barr.shape)}")
            continue
        if n not in touched:
            if marr.tobytes() != barr.tobytes():
                errors.append(f"{n}: no adapter touches it, but it differs from the base")
            continue
        checked += 1
        exp = expected[n]
        got = marr.astype(np.float64)
        if not np.all(np.isfinite(got)):
            errors.append(f"{n}: non-finite values in the merged tensor")
            continue
        err = np.max(np.abs(got - exp) / ulp(exp, dt))
        if err > worst:
            worst, worst_name = float(err), n
        if err > TOL_ULPS:
            i = np.unravel_index(np.argmax(np.abs(got - exp) / ulp(exp, dt)), exp.shape)
            errors.append(f"{n}: {err:.3g} ulps off at {tuple(int(x) for x in i)}: merged {got[i]!r}, expected {exp[i]!r}")
        changed = marr.tobytes() != barr.tobytes()
        n_changed += changed
        if dt in ("F16", "F32", "F64"):
            exp_rounded = exp.astype(NP_DTYPES[dt])
            if not changed and exp_rounded.tobytes() != barr.tobytes():
                errors.append(f"{n}: the adapter changes it, but the merged tensor equals the base")
    extra = sorted(set(merged) - set(base))
    if extra:
        errors.append(f"merged folder has tensors the base lacks: {extra[:4]}")
    if touched and n_changed == 0:
        errors.append("no tensor of the merged folder differs from the base")
    for e in errors[:30]:
        print("FAIL", e)
    if len(errors) > 30:
        print(f"FAIL ... and {len(errors) - 30} more")
    status = "FAIL" if errors else "OK"
    print(f"lora_merge_check {status}: {len(base)} tensors, {checked} merged tensors checked ({n_changed} changed), "
          f"{len(base) - len(touched)} untouched, max error {worst:.3f} ulps ({worst_name or '-'}), tolerance {TOL_ULPS} ulp")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
