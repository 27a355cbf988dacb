import time, sys, tempfile, json, urllib.request
from pathlib import Path
from rig.cluster import KafkaCluster
from rig.java_tools import JavaTools
from rig.reassign import *
t=JavaTools(); work=Path(tempfile.mkdtemp())
with KafkaCluster(3, replication_via_sluice=True) as c:
    b1=c.broker(1).bootstrap
    sc=c.sidecars[1]
    topic="mv-f"
    create_on(t, b1, topic, [1])
    fill(t, b1, topic, 30*10**6)
    size=log_bytes(c,1,topic)
    print(put_throttles(sc.admin_url, {"follower_rate_bytes":10_000_000,"topics":[{"topic":topic,"replicas":"0:2"}]}))
    t0=time.monotonic(); reassign(t, b1, topic, [1,2], work); t1=wait_in_sync(c, topic, 2, 300)
    print(size, round(t1-t0,2))
    print(urllib.request.urlopen(sc.admin_url+"/throttles").read()[:1500])
    print([l for l in sc.metrics_text().splitlines() if "throttle" in l and not l.startswith("#")])
