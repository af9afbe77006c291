#!/usr/bin/env python3
"""Do GGUF files hold the same tensor bytes? Metadata is ignored.

A reproduction run of a support model records its own command line and
training time, so the files differ; what must match is every tensor.

    scripts/gguf-same-tensors.py REFERENCE.gguf OTHER.gguf [MORE.gguf ...]

Prints one line per OTHER file; exits 1 if any differs.
"""
import hashlib, struct, sys

def read_tensors(path):
    b = open(path, 'rb').read()
    o = 0
    def u(fmt):
        nonlocal o
        v = struct.unpack_from('<' + fmt, b, o); o += struct.calcsize('<' + fmt); return v[0]
    def s():
        nonlocal o
        n = u('Q'); v = b[o:o+n].decode(); o += n; return v
    sizes = {0:'B',1:'b',2:'H',3:'h',4:'I',5:'i',6:'f',7:'?',10:'Q',11:'q',12:'d'}
    def val(t):
        if t == 8: return s()
        if t == 9:
            et = u('I'); n = u('Q'); return [val(et) for _ in range(n)]
        return u(sizes[t])
    assert b[:4] == b'GGUF'; o = 4
    ver = u('I'); nt = u('Q'); nkv = u('Q')
    kv = {}
    for _ in range(nkv):
        k = s(); t = u('I'); kv[k] = val(t)
    infos = []
    for _ in range(nt):
        name = s(); nd = u('I'); dims = [u('Q') for _ in range(nd)]; ty = u('I'); off = u('Q')
        infos.append((name, dims, ty, off))
    align = kv.get('general.alignment', 32)
    base = (o + align - 1) // align * align
    offs = sorted(set(i[3] for i in infos)) + [len(b) - base]
    out = {}
    for name, dims, ty, off in infos:
        end = min(x for x in offs if x > off)
        out[name] = hashlib.sha256(b[base+off:base+end]).hexdigest()
    return out

a = read_tensors(sys.argv[1])
bad = False
for p in sys.argv[2:]:
    b = read_tensors(p)
    diff = [k for k in a if a[k] != b.get(k)] + [k for k in b if k not in a]
    print(p, 'same tensor bytes' if not diff else f'{len(diff)} tensors differ: {diff[:5]}', f'({len(a)} tensors)')
    bad = bad or bool(diff)
sys.exit(1 if bad else 0)
