"""codes_differ.py A B SUFFIX [--require]: two safetensors files with the
same tensors (names, dtypes, shapes); in the 4-bit packed tensors whose names
end with SUFFIX (uint32 words, eight codes each), at most 10% of the codes
may differ. --require: there must be such tensors. Prints the share."""
import json
import struct
import sys

import numpy as np


def load(p):
    b = open(p, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop('__metadata__', None)
    return b[8 + n:], h



def main():
    da, ha = load(sys.argv[1])
    db, hb = load(sys.argv[2])
    suffix = sys.argv[3]
    assert ha.keys() == hb.keys(), set(ha) ^ set(hb)
    codes = diff = 0
    for k, v in ha.items():
        w = hb[k]
        assert (v['dtype'], v['shape']) == (w['dtype'], w['shape']), (k, v, w)
        if k.endswith(suffix):
            x = np.frombuffer(da[v['data_offsets'][0]:v['data_offsets'][1]], np.uint32)
            y = np.frombuffer(db[w['data_offsets'][0]:w['data_offsets'][1]], np.uint32)
            for i in range(8):
                codes += x.size
                diff += int((((x >> (4 * i)) & 15) != ((y >> (4 * i)) & 15)).sum())
    assert codes or '--require' not in sys.argv[4:], f"no tensor ends with {suffix}"
    if codes:
        assert diff <= 0.10 * codes, f"{diff} of {codes} codes differ"
        print(f"  {100 * diff / codes:.2f}% of {codes} codes differ")


if __name__ == '__main__':
    main()
