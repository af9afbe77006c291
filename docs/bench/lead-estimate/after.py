# Slot-1 acceptance of a cycle by how the previous cycle ended (rej: a draft was rejected; acc: all accepted),
# from the spec logs of run.sh. Usage: OUT=/tmp/lead python3 docs/bench/lead-estimate/after.py
import re,glob,os
OUT=os.environ.get('OUT','/tmp/lead')
for kind in ('ds','mtp'):
    c={'rej':[0,0],'acc':[0,0]}
    for f in sorted(glob.glob(f'{OUT}/{kind}-*.log')):
        prev=None
        for l in open(f):
            m=re.search(r'verified=(\d+) accepted=(\d+)',l)
            if not m: continue
            k,a=int(m[1]),int(m[2])
            if prev is not None and k>0:
                key='rej' if prev[1]<prev[0] else 'acc'
                c[key][0]+=1; c[key][1]+= a>=1
            prev=(k,a)
    print(kind, {k:(n, round(h/max(n,1),3)) for k,(n,h) in c.items()})
