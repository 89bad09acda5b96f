"""kvpoolctl: the operator's command line for a kvpool cluster.

``cli`` parses arguments and maps failures to exit codes; ``session`` reads and
writes the cluster in etcd; ``cluster`` answers status, stats and config from
etcd joined with each node's control plane; ``nodes`` asks a static node list;
``drain`` moves nodes between active and draining; ``watch`` prints membership
changes live; ``blocks`` puts, gets, removes and looks up blocks through the
client SDK; ``format`` renders tables and sizes.
"""
