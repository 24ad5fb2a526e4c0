"""Checks of a vision-language model's quantize output, for tests/cli/vlm.sh.

  vlm_check.py rename SRC DST        copy the model folder SRC to DST with its
                                     tensors under the names transformers uses
                                     since 4.52 (model.language_model.*,
                                     model.visual.* / model.vision_tower.*, ...)
  vlm_check.py assemble VISION LM DST
                                     DST = the model folder LM (its language
                                     model and tokenizer) with the vision
                                     side, config.json and
                                     preprocessor_config.json of the
                                     vision-only folder VISION
  vlm_check.py kept SRC OUT          every vision and projector tensor of SRC
                                     is in OUT under the same name, dtype,
                                     shape and bytes; the processor files are
                                     copied; the ignore list is exactly the
                                     vision tower's and projector's Linears
                                     (2-D weights that are not embeddings)
                                     and the lm_head, as OUT's tensors name
                                     them
  vlm_check.py quantized SRC OUT     (recipe vision: {tower: W8A16,
                                     projector: FP8_DYNAMIC}) every vision
                                     Linear of SRC is stored quantized in OUT
                                     (int8 packed, or FP8 with per-token
                                     inputs), targeted by name, as OUT spells
                                     it, by exactly one config group of that
                                     scheme (per channel where 128 does not
                                     divide its columns, else group 128); the
                                     other vision tensors are byte-identical;
                                     ignore is the lm_head alone
  vlm_check.py changed A B TENSOR    TENSOR's bytes differ between the
                                     safetensors files A and B
"""
import json
import os
import shutil
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from codes_differ import load  # noqa: E402  (data section, header without __metadata__)


def tensor_bytes(data, info):
    a, b = info['data_offsets']
    return data[a:b]


def renamed(name, llava):
    if llava:
        for old, new in (('language_model.model.', 'model.language_model.'), ('language_model.lm_head.', 'lm_head.'),
                         ('vision_tower.', 'model.vision_tower.'), ('multi_modal_projector.', 'model.multi_modal_projector.'),
                         ('image_newline', 'model.image_newline')):
            if name.startswith(old):
                return new + name[len(old):]
        return name
    for old, new in (('model.', 'model.language_model.'), ('visual.', 'model.visual.')):
        if name.startswith(old):
            return new + name[len(old):]
    return name


def rename(src, dst):
    shutil.copytree(src, dst)
    llava = json.load(open(os.path.join(src, 'config.json')))['model_type'].startswith('llava')
    data, h = load(os.path.join(src, 'model.safetensors'))
    out = {}
    for k, v in sorted(h.items(), key=lambda kv: kv[1]['data_offsets'][0]):
        out[renamed(k, llava)] = v
    head = json.dumps(out, separators=(',', ':')).encode()
    head += b' ' * (-len(head) % 8)
    with open(os.path.join(dst, 'model.safetensors'), 'wb') as f:
        f.write(struct.pack('<Q', len(head)) + head + data)


def write_safetensors(path, tensors):
    """tensors: name -> (header entry, bytes), written in name order."""
    head, data = {}, b''
    for k in sorted(tensors):
        info, raw = tensors[k]
        head[k] = {'dtype': info['dtype'], 'shape': info['shape'], 'data_offsets': [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(head, separators=(',', ':')).encode()
    h += b' ' * (-len(h) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(h)) + h + data)


def assemble(vision, lm, dst):
    shutil.copytree(lm, dst)
    for f in ('config.json', 'preprocessor_config.json'):
        shutil.copyfile(os.path.join(vision, f), os.path.join(dst, f))
    vd, vh = load(os.path.join(vision, 'model.safetensors'))
    ld, lh = load(os.path.join(lm, 'model.safetensors'))
    tensors = {k: (v, tensor_bytes(ld, v)) for k, v in lh.items() if not k.startswith(VISION_PREFIXES)}
    tensors.update({k: (v, tensor_bytes(vd, v)) for k, v in vh.items()})
    write_safetensors(os.path.join(dst, 'model.safetensors'), tensors)
    for f in os.listdir(dst):
        if f.startswith('reference_') or f == 'training_report.json':
            os.remove(os.path.join(dst, f))


VISION_PREFIXES = ('visual.', 'vision_tower.', 'multi_modal_projector.', 'image_newline', 'model.visual.',
                   'model.vision_tower.', 'model.multi_modal_projector.', 'model.image_newline')


def kept(src, out):
    sd, sh = load(os.path.join(src, 'model.safetensors'))
    od, oh = load(os.path.join(out, 'model.safetensors'))
    vision = [k for k in sh if k.startswith(VISION_PREFIXES)]
    assert vision, 'no vision tensors in ' + src
    for k in vision:
        assert k in oh, 'missing ' + k
        assert (sh[k]['dtype'], sh[k]['shape']) == (oh[k]['dtype'], oh[k]['shape']), (k, sh[k], oh[k])
        assert tensor_bytes(sd, sh[k]) == tensor_bytes(od, oh[k]), 'changed ' + k
    for f in ('preprocessor_config.json', 'tokenizer_config.json'):
        if os.path.exists(os.path.join(src, f)):
            assert open(os.path.join(src, f), 'rb').read() == open(os.path.join(out, f), 'rb').read(), f
    qc = json.load(open(os.path.join(out, 'config.json')))['quantization_config']
    want = sorted(k[:-len('.weight')] for k in vision
                  if k.endswith('.weight') and len(sh[k]['shape']) == 2 and 'embed' not in k.rsplit('.', 2)[-2])
    head = 'language_model.lm_head' if 'language_model.lm_head.weight' in sh else 'lm_head'
    ignore = qc['ignore']
    assert len(ignore) == len(set(ignore)), ignore
    assert sorted(ignore) == sorted(want + [head]), (sorted(set(ignore) ^ set(want + [head])))
    # The language model's Linears are quantized under the checkpoint's own spelling.
    lm = [k for k in oh if '.layers.0.self_attn.q_proj.' in k and not k.startswith(VISION_PREFIXES)]
    assert lm and all(k.startswith(('model.layers.', 'model.language_model.layers.', 'language_model.model.layers.'))
                      for k in lm), lm
    prefix = lm[0].split('layers.0.')[0]
    src_prefix = [k for k in sh if '.layers.0.self_attn.q_proj.weight' in k and not k.startswith(VISION_PREFIXES)][0].split('layers.0.')[0]
    assert prefix == src_prefix, (prefix, src_prefix)
    print(len(vision), 'vision tensors kept,', len(want), 'vision Linears ignored')


def quantized(src, out):
    sd, sh = load(os.path.join(src, 'model.safetensors'))
    od, oh = load(os.path.join(out, 'model.safetensors'))
    vision = [k for k in sh if k.startswith(VISION_PREFIXES)]
    linears = sorted(k[:-len('.weight')] for k in vision
                     if k.endswith('.weight') and len(sh[k]['shape']) == 2 and 'embed' not in k.rsplit('.', 2)[-2])
    assert linears, 'no vision Linears in ' + src
    qc = json.load(open(os.path.join(out, 'config.json')))['quantization_config']
    head = 'language_model.lm_head' if 'language_model.lm_head.weight' in sh else 'lm_head'
    assert qc['ignore'] == [head], qc['ignore']
    owner = {}
    for name, g in qc['config_groups'].items():
        for t in g['targets']:
            if t != 'Linear':
                assert t not in owner, t + ' is targeted twice'
                owner[t] = g
    assert sorted(owner) == linears, sorted(set(owner) ^ set(linears))
    per_channel = 0
    for m in linears:
        g, (rows, cols) = owner[m], sh[m + '.weight']['shape']
        w, a = g['weights'], g['input_activations']
        if 'projector' in m or '.merger.' in m:
            assert (w['type'], w['num_bits'], w['strategy']) == ('float', 8, 'channel'), (m, w)
            assert a and (a['type'], a['strategy'], a['dynamic']) == ('float', 'token', True), (m, a)
            assert g['format'] == 'float-quantized', (m, g['format'])
            assert oh[m + '.weight']['dtype'] == 'F8_E4M3' and oh[m + '.weight_scale']['shape'] == [rows, 1], m
        else:
            assert (w['type'], w['num_bits'], w['symmetric']) == ('int', 8, True) and a is None, (m, w, a)
            want = ('group', 128) if cols % 128 == 0 else ('channel', None)
            per_channel += want[0] == 'channel'
            assert (w['strategy'], w['group_size']) == want, (m, cols, w)
            assert g['format'] == 'pack-quantized', (m, g['format'])
            assert m + '.weight' not in oh and oh[m + '.weight_packed']['shape'] == [rows, cols // 4], m
            assert oh[m + '.weight_shape']['dtype'] == 'I64', m
    kept = [k for k in vision if k[:-len('.weight')] not in linears]
    for k in kept:
        assert tensor_bytes(sd, sh[k]) == tensor_bytes(od, oh[k]), 'changed ' + k
    print(len(linears), 'vision Linears quantized (' + str(per_channel), 'per channel),', len(kept), 'other vision tensors kept')


def changed(a, b, name):
    (da, ha), (db, hb) = load(a), load(b)
    assert tensor_bytes(da, ha[name]) != tensor_bytes(db, hb[name]), name + ' is the same in both'


if __name__ == '__main__':
    {'rename': rename, 'assemble': assemble, 'kept': kept, 'quantized': quantized, 'changed': changed}[sys.argv[1]](*sys.argv[2:])
