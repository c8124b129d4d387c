"""Development and test clusters on one machine: role processes on loopback
(local.py) or in network namespaces with iptables cuts and cgroup CPU quotas (netns.py,
root only), and a node run as a child process (nodeproc.py). Used by `cherami cluster`,
the tests and the benchmarks; no server module imports it."""
