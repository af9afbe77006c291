#!/usr/bin/env python3
"""How well two per-slot signals of DSpark's full-block spec logs rank drafts
(BENCHMARKS.md §7q): `conf` (at temperature 0 the draft's own probability of
its token) and `head` (the confidence head). For each slot reached (all drafts
before it accepted): the AUC of the signal for that slot's acceptance. Then
the best truncation per cycle by each signal, calibrated in-sample per slot
over tenths, against fixed lengths, at a cost table in plain tokens (the
draft is paid every cycle). Usage: auc.py [--costs 1,1.07,1.2,1.4,1.75]
[--draft 0.14] LOG..."""
import re, sys, collections

args = sys.argv[1:]
cost, dc = [1, 1.07, 1.2, 1.4, 1.75], 0.14
while args and args[0].startswith('--'):
    k, v = args[0], args[1]
    args = args[2:]
    if k == '--costs':
        cost = [float(x) for x in v.split(',')]
    elif k == '--draft':
        dc = float(v)
cyc = []  # (conf list, head list, accepted)
for f in args:
    for l in open(f):
        if not l.startswith('spec cycle'):
            continue
        lst = lambda name: [float(x) for x in re.search(name + r'=\[([^\]]*)\]', l).group(1).split(',')]
        c, h = lst('conf'), lst('head')
        if len(c) == 4 and len(h) == 4:
            cyc.append((c, h, int(re.search(r'accepted=(\d+)', l).group(1))))
print(f'{len(cyc)} full-block cycles')


def auc(pairs):
    pos = sum(1 for _, y in pairs if y)
    neg = len(pairs) - pos
    s = sorted(pairs)
    rank_sum, i = 0.0, 0
    while i < len(s):
        j = i
        while j < len(s) and s[j][0] == s[i][0]:
            j += 1
        rank_sum += (i + 1 + j) / 2 * sum(1 for k in range(i, j) if s[k][1])
        i = j
    return (rank_sum - pos * (pos + 1) / 2) / (pos * neg)


sig = {'conf (draft probability)': 0, 'head': 1}
for slot in range(4):
    rows = [(x, slot < a) for *x, a in cyc if a >= slot]
    acc = sum(y for _, y in rows) / len(rows)
    print(f'slot {slot}: reached {len(rows)}, accepted {acc:.3f}; AUC ' +
          ', '.join(f'{n} {auc([(x[i][slot], y) for x, y in rows]):.3f}' for n, i in sig.items()))
pooled = [(x, s, s < a) for *x, a in cyc for s in range(4) if a >= s]
print('pooled AUC ' + ', '.join(f'{n} {auc([(x[i][s], y) for x, s, y in pooled]):.3f}' for n, i in sig.items()))

def policy(i):
    bins = [collections.defaultdict(lambda: [0, 0]) for _ in range(4)]
    b = lambda v: min(int(v * 10), 9)
    for *x, a in cyc:
        for s in range(min(a + 1, 4)):
            bins[s][b(x[i][s])][0] += s < a
            bins[s][b(x[i][s])][1] += 1
    p = lambda s, v: (bins[s][b(v)][0] + 1) / (bins[s][b(v)][1] + 2)
    tok = t = 0
    for *x, a in cyc:
        best, k, e, surv = 1 / (1 + dc), 0, 1.0, 1.0
        for j in range(1, 5):
            surv *= p(j - 1, x[i][j - 1])
            e += surv
            if e / (cost[j] + dc) > best:
                best, k = e / (cost[j] + dc), j
        tok += min(a, k) + 1
        t += cost[k] + dc
    return tok / t


for n, i in sig.items():
    print(f'best calibrated truncation by {n}: {policy(i):.3f}x')
for k in range(1, 5):
    print(f'fixed {k}: {sum(min(a, k) + 1 for *_, a in cyc) / (len(cyc) * (cost[k] + dc)):.3f}x')
