"""kvpoolctl: the operator's command line for a kvpool cluster.

``cli`` parses arguments and maps failures to exit codes; ``nodes`` answers
status and stats from the control plane; ``blocks`` puts, gets, removes and
looks up blocks through the client SDK; ``format`` renders tables and sizes.
"""
