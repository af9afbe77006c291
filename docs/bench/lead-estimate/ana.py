# Counts, over positions where both drafters started a cycle: DSpark's first draft
# accepted (ds0), MTP's (mtp0), both, either. See run.sh.
import re,glob,os
OUT=os.environ.get('OUT','/tmp/lead')
def parse(f):
    d={}
    for l in open(f):
        m=re.search(r'pos=(\d+).*?verified=(\d+) accepted=(\d+).*?draft=\[([^\]]*)\] next=(\d+)',l)
        if not m: continue
        pos,k,a=int(m[1]),int(m[2]),int(m[3])
        dr=[int(x) for x in m[4].split(',') if x.strip()]
        d[pos]=(k,a,dr,int(m[5]))
    return d
tot=dict(n=0,ds0=0,mtp0=0,both=0,either=0)
for f in sorted(glob.glob(OUT+'/ds-*.log')):
    id=f.split('ds-')[1]
    ds=parse(f); mt=parse(OUT+'/mtp-'+id)
    for pos,(k,a,dr,nx) in ds.items():
        if pos not in mt or k==0: continue
        mk,ma,mdr,mnx=mt[pos]
        if mk==0: continue
        tot['n']+=1
        d0 = a>=1; m0 = ma>=1
        tot['ds0']+=d0; tot['mtp0']+=m0; tot['both']+=d0 and m0; tot['either']+=d0 or m0
print(tot)
n=tot['n']; print({k:round(v/n,3) for k,v in tot.items()})
