import time, sys, tempfile, urllib.request
from pathlib import Path
from rig.cluster import KafkaCluster
from rig.java_tools import JavaTools
from rig.reassign import *
MB=int(sys.argv[1]); modes=sys.argv[2].split(",")
t=JavaTools(); work=Path(tempfile.mkdtemp())
with KafkaCluster(3, replication_via_sluice=True) as c:
    b1=c.broker(1).bootstrap
    sc=c.sidecars[1]
    for mode in modes:
        topic=f"mv-{mode}"
        create_on(t, b1, topic, [1])
        fill(t, b1, topic, MB*10**6)
        size=log_bytes(c,1,topic)
        if mode=="leader": put_throttles(sc.admin_url, {"leader_rate_bytes":10_000_000,"topics":[{"topic":topic,"replicas":"0:2"}]})
        if mode=="follower": put_throttles(sc.admin_url, {"follower_rate_bytes":10_000_000,"topics":[{"topic":topic,"replicas":"0:2"}]})
        t0=time.monotonic(); reassign(t, b1, topic, [1,2], work); t1=wait_in_sync(c, topic, 2, 300)
        print(mode, size, round(t1-t0,2), "plan", round(size/1e7,2), flush=True)
        print(urllib.request.urlopen(sc.admin_url+"/throttles").read()[:1500])
        print([l for l in sc.metrics_text().splitlines() if ("throttle" in l or "lookups" in l) and not l.startswith("#")])
        clear_throttles(sc.admin_url)
