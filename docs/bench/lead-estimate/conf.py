# DSpark's slot-1 confidence and acceptance by how the previous cycle ended, per confidence bin
# (spec logs of run.sh). Usage: python3 docs/bench/lead-estimate/conf.py  (reads $OUT, default /tmp/lead)
import re,glob
rows=[]
for f in sorted(glob.glob(__import__('os').environ.get('OUT','/tmp/lead')+'/ds-*.log')):
    prev=None
    for l in open(f):
        m=re.search(r'verified=(\d+) accepted=(\d+).*?conf=\[([^\]]*)\]',l)
        if not m: continue
        k,a=int(m[1]),int(m[2]); conf=[float(x) for x in m[3].split(',')]
        if prev is not None:
            rows.append(('rej' if prev[1]<prev[0] else 'acc', conf, a, k))
        prev=(k,a)
for case in ('rej','acc'):
    r=[x for x in rows if x[0]==case]
    print(case, len(r), 'mean conf1 %.3f'%(sum(x[1][0] for x in r)/len(r)), 'acc1 %.3f'%(sum(x[2]>=1 for x in r)/len(r)))
    for lo in (0,0.2,0.4,0.6,0.8):
        b=[x for x in r if lo<=x[1][0]<lo+0.2]
        if b: print('   conf1 in [%.1f,%.1f): n=%d acc=%.2f'%(lo,lo+0.2,len(b),sum(x[2]>=1 for x in b)/len(b)))
